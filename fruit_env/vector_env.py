"""`FruitCatcherVectorEnv`: the Gymnasium vector-env shell around the tensor rules.

The shell keeps the spaces, seeds, autoreset bookkeeping and state snapshots, and hands each
step to two objects chosen before the first step, so that `step` tests no flag:

* the step, chosen at construction by `compiled.select_step` (`compile=`): the eager
  `packed.EagerStep` (about 80 eager kernels on the packed state, no compilation) or
  `compiled.CompiledEnvStep` (the autoreset mode's transition from `transitions.py`,
  compiled once per machine by AOTInductor and cached on disk). Both give the same games
  bit for bit (tests/test_env_packed.py, tests/test_env_compile.py);
* the action check, chosen when `validate_actions` is set (`action_checks.py`).

What callers pass is checked and converted by `inputs.py`. Neither step syncs with the
device, branches on data or allocates on the host: with `validate_actions=False` or deferred
validation a step runs on `device="meta"`, which has no data (tests/test_env_devices.py).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from fruit_env import action_checks, compiled, core, inputs, rng
from fruit_env.action_checks import ActionCheck, DeferredCheck, ImmediateCheck, NoCheck
from fruit_env.packed import MODE_NAMES, EagerStep
from fruit_env.params import FruitParams
from fruit_env.render import RENDER_FPS, RENDER_MODES, ansi_board, rgb_frame
from fruit_env.transitions import pack, unpack

EPISODE_KEYS = ("r", "l", "caught", "missed")


class SubEnvSnapshot(NamedTuple):
    """The state of some sub-envs, one column (`packed`) or entry per sub-env."""

    packed: torch.Tensor  # (3*S + 6, n) int32, see `transitions.Layout`
    key: torch.Tensor  # (n,) int64
    counter: torch.Tensor  # (n,) int64


class FruitCatcherVectorEnv(VectorEnv):
    """`num_envs` Fruit Catcher games stepped together as torch tensors on one device.

    Rules arguments (`width`, `height`, ...) are those of `FruitParams`. Besides them:

    * `device`: where state and outputs live (`"cpu"`, `"cuda"`, `"cuda:1"`, a
      `torch.device`; `"meta"` for tests that must prove a step allocates nothing on the
      host and never syncs: shapes only, no data).
    * `autoreset_mode`: an `AutoresetMode` (or its value / name as a string).
    * `validate_actions`: what happens to actions outside {0, 1, 2}.
      `"immediate"`: `step` raises a `ValueError` before changing anything (one host read
      of a flag per step: free on the CPU, a sync on a GPU).
      `"deferred"`: the step runs with them clamped, and the first offending sub-env and
      value since the last check are kept on the device; `reset()`, `render()`, `close()`
      and `check_actions()` raise the `ValueError` (no sync per step).
      `True` (the default): `"immediate"` on the CPU, `"deferred"` on other devices.
      `False`: no check; out-of-range actions are clamped.
    * `compile`: `True` runs the compiled step (building it first if the cache lacks it),
      `False` the eager step, `"auto"` (the default) the compiled step where its package is
      cached (on CUDA: built first) and the measurement kept with it says it is faster at
      this `num_envs`, else the eager step (`compiled.select_step`).
    * `compile_mode`: how the compiled step is built and run. `"default"`; `"max-autotune"`:
      inductor tries kernel configurations and keeps the fastest (its own cached package, a
      longer build); `"reduce-overhead"`: on CUDA the step is replayed from a CUDA graph, one
      launch per step instead of one per kernel (elsewhere the default, with a log line).
      `env.compile_mode` says which mode runs.
    """

    metadata = {
        "autoreset_mode": AutoresetMode.NEXT_STEP,
        "render_modes": list(RENDER_MODES),
        "render_fps": RENDER_FPS,
        # Success ratios of the episode fields: catch_rate = caught / (caught + missed).
        "episode_ratios": {"catch_rate": ("caught", "missed")},
        # What counts as having learned the game (a greedy catch rate the project's default
        # training run reaches on every seed studied): trainers may report when they get there.
        "episode_goals": {"catch_rate": 0.70},
        # `make_vec` keyword arguments for a caller whose actions are always valid (a
        # trainer sampling from the action space): skip the per-step action check.
        "fast_kwargs": {"validate_actions": False},
        # Sub-env i plays the same game for the same seed and actions whatever num_envs is
        # (its randomness is its own key and counter): `grpo_trainer.tools.checker` tests the claim.
        "num_envs_invariant": True,
    }

    def __init__(
        self,
        num_envs: int,
        *,
        device: str | torch.device = "cpu",
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        render_mode: str | None = None,
        validate_actions: bool | str = True,
        compile: bool | str = "auto",
        compile_mode: str = "default",
        **rules: Any,
    ) -> None:
        self.num_envs = inputs.as_num_envs(num_envs)
        if render_mode is not None and render_mode not in RENDER_MODES:
            raise ValueError(
                f"render_mode must be one of {RENDER_MODES} or None, got {render_mode!r}"
            )
        compiled.check_choice(compile, compile_mode)
        self.params = p = FruitParams(**rules)
        self.device = inputs.resolve_device(device)
        inputs.check_size(p, self.num_envs, self.device)
        self.render_mode = render_mode
        mode = inputs.parse_autoreset_mode(autoreset_mode)
        self.metadata = {**self.metadata, "autoreset_mode": mode}
        self.autoreset_mode = mode  # as SyncVectorEnv has it; TorchRL reads this attribute
        self._deferred: DeferredCheck | None = None  # made by the first deferred setting
        self.validate_actions = validate_actions  # type: ignore[assignment]

        self.single_action_space = gym.spaces.Discrete(3)
        if p.obs_mode == "features":
            self.single_observation_space = gym.spaces.Box(0.0, 1.0, (p.obs_size,), np.float32)
        else:
            self.single_observation_space = gym.spaces.Box(0, 255, (1, p.height, p.width), np.uint8)

        self.compile_mode = compiled.runnable_compile_mode(compile_mode, self.device)
        self._step: compiled.EnvStep = compiled.select_step(
            compile, p, mode, self.device, self.num_envs, self.compile_mode
        )
        self.compiled = isinstance(self._step, compiled.CompiledEnvStep)  # which step runs
        keys = torch.from_numpy(rng.seed_keys(rng.fresh_seeds(self.num_envs)))
        self._state = core.empty_state(p, self.num_envs, self.device)._replace(
            key=keys.to(self.device)
        )
        self._needs_reset = True
        self._closed = False

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
        self._packed = self._step.reset(self._packed, key, counter, mask)  # counter advances
        self._key, self._counter = key, counter
        self._needs_reset = False
        return self._step.observe(self._packed), {}

    def step(
        self, actions: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        self._require_open()
        if self._needs_reset:
            raise RuntimeError("call reset() before step()")
        actions = inputs.as_actions(actions, self.num_envs, self.device)
        self._packed, out = self._action_check.step(
            self._step, self._packed, self._key, self._counter, actions
        )
        info: dict[str, Any] = {
            "episode": dict(zip(EPISODE_KEYS, out.episode, strict=True)),
            "_episode": out.ended,
        }
        if out.final_obs is not None:
            info["final_obs"] = out.final_obs
            info["_final_obs"] = out.ended
        return out.obs, out.reward, out.terminated, out.truncated, info

    def render(self) -> list[np.ndarray] | list[str] | None:
        """One frame (or text board) per sub-env; meant for small `num_envs`. Checks deferred
        action validation first (see `check_actions`)."""
        self.check_actions()
        if self.render_mode is None:
            return None
        grids = core.observe_pixels(self.params, self._state)[:, 0].cpu().numpy()
        if self.render_mode == "rgb_array":
            return [rgb_frame(g) for g in grids]
        scores = self._state.score.tolist()
        steps = self._state.t.tolist()
        return [
            ansi_board(g, score=s, step=t) for g, s, t in zip(grids, scores, steps, strict=True)
        ]

    def close_extras(self, **kwargs: Any) -> None:
        """Release the state; then raise the deferred action-validation error, if any."""
        try:
            self.check_actions()
        finally:
            # What a closed env holds: one game, and a step for one (no package, no buffers).
            self._step = EagerStep(self.params, MODE_NAMES[self.autoreset_mode], 1, self.device)
            self._state = core.empty_state(self.params, 1, self.device)
            self._needs_reset = self._closed = True

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError("the env is closed")

    @property
    def max_episode_steps(self) -> int:
        """The episode limit these games were made with (truncation after that many steps)."""
        return self.params.max_episode_steps

    # -- action validation ---------------------------------------------------------------------

    @property
    def validate_actions(self) -> bool | str:
        """The `validate_actions` setting (see the class docstring); assignable."""
        return self._validate

    @validate_actions.setter
    def validate_actions(self, value: bool | str) -> None:
        check = action_checks.resolve(value, self.device)
        self._validate = value
        if check == "deferred":  # one record for the env's life: a pending error survives
            self._deferred = self._deferred or DeferredCheck(self.num_envs, self.device)
            self._action_check: ActionCheck = self._deferred
        else:
            self._action_check = ImmediateCheck() if check == "immediate" else NoCheck()

    def check_actions(self) -> None:
        """Raise a `ValueError` naming the first sub-env, and its value, that got an action
        outside {0, 1, 2} in a step since the last check, with deferred validation (a no-op
        otherwise). This reads one flag from the device: call it where a sync happens anyway
        (after a rollout, say). `reset()`, `render()` and `close()` call it."""
        if self._deferred is not None:
            self._deferred.raise_pending()

    # -- sub-env state snapshots (the duck-typed protocol in docs/env.md) ------------------------

    def snapshot_state(self, index: Any) -> SubEnvSnapshot:
        """The state of sub-envs `index` (a 1-D integer tensor or array), one row per entry.

        Device tensors, gathered without a host sync: cheap enough to call every few steps.
        """
        if self._needs_reset:
            raise RuntimeError("call reset() before snapshot_state()")
        index = inputs.as_index(index, self.device)
        return SubEnvSnapshot(
            self._packed.index_select(1, index),
            self._key.index_select(0, index),
            self._counter.index_select(0, index),
        )

    def restore_state(self, index: Any, snapshot: SubEnvSnapshot) -> None:
        """Put row `j` of `snapshot` into sub-env `index[j]`.

        A restored sub-env continues exactly as the snapshot's source would have (same fruit,
        same rewards for the same actions), whatever its neighbours do: its randomness is its
        key and counter, which travel with the snapshot. Its observation is the source's.
        """
        if self._needs_reset:
            raise RuntimeError("call reset() before restore_state()")
        index = inputs.as_index(index, self.device)
        if not isinstance(snapshot, (tuple, list)) or len(snapshot) != len(SubEnvSnapshot._fields):
            raise ValueError(
                "snapshot must be what snapshot_state() returned (or its tensors as a tuple), "
                f"got {type(snapshot).__name__}"
            )
        snapshot = SubEnvSnapshot(*snapshot)
        expected = (self._packed.shape[0], len(index))
        if tuple(snapshot.packed.shape) != expected or snapshot.key.shape != (len(index),):
            raise ValueError(
                f"snapshot has {snapshot.key.shape[0]} rows of shape "
                f"{tuple(snapshot.packed.shape[:1])}, index has {len(index)} entries of "
                f"({expected[0]},): it is from another env or another index"
            )
        snapshot = SubEnvSnapshot(*(t.to(self.device) for t in snapshot))
        self._packed.index_copy_(1, index, snapshot.packed)  # the env's own tensors
        self._key.index_copy_(0, index, snapshot.key)
        self._counter.index_copy_(0, index, snapshot.counter)

    # -- the game state ------------------------------------------------------------------------

    @property
    def state(self) -> core.FruitState:
        """A copy of the current game state (for analysis and tests)."""
        return core.FruitState(*(t.clone() for t in self._state))

    @state.setter
    def state(self, state: core.FruitState) -> None:
        """Plant a game state (for analysis and tests: a scenario built by hand). Pending
        NEXT_STEP restarts stay; the state must be one the rules can reach."""
        self._state = state

    @property
    def pending(self) -> torch.Tensor:
        """NEXT_STEP: sub-envs whose episode ended on the last step (they restart next step)."""
        return unpack(self._packed)[1]

    @property
    def _state(self) -> core.FruitState:
        game, _ = unpack(self._packed)
        return game.state(self._key, self._counter)

    @_state.setter
    def _state(self, state: core.FruitState) -> None:
        """Replace the game state; pending NEXT_STEP restarts stay (tests plant states here).
        The state must be one the rules can reach (see `packed`'s invariants)."""
        n = state.basket.shape[0]
        packed = getattr(self, "_packed", None)
        if packed is not None and packed.shape[1] == n:
            pending = self.pending
        else:
            pending = torch.zeros(n, dtype=torch.bool, device=state.basket.device)
        self._packed = pack(core.Game.of(state), pending)
        self._key, self._counter = state.key.clone(), state.counter.clone()
