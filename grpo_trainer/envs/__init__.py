"""Making the vector env a config names: `gymnasium.make_vec`, then the env's contract.

A vector entry point is asked for the trainer's `device`; one that refuses the keyword
(Gymnasium's numpy vector envs) is made without it, and per-sub-env envs never get it. The
env's fast options are then set on the instance from what it declares
(`contract.apply_fast_options`, no signature read), so a game registered as a function gets
the same as one registered as a class; the user's `env_kwargs` win. Libraries with their own
vector API come through `FACTORIES`, by prefix (`gymnax:`, `envpool:`, `minatar:`), each
importing its library only when called and warning once about what its envs lack.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from grpo_trainer.base.config import GRPOConfig
from grpo_trainer.envs.contract import apply_fast_options


def make_envs(config: GRPOConfig, num_envs: int, device: torch.device, **extra: Any) -> Any:
    """`gymnasium.make_vec` for the config's env on `device`, with the env's fast options;
    or the factory its prefix names (`FACTORIES`)."""
    prefix, _, name = config.run.env.partition(":")
    given = {**config.run.env_kwargs, **extra}
    if name and prefix in FACTORIES:
        try:
            return FACTORIES[prefix](name, num_envs, device, config.run.seed, given)
        except ModuleNotFoundError as err:
            raise ValueError(
                f"env {config.run.env!r} needs {err.name!r}: pip install -e '.[{prefix}]'"
            ) from None
    try:
        if _native_vector(config.run.env, given) and "device" not in given:
            try:
                envs = gym.make_vec(config.run.env, num_envs, device=str(device), **given)
            except TypeError as err:
                if "'device'" not in str(err):  # refused another keyword: the user's to fix
                    raise
                envs = gym.make_vec(config.run.env, num_envs, **given)  # a numpy vector env
        else:
            envs = gym.make_vec(config.run.env, num_envs, **given)
    except (gym.error.Error, ModuleNotFoundError) as err:
        raise ValueError(f"cannot make env {config.run.env!r}: {err}") from None
    apply_fast_options(envs, given)
    return envs


def _native_vector(env_id: str, kwargs: dict[str, Any]) -> bool:
    """Will `make_vec` call `env_id`'s vector entry point (rather than one env per sub-env)?"""
    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)  # registers its envs; a missing module: make_vec says
    try:
        spec = gym.spec(name)
    except gym.error.Error:
        return False
    mode = kwargs.get("vectorization_mode")
    return spec.vector_entry_point is not None and mode in (None, "vector_entry_point")


# -- envs from libraries with their own vector API ---------------------------------------------

Factory = Callable[[str, int, torch.device, int, dict[str, Any]], Any]


def _gymnax(name: str, num_envs: int, device: torch.device, seed: int, kwargs: dict) -> Any:
    """A gymnax env in `GymnaxVectorEnv`, on the trainer's device (JAX and torch share it),
    with the fast options for a caller whose actions come from the action space. gymnax's
    `make` takes the remaining `env_kwargs`."""
    if device.type == "cuda":  # share the GPU with torch: JAX must not take 75% up front
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import gymnax

    keep_compiled_functions()

    from grpo_trainer.envs.gymnax_vector import GymnaxVectorEnv

    options = {**GymnaxVectorEnv.metadata["fast_kwargs"]}
    options.update({k: kwargs.pop(k) for k in list(kwargs) if k in options})
    env, params = gymnax.make(name, **kwargs)
    return GymnaxVectorEnv(env, params, num_envs, device, **options)


def jax_cache_dir() -> Path:
    """Where the trainer's gymnax envs keep JAX's compiled functions: `$GRPO_TRAINER_CACHE_DIR`,
    else `$XDG_CACHE_HOME/grpo_trainer/jax`, else `~/.cache/grpo_trainer/jax`."""
    if os.environ.get("GRPO_TRAINER_CACHE_DIR"):
        return Path(os.environ["GRPO_TRAINER_CACHE_DIR"]) / "jax"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "grpo_trainer" / "jax"


def keep_compiled_functions() -> None:
    """Turn on JAX's persistent compilation cache, unless the user configured one: a gymnax
    env's functions take seconds to compile, most of a short run's time (docs/integrations.md,
    "Compilation"); JAX keys each entry by the program, so only the same program reuses it."""
    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir", str(jax_cache_dir()))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def _envpool(name: str, num_envs: int, device: torch.device, seed: int, kwargs: dict) -> Any:
    """An EnvPool env (numpy, C++ threads). Its seeds are fixed when it is made, so
    `reset(seed=...)` cannot start a group's members alike."""
    import envpool

    warnings.warn(
        f"envpool:{name}: seeds are fixed at creation (its reset ignores seeds), so group "
        "members do not start alike; they are compared at the same step",
        stacklevel=3,
    )
    env = envpool.make_gymnasium(name, num_envs=num_envs, seed=seed, **kwargs)
    env.max_episode_steps = env.spec.config.max_episode_steps  # EnvPool keeps it in its config
    return env


def _minatar(name: str, num_envs: int, device: torch.device, seed: int, kwargs: dict) -> Any:
    """A MinAtar game (10x10 image planes, no time limit) in Gymnasium's `SyncVectorEnv`.
    Its sub-envs can be copied, so the trainer restarts a group by copying one member's new
    game to the others (`copied_state`): the same board, the same sticky-action memory and
    random state, so the same first step."""
    import minatar.gym

    minatar.gym.register_envs()
    warnings.warn(
        f"minatar:{name}: no episode limit (windowed rollouts need none; rollout='episodes' "
        "needs max_episode_steps)",
        stacklevel=3,
    )
    return gym.make_vec(f"MinAtar/{name}", num_envs=num_envs, vectorization_mode="sync", **kwargs)


FACTORIES: dict[str, Factory] = {"gymnax": _gymnax, "envpool": _envpool, "minatar": _minatar}
