"""`TensorVectorEnv`: any `TensorGame` as a Gymnasium vector env on one torch device.

The env keeps the spaces, seeds, autoreset bookkeeping and state snapshots, and hands each
step to two objects chosen before the first step, so that `step` tests no flag:

* the stepper, chosen at construction (`compile=`, `compiled.stepper`): the autoreset
  mode's step run eagerly on the game (or on its faster eager form), or the same step
  compiled once per machine by AOTInductor and cached on disk. All give the same games bit
  for bit. Its first step checks the game's rule outputs once (`rule_check.py`);
* the action check, chosen when `validate_actions` is set (`actions.py`).

What callers pass is checked and converted by `inputs.py`. No step syncs with the device,
branches on data or allocates on the host: with `validate_actions=False` or deferred
validation a step runs on `device="meta"`, which has no data (tests/test_env_devices.py).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from fruit_env.kit import actions, captured, compiled, inputs, rng, rule_check
from fruit_env.kit.autoreset import Running
from fruit_env.kit.game import TensorGame
from fruit_env.kit.layout import Layout, Packed, packed
from fruit_env.kit.snapshots import SubEnvSnapshot, checked, rules_tag


class TensorVectorEnv(VectorEnv):
    """`num_envs` games of `game` stepped together as torch tensors on one device.

    * `device`: where state and outputs live (`"cpu"`, `"cuda"`, `"cuda:1"`, a
      `torch.device`; `"meta"` for tests that must prove a step allocates nothing on the
      host and never syncs: shapes only, no data).
    * `autoreset_mode`: an `AutoresetMode` (or its value / name as a string).
    * `validate_actions`: what happens to actions outside `0 .. num_actions - 1`.
      `"immediate"`: `step` raises a `ValueError` before changing anything (one host read
      of a flag per step: free on the CPU, a sync on a GPU).
      `"deferred"`: the step runs with them clamped, and the first offending sub-env and
      value since the last check are kept on the device; `reset()`, `render()`, `close()`
      and `check_actions()` raise the `ValueError` (no sync per step).
      `True` (the default): `"immediate"` on the CPU, `"deferred"` on other devices.
      `False`: no check; out-of-range actions are clamped.
    * `compile`: `True` runs the compiled step (building it first if the cache lacks it),
      `False` the eager step. `"auto"` (the default) runs, on CUDA, the step captured in a
      CUDA graph (no compiler; proven against the uncaptured step first), elsewhere the
      eager step (on CUDA the compiled step's package crashed torch 2.11's loader:
      docs/performance.md). `env.compiled` and `env.captured` say which runs.
    """

    metadata = {
        "autoreset_mode": AutoresetMode.NEXT_STEP,
        # `make_vec` keyword arguments for a caller whose actions are always valid (a
        # trainer sampling from the action space): skip the per-step action check.
        "fast_kwargs": {"validate_actions": False},
        # keyword arguments that change how the env runs, never its games (a resumed run may
        # change them)
        "free_kwargs": ("compile",),
        # Sub-env i plays the same game for the same seed and actions whatever num_envs is
        # (its randomness is its own key and counter): `grpo_trainer.tools.checker` tests it.
        "num_envs_invariant": True,
    }

    def __init__(
        self,
        game: TensorGame[Any],
        num_envs: int,
        *,
        device: str | torch.device = "cpu",
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        render_mode: str | None = None,
        validate_actions: bool | str = True,
        compile: bool | str = "auto",
    ) -> None:
        self.num_envs = inputs.as_num_envs(num_envs)
        if render_mode is not None and render_mode not in game.render_modes:
            raise ValueError(
                f"render_mode must be one of {game.render_modes} or None, got {render_mode!r}"
            )
        compiled.check_choice(compile)
        self.game = game
        self.device = inputs.resolve_device(device)
        self.render_mode = render_mode
        mode = inputs.parse_autoreset_mode(autoreset_mode)
        self.autoreset_mode = mode  # as SyncVectorEnv has it; TorchRL reads this attribute
        self.metadata = {
            **self.metadata,
            "render_modes": list(game.render_modes),
            "render_fps": game.render_fps,
            **game.metadata,
            "autoreset_mode": mode,
        }
        self.single_action_space = gym.spaces.Discrete(game.num_actions)
        self.single_observation_space = game.observation_space
        self.layout = Layout(game.initial(torch.zeros(1, dtype=torch.int64, device=self.device)))
        obs_bytes = (
            int(np.prod(game.observation_space.shape or ()))
            * np.dtype(game.observation_space.dtype or np.float32).itemsize
        )
        inputs.check_size(game, 4 * self.layout.rows, obs_bytes, self.num_envs, self.device)
        stepper = compiled.stepper(compile, game, self.layout, mode, self.num_envs, self.device)
        self.compiled = isinstance(stepper, compiled.CompiledStepper)  # which step runs
        self.captured = isinstance(stepper, captured.CapturedStepper)
        self._stepper = rule_check.FirstStepCheck(stepper, game, self.layout)
        self._deferred: actions.DeferredCheck | None = None  # made by the first deferred setting
        self.validate_actions = validate_actions  # type: ignore[assignment]
        self._rules = rules_tag(game, self.device)  # what every snapshot carries
        # Unseeded sub-envs play the seeds after one fresh from OS entropy (any size, at once).
        self._key = rng.range_keys(int(rng.fresh_seeds(1)[0]), self.num_envs, self.device)
        self._counter = _outside_inference(
            torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        )
        self._running = self._empty(self.num_envs)
        self._needs_reset = True
        self._closed = False

    def _empty(self, num_envs: int) -> Running:
        pending = torch.zeros(num_envs, dtype=torch.bool, device=self.device)
        return Running(self.layout.zeros(num_envs, self.device), pending)

    # -- batched spaces are built on first use: at millions of envs they cost real memory ----

    @functools.cached_property
    def observation_space(self) -> gym.Space:  # type: ignore[override]
        return batch_space(self.single_observation_space, self.num_envs)

    @functools.cached_property
    def action_space(self) -> gym.Space:  # type: ignore[override]
        return batch_space(self.single_action_space, self.num_envs)

    # -- Gymnasium API -------------------------------------------------------------------------

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Start new games. `options={"reset_mask": mask}` restarts only the masked sub-envs.

        With deferred action validation, first raises the `ValueError` of an invalid action
        taken since the last check (see `check_actions`).
        """
        if options is not None and not isinstance(options, Mapping):
            raise ValueError(f"options must be a dict or None, got {options!r}")
        options = dict(options or {})
        mask = inputs.as_reset_mask(options.pop("reset_mask", None), self.num_envs, self.device)
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; only 'reset_mask' is known")
        seeded = inputs.seeded_keys(seed, mask, self.device)
        self._require_open()
        self.check_actions()
        key, counter = self._key, self._counter
        if seeded is not None:
            seeded_mask, keys = seeded
            key = torch.where(seeded_mask, keys, key)
            counter = torch.where(seeded_mask, 0, counter)
        self._running, counter = self._stepper.reset(self._running, key, counter, mask)
        self._counter = _outside_inference(counter)
        self._key = key
        self._needs_reset = False
        return self._stepper.observe(self._running), {}

    def step(
        self, actions: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        self._require_open()
        if self._needs_reset:
            raise RuntimeError("call reset() before step()")
        actions = self._check(inputs.as_actions(actions, self.num_envs, self.device))
        t = self._stepper.step(self._running, self._key, self._counter, actions)
        self._running, self._counter = t.running, t.counter
        info: dict[str, Any] = {
            "episode": dict(zip(self.game.episode_fields, t.episode, strict=True)),
            "_episode": t.ended,
        }
        if t.final_obs is not None:
            info["final_obs"] = t.final_obs
            info["_final_obs"] = t.ended
        return t.obs, t.reward, t.terminated, t.truncated, info

    def render(self) -> list[Any] | None:
        """One frame (or text board) per sub-env; meant for small `num_envs`. Checks deferred
        action validation first (see `check_actions`)."""
        self.check_actions()
        if self.render_mode is None:
            return None
        return self.game.render(self.layout.state(self._running.game), self.render_mode)

    def close_extras(self, **kwargs: Any) -> None:
        """Release the state; then raise the deferred action-validation error, if any."""
        try:
            self.check_actions()
        finally:
            # What a closed env holds: one game, and no package or buffers.
            self._stepper = compiled.stepper(
                False, self.game, self.layout, self.autoreset_mode, 1, self.device
            )
            self.validate_actions = self._validate  # the check that goes with that stepper
            self._running = self._empty(1)
            self._needs_reset = self._closed = True

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError("the env is closed")

    @property
    def max_episode_steps(self) -> int | None:
        """The game's time limit (truncation after that many steps), if it has one."""
        return self.game.max_episode_steps

    # -- action validation ---------------------------------------------------------------------

    @property
    def validate_actions(self) -> bool | str:
        """The `validate_actions` setting (see the class docstring); assignable."""
        return self._validate

    @validate_actions.setter
    def validate_actions(self, value: bool | str) -> None:
        check = actions.resolve(value, self.device)
        self._validate = value
        n = self.game.num_actions
        if check == "deferred":  # one record for the env's life: a pending error survives
            self._deferred = self._deferred or actions.DeferredCheck(n, self.num_envs, self.device)
            self._check: actions.ActionCheck = self._deferred
        else:
            self._check = actions.ImmediateCheck(n) if check else self._stepper.unchecked(n)

    def check_actions(self) -> None:
        """Raise a `ValueError` naming the first sub-env, and its value, that got an action
        out of range in a step since the last check, with deferred validation (a no-op
        otherwise). This reads one flag from the device: call it where a sync happens anyway
        (after a rollout, say). `reset()`, `render()` and `close()` call it."""
        if self._deferred is not None:
            self._deferred.raise_pending()

    # -- sub-env state snapshots (the duck-typed protocol in docs/env.md) ------------------------

    def snapshot_state(self, index: Any) -> SubEnvSnapshot:
        """The state of sub-envs `index` (a 1-D integer tensor or array), one row per entry,
        and the rules it is taken under.

        Device tensors, gathered without a host sync: cheap enough to call every few steps.
        """
        if self._needs_reset:
            raise RuntimeError("call reset() before snapshot_state()")
        index = inputs.as_index(index, self.device, self.num_envs)
        with inputs.index_errors(index, self.num_envs):
            chosen = _select_rows(self._running, index)
        return SubEnvSnapshot(
            self._pack(chosen),
            self._key.index_select(0, index),
            self._counter.index_select(0, index),
            self._rules,
        )

    def restore_state(self, index: Any, snapshot: SubEnvSnapshot) -> None:
        """Put row `j` of `snapshot` into sub-env `index[j]`.

        A restored sub-env continues exactly as the snapshot's source would have (same
        randomness, same rewards for the same actions), whatever its neighbours do: its
        randomness is its key and counter, which travel with the snapshot. Its observation
        is the source's. A snapshot taken under other rules (another game, or other
        parameters of this one) is refused with a `ValueError` naming both (`snapshots.py`).
        """
        if self._needs_reset:
            raise RuntimeError("call reset() before restore_state()")
        index = inputs.as_index(index, self.device, self.num_envs)
        snapshot = checked(snapshot, self.layout.rows, len(index), self._rules, self.game)
        snapshot = SubEnvSnapshot(*(t.to(self.device) for t in snapshot))
        # New tensors, not writes into the old ones: what was handed out before never changes.
        with inputs.index_errors(index, self.num_envs):
            rows = self._pack(self._running).index_copy(1, index, snapshot.packed)
        self._running = Running(packed(rows[:-1]), rows[-1] != 0)
        self._key = self._key.index_copy(0, index, snapshot.key)
        self._counter = _outside_inference(self._counter.index_copy(0, index, snapshot.counter))

    def _pack(self, running: Running) -> torch.Tensor:
        """`running` as packed rows, the pending row last."""
        pending = running.pending.to(torch.int32)[None]
        if isinstance(running.game, Packed):
            return torch.cat([running.game.board.T, pending])
        return torch.cat([*self.layout.blocks(running.game), pending])

    # -- the game state ------------------------------------------------------------------------

    @property
    def game_state(self) -> Any:
        """A copy of the games' state, in the game's own form (for analysis and tests)."""
        return self.layout.unpack(self.layout.pack(self._running.game).clone())

    @game_state.setter
    def game_state(self, state: Any) -> None:
        """Plant a state (for analysis and tests: a scenario built by hand). Pending
        NEXT_STEP restarts stay; the state must be one the rules can reach."""
        rows = self.layout.pack(state).clone()  # the env's own copy
        pending = self._running.pending
        if pending.shape[0] != rows.shape[1]:
            pending = torch.zeros(rows.shape[1], dtype=torch.bool, device=self.device)
        self._running = Running(packed(rows), pending)

    @property
    def pending(self) -> torch.Tensor:
        """NEXT_STEP: sub-envs whose episode ended on the last step (they restart next step)."""
        return self._running.pending.clone()


def _select_rows(running: Running, index: torch.Tensor) -> Running:
    """The sub-envs `index` of `running`, field by field."""

    def select(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            return node.index_select(0, index)
        fields = [select(child) for child in node]
        return type(node)(*fields) if hasattr(node, "_fields") else tuple(fields)

    return select(running)


def _outside_inference(counter: torch.Tensor) -> torch.Tensor:
    """`counter` as a normal tensor: every step advances it in place, which a tensor made under
    `torch.inference_mode` (a rollout's reset or restore) refuses once outside that mode."""
    if not counter.is_inference():
        return counter
    with torch.inference_mode(False):
        return counter.clone()
