"""Wall time to a greedy catch rate of 0.70 on Fruit Catcher: this tree against a git revision.

    python benchmarks/time_to_target.py --against 77ff776            # the make-train defaults
    python benchmarks/time_to_target.py --against 77ff776 --threads 2 --repeats 3 --seeds 0 1

Each run trains the default config (what `make train` trains) in a fresh process and
evaluates the greedy policy on 1000 games every `--eval-every` env steps; the evaluation is
excluded from the training time. The runs of the two revisions alternate, so that both see
the same machine load, and each process gets the same number of torch threads. The older
revision is checked out into a temporary git worktree and imported from there.
Results (every run, and the median ratio) go to benchmarks/results/time_to_target.json.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info, write_result  # noqa: E402

TARGET = 0.70


def worker(seed: int, eval_every: int, threads: int, budget: int | None) -> dict[str, Any]:
    """Train the defaults of whatever grpo_trainer is importable; stop at the target."""
    import gymnasium as gym
    import torch

    import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
    from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig

    try:  # where evaluate and make_envs live in this revision (layers since 737360e)
        from grpo_trainer.envs import make_envs
        from grpo_trainer.run.evaluation import evaluate
    except ImportError:
        from grpo_trainer.evaluation import evaluate, make_envs  # type: ignore[no-redef]

    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision("high")  # as the command line sets it
    config = GRPOConfig(run=RunConfig(seed=seed, progress=False, device="cpu"))
    if budget:
        config.total_env_steps = budget
    start = time.perf_counter()
    trainer = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
    setup_s = time.perf_counter() - start
    eval_envs = gym.make_vec("FruitCatcher-v0", num_envs=1000)
    train_s, next_eval, curve = 0.0, eval_every, []
    reached = None
    while trainer.env_steps < config.total_env_steps:
        start = time.perf_counter()
        trainer.update()
        train_s += time.perf_counter() - start
        if trainer.env_steps >= next_eval or trainer.env_steps >= config.total_env_steps:
            rate = evaluate(trainer.policy, eval_envs, 1000, seed=10_000 + seed)["catch_rate"]
            curve.append((trainer.env_steps, round(train_s, 3), round(rate, 4)))
            next_eval += eval_every
            if rate >= TARGET:
                reached = {"env_steps": trainer.env_steps, "train_s": train_s}
                break
    return {"seed": seed, "setup_s": setup_s, "reached": reached, "curve": curve}


def _run(tree: Path, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(args.threads)}
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--seed", str(seed)]
    command += ["--eval-every", str(args.eval_every), "--threads", str(args.threads)]
    out = subprocess.run(command, cwd=tree, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="77ff776", help="git revision to compare with")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per seed and revision")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=100_000, help="env steps")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.seed, args.eval_every, args.threads, args.budget)))
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(
            ["git", "worktree", "add", "-q", "--detach", str(old), args.against],
            cwd=ROOT,
            check=True,
        )
        try:
            runs: dict[str, list[dict[str, Any]]] = {"this": [], args.against: []}
            for seed in args.seeds:
                for _ in range(args.repeats):
                    for name, tree in (("this", ROOT), (args.against, old)):
                        result = _run(tree, args, seed)
                        runs[name].append(result)
                        print(name, seed, result["reached"], flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=True)

    def median(name: str, key: str) -> float:
        values = [r["reached"][key] for r in runs[name] if r["reached"]]
        return statistics.median(values) if values else float("nan")

    summary = {
        name: {"train_s": median(name, "train_s"), "env_steps": median(name, "env_steps")}
        for name in runs
    }
    ratio = summary[args.against]["train_s"] / summary["this"]["train_s"]
    print(json.dumps(summary), f"old / new wall time to {TARGET}: {ratio:.2f}x")
    path = write_result(
        f"time_to_target_{args.threads}thread_vs_{args.against}",
        {
            "target": TARGET,
            "against": args.against,
            "threads": args.threads,
            "runs": runs,
            "medians": summary,
            "old_over_new": ratio,
            "machine": machine_info(),
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
