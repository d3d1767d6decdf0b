"""Whole-episode rollouts (`rollout="episodes"`): every member plays one episode per update,
from a fresh group reset, for at most `horizon` steps; the horizon follows the episodes."""

from __future__ import annotations

from typing import Any

import torch

from grpo_trainer.algorithm.policy import ActionHead
from grpo_trainer.algorithm.rollout.buffer import (
    ExplorationNoise,
    Recorder,
    Rollout,
    RolloutBuffer,
    RolloutCheckpoint,
    SampleFn,
    rollout_view,
)
from grpo_trainer.algorithm.rollout.restarts import GroupSeeds
from grpo_trainer.envs.env_io import EnvIO
from grpo_trainer.envs.episodes import EpisodeRunner, play_until_ended

MIN_HORIZON = 16  # the shortest adapted horizon, and its rounding step
HORIZON_SLACK = (1.25, 8)  # next horizon = longest episode * 1.25 + 8


class EpisodeRollout:
    """Every member plays one episode, at most `horizon` steps, from a fresh group reset."""

    def __init__(
        self,
        env: EnvIO,
        buffer: RolloutBuffer,
        head: ActionHead,
        group_size: int,
        noise: ExplorationNoise,
        seeds: GroupSeeds,
    ) -> None:
        self.env, self.buffer, self.head, self.group_size = env, buffer, head, group_size
        self.runner = EpisodeRunner(env)
        self.noise, self.seeds = noise, seeds
        self.max_horizon = self.horizon = buffer.rows  # steps the next collect may play
        self.steps_played = 0  # steps each sub-env played in the last collect (the ended idle)
        self.collects = 0  # numbers the groups' seed draws: one per update

    @torch.inference_mode()
    def collect(self, sample: SampleFn, generator: torch.Generator) -> Rollout:
        recorder = Recorder(self.buffer, self.head, sample, generator, self.noise)
        self.runner.stats.reset()
        obs = self.env.reset_groups(self.seeds(self.collects), self.group_size)
        self.collects += 1
        play_until_ended(self.runner, obs, recorder.act, self.horizon, on_step=recorder.record)
        self.steps_played = self.horizon
        return rollout_view(self.buffer, self.runner, self.horizon, self.horizon)

    def after_update(self, metrics: dict[str, float]) -> None:
        """Record the horizon played; shorten the next when every episode ended early, grow
        it when some were cut."""
        metrics["horizon"] = self.horizon
        everyone = self.env.num_envs * self.seeds.world_size
        if metrics.get("episodes", 0.0) / everyone < 1.0:
            self.horizon = min(self.max_horizon, self.horizon * 2)
            return
        scale, slack = HORIZON_SLACK
        longest = int(metrics.get("length_max", self.horizon))
        rounded = -(-int(longest * scale + slack) // MIN_HORIZON) * MIN_HORIZON
        self.horizon = min(self.max_horizon, max(MIN_HORIZON, rounded))

    def state_dict(self) -> dict[str, Any]:
        """Nothing beyond the horizon and the update count, which the checkpoint holds."""
        return {}

    def resume(self, saved: RolloutCheckpoint) -> None:
        self.horizon = min(saved.horizon, self.max_horizon)
        self.collects = saved.updates
