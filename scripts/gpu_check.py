"""The first hour on a GPU: every check that needs CUDA, in one command (`make gpu-check`).

    python scripts/gpu_check.py            # all steps, within 30 minutes
    python scripts/gpu_check.py --only memory profile

Steps, each in its own process with a time limit, progress printed as they go:

1. `tests`: the tests that need CUDA (they skip elsewhere);
2. `env`: FruitCatcher's env benchmark on the GPU up to 4M envs, eager and compiled, against
   the naive reference, with the memory-bandwidth roofline (benchmarks/env_throughput.py);
3. `train`: training throughput of the default config at 1k to 1M envs, up to the largest
   batch that fits in memory and time, and of the default config with bf16 autocast;
4. `memory`: peak GPU memory of the default run and of a run at 1M envs;
5. `profile`: the host-sync ops of one default update on CUDA, counted by
   `grpo_trainer.tools.syncs.SyncCounter` around `collect()` and `learn()` (0 and 0 on the CPU), the
   device-to-host copies the profiler sees (docs/architecture.md allows one: the metrics),
   and the top kernels.

Each step's result goes to benchmarks/results/gpu_check.json and a markdown table,
gpu_check.md, ready for docs/performance.md; both are rewritten after every step, so a step
that fails or runs out of time loses nothing measured before it. The steps share a
30-minute budget (a step gets at most 10 minutes and what is left); a step with less than a
minute left is skipped and says so. On a machine without CUDA the script refuses in one line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STEP_LIMIT_S = 600  # a step's time limit
TOTAL_LIMIT_S = 1800  # the whole check's
MIN_STEP_S = 60  # a step with less time left than this is skipped
TRAIN_SIZE_S = 120  # the train step moves to the next size only while it has this much left
STEPS = ("tests", "env", "train", "memory", "profile")
WORKER_STEPS = ("train", "memory", "profile")


def run_step(command: list[str], result_file: Path | None, timeout: float) -> dict[str, Any]:
    """Run one step's command; its result is the JSON it wrote to `result_file` (whatever
    it printed on the way), its output's tail is kept for the record."""
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        code, out = done.returncode, done.stdout[-3000:] + done.stderr[-3000:]
    except subprocess.TimeoutExpired as err:
        code, out = -1, f"timed out after {timeout:.0f} s: {str(err.stdout)[-2000:]}"
    record: dict[str, Any] = {
        "command": " ".join(command),
        "returncode": code,
        "seconds": round(time.perf_counter() - start, 1),
        "tail": out,
    }
    if result_file is not None and result_file.exists():
        record["result"] = json.loads(result_file.read_text())
    return record


def run_steps(
    commands: dict[str, tuple[list[str], Path | None]],
    report: dict[str, Any],
    results: Path,
    total_limit_s: float = TOTAL_LIMIT_S,
) -> dict[str, Any]:
    """Run the steps in order within `total_limit_s`, writing the report after each one."""
    deadline = time.monotonic() + total_limit_s
    for i, (step, (command, result_file)) in enumerate(commands.items(), 1):
        left = deadline - time.monotonic()
        if left < MIN_STEP_S:
            report[step] = {"skipped": f"{left:.0f} s left of the {total_limit_s:.0f} s budget"}
            print(f"[{i}/{len(commands)}] {step}: skipped, out of time", flush=True)
        else:
            print(f"[{i}/{len(commands)}] {step}: {' '.join(command[1:])}", flush=True)
            report[step] = run_step(command, result_file, min(STEP_LIMIT_S, left))
            r = report[step]
            print(f"    done in {r['seconds']:.0f} s, exit {r['returncode']}", flush=True)
        write_report(report, list(commands)[:i], results)
    return report


def write_report(report: dict[str, Any], steps: list[str], results: Path) -> None:
    """gpu_check.json (everything) and gpu_check.md (a line per step) in `results`."""
    results.mkdir(parents=True, exist_ok=True)
    (results / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        f"GPU check on {report.get('device')} (torch {report.get('torch')})",
        "",
        "| step | exit | seconds | result |",
        "|---|---|---|---|",
    ]
    for step in steps:
        r = report[step]
        if "skipped" in r:
            lines.append(f"| {step} | - | - | skipped: {r['skipped']} |")
            continue
        if "result" in r:
            summary = json.dumps({k: v for k, v in r["result"].items() if k != "top_kernels"})
        else:
            summary = (r["tail"].strip().splitlines() or [""])[-1]
        summary = summary.replace("|", "/")[:300]
        lines.append(f"| {step} | {r['returncode']} | {r['seconds']:.0f} | {summary} |")
    (results / "gpu_check.md").write_text("\n".join(lines) + "\n")


def _worker(step: str, out: Path) -> None:
    """Steps that run inside this script, in a child process (`--worker STEP`). The result
    is rewritten to `out` as it grows, so a step stopped at its time limit keeps its rows."""
    import torch

    import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
    from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
    from grpo_trainer.envs import make_envs

    torch.set_float32_matmul_precision("high")  # as the command line sets it
    device = torch.device("cuda")
    started = time.monotonic()

    def trainer(num_groups: int, amp: str = "off") -> GRPOTrainer:
        run = RunConfig(progress=False, device="cuda", amp=amp)
        config = GRPOConfig(num_groups=num_groups, run=run)
        return GRPOTrainer(make_envs(config, config.num_envs, device), config)

    def rate(t: GRPOTrainer, updates: int = 3) -> float:
        t.update()  # compilation and allocator warm-up
        return sorted(t.update()["steps_per_s"] for _ in range(updates))[updates // 2]

    result: dict[str, Any] = {}

    def save() -> None:
        out.write_text(json.dumps(result))

    if step == "train":
        result["default_config_amp"] = {}
        for mode in ("off", "bf16"):  # whether bf16 pays on this GPU (it did not on the CPU)
            result["default_config_amp"][mode] = rate(trainer(128, amp=mode))
            save()
        result["rows"] = []
        for groups in (128, 2048, 16384, 131072):  # 1k to 1M envs
            if time.monotonic() - started > STEP_LIMIT_S - TRAIN_SIZE_S:
                result["rows"].append({"num_envs": groups * 8, "skipped": "out of time"})
                break
            try:
                row = {"num_envs": groups * 8, "steps_per_s": rate(trainer(groups), 1)}
            except torch.OutOfMemoryError:
                row = {"num_envs": groups * 8, "error": "out of memory"}
            finally:
                torch.cuda.empty_cache()
            result["rows"].append(row)
            save()
            if "error" in row:
                break
        return
    if step == "memory":
        for name, groups in (("default", 128), ("1M envs", 131072)):
            torch.cuda.reset_peak_memory_stats(device)
            t = trainer(groups)
            t.update()
            result[name] = {
                "num_envs": groups * 8,
                "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20,
            }
            save()
            del t
            torch.cuda.empty_cache()
        return
    if step == "profile":
        from torch.profiler import ProfilerActivity, profile

        from grpo_trainer.tools.syncs import SyncCounter

        t = trainer(128)
        for _ in range(2):
            t.update()
        with SyncCounter() as collect_syncs:
            rollout = t.collect()
        with SyncCounter() as learn_syncs:
            t.learn(rollout)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t.update()
        events = prof.key_averages()
        result["sync_ops_collect"] = collect_syncs.count
        result["sync_ops_learn"] = learn_syncs.count
        result["device_to_host_copies_per_update"] = sum(
            e.count for e in events if "Memcpy DtoH" in e.key
        )
        result["top_kernels"] = events.table(sort_by="cuda_time_total", row_limit=20)
        save()
        return
    raise ValueError(f"unknown worker step {step!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=STEPS, default=list(STEPS))
    parser.add_argument("--worker", choices=WORKER_STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu-check needs a CUDA GPU; this machine has none (torch.cuda.is_available() is False)"
        )
        return 2
    if args.worker:
        _worker(args.worker, args.out)
        return 0

    python = sys.executable
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    env_bench = [python, "benchmarks/env_throughput.py", "--device", "cuda"]
    env_bench += ["--sizes", "16384", "262144", "1048576", "4194304"]
    env_bench += ["--pixel-sizes", "16384", "262144", "--sync-sizes"]
    env_bench += ["--output", "env_throughput_cuda"]
    everything: dict[str, tuple[list[str], Path | None]] = {
        "tests": ([python, "-m", "pytest", "-q", "-rs", "-k", "cuda", "tests/"], None),
        "env": (env_bench, None),
        **{
            step: (
                [python, __file__, "--worker", step, "--out", str(scratch / f"{step}.json")],
                scratch / f"{step}.json",
            )
            for step in WORKER_STEPS
        },
    }
    commands = {step: everything[step] for step in args.only}
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    report = run_steps(commands, report, RESULTS)
    print(f"wrote {RESULTS / 'gpu_check.json'} and gpu_check.md")
    return 0 if all(report[s].get("returncode") == 0 for s in commands) else 1


if __name__ == "__main__":
    sys.exit(main())
