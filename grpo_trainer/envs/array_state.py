"""Gymnasium's numpy vector envs that keep their state in arrays, given the state protocol.

`CartPoleVectorEnv` keeps each sub-env's state in a column of a few arrays (its `ArrayLayout`
in `ARRAY_LAYOUTS`), so a snapshot is an index and a restore a write. Its reset takes one seed
for all, so a sub-env reset with seed `s` is a one-sub-env *twin* reset with `s`, copied into
its row; its autoreset shares one generator, so with `autoreset=True` the adapter restarts
sub-envs itself, each from its own seed chain (part of its state). The trainer uses DISABLED.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from grpo_trainer.envs.host_inputs import host_index, host_mask, per_env_seeds

__all__ = ["ARRAY_LAYOUTS", "ArrayLayout", "ArrayStateVectorEnv", "array_layout"]


@dataclass(frozen=True)
class ArrayLayout:
    """Where a numpy vector env keeps its per-sub-env state."""

    arrays: dict[str, int]  # attribute -> the axis that indexes sub-envs
    pending: str  # the (N,) bool attribute of sub-envs whose next step is a reset


def _cartpole_layout() -> tuple[type, ArrayLayout]:
    from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

    # state: (4, N) positions and velocities; steps: (N,) for the time limit;
    # prev_done: (N,) the NEXT_STEP autoreset's pending sub-envs
    return CartPoleVectorEnv, ArrayLayout({"state": 1, "steps": 0, "prev_done": 0}, "prev_done")


ARRAY_LAYOUTS: dict[type, ArrayLayout] = dict([_cartpole_layout()])
"""Env class (exactly: a subclass may keep more state) -> its `ArrayLayout`."""


def array_layout(envs: Any) -> ArrayLayout | None:
    """The array layout of `envs.unwrapped`'s class, or None if it has none."""
    return ARRAY_LAYOUTS.get(type(envs.unwrapped))


def _next(seed: np.ndarray) -> np.ndarray:
    """The next seed of a chain (a 31-bit linear congruential step, per sub-env)."""
    return (seed * 1103515245 + 12345) % 2**31


class ArrayStateVectorEnv(gym.vector.VectorWrapper):
    """A numpy vector env with state in `layout`'s arrays: seeded masked resets, snapshots."""

    def __init__(
        self, env: gym.vector.VectorEnv, layout: ArrayLayout, *, autoreset: bool = True
    ) -> None:
        super().__init__(env)
        self.layout = layout
        self.autoreset = autoreset
        mode = AutoresetMode.NEXT_STEP if autoreset else AutoresetMode.DISABLED
        self.metadata = {**env.metadata, "autoreset_mode": mode}
        self._twin: Any = None  # a one-sub-env copy that resets one seed at a time
        self._obs: np.ndarray | None = None  # every sub-env's latest observation
        self.next_seed = np.zeros(self.num_envs, np.int64)  # each sub-env's next new game

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """As the env's reset, plus a list of seeds (one per sub-env, None: a draw from the
        env's generator) and `options["reset_mask"]` (only those sub-envs reset)."""
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        self._options = options
        n = self.num_envs
        if self._obs is None:
            if mask is not None:
                raise RuntimeError("the first reset() resets every sub-env: it takes no reset_mask")
            obs, info = self.env.reset(seed=seed if isinstance(seed, int) else None)
            self._obs = np.array(obs)  # allocates the env's arrays
            rng = self.env.unwrapped.np_random
            self.next_seed = rng.integers(0, 2**31, n).astype(np.int64)
            if not isinstance(seed, Sequence):
                return self._obs.copy(), info
        rows = np.ones(n, bool) if mask is None else host_mask(mask, n)
        seeds = per_env_seeds(seed, n)
        if isinstance(seed, (int, np.integer)) and mask is None:
            seeds = [None] * n  # the env's own seeding, above: sub-env i gets seed + i below
            self.next_seed = np.arange(int(seed), int(seed) + n, dtype=np.int64) % 2**31
        given = np.array([-1 if s is None else s for s in seeds], np.int64)
        self.next_seed = np.where(given >= 0, given, self.next_seed)
        self._new_games(rows)
        return self._obs.copy(), {}

    def step(self, actions: Any) -> tuple[Any, ...]:
        env = self.env.unwrapped
        pending = np.array(getattr(env, self.layout.pending))
        getattr(env, self.layout.pending)[:] = False  # the adapter restarts them, below
        obs, reward, terminated, truncated, info = self.env.step(actions)
        self._obs = np.array(obs)
        if self.autoreset and pending.any():  # NEXT_STEP: their step was a reset
            self._new_games(pending)
            reward[pending], terminated[pending], truncated[pending] = 0, False, False
            obs = self._obs.copy()
            getattr(env, self.layout.pending)[pending] = False
        return obs, reward, terminated, truncated, info

    # -- sub-env state snapshots (docs/env.md) ---------------------------------------------

    def snapshot_state(self, index: Any) -> tuple[np.ndarray, ...]:
        """Sub-envs `index` in the layout's arrays, then their observations and seed chains."""
        if self._obs is None:
            raise RuntimeError("call reset() before snapshot_state()")
        rows = host_index(index, self.num_envs)
        return tuple(np.take(target, rows, axis=axis) for target, axis in self._targets())

    def _targets(self) -> list[tuple[np.ndarray, int]]:
        """Every per-sub-env array of the state, with its sub-env axis."""
        env = self.env.unwrapped
        assert self._obs is not None
        return [
            *((getattr(env, name), axis) for name, axis in self.layout.arrays.items()),
            (self._obs, 0),
            (self.next_seed, 0),
        ]

    def restore_state(self, index: Any, snapshot: Sequence[Any]) -> None:
        """Write row `j` of `snapshot` into sub-env `index[j]`."""
        if self._obs is None:
            raise RuntimeError("call reset() before restore_state()")
        rows = host_index(index, self.num_envs)
        targets = self._targets()
        if not isinstance(snapshot, (tuple, list)) or len(snapshot) != len(targets):
            raise ValueError(
                f"snapshot must be the {len(targets)} arrays snapshot_state() returned, "
                f"got {type(snapshot).__name__}"
            )
        for (target, axis), values in zip(targets, snapshot, strict=True):
            values = np.asarray(values)
            expected = list(target.shape)
            expected[axis] = len(rows)
            if list(values.shape) != expected:
                raise ValueError(
                    f"snapshot array of shape {values.shape} does not fit {tuple(expected)}: "
                    "it is from another env or another index"
                )
            target[(slice(None),) * axis + (rows,)] = values

    # -- internals ---------------------------------------------------------------------------

    def _new_games(self, rows: np.ndarray) -> None:
        """Sub-envs in the mask `rows` start the game of their next seed; their chains move on."""
        chosen = np.flatnonzero(rows)
        for seed in dict.fromkeys(self.next_seed[chosen].tolist()):
            self._reset_rows(chosen[self.next_seed[chosen] == seed], int(seed))
        self.next_seed[chosen] = _next(self.next_seed[chosen])

    def _reset_rows(self, rows: np.ndarray, seed: int) -> None:
        """Reset sub-envs `rows` as the env's own reset with `seed` would start sub-env 0."""
        if self._twin is None:
            self._twin = copy.deepcopy(self.env.unwrapped)
            self._twin.num_envs = 1
        obs, _ = self._twin.reset(seed=seed, options=getattr(self, "_options", None) or None)
        env, twin = self.env.unwrapped, self._twin
        for name, axis in self.layout.arrays.items():
            target = getattr(env, name)
            value = np.take(getattr(twin, name), [0], axis=axis)
            target[(slice(None),) * axis + (rows,)] = value
        assert self._obs is not None
        self._obs[rows] = obs[0]
