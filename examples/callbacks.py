"""Callbacks: watch evaluations and stop when they stop improving (Stable-Baselines3's
`EvalCallback` + `StopTrainingOnNoModelImprovement`, in GRPO's terms).

python examples/callbacks.py                      # Fruit Catcher, evaluated every 250k steps
python examples/callbacks.py --patience 2 --total-env-steps 4000000
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.envs import make_envs
from grpo_trainer.run.callbacks import Callback, RunState


class PrintEvaluations(Callback):
    """One line per evaluation; the score is what best.pt is chosen by."""

    def on_eval(self, state: RunState, metrics: dict[str, float]) -> None:
        print(
            f"{state.env_steps:>10,} env steps  eval score {metrics['eval_score']:.3f}", flush=True
        )

    def on_checkpoint(self, state: RunState, path: Path) -> None:
        if path.name == "best.pt":
            print(f"{'':>10}  new best policy saved to {path}", flush=True)


class StopWithoutImprovement(Callback):
    """Stop after `patience` evaluations in a row without a better score."""

    def __init__(self, patience: int) -> None:
        self.patience, self.best, self.without_gain = patience, float("-inf"), 0

    def on_eval(self, state: RunState, metrics: dict[str, float]) -> None:
        if metrics["eval_score"] > self.best:
            self.best, self.without_gain = metrics["eval_score"], 0
            return
        self.without_gain += 1
        if self.without_gain >= self.patience:
            state.request_stop(f"no better evaluation in {self.patience} in a row")


def main(argv: list[str] | None = None) -> GRPOTrainer:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-env-steps", type=int, default=2_500_000)
    parser.add_argument("--eval-every", type=int, default=250_000)
    parser.add_argument("--eval-episodes", type=int, default=1000)
    parser.add_argument("--num-groups", type=int, default=None, help="default: from the budget")
    parser.add_argument("--patience", type=int, default=3)
    parser.add_argument("--run-dir", default="runs/callbacks")
    args = parser.parse_args(argv)

    run = RunConfig(
        eval_every=args.eval_every,
        eval_episodes=args.eval_episodes,
        run_dir=args.run_dir,
        progress=False,
        device="cpu",
    )
    config = GRPOConfig(num_groups=args.num_groups, total_env_steps=args.total_env_steps, run=run)
    trainer = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
    trainer.train(callbacks=[PrintEvaluations(), StopWithoutImprovement(args.patience)])
    print(f"stopped at {trainer.env_steps:,} env steps: {trainer.stop_reason or 'the budget'}")
    return trainer


if __name__ == "__main__":
    main()
