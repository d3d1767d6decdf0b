"""One GRPO run with config fields changed, greedy evaluation along the way: the variant runs
behind docs/trainer.md's "Defaults that transfer" and "Measured learning results".

    python benchmarks/variants.py --env gymnax:Breakout-MinAtar --steps 1000000 --seed 0 \
        --set window=32 epochs=4 --tag w32_ep4
    python benchmarks/variants.py --env CartPole-v1 --steps 500000 --eval-every 50000 \
        --episodes 100 --tag defaults

Every `--set FIELD=JSON` changes one `GRPOConfig` field over the defaults (which follow the
budget and the env: docs/trainer.md). The greedy policy plays `--episodes` episodes on envs
of its own every `--eval-every` env steps and at the end (the catch rate on Fruit Catcher,
else the mean return); evaluation is timed apart from training. One torch thread. Each run
appends one JSON line to benchmarks/results/variants.jsonl: tag, env, seed, the fields set,
the evaluations as (env steps, training seconds, score), the final score, updates and the
machine. On the CPU a run is deterministic for its seed, so scores do not depend on the load;
times do.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.envs import make_envs
from grpo_trainer.run.evaluation import evaluate

RESULTS = Path(__file__).parent / "results" / "variants.jsonl"


def run(
    env: str, steps: int, seed: int, fields: dict[str, Any], eval_every: int, episodes: int
) -> dict[str, Any]:
    """Train to `steps` env steps with `fields` over the defaults; evaluate on the way."""
    config = GRPOConfig(
        total_env_steps=steps,
        **fields,
        run=RunConfig(env=env, device="cpu", seed=seed, progress=False, eval_every=0),
    )
    cpu = torch.device("cpu")
    trainer = GRPOTrainer(make_envs(config, config.num_envs, cpu), config)
    eval_envs = make_envs(config, min(episodes, 256), cpu)
    evals, train_s, next_eval = [], 0.0, eval_every
    while trainer.env_steps < steps:
        start = time.perf_counter()
        trainer.update()
        train_s += time.perf_counter() - start
        if trainer.env_steps >= next_eval or trainer.env_steps >= steps:
            out = evaluate(trainer.policy, eval_envs, episodes, seed=10_000 + seed)
            score = out.get("catch_rate", out["return_mean"])
            evals.append((trainer.env_steps, round(train_s, 2), round(score, 4)))
            next_eval += eval_every
    return {
        "env": env,
        "seed": seed,
        "set": fields,
        "resolved": {
            k: getattr(trainer.config, k)
            for k in (
                "num_groups",
                "rollout_steps",
                "window",
                "gamma",
                "epochs",
                "minibatch_size",
                "lr",
            )
        },
        "evals": evals,
        "final": evals[-1][2],
        "train_s": round(train_s, 1),
        "updates": trainer.update_index,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="gymnax:Breakout-MinAtar")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=250_000)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=JSON")
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    fields = {}
    for item in args.set:
        name, _, value = item.partition("=")
        fields[name] = json.loads(value)
    result = {
        "tag": args.tag,
        **run(args.env, args.steps, args.seed, fields, args.eval_every, args.episodes),
    }
    result["machine"] = machine_info()
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as handle:
        handle.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
