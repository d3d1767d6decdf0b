"""The first hour on a GPU: every check that needs CUDA, in one command (`make gpu-check`).

    python scripts/gpu_check.py            # all steps, about 20 minutes on an H100
    python scripts/gpu_check.py --only memory profile

Steps, each in its own process with a time limit (progress is printed as they go):

1. `tests`: the tests that need CUDA (they skip elsewhere), and the trainer's sync-count
   tests run with the env on the GPU;
2. `env`: FruitCatcher's env benchmark on the GPU up to 4M envs, eager and compiled, with
   the memory-bandwidth roofline (benchmarks/env_throughput.py);
3. `train`: training throughput of the default config and of the largest batch that fits,
   and of the default config with bf16 autocast;
4. `memory`: peak GPU memory of the default run and of a run at 1M envs;
5. `profile`: a profiler summary of one default update, with the number of device-to-host
   copies it makes (docs/architecture.md allows one: the metrics).

It writes benchmarks/results/gpu_check.json and a markdown table, gpu_check.md, ready for
docs/performance.md. On a machine without CUDA it refuses with one line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STEP_LIMIT_S = 600  # each step; the whole check stays under 30 minutes
STEPS = ("tests", "env", "train", "memory", "profile")


def _run(command: list[str], timeout: float = STEP_LIMIT_S) -> dict[str, Any]:
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        code, out = done.returncode, done.stdout[-4000:] + done.stderr[-4000:]
    except subprocess.TimeoutExpired as err:
        code, out = -1, f"timed out after {timeout:.0f} s: {str(err.stdout)[-2000:]}"
    return {
        "command": " ".join(command),
        "returncode": code,
        "seconds": time.perf_counter() - start,
        "tail": out,
    }


def _worker(step: str) -> dict[str, Any]:
    """Steps that run inside this script, in a child process (`--worker STEP`)."""
    import torch

    import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
    from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
    from grpo_trainer.envs import make_envs

    device = torch.device("cuda")

    def trainer(num_groups: int, amp: str = "off", **fields: Any) -> GRPOTrainer:
        config = GRPOConfig(
            num_groups=num_groups, **fields, run=RunConfig(progress=False, device="cuda", amp=amp)
        )
        return GRPOTrainer(make_envs(config, config.num_envs, device), config)

    if step == "train":
        rows = []
        for groups in (128, 2048, 16384, 131072):  # 1k to 1M envs
            try:
                t = trainer(groups)
                t.update()
                rates = [t.update()["steps_per_s"] for _ in range(3)]
                rows.append({"num_envs": groups * 8, "steps_per_s": sorted(rates)[1]})
            except torch.OutOfMemoryError:
                rows.append({"num_envs": groups * 8, "steps_per_s": None, "error": "out of memory"})
                break
            finally:
                torch.cuda.empty_cache()
        amp = {}
        for mode in ("off", "bf16"):  # whether bf16 pays on this GPU (it did not on the CPU)
            t = trainer(128, amp=mode)
            t.update()
            amp[mode] = sorted(t.update()["steps_per_s"] for _ in range(3))[1]
        return {"rows": rows, "default_config_amp": amp}
    if step == "memory":
        out = {}
        for name, groups in (("default", 128), ("1M envs", 131072)):
            torch.cuda.reset_peak_memory_stats(device)
            t = trainer(groups)
            for _ in range(2):
                t.update()
            out[name] = {
                "num_envs": groups * 8,
                "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20,
            }
            del t
            torch.cuda.empty_cache()
        return out
    if step == "profile":
        from torch.profiler import ProfilerActivity, profile

        t = trainer(128)
        for _ in range(2):
            t.update()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t.update()
        events = prof.key_averages()
        copies = sum(e.count for e in events if "Memcpy DtoH" in e.key)
        table = events.table(sort_by="cuda_time_total", row_limit=20)
        return {"device_to_host_copies_per_update": copies, "top_kernels": table}
    raise ValueError(f"unknown worker step {step!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=STEPS, default=list(STEPS))
    parser.add_argument("--worker", choices=["train", "memory", "profile"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu-check needs a CUDA GPU; this machine has none (torch.cuda.is_available() is False)"
        )
        return 2
    if args.worker:
        print(json.dumps(_worker(args.worker)))
        return 0

    python = sys.executable
    commands = {
        "tests": [python, "-m", "pytest", "-q", "-rs", "-k", "cuda", "tests/"],
        "env": [
            python,
            "benchmarks/env_throughput.py",
            "--device",
            "cuda",
            "--sizes",
            "16384",
            "262144",
            "1048576",
            "4194304",
            "--output",
            "env_throughput_cuda",
        ],
        "train": [python, __file__, "--worker", "train"],
        "memory": [python, __file__, "--worker", "memory"],
        "profile": [python, __file__, "--worker", "profile"],
    }
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for i, step in enumerate(args.only, 1):
        print(f"[{i}/{len(args.only)}] {step}: {' '.join(commands[step][1:])}", flush=True)
        result = _run(commands[step])
        if step in ("train", "memory", "profile") and result["returncode"] == 0:
            result["result"] = json.loads(result["tail"].strip().splitlines()[-1])
        report[step] = result
        print(f"    done in {result['seconds']:.0f} s, exit {result['returncode']}", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        f"GPU check on {report['device']} (torch {report['torch']})",
        "",
        "| step | exit | seconds | result |",
        "|---|---|---|---|",
    ]
    for step in args.only:
        r = report[step]
        summary = (
            json.dumps(r.get("result", ""))[:200]
            if "result" in r
            else r["tail"].strip().splitlines()[-1:] or ""
        )
        lines.append(f"| {step} | {r['returncode']} | {r['seconds']:.0f} | {summary} |")
    (RESULTS / "gpu_check.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / 'gpu_check.json'} and gpu_check.md")
    return 0 if all(report[s]["returncode"] == 0 for s in args.only) else 1


if __name__ == "__main__":
    sys.exit(main())
