"""Why a compiled (AOTInductor) game step dies on CUDA: one package, played by child processes
that each differ from the kit's own check (`fruit_env/kit/package_check.py`) in one thing,
with Python's fault handler on, which prints the Python line where a SIGSEGV struck.

    python scripts/aoti_cuda_probe.py --out DIR      # about 3 minutes on an H100, cold

Variants: the check as the kit runs it; loading only; `device_index=0` instead of -1;
`loader.run` instead of `loader.boxed_run`; a CUDA context made before loading; the check
under compute-sanitizer (memcheck); and a minimal module (two inputs written in place, a
dynamic batch, no game) built and played the same way, to tell a game's fault from the
loader's. The findings are in docs/performance.md ("On a GPU").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHILD = ROOT / "fruit_env" / "kit" / "package_check.py"

# The kit's check with one change each, as source edits of package_check.py.
VARIANTS: dict[str, tuple[str, str] | None] = {
    "as_the_kit_runs_it": None,
    "load_only": ("rows, key, counter = (", "return 0\n    rows, key, counter = ("),
    "device_index_0": (
        'index = device.index if device.type == "cuda" and device.index is not None else -1',
        "index = 0",
    ),
    "run_not_boxed_run": ("loader.boxed_run(", "loader.run("),
    "cuda_context_first": (
        "    loader = aoti_load_package(",
        "    torch.zeros(1, device=device).sum().item()\n    loader = aoti_load_package(",
    ),
}

TINY = """
import sys, torch
from torch._inductor import aoti_compile_and_package, aoti_load_package

class M(torch.nn.Module):
    def forward(self, rows, counter, action):
        rows.add_(action.to(torch.int32)[None])
        counter.add_(1)
        return rows.sum(0), (counter * 3).to(torch.int32)

n, d = 64, torch.device("cuda")
ex = (torch.zeros(5, n, dtype=torch.int32, device=d), torch.zeros(n, dtype=torch.int64, device=d),
      torch.ones(n, dtype=torch.int64, device=d))
dim = torch.export.Dim("n", min=1)
ep = torch.export.export(M(), ex, dynamic_shapes=({1: dim}, {0: dim}, {0: dim}), strict=False)
path = aoti_compile_and_package(ep, package_path=sys.argv[1] + "/tiny.pt2")
print("built", flush=True)
loader = aoti_load_package(path, device_index=-1).loader
rows = torch.zeros(5, 37, dtype=torch.int32, device=d)
counter = torch.zeros(37, dtype=torch.int64, device=d)
for _ in range(8):
    out = loader.boxed_run([rows, counter, torch.ones(37, dtype=torch.int64, device=d)])
torch.cuda.synchronize()
print("played", int(counter[0]), int(rows[0, 0]), flush=True)
"""


def start(command: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def finish(proc: subprocess.Popen[str], started: float, deadline: float) -> dict[str, Any]:
    """The child's exit status (a signal as minus its number) and the end of its output."""
    try:
        out, err = proc.communicate(timeout=max(1.0, deadline - time.perf_counter()))
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        code = None
    return {
        "returncode": code,
        "seconds": round(time.perf_counter() - started, 1),
        "out": out[-1500:] + "\n--stderr--\n" + err[-3000:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--env", default="FruitCatcher-v0")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="aoti-probe-"))
    os.environ["FRUIT_ENV_CACHE_DIR"] = str(scratch / "cache")
    report: dict[str, Any] = {}

    def save() -> None:
        (args.out / "aoti_probe.json").write_text(json.dumps(report, indent=1) + "\n")

    tiny = scratch / "tiny.py"
    tiny.write_text(TINY)
    tiny_started = time.perf_counter()
    tiny_proc = start([sys.executable, str(tiny), str(scratch)])  # builds beside the game's

    import gymnasium as gym
    import torch

    import fruit_env  # noqa: F401
    from fruit_env.kit import compiled, proof, step_graph

    report["torch"], report["device"] = torch.__version__, torch.cuda.get_device_name(0)
    env = gym.make_vec(args.env, num_envs=64, device="cuda", compile=False).unwrapped
    game, layout, mode, device = env.game, env.layout, env.autoreset_mode, torch.device("cuda")
    started = time.perf_counter()
    package = compiled.built(game, layout, mode, device)
    report["build_s"] = round(time.perf_counter() - started, 1)
    cases = scratch / "cases.pt"
    torch.save(
        proof._cases(game, layout, mode, device, step_graph.StepGraph(game, layout, mode)), cases
    )
    save()

    source = CHILD.read_text()
    checks: dict[str, list[str]] = {}
    for name, edit in VARIANTS.items():  # side by side: each took 45-50 s to fault on an H100
        child = scratch / f"{name}.py"
        if edit is not None:
            assert source.count(edit[0]) == 1, edit[0]
        child.write_text(source if edit is None else source.replace(edit[0], edit[1]))
        checks[name] = [sys.executable, str(child), str(package), str(cases), "cuda"]
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer:
        memcheck = [sanitizer, "--tool", "memcheck", "--print-limit", "5", sys.executable]
        checks["memcheck"] = [*memcheck, str(CHILD), str(package), str(cases), "cuda"]
    started = time.perf_counter()
    running = {name: start(command) for name, command in checks.items()}
    report["minimal_module"] = finish(tiny_proc, tiny_started, tiny_started + 240)
    save()
    for name, proc in running.items():
        report[name] = finish(proc, started, started + 150)
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
