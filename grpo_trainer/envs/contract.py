"""What the trainer needs from a vector env, read once from the env instance: `EnvContract`.

Any Gymnasium vector env works: what an env does not declare takes a default. A torch-native
env declares more, as attributes and `metadata` of the instance (fruit_env's kit does all of
it; no entry point's signature is read):

* `device`: where its tensors live (an env without one is a host env: numpy);
* `max_episode_steps`, else its spec's: the episode limit (the default window follows it);
* `metadata["fast_kwargs"]`: options safe for a caller whose actions always come from the
  action space, which make it faster (the kit: no per-step action check); the trainer sets
  them on the instance (`apply_fast_options`) unless the user's `env_kwargs` name them;
* `metadata["free_kwargs"]`: env kwargs that change how it runs, never its games (a resumed
  run may change them);
* `metadata["episode_ratios"]` / `["episode_goals"]`: success ratios over its episode fields
  and the scores it calls good enough;
* `snapshot_state` / `restore_state`: the sub-env state protocol, so groups restart (and
  branch) from snapshots rather than from seeds.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from grpo_trainer.envs.state import has_state_protocol

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EnvContract:
    """One vector env as the trainer sees it."""

    num_envs: int
    observation_space: gym.Space
    action_space: gym.Space
    device: torch.device | None  # None: a host (numpy) env
    episode_limit: int | None
    autoreset_mode: AutoresetMode
    fast_options: Mapping[str, Any]
    free_kwargs: frozenset[str]
    episode_ratios: Mapping[str, tuple[str, str]]
    episode_goals: Mapping[str, float]
    snapshots: bool  # it offers state snapshots itself (else its family's adapter may)


def is_spatial(space: gym.Space) -> bool:
    """An observation with two or more axes (a grid's planes, an image: a Box of shape
    (H, W, ...)): the derived defaults give such an env a critic (`GRPOConfig.value_coef`)."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) >= 2


def read_contract(envs: Any) -> EnvContract:
    """The contract of `envs` (an instance), with defaults for what it does not declare."""
    if not hasattr(envs, "num_envs") or not hasattr(envs, "single_action_space"):
        raise ValueError(f"expected a gymnasium.vector.VectorEnv, got {type(envs).__name__}")
    metadata = getattr(envs, "metadata", None) or {}
    device = getattr(envs.unwrapped, "device", None)
    fast = dict(metadata.get("fast_kwargs", {}))
    return EnvContract(
        num_envs=int(envs.num_envs),
        observation_space=envs.single_observation_space,
        action_space=envs.single_action_space,
        device=torch.device(device) if isinstance(device, (str, torch.device)) else None,
        episode_limit=_episode_limit(envs),
        autoreset_mode=AutoresetMode(metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)),
        fast_options=fast,
        free_kwargs=frozenset({"device", "render_mode", *fast, *metadata.get("free_kwargs", ())}),
        episode_ratios=dict(metadata.get("episode_ratios", {})),
        episode_goals=dict(metadata.get("episode_goals", {})),
        snapshots=has_state_protocol(envs),
    )


def apply_fast_options(envs: Any, given: Mapping[str, Any]) -> None:
    """Set the env's declared fast options on the instance, except those the user gave: the
    same options whether the env is registered as a class or as a function."""
    target = envs.unwrapped
    for name, value in read_contract(envs).fast_options.items():
        if name not in given and hasattr(target, name):
            setattr(target, name, value)


def _episode_limit(envs: Any) -> int | None:
    """The env's own `max_episode_steps` (what it was made with), else its spec's (set by
    `gymnasium.make_vec` from the registration)."""
    own = getattr(envs.unwrapped, "max_episode_steps", None)
    if isinstance(own, (int, np.integer)) and not isinstance(own, bool) and own > 0:
        return int(own)
    spec = getattr(envs, "spec", None)
    steps = getattr(spec, "max_episode_steps", None)
    if steps is None and spec is not None:  # an EnvSpec registered without a limit
        steps = (getattr(spec, "kwargs", None) or {}).get("max_episode_steps")
    return int(steps) if steps else None
