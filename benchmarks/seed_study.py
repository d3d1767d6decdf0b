"""Seed study: greedy catch rate against env steps, for several configs and seeds.

    python benchmarks/seed_study.py                                  # the study behind the defaults
    python benchmarks/seed_study.py --seeds 0 1 --config 'ep6={"epochs": 6}'
    python benchmarks/seed_study.py --throughput                      # env-steps/s of each config

Why env steps and not seconds: on the CPU a run is deterministic for a given seed, so a curve
against env steps does not depend on the machine's load. Runs can therefore go in parallel
(`--jobs`, one torch thread each) and the time to a catch rate follows from the steps and
the throughput, which `--throughput` measures: one process, one torch thread, the configs'
updates interleaved so that the load hits all alike (medians; wall and CPU time).

Each config is a JSON object of `GRPOConfig` fields over the defaults. Every run evaluates
the greedy policy on 1000 games every `--eval-every` env steps. Results (one entry per run:
the curve, the first point at or above the target, the final point) go to
benchmarks/results/seed_study.json (throughput: seed_study_throughput.json; `--name` changes
the stem).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info, write_result

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.envs import make_envs
from grpo_trainer.run.evaluation import evaluate

TARGET = 0.70
DEFAULT_CONFIGS = {
    "4 epochs": {"epochs": 4},
    "6 epochs": {"epochs": 6},
    "8 epochs": {"epochs": 8},
}


def make_trainer(overrides: dict[str, Any], seed: int) -> GRPOTrainer:
    """The defaults with `overrides` (`"run"` holds `RunConfig` fields), quiet and seeded."""
    fields = dict(overrides)
    run = RunConfig(**{**fields.pop("run", {}), "seed": seed, "progress": False})
    config = GRPOConfig(**fields, run=run)
    return GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)


def run_one(overrides: dict[str, Any], seed: int, eval_every: int) -> dict[str, Any]:
    """Train one config for its whole budget, evaluating every `eval_every` env steps."""
    trainer = make_trainer(overrides, seed)
    budget = trainer.config.total_env_steps
    eval_envs = gym.make_vec("FruitCatcher-v0", num_envs=1000)
    curve: list[dict[str, float]] = []
    next_eval, train_s = eval_every, 0.0
    while trainer.env_steps < budget:
        start = time.perf_counter()
        trainer.update()
        train_s += time.perf_counter() - start
        if trainer.env_steps >= next_eval or trainer.env_steps >= budget:
            result = evaluate(trainer.policy, eval_envs, 1000, seed=10_000 + seed)
            curve.append(
                {
                    "env_steps": trainer.env_steps,
                    "train_s": round(train_s, 2),  # depends on the load: for reference only
                    "greedy_catch_rate": round(result["catch_rate"], 4),
                }
            )
            next_eval += eval_every
    first = next((p for p in curve if p["greedy_catch_rate"] >= TARGET), None)
    return {"seed": seed, "first_at_target": first, "final": curve[-1], "curve": curve}


def throughput(configs: dict[str, dict[str, Any]], updates: int) -> dict[str, Any]:
    """Env-steps per second of wall and of CPU time, per config, interleaved update by update."""
    trainers = {name: make_trainer(overrides, 0) for name, overrides in configs.items()}
    for trainer in trainers.values():
        trainer.update()  # warm-up, not timed
    wall: dict[str, list[float]] = {name: [] for name in configs}
    cpu: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(updates):
        for name, trainer in trainers.items():
            before = trainer.env_steps
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            trainer.update()
            steps = trainer.env_steps - before
            wall[name].append(steps / (time.perf_counter() - start_wall))
            cpu[name].append(steps / (time.process_time() - start_cpu))
    return {
        name: {
            "steps_per_s": statistics.median(wall[name]),
            "steps_per_cpu_s": statistics.median(cpu[name]),
        }
        for name in configs
    }


def _worker(args: argparse.Namespace) -> None:
    print(json.dumps(run_one(json.loads(args.overrides), args.seed, args.eval_every)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="a config to study (repeatable); default: 4, 6 and 8 epochs",
    )
    parser.add_argument("--eval-every", type=int, default=250_000, help="env steps")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel")
    parser.add_argument(
        "--throughput", action="store_true", help="only measure each config's env-steps/s"
    )
    parser.add_argument("--updates", type=int, default=10, help="--throughput: timed updates")
    parser.add_argument(
        "--name", default="seed_study", help="results file stem (keeps the committed one)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--overrides", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)  # a worker's run, or the interleaved throughput measurement
    if args.worker:
        _worker(args)
        return 0

    configs = dict(DEFAULT_CONFIGS)
    if args.config:
        configs = {}
        for item in args.config:
            name, _, text = item.partition("=")
            configs[name] = json.loads(text)
    if args.throughput:
        rates = throughput(configs, args.updates)
        for name, rate in rates.items():
            print(
                f"{name:>12}: {rate['steps_per_s']:,.0f} env-steps/s, "
                f"{rate['steps_per_cpu_s']:,.0f} per CPU-second"
            )
        info = {"machine": machine_info(), "command": " ".join(sys.argv)}
        path = write_result(f"{args.name}_throughput", {"configs": configs, "rates": rates, **info})
        print(f"wrote {path}")
        return 0
    jobs = [(name, seed) for name in configs for seed in args.seeds]

    def launch(job: tuple[str, int]) -> dict[str, Any]:
        name, seed = job
        command = [sys.executable, __file__, "--worker", "--seed", str(seed)]
        command += ["--overrides", json.dumps(configs[name]), "--eval-every", str(args.eval_every)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        result = {"config": name, **json.loads(out.strip().splitlines()[-1])}
        first = result["first_at_target"]
        reached = f"{first['env_steps'] / 1e6:.2f}M steps" if first else "not reached"
        print(f"{name:>12} seed {seed}: {TARGET} {reached}, final {result['final']}", flush=True)
        return result

    with ThreadPoolExecutor(args.jobs) as pool:
        runs = list(pool.map(launch, jobs))
    path = write_result(
        args.name,
        {
            "target_catch_rate": TARGET,
            "configs": configs,
            "runs": runs,
            "machine": machine_info(),
            "command": " ".join(sys.argv),
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
