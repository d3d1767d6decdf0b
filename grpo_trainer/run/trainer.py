"""`GRPOTrainer`: the algorithm (`grpo_trainer.algorithm.GRPO`) with the run around it.

`train()` is the Stable-Baselines3-style entry point: it runs `Harness` (the loop to the
budget, with checkpoints, evaluation, signals, logging and callbacks) on this trainer.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym

from grpo_trainer.algorithm.grpo import GRPO
from grpo_trainer.run.callbacks import Callback
from grpo_trainer.run.harness import Harness


class GRPOTrainer(GRPO):
    """GRPO on any Gymnasium vector env, trained to its budget by `train()`."""

    stop_signal: str | None = None  # the signal the last train() stopped on, if any
    stop_reason: str | None = None  # why it ended early otherwise (a target, a callback)

    def train(
        self,
        callbacks: Sequence[Callback] = (),
        eval_envs: gym.vector.VectorEnv | None = None,
    ) -> dict[str, float]:
        """Train until `total_env_steps`; returns the last update's metrics.

        `callbacks` hook into the run (`grpo_trainer.run.callbacks`). Evaluation during
        training plays on `eval_envs`, by default envs made from `config.run.env` like the
        training env. SIGINT/SIGTERM finish the current update, write a checkpoint and return
        (then `stop_signal` names the signal; `stop_reason` says why a run ended early
        otherwise). With `config.run.wandb`, rank 0 also logs to Weights & Biases; a missing
        wandb package raises `ImportError` before anything runs, on every rank.
        """
        outcome = Harness(self, callbacks, eval_envs).run()
        self.stop_signal, self.stop_reason = outcome.stop_signal, outcome.stop_reason
        return outcome.metrics
