"""What an env step costs the trainer on one core: played and trained, or played only.

    python benchmarks/step_costs.py                      # the four MinAtar games, 2M budget
    python benchmarks/step_costs.py --games breakout --updates 9 --name smoke
    python benchmarks/step_costs.py --flags --branch-every 128 --branch-complete  # a variant

A forked continuation that only estimates a baseline is played, never trained: it costs
the policy's forward pass and the env step, not the update's epochs of forward and backward
passes. This script measures both sides at the train command's defaults for a budget, so
the arithmetic of a fork idea at its real cost (docs/trainer.md, "Forks at their real cost")
starts from measured figures. Per game it builds the config the train command builds,
plays `--updates` updates through `GRPOTrainer.collect` and `learn`, and records, after one
untimed warm-up update, the median seconds of each side per update, and per env step:

* `collect_us_per_step`: playing (policy forward, sampling, env step, storing the row);
* `update_us_per_step`: a played step's share of the whole update, collect plus learn;
* `mean_update_s`: the mean of collect plus learn, which counts a variant's occasional
  extra work (a median would skip updates that do it).

With `--flags` the same for a variant; a variant that plays extra inference-only steps
reports them (`extra_steps_per_update`) when its rollout counts them (`env_steps` of
`rollout.completion`). With `--every-row` the update trains every row, those of weight 0
too, as it does on a GPU (`drop_flat_rows`, docs/performance.md, "Rows that weigh
nothing"). Each row reports the timed updates' `frac_zero_std_groups` (their rows of weight
0, but those of steps that do not count).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import per_game_parser, run_per_game, train_command_trainer


def measure(
    env_id: str, budget: int, updates: int, flags: list[str], every_row: bool = False
) -> dict[str, Any]:
    """Median collect and learn seconds per update of the train command's run of `env_id`,
    in a run directory that is removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="step-costs-") as run_dir:
        return _measure(env_id, budget, updates, flags, every_row, run_dir)


def _measure(
    env_id: str, budget: int, updates: int, flags: list[str], every_row: bool, run_dir: str
) -> dict[str, Any]:
    import torch

    trainer = train_command_trainer(env_id, budget, run_dir, flags)
    if every_row:
        trainer.drop_flat_rows = False
    completion = getattr(trainer.rollout, "completion", None)
    collect_s, learn_s, extra, flat = [], [], [], []
    for index in range(updates + 1):
        before = completion.env_steps if completion is not None else 0
        start = time.perf_counter()
        rollout = trainer.collect()
        played = time.perf_counter()
        metrics = trainer.learn(rollout).metrics
        done = time.perf_counter()
        if index:  # the first update warms up (allocations, lazy set-up)
            collect_s.append(played - start)
            learn_s.append(done - played)
            extra.append((completion.env_steps if completion is not None else 0) - before)
            flat.append(metrics.get("frac_zero_std_groups"))  # absent: nothing compared
    config = trainer.config
    samples = config.num_envs * config.rollout_steps
    collect, learn = statistics.median(collect_s), statistics.median(learn_s)
    updates_s = [c + u for c, u in zip(collect_s, learn_s, strict=True)]
    return {
        "env": env_id,
        "flags": flags,
        "budget": budget,
        "samples_per_update": samples,
        "epochs": config.epochs,
        "minibatch_size": config.minibatch_size,
        "torch_threads": torch.get_num_threads(),
        "collect_s": collect_s,
        "learn_s": learn_s,
        "median_collect_s": round(collect, 4),
        "median_learn_s": round(learn, 4),
        "mean_update_s": round(statistics.fmean(updates_s), 4),
        "collect_us_per_step": round(collect / samples * 1e6, 2),
        "update_us_per_step": round((collect + learn) / samples * 1e6, 2),
        "played_over_trained": round(collect / (collect + learn), 3),
        "extra_steps_per_update": statistics.fmean(extra),
        "drop_flat_rows": trainer.drop_flat_rows,
        "frac_zero_std_groups": flat,
    }


def main(argv: list[str] | None = None) -> int:
    parser = per_game_parser(__doc__, "step_costs", budget=2_000_000, updates=17)
    parser.add_argument("--flags", nargs=argparse.REMAINDER, default=[], help="train flags")
    parser.add_argument("--every-row", action="store_true", help="train rows of weight 0 too")
    args = parser.parse_args(argv)
    return run_per_game(
        args,
        lambda env_id: measure(env_id, args.budget, args.updates, args.flags, args.every_row),
        lambda row: (
            f"{row['samples_per_update']} samples, collect {row['median_collect_s']} s, "
            f"learn {row['median_learn_s']} s per update; {row['collect_us_per_step']} us "
            f"played, {row['update_us_per_step']} us played and trained per env step"
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
