"""Rollouts: every group member plays one episode; storage is preallocated on the device.

Storage per env-step is what the loss needs and nothing else: the observation (in the
compact dtype the policy reads), the action (uint8 for up to 256 choices), the rollout
policy's log-prob and the reward. Validity is not stored: it is `t < length[b]`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from grpo_trainer.env_io import EnvIO
from grpo_trainer.policy import ActionHead

SampleFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class RolloutBuffer:
    """`(horizon, num_envs, ...)` tensors, allocated once and reused every update."""

    def __init__(
        self,
        horizon: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        obs_dtype: torch.dtype,
        head: ActionHead,
        device: torch.device,
    ) -> None:
        self.horizon, self.num_envs = horizon, num_envs
        self.obs = torch.zeros((horizon, num_envs, *obs_shape), dtype=obs_dtype, device=device)
        self.actions = torch.zeros(
            (horizon, num_envs, *head.action_shape), dtype=head.action_dtype, device=device
        )
        self.logp = torch.zeros((horizon, num_envs), dtype=torch.float32, device=device)
        self.rewards = torch.zeros((horizon, num_envs), dtype=torch.float32, device=device)
        self.lengths = torch.zeros(num_envs, dtype=torch.int64, device=device)

    @property
    def bytes_per_step(self) -> int:
        """Bytes stored per env-step (the tensors above, per (t, b) entry)."""
        per_step = (self.obs, self.actions, self.logp, self.rewards)
        return sum(t[0, 0].numel() * t.element_size() for t in per_step)

    def valid(self, horizon: int) -> torch.Tensor:
        """`(horizon, B)` bool: member b was still playing at step t."""
        steps = torch.arange(horizon, device=self.lengths.device)
        return steps[:, None] < self.lengths[None, :]


class RolloutStats(NamedTuple):
    """Device tensors summarising a rollout's episodes (copied to the host with the metrics)."""

    finished: torch.Tensor  # (B,) bool: the episode ended inside the horizon
    info_sums: dict[str, torch.Tensor]  # numeric info["episode"] fields, summed over episodes
    info_counts: dict[str, torch.Tensor]


@torch.inference_mode()
def collect(
    env: EnvIO,
    obs: torch.Tensor,
    sample: SampleFn,
    head: ActionHead,
    buffer: RolloutBuffer,
    horizon: int,
    generator: torch.Generator,
) -> RolloutStats:
    """Play `horizon` steps from the reset observation `obs`; steps after an end are masked.

    No host synchronisation: the loop runs the full horizon whatever happens (the trainer
    shortens the horizon between updates when episodes end early).
    """
    device = buffer.lengths.device
    alive = torch.ones(buffer.num_envs, dtype=torch.bool, device=device)
    buffer.lengths.zero_()
    info_sums: dict[str, torch.Tensor] = {}
    info_counts: dict[str, torch.Tensor] = {}
    for t in range(horizon):
        stored = obs.to(buffer.obs.dtype)
        buffer.obs[t] = stored
        action, logp = sample(stored, head.noise(buffer.num_envs, generator, device))
        buffer.actions[t] = action.to(buffer.actions.dtype)
        buffer.logp[t] = logp
        step = env.step(head.to_env(action))
        buffer.rewards[t] = torch.where(alive, step.reward, 0.0)
        buffer.lengths += alive
        ended = alive & step.done
        for name, (values, mask) in step.episode.items():
            taken = ended & mask
            info_sums[name] = info_sums.get(name, 0) + torch.where(taken, values, 0.0).sum()
            info_counts[name] = info_counts.get(name, 0) + taken.sum()
        alive = alive & ~step.done
        obs = step.obs
    return RolloutStats(~alive, info_sums, info_counts)
