"""The trainer's only view of an environment: the Gymnasium vector API and its spaces.

`EnvIO` turns whatever a vector env returns (torch tensors, or numpy arrays as Gymnasium's
own envs give) into tensors on the trainer's device, zero-copy where the memory allows, and
turns actions back. It also resets groups: all members of a group get the same seed.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

log = logging.getLogger(__name__)


class EnvStep(NamedTuple):
    obs: torch.Tensor
    reward: torch.Tensor  # (B,) float32
    done: torch.Tensor  # (B,) bool: terminated or truncated
    episode: dict[str, tuple[torch.Tensor, torch.Tensor]]  # name -> (values, mask)


def to_tensor(x: Any, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """numpy or torch -> tensor on `device`; shares memory when it is already there."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    return torch.as_tensor(x, device=device, dtype=dtype)


class EnvIO:
    """Adapter between one Gymnasium vector env and the trainer's device."""

    def __init__(self, envs: gym.vector.VectorEnv, device: torch.device) -> None:
        if not hasattr(envs, "num_envs") or not hasattr(envs, "single_action_space"):
            raise ValueError(f"expected a gymnasium.vector.VectorEnv, got {type(envs).__name__}")
        self.envs = envs
        self.device = device
        self.num_envs = int(envs.num_envs)
        self.observation_space = envs.single_observation_space
        self.action_space = envs.single_action_space
        self.numpy_actions: bool | None = None  # decided by what reset returns
        self.per_env_seeds: bool | None = None  # does reset accept a list of seeds?

    def max_episode_steps(self) -> int | None:
        """The env's own episode limit, from its spec (set by `gymnasium.make_vec`)."""
        spec = getattr(self.envs, "spec", None)
        steps = getattr(spec, "max_episode_steps", None)
        if steps is None and spec is not None:
            steps = spec.kwargs.get("max_episode_steps")
        return int(steps) if steps else None

    def reset_groups(self, group_seeds: list[int], group_size: int) -> torch.Tensor:
        """Reset every sub-env; members of group g get `group_seeds[g]`, so they start alike.

        Envs whose `reset` takes only an int seed (Gymnasium's CartPoleVectorEnv, say) get
        one seed for all: their members then start from different states, and a warning
        says so once.
        """
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

    def step(self, action: torch.Tensor) -> EnvStep:
        if self.numpy_actions:
            env_action: Any = action.detach().cpu().numpy()
        else:
            env_action = action
        obs, reward, terminated, truncated, info = self.envs.step(env_action)
        done = to_tensor(terminated, self.device, torch.bool) | to_tensor(
            truncated, self.device, torch.bool
        )
        return EnvStep(
            self._obs(obs), to_tensor(reward, self.device, torch.float32), done, self._episode(info)
        )

    # -- internals ---------------------------------------------------------------------------

    def _obs(self, obs: Any) -> torch.Tensor:
        if self.numpy_actions is None:
            self.numpy_actions = not isinstance(obs, torch.Tensor)
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
                fields[name] = (to_tensor(values, self.device, torch.float32), mask)
        return fields

    def _check_identical_starts(self, obs: Any, group_size: int) -> None:
        """Once, at the first reset: warn if equal seeds did not give equal observations."""
        first = to_tensor(obs, torch.device("cpu")).reshape(self.num_envs, -1)
        grouped = first.unflatten(0, (-1, group_size))
        if not bool((grouped == grouped[:, :1]).all()):
            warnings.warn(
                "sub-envs reset with equal seeds returned different observations; "
                "group members may not start from identical states",
                RuntimeWarning,
                stacklevel=3,
            )
