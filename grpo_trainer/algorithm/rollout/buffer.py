"""Rollout storage, on the device, allocated once (docs/trainer.md, "Storage and speed"); what
fills it (`ExplorationNoise`, `Recorder`) and what leaves it (`Rollout`, `RolloutCheckpoint`).
`valid`: the step's episode counts; `cut`: its episode or path ends there (returns stop);
`bootstrap`: it ended by a time limit and the next row holds its last observation, so a
critic's value there carries its return on (Pardo et al., 2018, "Time Limits in
Reinforcement Learning").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import gymnasium as gym
import torch

from grpo_trainer.algorithm.policy import ActionHead
from grpo_trainer.base.collective import Collective
from grpo_trainer.base.config import GRPOConfig
from grpo_trainer.envs.episodes import EpisodeRunner, RunnerStep

SampleFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# Settings a windowed rollout's saved episodes depend on: with others they cannot continue.
ROLLOUT_FIELDS = ("rollout", "rollout_steps", "window", "num_groups", "group_size")
# a checkpoint's order
BUFFER_TENSORS = ("obs", "actions", "logp", "rewards", "valid", "cut", "bootstrap")
NEWER_BUFFER_TENSORS = frozenset({"bootstrap"})  # older checkpoints lack them, and carry none


def storage_dtype(space: gym.Space, choice: str) -> torch.dtype:
    """How rollouts store observations ("auto": integers as they are, floats bounded within
    float16's range as float16, else float32). The policy reads them in this dtype, in the
    rollout and in the update alike, so nothing it used is lost."""
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
    """`(rows, num_envs, ...)` tensors, reused every update: rows `[0, trained_rows)` are
    trained on; the last `lookahead_rows`, their returns' look-ahead, open the next rollout."""

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
        self.bootstrap = torch.zeros((rows, num_envs), dtype=torch.bool, device=device)

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in BUFFER_TENSORS}

    @property
    def bytes_per_step(self) -> int:
        """Bytes stored per env-step (every tensor above, per (row, sub-env) entry)."""
        return sum(t[0, 0].numel() * t.element_size() for t in self.tensors.values())

    def shift_lookahead(self) -> None:
        """Move the look-ahead rows of the last rollout to the front. Where they overlap it
        (a look-ahead longer than a rollout), blocks of `trained_rows` rows move front to
        back: a block's source lies past every row written before it, so each row is copied
        once, without the clone of the whole tail that a single copy would need."""
        shift, rows = self.trained_rows, self.lookahead_rows
        for t in self.tensors.values():
            for start in range(0, rows, shift):
                stop = min(start + shift, rows)
                t[start:stop] = t[start + shift : stop + shift]


class Rollout(NamedTuple):
    """What one collection produced: views of the buffer, and device statistics."""

    obs: torch.Tensor  # (T, B, ...) the trained rows
    actions: torch.Tensor
    logp: torch.Tensor
    rewards: torch.Tensor  # (rows, B): trained rows and their look-ahead
    valid: torch.Tensor  # (rows, B) bool
    cut: torch.Tensor  # (rows, B) bool
    bootstrap: torch.Tensor  # (rows, B) bool: cut by a time limit, the next row its last obs
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
        buffer.bootstrap[:rows],
        runner.stats.sums(),
        runner.lengths.max(),
        min(buffer.lookahead_rows, trained),
        window,
    )


class ExplorationNoise:
    """The noise each sub-env samples its actions with. With the head's `noise_correlation`
    rho > 0 (a Gaussian's), a sub-env's noise is an AR(1) process,
    `n_t = rho n_(t-1) + sqrt(1 - rho^2) z_t`, which pushes one way for about 1 / (1 - rho)
    steps (colored-noise exploration, Eberhard et al., 2023). A step samples its stored action
    with the innovation `sqrt(1 - rho^2) z_t` alone, and the env gets the carried part
    `rho n_(t-1)` on top: its log-prob credits the step with what it drew, not with what
    earlier steps drew. Credited with the whole noise, a step's std answers for pushes it did
    not choose, and it collapsed on Pendulum (docs/trainer.md, "Correlated exploration for
    MountainCarContinuous"). A sub-env's noise starts from rest (nothing carried)."""

    def __init__(self, head: ActionHead, num_envs: int) -> None:
        self.head, self.num_envs = head, num_envs
        # the head's own rho, so the noise and the log-probs scaled by it always agree
        self.correlation = head.noise_correlation
        self.innovation = math.sqrt(1.0 - self.correlation * self.correlation)
        self.last: torch.Tensor | None = None  # what the last step drew (kept in checkpoints)

    def draw(
        self, generator: torch.Generator, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This step's noise to sample with, and the noise carried over (None: nothing)."""
        fresh = self.head.noise(self.num_envs, generator, device)
        if not self.correlation:
            self.last = fresh
            return fresh, None
        innovation = fresh * self.innovation
        carried = None if self.last is None else self.last * self.correlation
        self.last = innovation if carried is None else carried + innovation
        return innovation, carried


class Recorder:
    """Plays the policy into the buffer: `act` samples from the stored (compact) observation,
    as the update will read it; `record` stores what the step brought. Values are written
    straight into the buffer (`copy_` casts): at small batches the op count is the cost."""

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
        noise, carried = self.noise.draw(self.generator, obs.device)
        action, logp = self.sample(stored, noise)
        buffer.actions[row].copy_(action)
        buffer.logp[row].copy_(logp)
        return self.head.to_env(action if carried is None else self.head.shift(action, carried))

    def record(self, row: int, step: RunnerStep) -> None:
        buffer = self.buffer
        buffer.rewards[row].copy_(step.reward)
        buffer.valid[row].copy_(step.alive)
        buffer.cut[row].copy_(step.ended)
        buffer.bootstrap[row].copy_(step.timed_out)  # a restart that replaces the obs clears it


class RolloutCheckpoint(NamedTuple):
    """What a checkpoint holds of a rollout, for one rank."""

    state: dict[str, Any] | None  # this rank's state_dict(); None: other settings or ranks
    horizon: int  # the steps per sub-env the next collect plays
    updates: int  # updates done
    source: str  # where the checkpoint came from, for messages

    @classmethod
    def for_rank(
        cls, payload: dict[str, Any], config: GRPOConfig, collective: Collective, source: str
    ) -> RolloutCheckpoint:
        """This rank's rollout state in `payload`, if written with these settings and ranks."""
        states, saved = payload.get("rollouts") or [], payload["config"]
        same = all(saved.get(k) == getattr(config, k) for k in ROLLOUT_FIELDS)
        ranks = collective.world_size
        state = states[collective.rank] if same and len(states) == ranks else None
        return cls(state, int(payload["horizon"]), int(payload["update_index"]), source)
