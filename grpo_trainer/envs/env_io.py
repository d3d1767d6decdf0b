"""The trainer's only view of an environment: the Gymnasium vector API and its spaces.

`EnvIO` turns what a vector env returns (torch or numpy) into tensors on the trainer's device,
zero-copy where it can, turns actions back, and starts groups alike. How a group starts again
while its neighbours play on is found once from what the env offers: `FromSnapshots` (the
state protocol of docs/env.md; groups can branch), `FromSeeds` or `ByAutoreset`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from grpo_trainer.envs.contract import read_contract
from grpo_trainer.envs.state import has_state_protocol, with_state_protocol

__all__ = [
    "ByAutoreset",
    "EnvIO",
    "EnvStep",
    "FromSeeds",
    "FromSnapshots",
    "RestartMethod",
    "has_state_protocol",
    "to_tensor",
]

log = logging.getLogger(__name__)


class EnvStep(NamedTuple):
    obs: torch.Tensor
    reward: torch.Tensor  # (B,) float32
    done: torch.Tensor  # (B,) bool: terminated or truncated
    terminated: torch.Tensor  # (B,) bool: the game ended it (not a time limit)
    episode: dict[str, tuple[torch.Tensor, torch.Tensor]]  # name -> (values, mask)


def to_tensor(x: Any, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """numpy or torch -> tensor on `device`; shares memory when it is already there. The
    reference is `fruit_env.interop.wrappers.to_torch` (tests/test_shared_concepts.py)."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    return torch.as_tensor(x, device=device, dtype=dtype)


class EnvIO:
    """Adapter between one Gymnasium vector env and the trainer's device."""

    def __init__(self, envs: gym.vector.VectorEnv, device: torch.device) -> None:
        self.contract = contract = read_contract(envs)
        self.envs = with_state_protocol(envs)
        self.device = device
        self.num_envs = contract.num_envs
        self.observation_space = contract.observation_space
        self.action_space = contract.action_space
        self.autoreset_mode = contract.autoreset_mode
        # e.g. Fruit Catcher's {"catch_rate": ("caught", "missed")}: hits / (hits + misses)
        self.episode_ratios = dict(contract.episode_ratios)
        self.episode_goals = dict(contract.episode_goals)  # recorded when first reached
        self.free_kwargs = contract.free_kwargs
        self.restart_method = _restart_method(self)
        # actions as the env takes them: numpy if its first reset returns numpy, else tensors
        self.env_actions: Callable[[torch.Tensor], Any] = _before_reset
        self.per_env_seeds: bool | None = None  # does reset accept a list of seeds?
        self.indices = torch.arange(self.num_envs, device=device)  # every sub-env, in order

    def max_episode_steps(self) -> int | None:
        """The env's own episode limit (`EnvContract.episode_limit`)."""
        return self.contract.episode_limit

    # -- starting groups ---------------------------------------------------------------------

    def reset_groups(self, group_seeds: list[int], group_size: int) -> torch.Tensor:
        """Reset every sub-env; members of group g get `group_seeds[g]`, so they start alike
        (an env whose `reset` takes only an int gets one seed for all, and a warning once)."""
        seeds = [s for s in group_seeds for _ in range(group_size)]
        if self.per_env_seeds is not False:
            try:
                obs, _ = self.envs.reset(seed=seeds)
                if self.per_env_seeds is None:
                    self.per_env_seeds = True
                    self._check_identical_starts(obs, group_size)
                return self._obs(obs)
            except (TypeError, ValueError, AssertionError, gym.error.Error) as err:
                if self.per_env_seeds:
                    raise
                self.per_env_seeds = False
                warnings.warn(
                    f"{type(self.envs).__name__}.reset does not take a list of seeds ({err}); "
                    "group members will not start from identical states",
                    RuntimeWarning,
                    stacklevel=2,
                )
        obs, _ = self.envs.reset(seed=group_seeds[0])
        return self._obs(obs)

    def restart(
        self,
        obs: torch.Tensor,
        fresh: torch.Tensor,
        source: torch.Tensor,
        seeds: Callable[[], list[int]],
    ) -> torch.Tensor:
        """Start sub-envs again while the others play on; returns the new observations.

        `fresh` `(B,)` marks sub-envs that start a new game (seeded resets: with `seeds()[b]`);
        every sub-env `b` ends up in the state of sub-env `source[b]`, so with snapshots one
        whose source is another, not fresh one *branches* from the state that one reached.
        """
        return self.restart_method.restart(obs, fresh, source, seeds)

    # -- stepping ------------------------------------------------------------------------------

    def step(self, action: torch.Tensor) -> EnvStep:
        obs, reward, terminated, truncated, info = self.envs.step(self.env_actions(action))
        device = self.device
        terminated = to_tensor(terminated, device, torch.bool)
        truncated = to_tensor(truncated, device, torch.bool)
        reward = to_tensor(reward, device, torch.float32)
        return EnvStep(
            self._obs(obs), reward, terminated | truncated, terminated, self._episode(info)
        )

    # -- state snapshots (FromSnapshots) -----------------------------------------------------

    def snapshot(self) -> Any:
        """Every sub-env's state, for a checkpoint (CPU tensors); None where the env has no
        snapshots, or they are not arrays (copied Python envs: a checkpoint holds tensors
        only, and loads no code)."""
        return self.restart_method.snapshot()

    def restore(self, snapshot: Any) -> None:
        """Put back what `snapshot()` returned (a checkpoint's env state)."""
        self.envs.restore_state(self.indices, tuple(t.to(self.device) for t in snapshot))

    # -- internals ---------------------------------------------------------------------------

    def _obs(self, obs: Any) -> torch.Tensor:
        if self.env_actions is _before_reset:
            self.env_actions = _as_tensor if isinstance(obs, torch.Tensor) else _as_numpy
        return to_tensor(obs, self.device)

    def _episode(self, info: dict[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Numeric fields of `info["episode"]` with the `_episode` mask, as tensors."""
        episode = info.get("episode")
        if not isinstance(episode, dict) or "_episode" not in info:
            return {}
        mask = to_tensor(info["_episode"], self.device, torch.bool)
        fields = {}
        for name, values in episode.items():
            if name.startswith("_"):
                continue
            if isinstance(values, (np.ndarray, torch.Tensor)) and values.shape == mask.shape:
                fields[name] = (to_tensor(values, self.device), mask)
        return fields

    def _check_identical_starts(self, obs: Any, group_size: int) -> None:
        """Once, at the first reset: warn if equal seeds did not give equal observations."""
        if isinstance(obs, torch.Tensor) and obs.is_meta:
            return  # the test device: shapes without values, nothing to compare
        first = to_tensor(obs, torch.device("cpu")).reshape(self.num_envs, -1)
        grouped = first.unflatten(0, (-1, group_size))
        if not bool((grouped == grouped[:, :1]).all()):
            warnings.warn(
                "sub-envs reset with equal seeds returned different observations; "
                "group members may not start from identical states",
                RuntimeWarning,
                stacklevel=3,
            )


def _before_reset(action: torch.Tensor) -> Any:
    raise RuntimeError("reset the env (EnvIO.reset_groups) before stepping it")


def _as_tensor(action: torch.Tensor) -> torch.Tensor:
    return action


def _as_numpy(action: torch.Tensor) -> Any:
    return action.detach().cpu().numpy()


def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A `(B,)` mask shaped to broadcast over `(B, ...)` rows."""
    return mask.view(-1, *([1] * (like.dim() - 1)))


# -- how a sub-env starts again while its neighbours play on -----------------------------------

Seeds = Callable[[], list[int]]  # a restart point's seeds, one per sub-env (drawn when asked)


class RestartMethod:
    """What the env lets the trainer do to start sub-envs again, found once per env."""

    name = ""
    can_branch = False  # sub-envs can take each other's state
    restarts_itself = False  # only the env's own autoreset starts a sub-env again

    def __init__(self, io: EnvIO) -> None:
        self.io = io

    def restart(self, obs: Tensor, fresh: Tensor, source: Tensor, seeds: Seeds) -> Tensor:
        raise RuntimeError(f"{type(self.io.envs).__name__} restarts its sub-envs itself")

    def snapshot(self) -> Any:
        return None


class FromSnapshots(RestartMethod):
    """Sources reset (masked), then every sub-env takes its source's state; no host sync."""

    name = "snapshot"
    can_branch = True

    def restart(self, obs: Tensor, fresh: Tensor, source: Tensor, seeds: Seeds) -> Tensor:
        io = self.io
        leaders = fresh & (source == io.indices)
        new_obs, _ = io.envs.reset(options={"reset_mask": leaders})
        obs = torch.where(_rows(leaders, obs), io._obs(new_obs), obs)
        io.envs.restore_state(io.indices, io.envs.snapshot_state(source))
        return obs.index_select(0, source)

    def snapshot(self) -> Any:
        state = self.io.envs.snapshot_state(self.io.indices)
        if not all(isinstance(t, (torch.Tensor, np.ndarray)) for t in state):
            return None
        return [to_tensor(t, torch.device("cpu")).detach().clone() for t in state]


class FromSeeds(RestartMethod):
    """Restarting sub-envs reset with their group's seed (numpy envs: the mask read is free)."""

    name = "seeded"

    def restart(self, obs: Tensor, fresh: Tensor, source: Tensor, seeds: Seeds) -> Tensor:
        io, mask = self.io, fresh.cpu().numpy()
        if not mask.any():
            return obs
        per_env = [seed if m else None for seed, m in zip(seeds(), mask, strict=True)]
        new_obs, _ = io.envs.reset(seed=per_env, options={"reset_mask": mask})
        return torch.where(_rows(fresh, obs), io._obs(new_obs), obs)


class ByAutoreset(RestartMethod):
    """The env restarts each sub-env itself; the trainer only follows."""

    name = "independent"
    restarts_itself = True


def _restart_method(io: EnvIO) -> RestartMethod:
    if has_state_protocol(io.envs):  # the env's own, or its family adapter's
        return FromSnapshots(io)
    if isinstance(io.envs.unwrapped, (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv)):
        return FromSeeds(io)
    return ByAutoreset(io)
