"""A compiled package is proven in a child process before a process trusts it.

Loading a package runs native code that can take the process down (on CUDA, torch's loader
once died with SIGSEGV, which no `try` catches). So the first process on a machine that wants
a package plays a few steps of it in a child (`package_check.py`) against the eager step of
the same rules, and records the verdict beside the package: once per machine, package and
device. Later processes read the verdict. A package that crashed its child, raised, timed
out or played other games is never loaded; the env runs its eager step and says why once.
Delete the verdict file (or the cache folder) to check again.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from gymnasium.vector import AutoresetMode

from fruit_env.kit.autoreset import EagerStepper, Running
from fruit_env.kit.game import TensorGame
from fruit_env.kit.layout import Layout

CHILD = Path(__file__).with_name("package_check.py")  # run by path: it imports torch alone
CHECK_ENVS = 37  # not the traced size, so the dynamic batch dimension is exercised
CHECK_STEPS = 48
CHECK_TIMEOUT_S = 300.0  # a cold CUDA context and the loader take seconds, not minutes
NAMES = ("rows", "key", "counter")  # the graph's inputs besides the actions


def verdict_path(package: Path, device: torch.device) -> Path:
    """Where the verdict of `package` on this machine and `device` is recorded."""
    where = f"{platform.node() or 'host'}-{device}".replace(":", "-").replace(os.sep, "-")
    return package.with_name(f"{package.stem}.{where}.verdict.json")


def problem(
    package: Path,
    game: TensorGame[Any],
    layout: Layout,
    mode: AutoresetMode,
    device: torch.device,
    graph: torch.nn.Module,
) -> str | None:
    """None if `package` plays the eager games on `device`, else why not (from the recorded
    verdict, or from a check run now and recorded)."""
    record = verdict_path(package, device)
    try:
        verdict = json.loads(record.read_text())
        return None if verdict["ok"] else f"{verdict['reason']} (recorded in {record})"
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no verdict yet (or an unreadable one): check now
    reason = check(package, game, layout, mode, device, graph)
    verdict = {"ok": reason is None, "reason": reason, "torch": torch.__version__}
    try:
        partial = record.with_suffix(".tmp")
        partial.write_text(json.dumps(verdict) + "\n")
        os.replace(partial, record)
    except OSError:
        pass  # an unwritable cache: the next process checks again
    return None if reason is None else f"{reason} (recorded in {record})"


def check(
    package: Path,
    game: TensorGame[Any],
    layout: Layout,
    mode: AutoresetMode,
    device: torch.device,
    graph: torch.nn.Module,
) -> str | None:
    """Run the child on `CHECK_STEPS` steps of the eager graph; None if it agreed."""
    with tempfile.TemporaryDirectory() as tmp:
        cases = Path(tmp) / "cases.pt"
        torch.save(_cases(game, layout, mode, device, graph), cases)
        command = [sys.executable, str(CHILD), str(package), str(cases), str(device)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"its check did not finish in {CHECK_TIMEOUT_S:.0f} s"
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        return f"its check process was killed by {signal.Signals(-done.returncode).name}"
    said = (done.stdout.strip() or done.stderr.strip() or "no output").splitlines()[-1]
    return f"its check failed (exit {done.returncode}): {said}"


def graph_inputs(
    game: TensorGame[Any], layout: Layout, mode: AutoresetMode, key: torch.Tensor
) -> list[torch.Tensor]:
    """The step graph's inputs (`NAMES`) for games freshly reset from `key`, on its device:
    the packed rows with the pending row, the keys, and the counters (rows and counters are
    what a step rewrites in place)."""
    n, device = key.shape[0], key.device
    counter = torch.zeros(n, dtype=torch.int64, device=device)
    flags = torch.zeros(n, dtype=torch.bool, device=device)
    empty = Running(layout.zeros(n, device), flags)
    running, _ = EagerStepper(game, layout, mode).reset(empty, key, counter, ~flags)
    rows = torch.cat([layout.pack(running.game), running.pending.to(torch.int32)[None]])
    return [rows, key, counter]


def _cases(
    game: TensorGame[Any],
    layout: Layout,
    mode: AutoresetMode,
    device: torch.device,
    graph: torch.nn.Module,
) -> dict[str, Any]:
    """A reset batch, random actions, and every output of the eager graph (the function the
    package was exported from) step by step, with the state and counters after each."""
    n = CHECK_ENVS
    gen = torch.Generator().manual_seed(0)
    key = torch.randint(0, 2**62, (n,), generator=gen).to(device)
    rows, key, counter = graph_inputs(game, layout, mode, key)
    start = zip(NAMES, (rows, key, counter), strict=True)
    cases: dict[str, Any] = {name: t.cpu().clone() for name, t in start}
    actions = torch.randint(0, game.num_actions, (CHECK_STEPS, n), generator=gen)
    cases["actions"], cases["outputs"] = actions, []
    with torch.no_grad():
        for action in actions:
            out = graph(rows, key, counter, action.to(device))  # rows and counter in place
            cases["outputs"].append([t.cpu().clone() for t in (*out, rows, counter)])
    return cases
