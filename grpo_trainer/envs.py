"""Making the vector env a config names: `gymnasium.make_vec` plus what the env declares.

When the trainer builds its own env it passes `device` if the env takes one, and the env's
declared fast options: a vector env class may list, in `metadata["fast_kwargs"]`, keyword
arguments that are safe for a caller whose actions always come from the action space and
that make it faster (Fruit Catcher: no per-step action check). The user's `env_kwargs` win.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import gymnasium as gym
import torch

from grpo_trainer.config import GRPOConfig


def make_envs(config: GRPOConfig, num_envs: int, device: torch.device, **extra: Any) -> Any:
    """`gymnasium.make_vec` for the config's env, with `device` and the env's fast options."""
    creator = _vector_creator(config.run.env)
    kwargs: dict[str, Any] = {}
    if creator is not None:
        kwargs.update(getattr(creator, "metadata", {}).get("fast_kwargs", {}))
        if _accepts(creator, "device"):
            kwargs["device"] = str(device)
    kwargs.update(config.run.env_kwargs)
    kwargs.update(extra)
    try:
        return gym.make_vec(config.run.env, num_envs=num_envs, **kwargs)
    except (gym.error.Error, ModuleNotFoundError) as err:
        raise ValueError(f"cannot make env {config.run.env!r}: {err}") from None


def _vector_creator(env_id: str) -> Any:
    """The registered vector entry point of `env_id` (a class or function), or None."""
    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        entry = gym.spec(name).vector_entry_point
    except (gym.error.Error, ModuleNotFoundError):
        return None
    if entry is None:
        return None
    return gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry


def _accepts(creator: Any, name: str) -> bool:
    try:
        return name in inspect.signature(creator).parameters
    except (TypeError, ValueError):
        return False
