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

    Every operation here runs once per step, so at small batches their count is the cost
    (a few microseconds each): values are written straight into the buffer (`copy_` casts),
    and episode statistics are kept per sub-env and summed once at the end. Each member
    ends at most one episode while alive, so a per-env slot holds that episode's value.
    """
    device = buffer.lengths.device
    alive = torch.ones(buffer.num_envs, dtype=torch.bool, device=device)
    zero = torch.zeros((), device=device)
    buffer.lengths.zero_()
    info_values: dict[str, torch.Tensor] = {}  # name -> (B,) value of b's ended episode
    info_taken: dict[str, torch.Tensor] = {}  # name -> (B,) bool: b reported it
    for t in range(horizon):
        stored = buffer.obs[t]
        stored.copy_(obs)  # the policy reads the stored (compact) value, as the update will
        action, logp = sample(stored, head.noise(buffer.num_envs, generator, device))
        buffer.actions[t].copy_(action)
        buffer.logp[t].copy_(logp)
        step = env.step(head.to_env(action))
        torch.where(alive, step.reward, zero, out=buffer.rewards[t])
        buffer.lengths += alive
        ended = alive & step.done
        taken_by_mask: dict[int, torch.Tensor] = {}  # fields usually share one mask
        for name, (values, mask) in step.episode.items():
            taken = taken_by_mask.get(id(mask))
            if taken is None:
                taken = taken_by_mask[id(mask)] = ended & mask
            if name not in info_values:
                info_values[name] = torch.zeros_like(values, dtype=torch.float32)
                info_taken[name] = torch.zeros_like(taken)
            torch.where(taken, values, info_values[name], out=info_values[name])
            info_taken[name] |= taken
        alive = alive ^ ended
        obs = step.obs
    info_sums = {name: values.sum() for name, values in info_values.items()}
    info_counts = {name: taken.sum() for name, taken in info_taken.items()}
    return RolloutStats(~alive, info_sums, info_counts)
