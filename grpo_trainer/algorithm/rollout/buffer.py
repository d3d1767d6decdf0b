"""Rollout storage: what the update needs of every env step, on the device, allocated once.

Per env-step: the observation (in the compact dtype the policy reads), the action (uint8 for up
to 256 choices), the rollout policy's log-prob, the reward, and two flags: `valid` (the step
belongs to an episode that counts) and `cut` (its episode, or the member's path, ends there:
returns stop at it).
"""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import torch

from grpo_trainer.algorithm.policy import ActionHead
from grpo_trainer.envs.episodes import EpisodeRunner


def storage_dtype(space: gym.Space, choice: str) -> torch.dtype:
    """How rollouts store observations; the policy reads them in this dtype, always.

    "auto" keeps integer observations (images) as they are, stores float observations with
    finite bounds within float16 range as float16, and anything else as float32. Because
    the policy sees the stored value in the rollout and in the update alike, nothing it
    used is lost.
    """
    explicit = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if choice in explicit:
        return explicit[choice]
    dtype = torch.from_numpy(space.sample().reshape(-1)[:1]).dtype if space.shape else torch.float32
    if not dtype.is_floating_point:
        return dtype
    low, high = getattr(space, "low", None), getattr(space, "high", None)
    limit = torch.finfo(torch.float16).max
    bounded = low is not None and bool((abs(low) <= limit).all() and (abs(high) <= limit).all())
    return torch.float16 if bounded else torch.float32


class RolloutBuffer:
    """`(rows, num_envs, ...)` tensors, allocated once and reused every update.

    Rows `[0, trained_rows)` are trained on; the last `lookahead_rows` rows are the look-ahead
    of those returns and become the first rows of the next rollout.
    """

    def __init__(
        self,
        trained_rows: int,
        lookahead_rows: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        obs_dtype: torch.dtype,
        head: ActionHead,
        device: torch.device,
    ) -> None:
        self.trained_rows, self.lookahead_rows = trained_rows, lookahead_rows
        self.num_envs = num_envs
        self.rows = rows = trained_rows + lookahead_rows
        self.obs = torch.zeros((rows, num_envs, *obs_shape), dtype=obs_dtype, device=device)
        self.actions = torch.zeros(
            (rows, num_envs, *head.action_shape), dtype=head.action_dtype, device=device
        )
        self.logp = torch.zeros((rows, num_envs), dtype=torch.float32, device=device)
        self.rewards = torch.zeros((rows, num_envs), dtype=torch.float32, device=device)
        self.valid = torch.zeros((rows, num_envs), dtype=torch.bool, device=device)
        self.cut = torch.zeros((rows, num_envs), dtype=torch.bool, device=device)

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        return {
            "obs": self.obs,
            "actions": self.actions,
            "logp": self.logp,
            "rewards": self.rewards,
            "valid": self.valid,
            "cut": self.cut,
        }

    @property
    def bytes_per_step(self) -> int:
        """Bytes stored per env-step (every tensor above, per (row, sub-env) entry)."""
        return sum(t[0, 0].numel() * t.element_size() for t in self.tensors.values())

    def shift_lookahead(self) -> None:
        """Move the look-ahead rows of the last rollout to the front."""
        if not self.lookahead_rows:
            return
        overlap = self.trained_rows < self.lookahead_rows  # the tail overlaps the front
        for t in self.tensors.values():
            tail = t[self.trained_rows :]
            t[: self.lookahead_rows] = tail.clone() if overlap else tail


class Rollout(NamedTuple):
    """What one collection produced: views of the buffer, and device statistics."""

    obs: torch.Tensor  # (T, B, ...) the trained rows
    actions: torch.Tensor
    logp: torch.Tensor
    rewards: torch.Tensor  # (rows, B): trained rows and their look-ahead
    valid: torch.Tensor  # (rows, B) bool
    cut: torch.Tensor  # (rows, B) bool
    episodes: dict[str, torch.Tensor]  # EpisodeStats.sums() of the episodes that ended
    length_max: torch.Tensor  # () longest current episode (episodes mode: its horizon)
    earlier_policy_rows: int  # leading trained rows played by the policy of an earlier update
    window: int  # how many rows ahead a step's return may look


def rollout_view(buffer: RolloutBuffer, runner: EpisodeRunner, rows: int, window: int) -> Rollout:
    """The first `rows` rows of `buffer` as a `Rollout`."""
    trained = min(buffer.trained_rows, rows)
    return Rollout(
        buffer.obs[:trained],
        buffer.actions[:trained],
        buffer.logp[:trained],
        buffer.rewards[:rows],
        buffer.valid[:rows],
        buffer.cut[:rows],
        runner.stats.sums(),
        runner.lengths.max(),
        min(buffer.lookahead_rows, trained),
        window,
    )
