"""Sub-env state snapshots for any Python env in a `SyncVectorEnv`: copies of the sub-envs.

A Python env's state is the env object itself (its physics, its random generator, MinAtar's
sticky-action memory...), so a snapshot of sub-env `i` is a copy of `envs[i]` and a restore
puts a copy in its place. `CopiedStateVectorEnv` wraps the vector env and adds the protocol
of docs/env.md; the trainer then restarts a group by resetting one member and copying it to
the others, so the members start alike in every respect, and it can branch.

Copies are made only when needed. A snapshot holds the sub-env objects themselves until the
vector env next changes them (a step, a reset); only then are the objects a live snapshot
still holds copied. Restoring a sub-env's own unchanged snapshot into it copies nothing. So
the trainer's "snapshot every sub-env, restore every sub-env" at a restart point costs one
copy per sub-env that actually moves.

`copyable_or_none` verifies at construction, by a round trip, that a copied sub-env
continues exactly as the original (same observations and rewards for the same actions);
where it does not, or cannot be copied at all (Box2D's handles), the env is left as it is
and a warning names it once.
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

__all__ = ["CopiedStateVectorEnv", "copyable_or_none"]

ROUND_TRIP_STEPS = 16


class SubEnvCopy:
    """One sub-env in a snapshot: the env (shared until it would change), its pending
    NEXT_STEP autoreset and its latest observation."""

    __slots__ = ("env", "obs", "pending", "shared")

    def __init__(self, env: gym.Env, pending: bool, obs: Any) -> None:
        self.env, self.pending, self.obs, self.shared = env, pending, obs, True


class Snapshot(list):  # a list, so that the wrapper can hold it by weak reference
    """`SubEnvCopy` rows, in the order of the index they were taken at."""


class CopiedStateVectorEnv(gym.vector.VectorWrapper):
    """A `SyncVectorEnv` (possibly wrapped) with sub-env state snapshots by copying."""

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        self._live: list[weakref.ref[Snapshot]] = []  # snapshots that may share sub-envs
        self._reset_done = False

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self._detach_snapshots()
        options = kwargs.get("options")
        mask = (options or {}).get("reset_mask")
        if mask is not None:
            mask = host_mask(mask, self.num_envs)
            if not mask.any():  # nothing to reset (SyncVectorEnv refuses an empty mask)
                return copy.deepcopy(self.env.unwrapped._observations), {}
        if options is not None:  # a copy: SyncVectorEnv pops reset_mask from it
            kwargs["options"] = {**options, **({} if mask is None else {"reset_mask": mask})}
        self._reset_done = True
        return self.env.reset(**kwargs)

    def step(self, actions: Any) -> tuple[Any, ...]:
        self._detach_snapshots()
        return self.env.step(actions)

    # -- sub-env state snapshots (docs/env.md) ---------------------------------------------

    def snapshot_state(self, index: Any) -> Snapshot:
        """Sub-envs `index` as they are now (copied lazily, before anything changes them)."""
        if not self._reset_done:
            raise RuntimeError("call reset() before snapshot_state()")
        sync = self.env.unwrapped
        rows = Snapshot(
            SubEnvCopy(sync.envs[i], bool(sync._autoreset_envs[i]), sync._env_obs[i])
            for i in host_index(index, self.num_envs)
        )
        self._live.append(weakref.ref(rows))
        return rows

    def restore_state(self, index: Any, snapshot: Sequence[SubEnvCopy]) -> None:
        """Sub-env `index[j]` becomes a copy of row `j` of `snapshot`."""
        if not self._reset_done:
            raise RuntimeError("call reset() before restore_state()")
        rows = host_index(index, self.num_envs)
        if not isinstance(snapshot, Sequence) or len(snapshot) != len(rows):
            raise ValueError(
                f"snapshot must be what snapshot_state() returned for {len(rows)} sub-envs, "
                f"got {type(snapshot).__name__}"
            )
        sync = self.env.unwrapped
        for i, row in zip(rows, snapshot, strict=True):
            if not isinstance(row, SubEnvCopy):
                raise ValueError(f"snapshot rows must be SubEnvCopy, got {type(row).__name__}")
            if row.shared and sync.envs[i] is row.env:
                continue  # its own snapshot, and it has not changed since
            sync.envs[i] = copy.deepcopy(row.env)
            sync._autoreset_envs[i] = row.pending
            sync._env_obs[i] = copy.deepcopy(row.obs)

    def _detach_snapshots(self) -> None:
        """Before the sub-envs change: live snapshots that still share them take copies."""
        for ref in self._live:
            for row in ref() or ():
                if row.shared:
                    row.env, row.obs = copy.deepcopy(row.env), copy.deepcopy(row.obs)
                    row.shared = False
        self._live = []


def copyable_or_none(envs: gym.vector.VectorEnv) -> CopiedStateVectorEnv | None:
    """`envs` with copied-state snapshots if its sub-envs survive a round trip, else None
    (and a warning naming the env, once)."""
    sync = envs.unwrapped
    name = _env_name(sync)
    problem = _round_trip_problem(sync.envs[0], sync.single_action_space)
    if problem is None:
        return CopiedStateVectorEnv(envs)
    warnings.warn(
        f"{name}: its sub-envs cannot be copied ({problem}), so there are no state snapshots: "
        "groups restart with a shared seed and cannot branch",
        RuntimeWarning,
        stacklevel=3,
    )
    return None


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
        names = ("observation", "reward", "terminated", "truncated")
        for what, x, y in zip(names, a[:4], b[:4], strict=True):
            if not _equal(x, y):
                return f"a copy's {what} differs from the original's at step {t}"
        if a[2] or a[3]:
            break
    return None


def _equal(x: Any, y: Any) -> bool:
    try:
        return bool(np.array_equal(np.asarray(x), np.asarray(y)))
    except Exception:
        return False


def _env_name(sync: Any) -> str:
    spec = getattr(sync.envs[0], "spec", None)
    return getattr(spec, "id", None) or type(sync.envs[0].unwrapped).__name__
