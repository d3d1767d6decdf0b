"""`GRPOTrainer`: the algorithm (`grpo_trainer.algorithm.GRPO`) with the run around it.

`train()` is the Stable-Baselines3-style entry point: it runs `Harness` (the loop to the
budget, with checkpoints, evaluation, signals, logging and callbacks) on this trainer.
`load()` (and `RunConfig.resume`) continues from a checkpoint file or run directory: reading
files is the run's business, so the algorithm gets only the state they hold.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from grpo_trainer.algorithm.grpo import GRPO, STATE_KEYS
from grpo_trainer.base import checkpoint
from grpo_trainer.base.accel import resolve_device
from grpo_trainer.base.config import GRPOConfig
from grpo_trainer.envs import make_envs
from grpo_trainer.envs.contract import is_spatial, read_contract
from grpo_trainer.run.callbacks import Callback
from grpo_trainer.run.files import resumed_best
from grpo_trainer.run.harness import Harness

log = logging.getLogger(__name__)


class GRPOTrainer(GRPO):
    """GRPO on any Gymnasium vector env, trained to its budget by `train()`."""

    stop_signal: str | None = None  # the signal the last train() stopped on, if any
    stop_reason: str | None = None  # why it ended early otherwise (a target, a callback)

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        config: GRPOConfig | None = None,
        *,
        resumed: tuple[dict[str, Any], Path] | None = None,
    ) -> None:
        """`resumed`: the checkpoint `config.run.resume` names, already read (`open_run`)."""
        super().__init__(envs, config)
        # entries of a resumed checkpoint that the run wrote beside GRPO's (best.pt's score)
        self.checkpoint_extras: dict[str, Any] = {}
        if resumed is not None:
            self._restore(*resumed)
        elif self.config.run.resume:
            self.load(self.config.run.resume)

    def load(self, path: str | Path) -> Path:
        """Continue from a checkpoint file or run directory (its newest usable checkpoint),
        refusing one made for other spaces or another network. Returns the file read."""
        return self._restore(*checkpoint.load_for_resume(path))

    def _restore(self, payload: dict[str, Any], found: Path) -> Path:
        spaces = checkpoint.space_signature(self.env.observation_space, self.env.action_space)
        config = self.config.to_dict()
        checkpoint.check_compatible(payload, found, spaces, config)
        checkpoint.check_same_env(payload, found, config["run"], self.env.free_kwargs)
        self.load_state_dict(payload, str(found))
        self.checkpoint_extras = {k: v for k, v in payload.items() if k not in STATE_KEYS}
        log.info(
            "resumed from %s at update %d (%d env steps)", found, self.update_index, self.env_steps
        )
        return found

    def train(
        self,
        callbacks: Sequence[Callback] = (),
        eval_envs: gym.vector.VectorEnv | None = None,
    ) -> dict[str, float]:
        """Train until `total_env_steps`, or until `time_budget_s` seconds of training where
        that ends first (no update starts after it); returns the last update's metrics.

        `callbacks` hook into the run (`grpo_trainer.run.callbacks`). Evaluation during
        training plays on `eval_envs`, by default envs made from `config.run.env` like the
        training env. SIGINT/SIGTERM finish the current update, write a checkpoint and return
        (then `stop_signal` names the signal; `stop_reason` says why a run ended early
        otherwise). With `config.run.wandb`, rank 0 also logs to Weights & Biases; a missing
        wandb package raises `ImportError` before anything runs, on every rank.
        """
        if self.device.type == "meta":
            raise ValueError(
                "device 'meta' holds no data: it checks shapes in tests (update() runs on it), "
                "but train() needs values to report and save; use 'cpu' or 'cuda'"
            )
        best = resumed_best(self.checkpoint_extras)
        outcome = Harness(self, callbacks, eval_envs, best).run()
        self.stop_signal, self.stop_reason = outcome.stop_signal, outcome.stop_reason
        return outcome.metrics


def open_run(config: GRPOConfig, device: torch.device | None = None) -> GRPOTrainer:
    """The one way into a run (the train command, `.train()` scripts that start here, a
    sweep's trials, the suite): the checkpoint to resume read once, the env made once on the
    run's device (`device`, else `config.run.device` resolved), its contract read, and the
    config resolved once from both (`GRPOConfig.resolve`): a resumed run keeps what it
    derived (its batch, learning rate and window) unless they are set again."""
    resumed, kept = None, {}
    if config.run.resume:
        resumed = checkpoint.load_for_resume(config.run.resume)
        saved = resumed[0].get("config") or {}
        kept = {name: saved[name] for name in config.derived if saved.get(name) is not None}
    device = device or resolve_device(config.run.device)
    num_envs = kept.get("num_groups", config.num_groups) * config.group_size
    try:
        envs = make_envs(config, num_envs, device)
    except (TypeError, ValueError) as err:  # the env's own check of its kwargs
        raise ValueError(
            f"argument --env/--env-kwargs: cannot make {config.run.env!r} with "
            f"{config.run.env_kwargs}: {err}"
        ) from None
    contract = read_contract(envs)
    config = config.resolve(contract.episode_limit, kept, is_spatial(contract.observation_space))
    derived = ", ".join(f"{name}={getattr(config, name)}" for name in config.derived)
    log.info("training %s on %s with %d sub-envs", config.run.env, device, num_envs)
    log.info("derived (config.json names them): %s", derived or "none")
    return GRPOTrainer(envs, config, resumed=resumed)
