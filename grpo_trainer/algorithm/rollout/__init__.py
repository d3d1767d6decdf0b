"""Rollouts: play the policy in every sub-env and store what the update needs, on the device.

Two modes, `WindowedRollout` (the default) and `EpisodeRollout`, behind one protocol
(`RolloutMode`) chosen once by `make_rollout`, so the trainer never asks which mode it runs.
"""

from __future__ import annotations

import warnings
from typing import Any, Protocol

import torch

from grpo_trainer.algorithm.policy import ActionHead
from grpo_trainer.algorithm.rollout.buffer import (
    ExplorationNoise,
    Rollout,
    RolloutBuffer,
    RolloutCheckpoint,
    SampleFn,
    storage_dtype,
)
from grpo_trainer.algorithm.rollout.modes import BranchCompletion, EpisodeRollout, WindowedRollout
from grpo_trainer.algorithm.rollout.restarts import (
    GroupRestarts,
    GroupSeeds,
    IndependentRestarts,
    RestartPolicy,
)
from grpo_trainer.base.config import GRPOConfig
from grpo_trainer.envs.env_io import EnvIO

__all__ = [
    "ExplorationNoise",
    "GroupSeeds",
    "Rollout",
    "RolloutBuffer",
    "RolloutCheckpoint",
    "RolloutMode",
    "make_rollout",
    "storage_dtype",
]


class RolloutMode(Protocol):
    """What the trainer asks of a rollout, whatever the mode."""

    buffer: RolloutBuffer
    horizon: int  # steps per sub-env the next collect plays

    @property
    def steps_played(self) -> int:
        """Steps each sub-env played in the last collect."""
        ...

    def collect(self, sample: SampleFn, generator: torch.Generator) -> Rollout:
        """Play with `sample(obs, noise) -> (action, log_prob)` and store what the update needs."""
        ...

    def after_update(self, metrics: dict[str, float]) -> None:
        """Learn from the update's host metrics what the next collect needs (and report it)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to continue this rank's rollout exactly."""
        ...

    def resume(self, saved: RolloutCheckpoint) -> None:
        """Continue from what a checkpoint holds."""
        ...


def make_rollout(
    config: GRPOConfig,
    env: EnvIO,
    head: ActionHead,
    seeds: GroupSeeds,
    generator: torch.Generator,
) -> RolloutMode:
    """The rollout the config asks for, with the restart policy the env allows."""
    obs_shape = tuple(env.observation_space.shape or ())
    obs_dtype = storage_dtype(env.observation_space, config.obs_storage)
    noise = ExplorationNoise(head, env.num_envs)
    if config.rollout == "episodes":
        horizon = config.max_episode_steps or env.max_episode_steps()
        if horizon is None:
            raise ValueError(
                "rollout='episodes' plays whole episodes: max_episode_steps is not set and "
                "the env declares no limit; set it in the config"
            )
        buffer = RolloutBuffer(horizon, 0, env.num_envs, obs_shape, obs_dtype, head, env.device)
        return EpisodeRollout(env, buffer, head, config.group_size, noise, seeds)
    lookahead = config.window - 1
    buffer = RolloutBuffer(
        config.rollout_steps, lookahead, env.num_envs, obs_shape, obs_dtype, head, env.device
    )
    restarts = _restart_policy(config, env, seeds, generator)
    steps = config.max_episode_steps
    completion = None
    if config.branch_complete:  # the config and _restart_policy make its restarts branch
        completion = BranchCompletion(env, head, noise, config.window, config.gamma, buffer.obs[0])
    return WindowedRollout(env, buffer, head, restarts, steps, noise, config.window, completion)


def _restart_policy(
    config: GRPOConfig, env: EnvIO, seeds: GroupSeeds, generator: torch.Generator
) -> RestartPolicy:
    """Groups restart together where the env allows it; else each alone, with a warning."""
    name = type(env.envs).__name__
    method = env.restart_method
    if config.branch_every and not method.can_branch:  # checked first: never silently ignored
        raise ValueError(
            f"branch_every: branching needs state snapshots, which {name} does not offer "
            "(docs/env.md: sub-env state snapshots)"
        )
    if method.restarts_itself:
        if config.max_episode_steps is not None:
            raise ValueError(
                f"max_episode_steps: {name} restarts its sub-envs itself, so the trainer "
                "cannot end episodes early; leave max_episode_steps unset"
            )
        warnings.warn(
            f"{name} offers neither state snapshots nor masked seeded resets: its sub-envs "
            "restart on their own, so group members are compared at the same step but not "
            "in the same situation",
            RuntimeWarning,
            stacklevel=4,
        )
        return IndependentRestarts(env, config.group_size, seeds)
    return GroupRestarts(
        env,
        config.group_size,
        seeds,
        generator,
        every=config.restart_every,
        branch_every=config.branch_every,
        aligned=config.branch_complete,
        branch_ended=config.branch_ended and method.can_branch,
    )
