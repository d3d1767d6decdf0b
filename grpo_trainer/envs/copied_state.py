"""Sub-env state snapshots for any Python env in a `SyncVectorEnv`: copies of the sub-envs.

A snapshot of sub-env `i` is `envs[i]`, copied only before the vector env would change it, and
offered only where a round trip shows that a copy continues as its source (docs/integrations.md).
`LazySnapshots` is what this adapter and `async_state`'s share.
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from grpo_trainer.envs.host_inputs import host_index, host_mask

__all__ = ["CopiedStateVectorEnv", "LazySnapshots", "copyable_or_none"]

ROUND_TRIP_STEPS = 16
OUTPUTS = ("observation", "reward", "terminated", "truncated")


class Snapshot(list):  # a list, so that the wrapper can hold it by weak reference
    """One row per sub-env of the index it was taken at."""


class LazySnapshots(gym.vector.VectorWrapper):
    """What both Python-env adapters share: a snapshot refers to the live sub-envs until a
    step or a reset changes them (`_changing`), masked resets that accept an empty mask, and
    the checks on the indices and snapshots callers hand them."""

    _reset_done = False

    def _observations(self) -> Any:
        raise NotImplementedError

    def _changing(self) -> None:
        """Before a step or a reset changes the sub-envs: live snapshots take their copies."""
        raise NotImplementedError

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        options = kwargs.get("options")
        mask = (options or {}).get("reset_mask")
        if mask is not None:
            mask = host_mask(mask, self.num_envs)
            if not mask.any():  # nothing to reset (Gymnasium refuses an empty mask)
                return copy.deepcopy(self._observations()), {}
        if options is not None:  # a copy: Gymnasium pops reset_mask from it
            kwargs["options"] = {**options, **({} if mask is None else {"reset_mask": mask})}
        self._changing()
        out = self.env.reset(**kwargs)
        self._after_reset(mask)
        self._reset_done = True
        return out

    def _after_reset(self, mask: np.ndarray | None) -> None:
        pass

    def step(self, actions: Any) -> tuple[Any, ...]:
        self._changing()
        return self.env.step(actions)

    def _rows(self, call: str, index: Any) -> list[int]:
        if not self._reset_done:
            raise RuntimeError(f"call reset() before {call}()")
        return host_index(index, self.num_envs).tolist()

    def _restore_rows(self, index: Any, snapshot: Any, row: type) -> list[int]:
        """The sub-envs `index` names, each with its `row` of `snapshot`."""
        rows = self._rows("restore_state", index)
        if not isinstance(snapshot, Sequence) or len(snapshot) != len(rows):
            raise ValueError(
                f"snapshot must be what snapshot_state() returned for {len(rows)} sub-envs, "
                f"got {type(snapshot).__name__}"
            )
        wrong = next((r for r in snapshot if not isinstance(r, row)), None)
        if wrong is not None:
            raise ValueError(f"snapshot rows must be {row.__name__}, got {type(wrong).__name__}")
        return rows


class SubEnvCopy:
    """One sub-env in a snapshot: the env (shared until it would change), pending, obs."""

    __slots__ = ("env", "obs", "pending", "shared")

    def __init__(self, env: gym.Env, pending: bool, obs: Any) -> None:
        self.env, self.pending, self.obs, self.shared = env, pending, obs, True


class CopiedStateVectorEnv(LazySnapshots):
    """A `SyncVectorEnv` (possibly wrapped) with sub-env state snapshots by copying."""

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        self._live: list[weakref.ref[Snapshot]] = []  # snapshots that may share sub-envs

    def _observations(self) -> Any:
        return self.env.unwrapped._observations

    # -- sub-env state snapshots (docs/env.md) ---------------------------------------------

    def snapshot_state(self, index: Any) -> Snapshot:
        """Sub-envs `index` as they are now (copied lazily, before anything changes them)."""
        sync = self.env.unwrapped
        rows = Snapshot(
            SubEnvCopy(sync.envs[i], bool(sync._autoreset_envs[i]), sync._env_obs[i])
            for i in self._rows("snapshot_state", index)
        )
        self._live.append(weakref.ref(rows))
        return rows

    def restore_state(self, index: Any, snapshot: Sequence[SubEnvCopy]) -> None:
        """Sub-env `index[j]` becomes a copy of row `j` of `snapshot`."""
        sync = self.env.unwrapped
        rows = self._restore_rows(index, snapshot, SubEnvCopy)
        for i, row in zip(rows, snapshot, strict=True):
            if row.shared and sync.envs[i] is row.env:
                continue  # its own snapshot, and it has not changed since
            sync.envs[i] = copy.deepcopy(row.env)
            sync._autoreset_envs[i] = row.pending
            sync._env_obs[i] = copy.deepcopy(row.obs)

    def _changing(self) -> None:
        for ref in self._live:
            for row in ref() or ():
                if row.shared:
                    row.env, row.obs = copy.deepcopy(row.env), copy.deepcopy(row.obs)
                    row.shared = False
        self._live = []


def copyable_or_none(envs: gym.vector.VectorEnv) -> CopiedStateVectorEnv | None:
    """`envs` with copied-state snapshots if a round trip works, else None (and a warning)."""
    sync = envs.unwrapped
    name = _env_name(sync)
    problem = _round_trip_problem(sync.envs[0], sync.single_action_space)
    if problem is None:
        return CopiedStateVectorEnv(envs)
    warn_no_snapshots(name, problem)
    return None


def warn_no_snapshots(name: str, problem: str, where: str = "") -> None:
    warnings.warn(
        f"{name}: its sub-envs{where} cannot be copied ({problem}), so there are no state "
        "snapshots: groups restart with a shared seed and cannot branch",
        RuntimeWarning,
        stacklevel=4,
    )


def _round_trip_problem(env: gym.Env, action_space: gym.Space) -> str | None:
    """Why a copy of `env` does not continue exactly as the original, or None."""
    try:
        original = copy.deepcopy(env)
        original.reset(seed=12345)
        twin = copy.deepcopy(original)
    except Exception as err:  # any failure to copy means: no snapshots
        return f"{type(err).__name__}: {err}"
    space = copy.deepcopy(action_space)
    space.seed(0)
    for t in range(ROUND_TRIP_STEPS):
        action = space.sample()
        try:
            a, b = original.step(action), twin.step(copy.deepcopy(action))
        except Exception as err:  # a copy that cannot step is no copy
            return f"a copy fails to step: {type(err).__name__}: {err}"
        differs = first_difference(a, b, t, "a copy's")
        if differs:
            return differs
        if a[2] or a[3]:
            break
    return None


def first_difference(first: Sequence[Any], again: Sequence[Any], t: int, whose: str) -> str | None:
    """Which of a step's outputs differ between an original and its copy, or None."""
    for what, x, y in zip(OUTPUTS, first[:4], again[:4], strict=True):
        try:
            equal = bool(np.array_equal(np.asarray(x), np.asarray(y)))
        except Exception:
            equal = False
        if not equal:
            return f"{whose} {what} differs from the original's at step {t}"
    return None


def _env_name(sync: Any) -> str:
    spec = getattr(sync.envs[0], "spec", None)
    return getattr(spec, "id", None) or type(sync.envs[0].unwrapped).__name__
