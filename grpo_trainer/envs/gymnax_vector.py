"""A gymnax env as a torch vector env: one jit-compiled, vmapped step; torch in, torch out.

gymnax envs are pure functions of a state pytree, so what GRPO needs (a PRNG key chain per
sub-env, seeded masked resets, snapshots) is an index or a scatter on it, on the device. Why
it is ours rather than `GymnaxToVectorGymWrapper` + `JaxToTorch`: docs/integrations.md.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from grpo_trainer.envs.host_inputs import host_mask, per_env_seeds

__all__ = ["GymnaxVectorEnv", "JaxInputs", "jax_device"]


def jax_device(device: torch.device) -> Any:
    """The JAX device that shares memory with torch's `device` (CPU, or the same GPU)."""
    if device.type == "cpu":
        return jax.devices("cpu")[0]
    if device.type == "cuda":
        return jax.devices("gpu")[device.index or 0]
    raise ValueError(f"gymnax envs run on 'cpu' or 'cuda', not {device.type!r}")


def gymnasium_space(space: Any) -> gym.Space:
    """gymnax's `Discrete` / `Box` as Gymnasium's."""
    kind = type(space).__name__
    if kind == "Discrete":
        return gym.spaces.Discrete(int(space.n))
    if kind == "Box":
        low = np.broadcast_to(np.asarray(space.low, np.float32), space.shape)
        high = np.broadcast_to(np.asarray(space.high, np.float32), space.shape)
        return gym.spaces.Box(low, high, tuple(space.shape), np.float32)
    raise ValueError(f"gymnax space {kind} is not supported (Discrete and Box are)")


def _numpy_view(x: torch.Tensor) -> np.ndarray:
    return x.detach().numpy()


def _dlpack(x: torch.Tensor) -> jax.Array:
    return jax.dlpack.from_dlpack(x.detach().contiguous())


def torch_to_jax(device: torch.device) -> Callable[[torch.Tensor], Any]:
    """How torch tensors enter JAX on `device`: DLPack on a GPU; on the CPU a numpy view that
    the compiled call copies, cheaper there than JAX's DLPack import (docs/integrations.md)."""
    return _numpy_view if device.type == "cpu" else _dlpack


class GymnaxVectorEnv(gym.vector.VectorEnv):
    """`num_envs` copies of one gymnax env on `device`, stepped by one compiled call.

    `check_actions`: refuse out-of-range actions (a host read). `final_obs`: SAME_STEP's
    `info["final_obs"]`. `autoreset=False`: ended sub-envs wait for a masked reset or a
    restore (DISABLED). The trainer turns all three off (`metadata["fast_kwargs"]`).
    """

    metadata = {
        "autoreset_mode": AutoresetMode.SAME_STEP,
        "fast_kwargs": {"check_actions": False, "final_obs": False, "autoreset": False},
    }

    def __init__(
        self,
        env: Any,
        params: Any,
        num_envs: int,
        device: torch.device | str = "cpu",
        *,
        check_actions: bool = True,
        final_obs: bool = True,
        autoreset: bool = True,
    ) -> None:
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        self.env, self.params, self.num_envs = env, params, num_envs
        self.device = torch.device(device)
        self.check_actions = check_actions
        self.single_observation_space = gymnasium_space(env.observation_space(params))
        self.single_action_space = gymnasium_space(env.action_space(params))
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._inputs = JaxInputs(num_envs, self.device, self.single_action_space)
        limit = getattr(params, "max_steps_in_episode", None)
        self.max_episode_steps = int(limit) if limit is not None else None
        mode = AutoresetMode.SAME_STEP if autoreset else AutoresetMode.DISABLED
        self.metadata = {
            **self.metadata,
            "max_episode_steps": self.max_episode_steps,
            "autoreset_mode": mode,
        }
        self.autoreset_mode = mode
        self._state: Any = None  # the batched state pytree
        self._keys: jax.Array | None = None  # (N, 2) uint32, one key chain per sub-env
        self._obs: jax.Array | None = None  # (N, *obs_shape): each sub-env's latest obs
        step = functools.partial(self._compiled_step, autoreset=autoreset, final_obs=final_obs)
        self._step_fn = jax.jit(step)
        self._reset_fn = jax.jit(self._compiled_reset)
        # shapes and dtypes of (state, keys, observations), traced without computing anything
        keys = jax.ShapeDtypeStruct((num_envs, 2), jnp.uint32)
        obs, state = jax.eval_shape(jax.vmap(env.reset, in_axes=(0, None)), keys, params)
        self._shapes = (state, keys, jax.ShapeDtypeStruct(obs.shape, jnp.float32))
        self._gather_fn = jax.jit(_gather)
        self._scatter_fn = jax.jit(_scatter)

    # -- the compiled functions ------------------------------------------------------------

    def _compiled_step(
        self, state: Any, keys: jax.Array, action: jax.Array, *, autoreset: bool, final_obs: bool
    ) -> Any:
        """One step of every sub-env: state, keys, observations, `(N, 3)` reward and flags,
        and the info (the final observations, if asked). Without `autoreset`, gymnax's
        transition alone (`step_env`): no new game is drawn on the step."""
        split = jax.vmap(jax.random.split)(keys)
        action = action.astype(self._inputs.action_dtype)
        if autoreset:
            step = jax.vmap(self.env.step, in_axes=(0, 0, 0, None))
            obs, state, reward, terminated, truncated, info = step(
                split[:, 1], state, action, self.params
            )
        else:
            step = jax.vmap(self.env.step_env, in_axes=(0, 0, 0, None))
            obs, state, reward, terminated, _ = step(split[:, 1], state, action, self.params)
            truncated = jax.vmap(self.env.is_truncated, in_axes=(0, None))(state, self.params)
        flags = jnp.stack([reward, terminated, truncated], axis=1).astype(jnp.float32)
        final: dict[str, jax.Array] = {}
        if autoreset and final_obs:
            final["final_obs"] = info["final_observation"].astype(jnp.float32)
            final["_final_obs"] = terminated | truncated
        return state, split[:, 0], obs.astype(jnp.float32), flags, final

    def _compiled_reset(
        self, state: Any, keys: jax.Array, obs: Any, mask: jax.Array, seeds: jax.Array
    ) -> Any:
        """Sub-envs in `mask` start a new episode; a given seed (`seeds`: `JaxInputs.seeds`)
        restarts the key chain. The first reset comes here too, so a run compiles one reset."""
        given, low, high = seeds[:, 0] > 0, seeds[:, 1], seeds[:, 2]
        seeded = jax.vmap(jax.random.fold_in)(jax.vmap(jax.random.PRNGKey)(low), high)
        keys = jnp.where(given[:, None], seeded, keys)
        split = jax.vmap(jax.random.split)(keys)
        new_obs, new_state = jax.vmap(self.env.reset, in_axes=(0, None))(split[:, 1], self.params)
        new_obs = new_obs.astype(jnp.float32)
        keys = jnp.where(mask[:, None], split[:, 0], keys)
        state = jax.tree.map(lambda new, old: _where_rows(mask, new, old), new_state, state)
        return state, keys, _where_rows(mask, new_obs, obs)

    # -- the Gymnasium API ------------------------------------------------------------------

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Reset every sub-env, or those in `options["reset_mask"]`. `seed`: an int (sub-env `i`
        gets `seed + i`, as in Gymnasium), one seed or None per sub-env, or None (sub-envs
        continue their key chains; a first unseeded reset draws a random seed)."""
        super().reset(seed=None)
        mask = (options or {}).get("reset_mask")
        if mask is not None and self._state is None:
            raise RuntimeError("the first reset() resets every sub-env: it takes no reset_mask")
        seeds = self._inputs.seeds(seed, first=self._state is None)
        if self._state is None:  # what the first reset replaces: zeros of the state's shapes
            # (numpy's: a jnp.zeros per leaf would compile a small function per leaf)
            self._state, self._keys, self._obs = jax.tree.map(
                lambda leaf: np.zeros(leaf.shape, leaf.dtype), self._shapes
            )
        mask_j = jnp.ones(self.num_envs, jnp.bool_) if mask is None else self._inputs.mask(mask)
        self._state, self._keys, self._obs = self._reset_fn(
            self._state, self._keys, self._obs, mask_j, seeds
        )
        return torch.from_dlpack(self._obs), {}

    def step(
        self, actions: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        actions = self._inputs.actions(actions, self.check_actions)
        self._state, self._keys, self._obs, flags, info = self._step_fn(
            self._state, self._keys, actions
        )
        flags = torch.from_dlpack(flags)
        ended = flags[:, 1:] > 0  # terminated, truncated: one op, two views
        info = {name: torch.from_dlpack(value) for name, value in info.items()}
        return torch.from_dlpack(self._obs), flags[:, 0], ended[:, 0], ended[:, 1], info

    # -- sub-env state snapshots (docs/env.md) ---------------------------------------------

    def snapshot_state(self, index: Any) -> tuple[torch.Tensor, ...]:
        """Sub-envs `index` as torch tensors: key, latest observation, gymnax's state leaves."""
        if self._state is None:
            raise RuntimeError("call reset() before snapshot_state()")
        rows = self._gather_fn((self._keys, self._obs, self._state), self._inputs.index(index))
        return tuple(torch.from_dlpack(leaf) for leaf in jax.tree.leaves(rows))

    def restore_state(self, index: Any, snapshot: Sequence[Any]) -> None:
        """Put row `j` of `snapshot` into sub-env `index[j]` (its key chain travels with it)."""
        if self._state is None:
            raise RuntimeError("call reset() before restore_state()")
        index_j = self._inputs.index(index)
        tree = (self._keys, self._obs, self._state)
        leaves, treedef = jax.tree.flatten(tree)
        if not isinstance(snapshot, (tuple, list)) or len(snapshot) != len(leaves):
            raise ValueError(
                f"snapshot must be the {len(leaves)} tensors snapshot_state() returned, "
                f"got {type(snapshot).__name__}"
            )
        rows = []
        for i, (leaf, row) in enumerate(zip(leaves, snapshot, strict=True)):
            row_j = (
                self._inputs.from_torch(row.to(self.device))
                if isinstance(row, torch.Tensor)
                else jnp.asarray(row, leaf.dtype)
            )
            if row_j.shape != (index_j.shape[0], *leaf.shape[1:]) or row_j.dtype != leaf.dtype:
                raise ValueError(
                    f"snapshot tensor {i} is {row_j.dtype} {tuple(row_j.shape)}, expected "
                    f"{leaf.dtype} {(index_j.shape[0], *leaf.shape[1:])}: it is from another "
                    "env or another index"
                )
            rows.append(row_j)
        tree = self._scatter_fn(tree, index_j, jax.tree.unflatten(treedef, rows))
        self._keys, self._obs, self._state = tree


class JaxInputs:
    """Seeds, reset masks, indices and actions for a `GymnaxVectorEnv`, checked, in JAX."""

    def __init__(self, num_envs: int, device: torch.device, action_space: gym.Space) -> None:
        self.num_envs, self.device, self.action_space = num_envs, device, action_space
        self.batched_action_space = batch_space(action_space, num_envs)
        self.jax_device = jax_device(device)
        self.from_torch = torch_to_jax(device)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_dtype = jnp.int32 if self.discrete else jnp.float32

    def seeds(self, seed: int | Sequence[int | None] | None, first: bool) -> jax.Array:
        """One row per sub-env: (given, low 32 bits, high 32 bits) of its seed, any int in
        [0, 2**64); a sub-env without one goes on with its key chain (on the `first` reset,
        which has none yet, it draws a random seed)."""
        if seed is None:
            if not first:
                return jnp.zeros((self.num_envs, 3), jnp.uint32)
            seed = secrets.randbelow(2**63)
        per_env = per_env_seeds(seed, self.num_envs)  # checks each seed's range
        if first:
            per_env = [secrets.randbelow(2**63) if s is None else s for s in per_env]
        rows = [(0, 0, 0) if s is None else (1, int(s) & 0xFFFFFFFF, int(s) >> 32) for s in per_env]
        return jnp.asarray(np.array(rows, np.uint32))

    def mask(self, mask: Any) -> jax.Array:
        if isinstance(mask, torch.Tensor):
            if mask.shape != (self.num_envs,) or mask.dtype != torch.bool:
                raise ValueError(
                    f"reset_mask must be a ({self.num_envs},) bool tensor, got "
                    f"{mask.dtype} {tuple(mask.shape)}"
                )
            return self.from_torch(mask.to(self.device))
        return jax.device_put(host_mask(mask, self.num_envs), self.jax_device)

    def index(self, index: Any) -> jax.Array:
        if isinstance(index, torch.Tensor):
            if index.dim() != 1 or index.dtype.is_floating_point or index.dtype == torch.bool:
                raise ValueError(
                    f"index must be a 1-D integer tensor, got {index.dtype} {tuple(index.shape)}"
                )
            return self.from_torch(index.to(self.device, torch.int32))
        array = np.asarray(index)
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"index must be a 1-D integer array, got {array.dtype} {array.shape}")
        return jnp.asarray(array, jnp.int32)

    def actions(self, actions: Any, check_range: bool) -> jax.Array:
        """Shape and dtype checked from metadata (free); the range on request (a host read)."""
        shape = (self.num_envs, *(self.action_space.shape or ()))
        if isinstance(actions, torch.Tensor):
            if tuple(actions.shape) != shape:
                raise ValueError(f"actions must have shape {shape}, got {tuple(actions.shape)}")
            if actions.device != self.device:
                raise ValueError(f"actions are on {actions.device}, the env on {self.device}")
            if self.discrete and (actions.dtype.is_floating_point or actions.dtype == torch.bool):
                raise ValueError(f"discrete actions must be integers, got {actions.dtype}")
            if check_range:
                self._check_range(actions.detach().cpu().numpy())
            dtype = torch.int32 if self.discrete else torch.float32
            return self.from_torch(actions.to(dtype))
        array = np.asarray(actions)
        if array.shape != shape:
            raise ValueError(f"actions must have shape {shape}, got {array.shape}")
        if check_range:
            self._check_range(array)
        return jax.device_put(array.astype(self.action_dtype), self.jax_device)

    def _check_range(self, actions: np.ndarray) -> None:
        space = self.batched_action_space
        if not space.contains(actions.astype(space.dtype)):
            raise ValueError(f"actions out of the action space {self.action_space}: {actions!r}")


def _where_rows(mask: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
    return jnp.where(mask.reshape(-1, *([1] * (new.ndim - 1))), new, old)


def _gather(tree: Any, index: jax.Array) -> Any:
    return jax.tree.map(lambda leaf: leaf[index], tree)


def _scatter(tree: Any, index: jax.Array, rows: Any) -> Any:
    return jax.tree.map(lambda leaf, row: leaf.at[index].set(row), tree, rows)
