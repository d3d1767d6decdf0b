"""`FruitCatcherVectorEnv`: the Gymnasium vector-env shell around the tensor rules.

The shell checks inputs, keeps seeds and autoreset bookkeeping, and runs one of two steps
that give the same outputs bit for bit (tests/test_env_packed.py):

* the eager step, `packed.EagerStep`: the rules as about 80 eager kernels on the packed
  state, with no compilation;
* the compiled step, `compiled.CompiledStep`: the autoreset mode's transition from
  `transitions.py`, compiled once per machine by AOTInductor and cached on disk.

`compile="auto"` (the default) takes the compiled step on CUDA, and on the CPU when the
package is already cached; the choice is logged once at INFO on the `fruit_env` logger.
Neither step syncs with the device, branches on data or allocates on the host: with
`validate_actions=False` or deferred validation a step runs on `device="meta"`, which has
no data (tests/test_env_devices.py).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from fruit_env import compiled, core, packed, rng
from fruit_env.packed import StepOutput
from fruit_env.params import FruitParams
from fruit_env.render import RENDER_FPS, RENDER_MODES, ansi_board, rgb_frame
from fruit_env.transitions import COMPILED_OBSERVERS, pack, unpack

log = logging.getLogger("fruit_env")

EPISODE_KEYS = ("r", "l", "caught", "missed")
ACTION_CHECKS = (True, False, "immediate", "deferred")
_EAGER_MODES = {
    AutoresetMode.NEXT_STEP: "next_step",
    AutoresetMode.SAME_STEP: "same_step",
    AutoresetMode.DISABLED: "disabled",
}


class SubEnvSnapshot(NamedTuple):
    """The state of some sub-envs, one column (`packed`) or entry per sub-env."""

    packed: torch.Tensor  # (3*S + 6, n) int32, see `transitions.pack`
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
      `False` the eager step, `"auto"` (the default) the compiled step on CUDA and on the
      CPU when it is already cached, else the eager step.
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
        # (its randomness is its own key and counter): `fruit_env.checker` tests the claim.
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
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)):
            raise ValueError(f"num_envs must be an int, got {num_envs!r}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        if render_mode is not None and render_mode not in RENDER_MODES:
            raise ValueError(
                f"render_mode must be one of {RENDER_MODES} or None, got {render_mode!r}"
            )
        if not (isinstance(compile, bool) or (isinstance(compile, str) and compile == "auto")):
            raise ValueError(f"compile must be True, False or 'auto', got {compile!r}")
        if compile_mode not in compiled.COMPILE_MODES:
            raise ValueError(
                f"compile_mode must be one of {compiled.COMPILE_MODES}, got {compile_mode!r}"
            )
        self.params = FruitParams(**rules)
        self.num_envs = int(num_envs)
        self.device = resolve_device(device)
        check_size(self.params, self.num_envs, self.device)
        self.render_mode = render_mode
        mode = parse_autoreset_mode(autoreset_mode)
        self.metadata = {**self.metadata, "autoreset_mode": mode}
        self.autoreset_mode = mode  # as SyncVectorEnv has it; TorchRL reads this attribute
        self._bad: tuple[torch.Tensor, torch.Tensor] | None = None  # deferred action check
        self._unchecked_steps = 0
        self.validate_actions = validate_actions  # type: ignore[assignment]

        p = self.params
        self.single_action_space = gym.spaces.Discrete(3)
        if p.obs_mode == "features":
            self.single_observation_space = gym.spaces.Box(0.0, 1.0, (p.obs_size,), np.float32)
        else:
            self.single_observation_space = gym.spaces.Box(0, 255, (1, p.height, p.width), np.uint8)

        self.compile_mode = _runnable_compile_mode(compile_mode, self.device)  # which one runs
        self._compiled = _compiled_step(compile, p, mode, self.device, self.compile_mode)
        self.compiled = self._compiled is not None  # which step runs (see `compile`)
        self._eager = (
            None
            if self.compiled
            else packed.EagerStep(p, _EAGER_MODES[mode], self.num_envs, self.device)
        )
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
        mask = self._reset_mask(options.pop("reset_mask", None))
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; only 'reset_mask' is known")
        seeded = self._seeded_mask(seed, mask)
        self._require_open()
        self.check_actions()
        key, counter = self._key, self._counter
        if seeded is not None:
            seeded_mask, keys = seeded
            key = torch.where(seeded_mask, keys, key)
            counter = torch.where(seeded_mask, 0, counter)
        p = self.params
        if self._eager is not None:  # in place, on the eager step's buffers
            self._packed = self._eager.reset(self._packed, key, counter, mask)
            obs = self._eager.observe(self._packed)
        else:
            game, pending = unpack(self._packed)
            game = core.restart(p, game, mask, core.draw(p, key, counter))
            self._packed, counter = pack(game, pending & ~mask), counter + mask
            obs = COMPILED_OBSERVERS[p.obs_mode](p, game)
        self._key, self._counter = key, counter
        self._needs_reset = False
        return obs, {}

    def step(
        self, actions: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        self._require_open()
        if self._needs_reset:
            raise RuntimeError("call reset() before step()")
        actions = self._as_actions(actions)
        out = self._step_compiled(actions) if self._compiled else self._step_eager(actions)
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
            self._eager = self._compiled = None
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
        if not (isinstance(value, bool) or (isinstance(value, str) and value in ACTION_CHECKS)):
            raise ValueError(
                f"validate_actions must be True, False, 'immediate' or 'deferred', got {value!r}"
            )
        self._validate = value
        if value is True:
            value = "immediate" if self.device.type == "cpu" else "deferred"
        self._check: str | None = value or None  # type: ignore[assignment]
        if self._check == "deferred" and self._bad is None:
            self._bad = (
                torch.zeros((), dtype=torch.bool, device=self.device),
                torch.zeros(self.num_envs, dtype=torch.int64, device=self.device),
            )

    def check_actions(self) -> None:
        """Raise a `ValueError` naming the first sub-env, and its value, that got an action
        outside {0, 1, 2} in a step since the last check, with deferred validation (a no-op
        otherwise). This reads one flag from the device: call it where a sync happens anyway
        (after a rollout, say). `reset()`, `render()` and `close()` call it."""
        if self._bad is None or not self._unchecked_steps:
            return
        self._unchecked_steps = 0
        flag, first = self._bad
        if bool(flag):  # the host sync
            flag.zero_()
            raise _invalid_action(
                first, " (in a step since the last check, which ran with it clamped to [0, 2])"
            )

    def _record(self, invalid: torch.Tensor, actions: torch.Tensor) -> None:
        """Deferred validation: keep the actions of the first step with an invalid one."""
        flag, first = self._bad  # type: ignore[misc]
        torch.where(flag, first, actions, out=first)
        flag.logical_or_(invalid)
        self._unchecked_steps += 1

    # -- the two steps -------------------------------------------------------------------------

    def _checked(self, actions: torch.Tensor) -> torch.Tensor:
        """The actions a step may take: checked now ("immediate"), or clamped (and recorded
        when "deferred"); the compiled step clamps and flags in its graph."""
        if self._check == "immediate":
            low, high = torch.aminmax(actions)
            if int(low) < 0 or int(high) > 2:  # host reads: free on the CPU
                raise _invalid_action(actions)
            return actions
        if self._compiled is not None:
            return actions
        clamped = actions.clamp(0, 2)
        if self._check == "deferred":
            self._record((clamped != actions).any(), actions)
        return clamped

    def _step_eager(self, actions: torch.Tensor) -> StepOutput:
        self._packed, out = self._eager(  # type: ignore[misc]
            self._packed, self._key, self._counter, self._checked(actions)
        )
        return out

    def _step_compiled(self, actions: torch.Tensor) -> StepOutput:
        checked = self._checked(actions).to(torch.int64).contiguous()
        t = self._compiled(self._packed, self._key, self._counter, checked)  # type: ignore[misc]
        if self._check == "deferred":
            self._record(t.invalid, actions)
        # One tensor each (not views of one): DLPack consumers such as JAX copy unaligned views.
        terminated, truncated, ended = (flag.to(torch.bool) for flag in t.flags)
        return StepOutput(t.obs, t.reward, terminated, truncated, ended, t.episode, t.final_obs)

    # -- sub-env state snapshots (the duck-typed protocol in docs/env.md) ------------------------

    def snapshot_state(self, index: Any) -> SubEnvSnapshot:
        """The state of sub-envs `index` (a 1-D integer tensor or array), one row per entry.

        Device tensors, gathered without a host sync: cheap enough to call every few steps.
        """
        if self._needs_reset:
            raise RuntimeError("call reset() before snapshot_state()")
        index = self._state_index(index)
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
        index = self._state_index(index)
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

    def _state_index(self, index: Any) -> torch.Tensor:
        if not isinstance(index, torch.Tensor):
            index = torch.from_numpy(_integer_array(index, "index"))
        if index.dim() != 1 or index.dtype.is_floating_point or index.dtype == torch.bool:
            raise ValueError(
                f"index must be a 1-D integer tensor, got {index.dtype} {tuple(index.shape)}"
            )
        return index.to(self.device, torch.int64)

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
        return self._pending

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
            pending = unpack(packed)[1]
        else:
            pending = torch.zeros(n, dtype=torch.bool, device=state.basket.device)
        self._packed = pack(core.Game.of(state), pending)
        self._key, self._counter = state.key.clone(), state.counter.clone()

    @property
    def _pending(self) -> torch.Tensor:
        """NEXT_STEP: sub-envs whose episode ended on the last step (they restart next step)."""
        return unpack(self._packed)[1]

    # -- input checks --------------------------------------------------------------------------

    def _as_actions(self, actions: Any) -> torch.Tensor:
        if not isinstance(actions, torch.Tensor):
            actions = torch.from_numpy(_integer_array(actions, "actions"))
        elif actions.layout != torch.strided:
            raise ValueError(f"actions must be a dense tensor, got {actions.layout}")
        if actions.shape != (self.num_envs,):
            raise ValueError(
                f"actions must have shape ({self.num_envs},), got {tuple(actions.shape)}"
            )
        if (
            actions.dtype.is_floating_point
            or actions.dtype.is_complex
            or actions.dtype == torch.bool
        ):
            raise ValueError(f"actions must have an integer dtype, got {actions.dtype}")
        if actions.dtype in _WIDE_UNSIGNED:  # torch has few kernels for these dtypes
            actions = actions.to(torch.int64)
        # The range check (or the clamp) is the step's: see `_step_eager`, `_step_compiled`.
        if actions.device == self.device:
            return actions
        return _to_device(actions, self.device, "actions", non_blocking=True)

    def _reset_mask(self, mask: Any) -> torch.Tensor:
        if mask is None:
            return torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        if not isinstance(mask, torch.Tensor):
            try:
                array = np.asarray(mask)
            except ValueError as err:
                raise ValueError(f"options['reset_mask'] is not an array: {err}") from None
            if array.dtype != np.bool_:
                raise ValueError(
                    f"options['reset_mask'] must be a bool array, got dtype {array.dtype}"
                )
            mask = torch.from_numpy(array)
        elif mask.layout != torch.strided:
            raise ValueError("options['reset_mask'] must be a dense tensor")
        if mask.shape != (self.num_envs,) or mask.dtype != torch.bool:
            raise ValueError(
                f"options['reset_mask'] must be a bool array of shape ({self.num_envs},), "
                f"got {mask.dtype} {tuple(mask.shape)}"
            )
        return _to_device(mask, self.device, "options['reset_mask']")

    def _seeded_mask(
        self, seed: int | Sequence[int | None] | None, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Which sub-envs get a new key from `seed`, and those keys; None if no seed given."""
        if seed is None:
            return None
        n = self.num_envs
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
            base = rng.normalize_seed(seed)
            seeds = (np.arange(n, dtype=np.uint64) + np.uint64(base % 2**64)).astype(np.uint64)
            given = np.ones(n, dtype=bool)
        elif isinstance(seed, Sequence) and not isinstance(seed, str):
            if len(seed) != n:
                raise ValueError(f"seed list must have num_envs={n} entries, got {len(seed)}")
            given = np.array([s is not None for s in seed], dtype=bool)
            seeds = np.array(
                [0 if s is None else rng.normalize_seed(s) % 2**64 for s in seed], dtype=np.uint64
            )
        else:
            raise ValueError(f"seed must be an int, a list of num_envs ints, or None; got {seed!r}")
        keys = torch.from_numpy(rng.seed_keys(seeds)).to(self.device)
        return torch.from_numpy(given).to(self.device) & mask, keys


_WIDE_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)
_LOGGED: set[str] = set()


def _log_once(message: str, *args: object) -> None:
    """INFO on the `fruit_env` logger, once per process for each distinct message."""
    text = message % args
    if text not in _LOGGED:
        _LOGGED.add(text)
        log.info(text)


def _runnable_compile_mode(requested: str, device: torch.device) -> str:
    """`requested`, except CUDA graphs off CUDA: the default mode there, with a log line."""
    if requested == "reduce-overhead" and device.type != "cuda":
        _log_once(
            f"FruitCatcher: compile_mode='reduce-overhead' (CUDA graphs) needs CUDA; "
            f"the {device.type} step runs as compile_mode='default'"
        )
        return "default"
    return requested


def _compiled_step(
    choice: bool | str,
    params: FruitParams,
    mode: AutoresetMode,
    device: torch.device,
    compile_mode: str = "default",
) -> compiled.CompiledStep | compiled.GraphedStep | None:
    """The compiled step that `compile=choice` asks for, or None for the eager step."""
    if choice is False:
        return None
    if not compiled.supported(device):
        if choice is True:
            log.warning(
                "FruitCatcher: compile=True, but this torch builds no compiled step for %s "
                "devices; running the eager step",
                device.type,
            )
        else:
            _log_once("FruitCatcher: eager step on %s (compile='auto')", device.type)
        return None
    cached = compiled.is_cached(params, mode, device, compile_mode)
    if choice == "auto" and device.type != "cuda" and not cached:
        _log_once(
            "FruitCatcher: eager step on %s (compile='auto': no compiled step for these rules, "
            "%s, %s observations in %s; compile=True builds it, once per machine)",
            device.type,
            mode.name,
            params.obs_mode,
            compiled.cache_dir(),
        )
        return None
    try:
        step = compiled.load(params, mode, device, compile_mode)
    except Exception as err:  # no C++ compiler, say: the eager step gives the same games
        log.warning("FruitCatcher: building the compiled step failed (%s); running eager", err)
        return None
    if choice == "auto":
        reason = "CUDA" if device.type == "cuda" else "cached"
        _log_once(
            "FruitCatcher: compiled step on %s (compile='auto': %s) for %s, %s observations",
            device.type,
            reason,
            mode.name,
            params.obs_mode,
        )
    return step


def check_size(params: FruitParams, num_envs: int, device: torch.device) -> None:
    """Refuse a batch whose state and observations would not fit in the device's memory,
    with a `ValueError` naming the arguments that size them."""
    memory = _device_memory(device)
    if memory is None:
        return
    state = 4 * (3 * params.max_fruits + 6)
    if params.obs_mode == "pixels":
        obs, lower = params.height * params.width, "num_envs, width or height"
        sized = f"width={params.width}, height={params.height}, max_fruits={params.max_fruits}"
    else:
        obs, lower = 4 * params.obs_size, "num_envs or max_fruits"
        sized = f"max_fruits={params.max_fruits}"
    need = num_envs * (state + obs)
    if need > memory:
        raise ValueError(
            f"num_envs={num_envs} games with {sized} need {need / 2**30:,.1f} GiB for one state "
            f"and one {params.obs_mode} observation, more than the {memory / 2**30:,.1f} GiB "
            f"of {device}: lower {lower}"
        )


def _device_memory(device: torch.device) -> int | None:
    """Bytes of memory of `device` (the CPU's: physical RAM), None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "cpu" and hasattr(os, "sysconf"):
        try:
            return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError):
            return None
    return None


def _invalid_action(actions: torch.Tensor, suffix: str = "") -> ValueError:
    """The error for the first action outside {0, 1, 2} (reads `actions` on the host)."""
    index = int(((actions < 0) | (actions > 2)).nonzero()[0, 0])
    return ValueError(
        f"actions must be 0, 1 or 2; sub-env {index} got {int(actions[index])}{suffix}"
    )


def _to_device(
    tensor: torch.Tensor, device: torch.device, name: str, non_blocking: bool = False
) -> torch.Tensor:
    try:
        return tensor.to(device, non_blocking=non_blocking)
    except NotImplementedError:  # a meta tensor has no data to copy
        raise ValueError(
            f"{name} must be a tensor with data for an env on {device}, got one on {tensor.device}"
        ) from None


def _integer_array(values: Any, name: str) -> np.ndarray:
    """numpy integers from array-likes, or a `ValueError` naming `name`."""
    try:
        array = np.asarray(values)
    except ValueError as err:  # ragged nesting
        raise ValueError(f"{name} must be an array of integers: {err}") from None
    if array.dtype.kind not in "iu":  # bool, float, strings, objects
        raise ValueError(f"{name} must have an integer dtype, got {array.dtype}")
    if array.dtype.kind == "u" and array.dtype.itemsize > 1:  # few torch kernels for these
        array = array.astype(np.int64)
    if not array.flags.writeable:  # torch cannot alias read-only memory
        array = array.copy()
    return array


def resolve_device(device: str | torch.device) -> torch.device:
    """A `torch.device` that exists on this machine, or a `ValueError` naming the problem."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a valid torch device: {err}") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        index = resolved.index if resolved.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) exist"
            )
        resolved = torch.device("cuda", index)
    elif resolved.type in ("mps", "xpu"):
        backend = torch.backends.mps if resolved.type == "mps" else getattr(torch, "xpu", None)
        if backend is None or not backend.is_available():
            raise ValueError(f"device {device!r} requested but {resolved.type} is not available")
    elif resolved.type not in ("cpu", "meta"):  # meta: shapes only, for tests (class docstring)
        raise ValueError(f"device {device!r}: unsupported device type {resolved.type!r}")
    return resolved


def parse_autoreset_mode(mode: AutoresetMode | str) -> AutoresetMode:
    """Accept the enum, its value ("NextStep") or its name ("next_step", any case)."""
    if isinstance(mode, AutoresetMode):
        return mode
    if isinstance(mode, str):
        for member in AutoresetMode:
            if mode in (member.value, member.name) or mode.upper() == member.name:
                return member
    choices = [m.name for m in AutoresetMode]
    raise ValueError(f"autoreset_mode must be an AutoresetMode or one of {choices}, got {mode!r}")
