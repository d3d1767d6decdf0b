"""The passes an update makes before it trains, one way and the other, in one process.

    python benchmarks/update_passes.py                   # the four MinAtar games
    python benchmarks/update_passes.py --games breakout --updates 5 --name smoke

Before its minibatches an update values every played row with the critic and re-scores the
rows an earlier policy played (`RowScores`, `algorithm/scoring.py`). With a shared critic
both read the policy's encoder, so `RowScores.both` runs it once over the re-scored rows
instead of twice. Per game this script builds the train command's trainer for a budget, and
in every update after one untimed warm-up it times, on the same rollout and the same
weights, the two passes made apart (`RowScores.values`, then `rescored`) and `both`,
alternating which goes first, then trains as the run would. It records the medians, whether
both ways gave the same numbers bit for bit, and the update's median seconds (collect plus
learn), to which the saving compares. One process and one rollout per pair, so the
machine's drift between runs minutes apart does not enter the ratio.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import per_game_parser, run_per_game, train_command_trainer


def measure(env_id: str, budget: int, updates: int) -> dict[str, Any]:
    """Medians of the two ways over `updates` updates of the train command's run of `env_id`."""
    import torch

    with tempfile.TemporaryDirectory(prefix="update-passes-") as run_dir:
        trainer = train_command_trainer(env_id, budget, run_dir)
        trainer.learn(trainer.collect())  # warm-up: allocations, lazy set-up
        scores = trainer.scores
        apart_s, once_s, update_s, same = [], [], [], True
        for index in range(updates):
            start = time.perf_counter()
            rollout = trainer.collect()
            collected = time.perf_counter() - start
            results: dict[str, Any] = {}
            for way in ("apart", "once") if index % 2 == 0 else ("once", "apart"):
                begin = time.perf_counter()
                if way == "apart":
                    results[way] = (scores.values(rollout), scores.rescored(rollout))
                else:
                    results[way] = scores.both(rollout)
                (apart_s if way == "apart" else once_s).append(time.perf_counter() - begin)
            same &= all(
                (a is None and b is None) or torch.equal(a, b)
                for a, b in zip(results["apart"], results["once"], strict=True)
            )
            start = time.perf_counter()
            trainer.learn(rollout)
            update_s.append(collected + time.perf_counter() - start)
    apart, once, update = (statistics.median(t) for t in (apart_s, once_s, update_s))
    return {
        "env": env_id,
        "budget": budget,
        "updates": updates,
        "rescored_rows": rollout.earlier_policy_rows * rollout.obs.shape[1],
        "apart_s": apart_s,
        "once_s": once_s,
        "update_s": update_s,
        "median_apart_ms": round(apart * 1e3, 1),
        "median_once_ms": round(once * 1e3, 1),
        "median_update_s": round(update, 4),
        "saved_share_of_update": round((apart - once) / update, 3),
        "bit_identical": same,
        "torch_threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> int:
    args = per_game_parser(__doc__, "update_passes", budget=1_500_000, updates=11).parse_args(argv)
    return run_per_game(
        args,
        lambda env_id: measure(env_id, args.budget, args.updates),
        lambda row: (
            f"apart {row['median_apart_ms']} ms, once {row['median_once_ms']} ms, "
            f"update {row['median_update_s']} s (saved {row['saved_share_of_update']:.1%}), "
            f"bit-identical {row['bit_identical']}"
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
