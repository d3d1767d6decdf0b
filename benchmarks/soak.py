"""Soak test: do memory and speed stay flat over a long run?

Two phases, each sampled often enough to fit a line through:

1. **env**: `--env-steps` (default 10 million) random-action steps of FruitCatcher-v0 in chunks;
   per chunk, resident memory (CPU) or allocated/reserved memory (CUDA) and steps/s.
2. **train**: `--updates` (default 500) GRPO updates through `GRPOTrainer.train()` with
   periodic checkpoints and the metrics writer running, so that every path a long run takes
   (rollout, update, checkpoint rotation, JSONL) is in the loop; per update, the trainer's own
   memory figures and steps/s from `metrics.jsonl`.

A leak shows as a positive slope of memory against progress. The first 10% of each phase is
warm-up (allocator pools, lazy imports, autotuning) and is left out of slopes and ratios.

    python benchmarks/soak.py                                   # the full soak, minutes
    python benchmarks/soak.py --env-steps 200000 --updates 20   # a quick check

The JSON (machine, versions, command, every sample, summary) goes to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.envs import make_envs

RESULTS = Path(__file__).resolve().parent / "results"
WARMUP = 0.1  # fraction of each phase excluded from slopes and ratios


def rss_mib() -> float:
    """Resident set size now (not the peak), from /proc; NaN where that is unavailable."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return float("nan")


def memory(device: torch.device) -> dict[str, float]:
    out = {"rss_mib": rss_mib()}
    if device.type == "cuda":
        out["cuda_allocated_mib"] = torch.cuda.memory_allocated(device) / 2**20
        out["cuda_reserved_mib"] = torch.cuda.memory_reserved(device) / 2**20
    return out


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs (0 for fewer than two points)."""
    if len(xs) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def summarise(samples: list[dict[str, float]], progress_key: str, per: float) -> dict[str, Any]:
    """Per memory series: first/last/max after warm-up and the slope per `per` progress units;
    steps/s: median of the first and last quarter after warm-up, and their ratio."""
    kept = samples[int(len(samples) * WARMUP) :] or samples
    xs = [s[progress_key] for s in kept]
    out: dict[str, Any] = {"samples": len(samples), "kept_after_warmup": len(kept)}
    for key in [k for k in kept[0] if k.endswith("_mib")]:
        ys = [s[key] for s in kept]
        out[key] = {
            "first": ys[0],
            "last": ys[-1],
            "max": max(ys),
            "growth": ys[-1] - ys[0],
            f"slope_per_{per:g}": slope(xs, ys) * per,
        }
    for key in ("steps_per_s", "steps_per_cpu_s"):
        speeds = [s[key] for s in kept]
        quarter = max(len(speeds) // 4, 1)
        first, last = statistics.median(speeds[:quarter]), statistics.median(speeds[-quarter:])
        out[key] = {
            "first_quarter_median": first,
            "last_quarter_median": last,
            "last_over_first": last / first if first else float("nan"),
            "min": min(speeds),
            "max": max(speeds),
        }
    return out


def env_phase(total_steps: int, num_envs: int, device: torch.device, chunks: int) -> dict:
    """Random actions for `total_steps` env steps; one sample per chunk."""
    envs = gym.make_vec("FruitCatcher-v0", num_envs=num_envs, device=str(device))
    envs.reset(seed=0)
    generator = torch.Generator(device=device).manual_seed(0)
    steps_per_chunk = max(total_steps // (num_envs * chunks), 1)
    samples = []
    done = 0
    for _ in range(chunks):
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(steps_per_chunk):
            action = torch.randint(0, 3, (num_envs,), generator=generator, device=device)
            envs.step(action)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        steps = steps_per_chunk * num_envs
        done += steps
        samples.append(
            {"env_steps": done, "steps_per_s": steps / elapsed, "steps_per_cpu_s": steps / cpu}
            | memory(device)
        )
    envs.close()
    return {
        "num_envs": num_envs,
        "env_steps": done,
        "summary": summarise(samples, "env_steps", 1e6),
        "samples": samples,
    }


def train_phase(updates: int, device: torch.device, args: argparse.Namespace) -> dict:
    """`updates` GRPO updates via `train()`, with checkpoints; samples from metrics.jsonl."""
    with tempfile.TemporaryDirectory(prefix="grpo-soak-") as run_dir:
        config = GRPOConfig(
            num_groups=args.num_groups,
            group_size=args.group_size,
            rollout_steps=args.rollout_steps,
            # Every update simulates num_envs * rollout_steps steps (episodes continue across
            # updates), so this budget is exactly `updates` updates.
            total_env_steps=updates * args.num_groups * args.group_size * args.rollout_steps,
            epochs=1,
            run=RunConfig(
                device=str(device),
                run_dir=run_dir,
                checkpoint_every=args.checkpoint_every,
                keep_checkpoints=3,
                progress=False,
            ),
        )
        envs = make_envs(config, config.num_envs, device)
        trainer = GRPOTrainer(envs, config)
        cpu_times: list[float] = []  # per update: CPU seconds, which other tenants barely move
        step = trainer.step  # what train() calls once per update

        def timed_step(*args: Any, **kwargs: Any) -> Any:
            cpu_start = time.process_time()
            result = step(*args, **kwargs)
            cpu_times.append(time.process_time() - cpu_start)
            return result

        trainer.step = timed_step  # type: ignore[method-assign]
        start = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - start
        rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").open()]
        checkpoints = sorted(p.name for p in (Path(run_dir) / "checkpoints").iterdir())
    envs.close()
    samples = []
    for row, cpu in zip(rows, cpu_times, strict=True):
        sample = {
            "update": row["update"],
            "steps_per_s": row["steps_per_s"],
            "steps_per_cpu_s": config.num_envs * config.rollout_steps / cpu,
        }
        for ours, theirs in (
            ("rss_mib", "mem_rss_mib"),
            ("cuda_allocated_mib", "mem_allocated_mib"),
            ("cuda_reserved_mib", "mem_reserved_mib"),
        ):
            if theirs in row:
                sample[ours] = row[theirs]
        samples.append(sample)
    return {
        "updates": len(rows),
        "env_steps": int(rows[-1]["env_steps"]) if rows else 0,
        "wall_s": wall,
        "checkpoints_at_end": checkpoints,
        "skipped_steps": sum(r["skipped_steps"] for r in rows),
        "summary": summarise(samples, "update", 100),
        "samples": samples,
    }


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info  # noqa: E402


def machine(device: torch.device) -> dict[str, Any]:
    info = {
        **machine_info(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-steps", type=int, default=10_000_000)
    parser.add_argument("--updates", type=int, default=500)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--num-envs", type=int, default=1024, help="env phase batch")
    parser.add_argument("--chunks", type=int, default=100, help="env phase samples")
    parser.add_argument("--num-groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--rollout-steps", type=int, default=32, help="steps per update")
    parser.add_argument("--checkpoint-every", type=int, default=25)
    parser.add_argument("--out", type=Path, default=None, help="default: results/soak-DEVICE.json")
    args = parser.parse_args(argv)
    for name in (
        "env_steps",
        "updates",
        "num_envs",
        "chunks",
        "num_groups",
        "rollout_steps",
        "checkpoint_every",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.group_size < 2:
        parser.error("--group-size must be at least 2")
    device = torch.device(args.device)

    result: dict[str, Any] = {
        "benchmark": "soak",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(device),
        "warmup_fraction_excluded": WARMUP,
    }
    print(f"env phase: {args.env_steps:,} steps on {device} ...", flush=True)
    result["env"] = env_phase(args.env_steps, args.num_envs, device, args.chunks)
    print(f"train phase: {args.updates} updates ...", flush=True)
    result["train"] = train_phase(args.updates, device, args)

    if hasattr(os, "getloadavg"):  # other tenants' load explains wall-clock noise
        result["machine"]["load_average_at_end"] = os.getloadavg()
    out = args.out or RESULTS / f"soak-{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print_table(result)
    print(f"wrote {out}")
    return 0


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{'phase':<6} {'series':<20} {'first':>10} {'last':>10} {'max':>10} {'slope':>16}")
    for phase, unit in (("env", "/1M steps"), ("train", "/100 updates")):
        summary = result[phase]["summary"]
        for key, v in summary.items():
            if key.endswith("_mib"):
                slope_value = next(x for k, x in v.items() if k.startswith("slope"))
                print(
                    f"{phase:<6} {key:<20} {v['first']:>10.1f} {v['last']:>10.1f} "
                    f"{v['max']:>10.1f} {slope_value:>+10.2f}{unit}"
                )
        for key, label in (("steps_per_s", "steps/s"), ("steps_per_cpu_s", "steps/CPU-s")):
            s = summary[key]
            print(
                f"{phase:<6} {label + ' (median)':<20} {s['first_quarter_median']:>10,.0f} "
                f"{s['last_quarter_median']:>10,.0f} {s['max']:>10,.0f} "
                f"{'last/first ' + format(s['last_over_first'], '.2f'):>16}"
            )


if __name__ == "__main__":
    sys.exit(main())
