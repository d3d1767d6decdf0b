"""Sub-env state snapshots for any Python env in an `AsyncVectorEnv`: pickled worker states.

`call("__dict__")` pulls every worker's env state (lazily, once before the workers change) and
`set_attr("__dict__", states)` pushes them back. The adapter mirrors each worker's NEXT_STEP
autoreset flag, which only a masked reset can clear (docs/integrations.md).
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode
from gymnasium.vector.utils import concatenate, iterate

from grpo_trainer.envs.copied_state import (
    ROUND_TRIP_STEPS,
    LazySnapshots,
    Snapshot,
    first_difference,
    warn_no_snapshots,
)
from grpo_trainer.envs.host_inputs import host_mask

__all__ = ["PickledStateVectorEnv", "picklable_or_none"]


class WorkerState:
    """One sub-env in a snapshot: env state (None until pulled), source, pending, obs."""

    __slots__ = ("obs", "pending", "source", "state")

    def __init__(self, source: int, state: dict | None, pending: bool, obs: Any) -> None:
        self.source, self.state, self.pending, self.obs = source, state, pending, obs


class PickledStateVectorEnv(LazySnapshots):
    """An `AsyncVectorEnv` (possibly wrapped) with sub-env state snapshots by pickling."""

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        self.workers: AsyncVectorEnv = env.unwrapped
        self._next_step = self.workers.autoreset_mode == AutoresetMode.NEXT_STEP
        self._pending = np.zeros(self.num_envs, bool)  # the workers' NEXT_STEP flags
        self._states: list[dict] | None = None  # the workers' env states, if pulled since
        self._live: list[weakref.ref[Snapshot]] = []  # snapshots not pulled yet

    def _observations(self) -> Any:
        return self.workers.observations

    def _after_reset(self, mask: np.ndarray | None) -> None:
        self._pending[slice(None) if mask is None else mask] = False

    def step(self, actions: Any) -> tuple[Any, ...]:
        obs, reward, terminated, truncated, info = super().step(actions)
        if self._next_step:  # the worker resets at its next step (it keeps this flag itself)
            n = self.num_envs
            self._pending = host_mask(terminated, n) | host_mask(truncated, n)
        return obs, reward, terminated, truncated, info

    # -- sub-env state snapshots (docs/env.md) ---------------------------------------------

    def snapshot_state(self, index: Any) -> Snapshot:
        """Sub-envs `index` as they are now (pulled lazily, before anything changes them)."""
        rows = self._rows("snapshot_state", index)
        obs = self._observation_rows()
        states = self._states or [None] * self.num_envs
        snapshot = Snapshot(
            WorkerState(i, states[i], bool(self._pending[i]), copy.deepcopy(obs[i])) for i in rows
        )
        if self._states is None:
            self._live.append(weakref.ref(snapshot))
        return snapshot

    def restore_state(self, index: Any, snapshot: Sequence[WorkerState]) -> None:
        """Sub-env `index[j]` takes the state of row `j` of `snapshot`."""
        rows = self._restore_rows(index, snapshot, WorkerState)
        moves = dict(zip(rows, snapshot, strict=True))  # the last one wins, as in assignments
        moves = {i: row for i, row in moves.items() if not self._unchanged(i, row)}
        for i, row in moves.items():
            if row.pending and not self._pending[i]:
                raise ValueError(
                    f"sub-env {row.source}'s snapshot was taken right after its episode ended, "
                    f"and sub-env {i} had not just ended: an AsyncVectorEnv worker cannot be "
                    "told that its next step is a reset"
                )
        if not moves:
            return
        self._pull_live()
        states = list(self._pull())
        if any(row.state is None for row in moves.values()):
            raise ValueError("snapshot rows from another env")
        cancel = [i for i, row in moves.items() if self._pending[i] and not row.pending]
        if cancel:  # a masked reset is the one way to cancel a worker's pending autoreset
            self.workers.reset(options={"reset_mask": np.isin(np.arange(self.num_envs), cancel)})
        obs = copy.deepcopy(self._observation_rows())
        for i, row in moves.items():
            states[i], obs[i], self._pending[i] = row.state, row.obs, row.pending
        self.workers.set_attr("__dict__", states)
        self._states = states
        concatenate(self.workers.single_observation_space, obs, self.workers.observations)

    # -- internals ---------------------------------------------------------------------------

    def _unchanged(self, i: int, row: WorkerState) -> bool:
        """Is `row` sub-env `i`'s own state, with nothing changed since it was taken?"""
        if row.state is None:  # unpulled rows exist only while nothing has changed
            return row.source == i
        return self._states is not None and row.state is self._states[i]

    def _observation_rows(self) -> list[Any]:
        """Each sub-env's latest observation (views of AsyncVectorEnv's `observations`)."""
        return list(iterate(self.workers.observation_space, self.workers.observations))

    def _pull(self) -> list[dict]:
        """Every worker's env state, pulled once per change of the workers."""
        if self._states is None:
            self._states = list(self.workers.call("__dict__"))
        return self._states

    def _pull_live(self) -> None:
        """Live snapshots that still refer to the workers take their states."""
        rows = [row for ref in self._live for row in ref() or () if row.state is None]
        if rows:
            states = self._pull()
            for row in rows:
                row.state = states[row.source]
        self._live = []

    def _changing(self) -> None:
        self._pull_live()
        self._states = None


def picklable_or_none(envs: gym.vector.VectorEnv) -> PickledStateVectorEnv | None:
    """`envs` with pickled-state snapshots if a round trip works, else None (and a warning)."""
    workers = envs.unwrapped
    name, problem = _round_trip_problem(workers)
    if problem is None:
        return PickledStateVectorEnv(envs)
    warn_no_snapshots(name, problem, " in AsyncVectorEnv")
    return None


def _round_trip_problem(workers: AsyncVectorEnv) -> tuple[str, str | None]:
    """The env's name, and why a pushed state does not continue as the pulled one, or None."""
    spec = getattr(workers, "spec", None)
    name = getattr(spec, "id", None) or type(workers).__name__
    if workers.worker is not None:
        return name, "a custom worker, whose autoreset bookkeeping is unknown"
    if workers.autoreset_mode == AutoresetMode.NEXT_STEP and not workers.shared_memory:
        return name, "shared_memory=False, where a masked reset keeps a pending autoreset"
    probe = None
    try:
        with warnings.catch_warnings():  # the probe's own (Gymnasium logs a worker's end as one)
            warnings.simplefilter("ignore")
            probe = PickledStateVectorEnv(
                AsyncVectorEnv(
                    workers.env_fns[:1],
                    shared_memory=workers.shared_memory,
                    context=workers.context,
                    daemon=workers.daemon,
                    autoreset_mode=workers.autoreset_mode,
                )
            )
            if spec is None:
                name = probe.workers.call("__str__")[0]
            return name, _replay_problem(probe)
    except Exception as err:  # any failure to pickle or to restore means: no snapshots
        return name, f"{type(err).__name__}: {err}"
    finally:
        if probe is not None:
            probe.close()


def _replay_problem(probe: PickledStateVectorEnv) -> str | None:
    """Snapshot, play, restore, play again: why the replay differs, or None."""
    probe.reset(seed=12345)
    snapshot = probe.snapshot_state(np.array([0]))
    space = copy.deepcopy(probe.action_space)
    space.seed(0)
    actions = [space.sample() for _ in range(ROUND_TRIP_STEPS)]
    played = [probe.step(a)[:4] for a in actions]
    probe.restore_state(np.array([0]), snapshot)
    for t, (action, first) in enumerate(zip(actions, played, strict=True)):
        differs = first_difference(first, probe.step(action), t, "a restored sub-env's")
        if differs:
            return differs
    return None
