"""Playing the policy into the buffer: the exploration noise and the per-step writes."""

from __future__ import annotations

from collections.abc import Callable

import torch

from grpo_trainer.algorithm.policy import ActionHead
from grpo_trainer.algorithm.rollout.buffer import RolloutBuffer
from grpo_trainer.envs.episodes import RunnerStep

SampleFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class ExplorationNoise:
    """The noise each sub-env samples its actions with, step after step. The head decides
    how one step's noise follows the last (`ActionHead.correlate`): for Gaussian heads an
    AR(1) process with `correlation` ρ, so exploration pushes one way for about 1 / (1 − ρ)
    steps, as colored-noise exploration does (Eberhard et al., 2023; Hollenstein et al.,
    2024); for categorical heads independent draws. Each step's marginal is the head's own,
    so the stored log-probs are exact."""

    def __init__(self, head: ActionHead, num_envs: int, correlation: float) -> None:
        self.head, self.num_envs, self.correlation = head, num_envs, correlation
        self.last: torch.Tensor | None = None  # what the last step drew (kept in checkpoints)

    def draw(self, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        fresh = self.head.noise(self.num_envs, generator, device)
        last = self.last
        self.last = fresh if last is None else self.head.correlate(last, fresh, self.correlation)
        return self.last


class Recorder:
    """Plays the policy into the buffer: `act` stores the observation, samples an action from
    the stored (compact) value, as the update will read it, and stores action and log-prob;
    `record` stores what the step brought.

    Every operation here runs once per step, so at small batches their count is the cost:
    values are written straight into the buffer (`copy_` casts).
    """

    def __init__(
        self,
        buffer: RolloutBuffer,
        head: ActionHead,
        sample: SampleFn,
        generator: torch.Generator,
        noise: ExplorationNoise,
    ) -> None:
        self.buffer, self.head, self.sample, self.generator = buffer, head, sample, generator
        self.noise = noise

    def act(self, row: int, obs: torch.Tensor) -> torch.Tensor:
        buffer = self.buffer
        stored = buffer.obs[row]
        stored.copy_(obs)
        noise = self.noise.draw(self.generator, obs.device)
        action, logp = self.sample(stored, noise)
        buffer.actions[row].copy_(action)
        buffer.logp[row].copy_(logp)
        return self.head.to_env(action)

    def record(self, row: int, step: RunnerStep) -> None:
        buffer = self.buffer
        buffer.rewards[row].copy_(step.reward)
        buffer.valid[row].copy_(step.alive)
        buffer.cut[row].copy_(step.ended)
