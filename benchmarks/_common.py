"""Helpers shared by the benchmark scripts: what machine ran them, how to time, where results go.

    from _common import machine_info, median_time, write_result

    timing = median_time(lambda: env.step(actions), repeats=7, warmup=2)
    write_result("env_throughput", {"machine": machine_info(), "seconds": timing.wall})

The scripts put `benchmarks/` on `sys.path` by being run from it (`python benchmarks/x.py`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

RESULTS = Path(__file__).resolve().parent / "results"
# The kit's MinAtar games by the suite's task names (registered by `import fruit_env`).
MINATAR_GAMES = {
    "breakout": "Breakout-MinAtar-v0",
    "space_invaders": "SpaceInvaders-MinAtar-v0",
    "freeway": "Freeway-MinAtar-v0",
    "asterix": "Asterix-MinAtar-v0",
}


def machine_info() -> dict[str, Any]:
    """What a figure depends on: CPU, cores, GPU, library versions, threads, current load."""
    import gymnasium
    import numpy
    import torch

    info: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "gpu": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] or None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gymnasium": gymnasium.__version__,
        "numpy": numpy.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class Timing(NamedTuple):
    """Seconds per call of each timed repeat: wall clock, and this process's CPU time (which a
    busy shared machine inflates less)."""

    wall: list[float]
    cpu: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)


def median_time(
    fn: Callable[[], object],
    *,
    repeats: int = 5,
    warmup: int = 1,
    number: int = 1,
    sync: Callable[[], object] | None = None,
) -> Timing:
    """Time `fn`: `warmup` untimed calls, then `repeats` blocks of `number` calls each.

    `sync` (e.g. `torch.cuda.synchronize`) runs before each clock read, so queued device work
    is counted in the block that queued it.
    """
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        if sync is not None:
            sync()
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(number):
            fn()
        if sync is not None:
            sync()
        wall.append((time.perf_counter() - w0) / number)
        cpu.append((time.process_time() - c0) / number)
    return Timing(wall, cpu)


def train_command_trainer(
    env_id: str, budget: int, run_dir: str, flags: list[str] | tuple[str, ...] = ()
) -> Any:
    """The trainer `python -m grpo_trainer train` builds for the fruit_env game `env_id` on
    the CPU at a budget of `budget` env steps (no progress bar, no periodic evaluation), with
    `flags` added, its run directory `run_dir`: what the benchmarks that time or probe the
    train command's own run step through."""
    from grpo_trainer.run.trainer import open_run
    from grpo_trainer.tools.cli import build_parser, config_from_args

    argv = ["train", "--env", f"fruit_env:{env_id}", "--total-env-steps", str(budget)]
    argv += ["--device", "cpu", "--no-progress", "--eval-every", "0", *flags]
    return open_run(config_from_args(build_parser().parse_args([*argv, "--run-dir", run_dir])))


def per_game_parser(doc: str, name: str, budget: int, updates: int) -> argparse.ArgumentParser:
    """The arguments of a benchmark that times the train command's trainer per MinAtar game:
    which games, the run's budget, how many timed updates, and where the JSON goes."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    games = list(MINATAR_GAMES)
    parser.add_argument("--games", nargs="+", choices=games, default=games)
    parser.add_argument("--budget", type=int, default=budget, help="the run's env steps")
    parser.add_argument("--updates", type=int, default=updates, help="timed updates per game")
    parser.add_argument("--name", default=name, help="results file stem")
    parser.add_argument("--results", type=Path, help="folder of the JSON (benchmarks/results)")
    return parser


def run_per_game(
    args: argparse.Namespace,
    measure: Callable[[str], dict[str, Any]],
    summary: Callable[[dict[str, Any]], str],
) -> int:
    """Measure each of `args.games` on one torch thread (`measure` takes the registered env
    id), print a line of `summary` per game as it ends, and write the rows with the machine."""
    import torch

    import fruit_env  # noqa: F401  (registers the games)

    torch.set_num_threads(1)
    rows = []
    for game in args.games:
        row = measure(MINATAR_GAMES[game])
        print(f"{game}: {summary(row)}", flush=True)
        rows.append({"game": game, **row})
    write_result(args.name, {"machine": machine_info(), "rows": rows}, args.results)
    return 0


def command_line() -> str:
    """The command that ran this script, as one could type it again."""
    return shlex.join([Path(sys.executable).name, *sys.argv])


def write_result(name: str, payload: dict[str, Any], folder: Path | None = None) -> Path:
    """Write `payload` to `benchmarks/results/<name>.json` (or `folder/<name>.json`), adding
    `command` and `timestamp` unless present, and return the path."""
    payload = {
        "command": command_line(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **payload,
    }
    path = (folder or RESULTS) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path
