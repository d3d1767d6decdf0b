"""Data-parallel scaling of GRPO training: env-steps/s with 1 rank vs K ranks on the CPU.

Every rank keeps the same per-rank batch (num_groups x group_size sub-envs), so K ranks do
K times the work per update; efficiency = throughput_K / (K * throughput_1). Each rank gets
`--threads` torch threads (default 1), so K ranks need K free cores: on a machine with fewer
cores than ranks, or cores shared with other work, the K-rank figure is bounded by the cores,
not by the trainer.

    python benchmarks/scaling.py                    # 1 vs 2 ranks, FruitCatcher-v0 on CPU

The driver starts `torchrun --standalone --nproc-per-node=K`, alternating 1 and K ranks for
`--rounds` rounds so that a change in the machine's load hits both alike. Every launch runs
`--warmup` updates (excluded), then `--repeats` timed blocks of `--updates` updates. A block
starts and ends with a barrier; its throughput is the valid env steps of all ranks over the
block's wall time, so the metrics gather and gradient all-reduces are included. The table
shows the median block and rank 0's CPU time per env step, which does not depend on free
cores: equal for 1 and K ranks means the K-rank run adds no work, only waits for cores. The
JSON (machine, versions, command, every block, the load average around each launch) goes to
benchmarks/results/scaling.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, write_result  # noqa: E402

# -- one rank (run by torchrun) ----------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    """Time blocks of updates; rank 0 writes the samples to `args.worker`."""
    import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
    from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
    from grpo_trainer.base import distributed
    from grpo_trainer.envs import make_envs

    torch.set_num_threads(args.threads)
    device = distributed.init_from_env(torch.device("cpu"))
    config = GRPOConfig(
        num_groups=args.num_groups,
        group_size=args.group_size,
        run=RunConfig(env="FruitCatcher-v0", device="cpu", seed=args.seed, progress=False),
    )
    trainer = GRPOTrainer(make_envs(config, config.num_envs, device), config)
    for _ in range(args.warmup):
        trainer.update()
    blocks = []
    for _ in range(args.repeats):
        distributed.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        simulated_before = trainer.env_steps
        rows = [trainer.update() for _ in range(args.updates)]
        distributed.barrier()
        seconds = time.perf_counter() - start
        blocks.append(
            {
                "seconds": seconds,
                "rank0_cpu_seconds": time.process_time() - cpu_start,
                "env_steps": sum(r["valid_steps"] for r in rows),
                "simulated_steps": trainer.env_steps - simulated_before,
            }
        )
    if distributed.is_main():
        samples = {"world_size": trainer.collective.world_size, "blocks": blocks}
        Path(args.worker).write_text(json.dumps(samples))
    distributed.shutdown()


# -- the driver ----------------------------------------------------------------------------------


def launch(ranks: int, args: argparse.Namespace, argv: list[str]) -> list[dict[str, Any]]:
    """One torchrun launch; its timed blocks, each tagged with the load around the launch."""
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "samples.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += [f"--nproc-per-node={ranks}", __file__, *argv, "--worker", str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        subprocess.run(command, check=True, env=env, cwd=ROOT)
        samples = json.loads(out.read_text())
    assert samples["world_size"] == ranks, samples["world_size"]
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    for block in samples["blocks"]:
        block["env_steps_per_s"] = block["env_steps"] / block["seconds"]
        block["simulated_steps_per_s"] = block["simulated_steps"] / block["seconds"]
        block["load_average_1m"] = [load_before, load_after]
        # CPU time per env step on rank 0 (its share of the steps): the work a step costs,
        # whether or not a core was free; equal for 1 and K ranks means no parallel overhead.
        block["rank0_cpu_us_per_step"] = (
            1e6 * block["rank0_cpu_seconds"] * ranks / block["env_steps"]
        )
    return samples["blocks"]


def summarise(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [b["env_steps_per_s"] for b in blocks]
    return {
        "median_env_steps_per_s": statistics.median(rates),
        "min_env_steps_per_s": min(rates),
        "max_env_steps_per_s": max(rates),
        "median_simulated_steps_per_s": statistics.median(
            b["simulated_steps_per_s"] for b in blocks
        ),
        "median_rank0_cpu_us_per_step": statistics.median(
            b["rank0_cpu_us_per_step"] for b in blocks
        ),
        "blocks": blocks,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="compare 1 rank with this many")
    parser.add_argument("--num-groups", type=int, default=32, help="per rank")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--warmup", type=int, default=1, help="updates excluded from timing")
    parser.add_argument("--updates", type=int, default=3, help="updates per timed block")
    parser.add_argument("--repeats", type=int, default=3, help="timed blocks per launch")
    parser.add_argument("--rounds", type=int, default=2, help="launches of each world size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    for name in ("ranks", "num_groups", "threads", "updates", "repeats", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.ranks < 2 or args.group_size < 2:
        parser.error("--ranks and --group-size must be at least 2")

    passed = sys.argv[1:] if argv is None else argv
    result: dict[str, Any] = {
        "benchmark": "scaling",
        "command": " ".join(["python", "benchmarks/scaling.py", *passed]),
        "machine": machine_info(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average_1m": [os.getloadavg()[0]] if hasattr(os, "getloadavg") else [],
        "settings": {k: v for k, v in vars(args).items() if k != "worker"},
    }
    blocks: dict[int, list[dict[str, Any]]] = {1: [], args.ranks: []}
    for round_ in range(args.rounds):
        for ranks in blocks:
            print(f"round {round_ + 1}/{args.rounds}: {ranks} rank(s) ...", flush=True)
            blocks[ranks] += launch(ranks, args, passed)
    result["runs"] = {str(k): summarise(v) for k, v in blocks.items()}
    one, many = (result["runs"][str(k)] for k in (1, args.ranks))
    result["efficiency"] = many["median_env_steps_per_s"] / (
        args.ranks * one["median_env_steps_per_s"]
    )
    result["efficiency_simulated"] = many["median_simulated_steps_per_s"] / (
        args.ranks * one["median_simulated_steps_per_s"]
    )
    if hasattr(os, "getloadavg"):
        result["load_average_1m"].append(os.getloadavg()[0])  # at the start and at the end
    out = write_result("scaling", result)

    header = f"{'ranks':>5} {'env-steps/s':>12} {'(min':>9} {'max)':>9} {'per rank':>10}"
    print(f"\n{header} {'CPU us/step':>12}")
    for ranks in blocks:
        run = result["runs"][str(ranks)]
        rate, cpu = run["median_env_steps_per_s"], run["median_rank0_cpu_us_per_step"]
        low, high = run["min_env_steps_per_s"], run["max_env_steps_per_s"]
        print(
            f"{ranks:>5} {rate:>12,.0f} {low:>9,.0f} {high:>9,.0f} {rate / ranks:>10,.0f} "
            f"{cpu:>12.1f}"
        )
    print(
        f"efficiency {args.ranks} ranks: {result['efficiency']:.2f} (env steps), "
        f"{result['efficiency_simulated']:.2f} (simulated steps)"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
