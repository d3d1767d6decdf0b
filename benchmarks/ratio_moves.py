"""How far each update moves the log-probs of the steps it trains: where a run leaves its
trust region.

    python benchmarks/ratio_moves.py --game breakout --updates 70 --flags --lr 0.0025
    python benchmarks/ratio_moves.py --game space_invaders --updates 40 --gpu-row

The clipped ratio bounds the policy's move on each step only while that step's gradient
flows. A run whose policy sharpens far can still move some steps' log-probs by tens of nats
in one update, and the k3 KL the trainer reports (`approx_kl_old`) is then dominated by a
few of them. This script trains the train command's run of a MinAtar game through
`GRPOTrainer.collect` and `learn`, and records per update, over the steps that carry weight:

* `down_max` and `up_max`: the largest fall and rise of a step's log-prob over the update
  (from its behaviour log-prob, the anchor of its ratio, to the policy after the update);
* `down_5` and `up_5`: how many steps moved more than 5 nats down or up;
* `old_below_10`: how many steps' behaviour log-prob is below -10 (actions the current
  policy all but never plays, re-scored from an earlier update's rows);
* the update's metrics: sampled return, entropy, `approx_kl_old`, grad norm, skipped steps.

`--gpu-row` trains the GPU's row of `DEVICE_DEFAULTS` on the CPU (8192 sub-envs, one trust
region of 262,144 samples, minibatch 32,768), as docs/trainer.md's device study does:
learning per update does not depend on the device. It found why the GPU's MinAtar runs
stopped on non-finite losses (docs/trainer.md, "MinAtar on a GPU").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import MINATAR_GAMES, machine_info, train_command_trainer, write_result

GAMES = MINATAR_GAMES
# The GPU's row on the CPU: what `--device cuda` derives for the MinAtar games.
GPU_ROW = ["--num-groups", "1024", "--anchor-samples", "262144", "--minibatch-size", "32768"]
MOVE = 5.0  # nats: a step whose log-prob moved more than this in one update is counted
CHUNK = 32_768  # samples scored at once after the update
REPORTED = ("return_mean", "entropy", "approx_kl_old", "grad_norm", "skipped_steps")  # metrics


def moves(game: str, budget: int, updates: int, flags: list[str]) -> list[dict[str, Any]]:
    """One record per update of the train command's run of `game` with `flags`."""
    with tempfile.TemporaryDirectory(prefix="ratio-moves-") as run_dir:
        return _moves(GAMES[game], budget, updates, flags, run_dir)


def _moves(
    env_id: str, budget: int, updates: int, flags: list[str], run_dir: str
) -> list[dict[str, Any]]:
    import torch

    from grpo_trainer.algorithm.optimizer_step import Samples

    trainer = train_command_trainer(env_id, budget, run_dir, flags)
    records = []
    for index in range(1, updates + 1):
        rollout = trainer.collect()
        with torch.no_grad():  # the update's own samples, copied before `learn` reuses them
            samples = trainer.trained_samples(rollout, trainer.advantages(rollout))
            samples = Samples(*(None if t is None else t.clone() for t in samples))
        metrics = trainer.learn(rollout).metrics
        with torch.no_grad():
            new = torch.cat(
                [
                    trainer.log_prob(obs, actions)
                    for obs, actions in zip(
                        samples.obs.split(CHUNK), samples.actions.split(CHUNK), strict=True
                    )
                ]
            )
        weighted = samples.weights > 0
        down = (samples.old_logp - new)[weighted]
        old = samples.old_logp[weighted]
        record = {"update": index, "env_steps": metrics["env_steps"]}
        record.update({k: metrics.get(k) for k in REPORTED})
        if down.numel():  # the first updates of a long window train no rows yet
            record.update(
                down_max=round(float(down.max()), 3),
                up_max=round(float((-down).max()), 3),
                down_5=int((down > MOVE).sum()),
                up_5=int((-down > MOVE).sum()),
                old_below_10=int((old < -10).sum()),
                weighted_steps=int(weighted.sum()),
            )
        records.append(record)
        print(json.dumps(record), flush=True)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", choices=list(GAMES), default="breakout")
    parser.add_argument("--budget", type=int, default=60_000_000, help="the run's env steps")
    parser.add_argument("--updates", type=int, default=40, help="updates to train")
    parser.add_argument("--gpu-row", action="store_true", help="the GPU's row, on the CPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--flags", nargs=argparse.REMAINDER, default=[], help="train flags")
    parser.add_argument("--name", default="ratio_moves", help="results file stem")
    parser.add_argument("--results", type=Path, help="folder of the JSON (benchmarks/results)")
    args = parser.parse_args(argv)
    import torch

    import fruit_env  # noqa: F401  (registers the games)

    torch.set_num_threads(1)
    flags = [*(GPU_ROW if args.gpu_row else []), "--seed", str(args.seed), *args.flags]
    records = moves(args.game, args.budget, args.updates, flags)
    payload = {"machine": machine_info(), "game": args.game, "flags": flags, "updates": records}
    write_result(args.name, payload, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
