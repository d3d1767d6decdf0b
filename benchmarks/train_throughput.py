"""End-to-end GRPO training throughput on FruitCatcher-v0, against a naive trainer doing the
same work, in one run.

    python benchmarks/train_throughput.py            # the table (a few minutes on 2 CPU cores)
    python benchmarks/train_throughput.py --quick    # fewer updates per row
    python benchmarks/train_throughput.py --profile  # + where one default update spends its time

What a row measures: whole updates (rollout, advantages, optimiser steps, the one host copy
of metrics) timed from outside, in env-steps per second of wall time and per CPU-second (the
figure a busy shared machine inflates less). Rows are measured interleaved, one update of
each, round after round, so that a change in the machine's load hits all of them alike; the
table shows medians over the rounds, after one untimed warm-up update per row.

The rows:

* "same work": the trainer with its defaults except 16384 envs, 1 epoch, one minibatch and
  one trust region per update (one gradient step per rollout), against
  benchmarks/naive_grpo.py doing the same work (the same rollout length and network, one
  gradient step per rollout), written the straightforward way;
* "learning": the defaults (1024 envs) and the defaults at 16384 envs, which take 8 epochs
  of 4096-sample minibatches per rollout: eight passes of the network per env step;
* "env alone": the env's own steps, for the policy's share of the time.

JSON with the machine, versions, command, load and every raw timing goes to
benchmarks/results/train_throughput[_quick].json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info, write_result
from naive_grpo import NaiveGRPO

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.envs import make_envs

CPU = torch.device("cpu")


def _trainer(**fields: Any) -> GRPOTrainer:
    config = GRPOConfig(**fields, run=RunConfig(progress=False, device="cpu"))
    return GRPOTrainer(make_envs(config, config.num_envs, CPU), config)


class Row:
    """One configuration: `step()` runs one update of `steps_per_update` env steps."""

    def __init__(self, name: str, step: Any, steps_per_update: int) -> None:
        self.name, self.step, self.steps = name, step, steps_per_update
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def timed(self) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.step()
        self.wall.append(self.steps / (time.perf_counter() - wall))
        self.cpu.append(self.steps / (time.process_time() - cpu))


def rows(big: int) -> list[Row]:
    out = []
    # one gradient step per rollout, as the naive trainer takes: one epoch, one minibatch and
    # one trust region for the whole batch
    same = _trainer(num_groups=big // 8, epochs=1, minibatch_size=1 << 30, anchor_samples=1 << 30)
    horizon = same.config.rollout_steps
    out.append(Row(f"trainer, {big} envs, 1 epoch x 1 minibatch", same.update, big * horizon))
    naive = NaiveGRPO(
        gym.make_vec("FruitCatcher-v0", num_envs=big),
        big // 8,
        8,
        horizon,
        epochs=1,
        minibatches=1,
        activation="relu",
    )
    out.append(Row(f"naive, {big} envs, 1 epoch x 1 minibatch", naive.update, big * horizon))
    default = _trainer()
    n = default.config.num_envs * default.config.rollout_steps
    out.append(Row(f"trainer defaults ({default.config.num_envs} envs)", default.update, n))
    wide = _trainer(num_groups=big // 8)
    out.append(Row(f"trainer defaults, {big} envs", wide.update, big * horizon))
    env = make_envs(default.config, big, CPU)
    env.reset(seed=0)
    actions = torch.ones(big, dtype=torch.long)

    def env_alone() -> None:
        for _ in range(horizon):
            env.step(actions)

    out.append(Row(f"env alone, {big} envs", env_alone, big * horizon))
    return out


def profile_default(limit: int = 15) -> list[dict[str, Any]]:
    """The top aten operations of one default update, by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    trainer = _trainer()
    for _ in range(2):
        trainer.update()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.update()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return [
        {
            "op": e.key,
            "calls": e.count,
            "self_ms": e.self_cpu_time_total / 1000,
            "share": e.self_cpu_time_total / total,
        }
        for e in events[:limit]
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--envs", type=int, default=16384, help="the large batch")
    parser.add_argument("--rounds", type=int, default=None, help="timed updates per row")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rounds = args.rounds or (3 if args.quick else 7)
    table = rows(args.envs)
    for row in table:
        row.step()  # warm-up, not timed
    for _ in range(rounds):
        for row in table:
            row.timed()
    results = {
        row.name: {
            "steps_per_s": statistics.median(row.wall),
            "steps_per_cpu_s": statistics.median(row.cpu),
            "wall": row.wall,
            "cpu": row.cpu,
        }
        for row in table
    }
    base = results[table[1].name]["steps_per_s"]
    print(f"{'row':<48} {'env-steps/s':>12} {'per CPU-s':>12} {'vs naive':>9}")
    for name, r in results.items():
        ratio = r["steps_per_s"] / base
        print(
            f"{name:<48} {r['steps_per_s']:>12,.0f} {r['steps_per_cpu_s']:>12,.0f} {ratio:>8.2f}x"
        )
    payload: dict[str, Any] = {"rounds": rounds, "rows": results, "machine": machine_info()}
    if args.profile:
        payload["profile_default_update"] = profile_default()
        for item in payload["profile_default_update"]:
            print(f"{item['op']:<40} {item['share']:6.1%} {item['calls']:>6} calls")
    path = write_result("train_throughput_quick" if args.quick else "train_throughput", payload)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
