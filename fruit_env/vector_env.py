"""`FruitCatcherVectorEnv`: the Gymnasium vector-env shell around the tensor rules.

The shell checks inputs, keeps seeds and autoreset bookkeeping, and calls one pure
*transition* function per step. There is one transition per autoreset mode, all with the
same signature, so the hot path has no mode flags and compiles as a single graph.

Between steps the game state lives in one packed int32 tensor (`pack`), and the transition
reports its flags as int32 rows that the shell turns into bool tensors. Few tensors, none of
them bool, cross the compiled graph's boundary: each input tensor costs guard time on every
call, and inductor's CPU code loads and stores bool tensors element by element (measured in
docs/performance.md).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from fruit_env import core, rng
from fruit_env.params import FruitParams
from fruit_env.render import RENDER_FPS, RENDER_MODES, ansi_board, rgb_frame

Observer = Callable[[FruitParams, core.Game], torch.Tensor]


def pack(game: core.Game, pending: torch.Tensor) -> torch.Tensor:
    """The game and the NEXT_STEP `pending` mask as one int32 `(3*S + 6, N)` tensor, one row
    per field and slot (`torch.stack` promotes the bool rows to int32 0/1)."""
    rows = (
        game.basket,
        *game.fruit_x,
        *game.fruit_y,
        *game.active,
        game.score,
        game.t,
        game.caught,
        game.missed,
        pending,
    )
    return torch.stack(rows)


def unpack(packed: torch.Tensor) -> tuple[core.Game, torch.Tensor]:
    """The inverse of `pack`: views of its rows (bool rows are compared with 0)."""
    s = (packed.shape[0] - 6) // 3
    basket, *rows = packed.unbind()
    score, t, caught, missed, pending = rows[3 * s :]
    game = core.Game(
        basket=basket,
        fruit_x=tuple(rows[:s]),
        fruit_y=tuple(rows[s : 2 * s]),
        active=tuple(row != 0 for row in rows[2 * s : 3 * s]),
        score=score,
        t=t,
        caught=caught,
        missed=missed,
    )
    return game, pending != 0


class SubEnvSnapshot(NamedTuple):
    """The state of some sub-envs, one column (`packed`) or entry per sub-env."""

    packed: torch.Tensor  # (3*S + 6, n) int32, see `pack`
    key: torch.Tensor  # (n,) int64
    counter: torch.Tensor  # (n,) int64


class Transition(NamedTuple):
    """Everything one vector step produces."""

    packed: torch.Tensor  # the next state, see `pack`
    counter: torch.Tensor  # (N,) int64, the next random-draw counters
    obs: torch.Tensor
    reward: torch.Tensor
    flags: torch.Tensor  # (3, N) int32 0/1: terminated, truncated, ended (the `_episode` mask)
    episode: tuple[torch.Tensor, ...]  # (return, length, caught, missed) of the ended episode
    final_obs: torch.Tensor | None  # SAME_STEP only: the last observation of ended episodes
    invalid: torch.Tensor  # () bool: some action was outside {0, 1, 2} (and was clamped)


def _clamp_actions(action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Actions clamped to {0, 1, 2}, and whether any needed it (checked in the graph, so that
    validation costs the shell no extra kernels)."""
    clamped = action.clamp(0, 2)
    return clamped, (clamped != action).any()


def _report(
    params: FruitParams,
    observe: Observer,
    *,
    new: core.Game,
    pending: torch.Tensor,
    counter: torch.Tensor,
    stepped: core.Game,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    final_obs: torch.Tensor | None,
    invalid: torch.Tensor,
) -> Transition:
    """The `Transition` to `new`; episode statistics come from `stepped`, the state before any
    restart."""
    ended = terminated | truncated
    return Transition(
        pack(new, pending),
        counter,
        observe(params, new),
        reward,
        torch.stack([flag.to(torch.int32) for flag in (terminated, truncated, ended)]),
        (stepped.score.to(torch.float32), stepped.t, stepped.caught, stepped.missed),
        final_obs,
        invalid,
    )


def _next_step(
    params: FruitParams,
    observe: Observer,
    packed: torch.Tensor,
    key: torch.Tensor,
    counter: torch.Tensor,
    action: torch.Tensor,
) -> Transition:
    """NEXT_STEP: sub-envs whose episode ended last step restart now and ignore their action.

    The restart draws from the same counter value as the step, so both share one hash.
    """
    action, invalid = _clamp_actions(action)
    game, pending = unpack(packed)
    rand = core.draw(params, key, counter)
    stepped, result = core.advance(params, game, action, rand)
    new = core.restart(params, stepped, pending, rand)
    keep = ~pending
    terminated = result.terminated & keep
    truncated = result.truncated & keep
    return _report(
        params,
        observe,
        new=new,
        pending=terminated | truncated,
        counter=counter + 1,
        stepped=stepped,
        reward=torch.where(pending, 0.0, result.reward),
        terminated=terminated,
        truncated=truncated,
        final_obs=None,
        invalid=invalid,
    )


def _same_step(
    params: FruitParams,
    observe: Observer,
    packed: torch.Tensor,
    key: torch.Tensor,
    counter: torch.Tensor,
    action: torch.Tensor,
) -> Transition:
    """SAME_STEP: an ended episode restarts at once (drawing from the next counter value);
    its last observation goes to `final_obs`."""
    action, invalid = _clamp_actions(action)
    game, pending = unpack(packed)
    stepped, result = core.advance(params, game, action, core.draw(params, key, counter))
    ended = result.terminated | result.truncated
    new = core.restart(params, stepped, ended, core.draw(params, key, counter + 1))
    return _report(
        params,
        observe,
        new=new,
        pending=pending,
        counter=counter + 1 + ended,
        stepped=stepped,
        reward=result.reward,
        terminated=result.terminated,
        truncated=result.truncated,
        final_obs=observe(params, stepped),
        invalid=invalid,
    )


def _disabled(
    params: FruitParams,
    observe: Observer,
    packed: torch.Tensor,
    key: torch.Tensor,
    counter: torch.Tensor,
    action: torch.Tensor,
) -> Transition:
    """DISABLED: no restarts; the caller resets with `options={"reset_mask": ...}`."""
    action, invalid = _clamp_actions(action)
    game, pending = unpack(packed)
    stepped, result = core.advance(params, game, action, core.draw(params, key, counter))
    return _report(
        params,
        observe,
        new=stepped,
        pending=pending,
        counter=counter + 1,
        stepped=stepped,
        reward=result.reward,
        terminated=result.terminated,
        truncated=result.truncated,
        final_obs=None,
        invalid=invalid,
    )


_TRANSITIONS = {
    AutoresetMode.NEXT_STEP: _next_step,
    AutoresetMode.SAME_STEP: _same_step,
    AutoresetMode.DISABLED: _disabled,
}
EPISODE_KEYS = ("r", "l", "caught", "missed")
# Each env's compiled step counts its own recompilations (one per action dtype, say), where
# torch supports it: all envs share one Python function, so several sizes or rule sets in one
# process would otherwise exhaust the shared recompile limit, a hard error with fullgraph=True.
_COMPILE_OPTIONS: dict[str, Any] = (
    {"isolate_recompiles": True}
    if "isolate_recompiles" in inspect.signature(torch.compile).parameters
    else {}
)
_CPU_INDUCTOR_OPTIONS = {
    # A C++ wrapper around the kernel: ~15 us less Python per step.
    "cpp_wrapper": True,
    # Threads only from 32768 envs per thread, like ATen's eager kernels (at::internal::GRAIN_SIZE):
    # below that, an OpenMP region costs more than it saves, and on a busy machine one
    # preempted thread stalls the step for milliseconds.
    "cpp.min_chunk_size": 32768,
}


class FruitCatcherVectorEnv(VectorEnv):
    """`num_envs` Fruit Catcher games stepped together as torch tensors on one device.

    Rules arguments (`width`, `height`, ...) are those of `FruitParams`. Besides them:

    * `device`: where state and outputs live (`"cpu"`, `"cuda"`, `"cuda:1"`, a `torch.device`).
    * `autoreset_mode`: an `AutoresetMode` (or its value / name as a string).
    * `validate_actions`: raise on actions outside {0, 1, 2}. On CUDA the check costs one
      device-to-host sync per step; with `False`, out-of-range actions are clamped instead.
    * `compile`: run the step through `torch.compile(fullgraph=True)`.
    """

    metadata = {
        "autoreset_mode": AutoresetMode.NEXT_STEP,
        "render_modes": list(RENDER_MODES),
        "render_fps": RENDER_FPS,
        # Success ratios of the episode fields: catch_rate = caught / (caught + missed).
        "episode_ratios": {"catch_rate": ("caught", "missed")},
        # `make_vec` keyword arguments for a caller whose actions are always valid (a
        # trainer sampling from the action space): skip the per-step action check.
        "fast_kwargs": {"validate_actions": False},
    }

    def __init__(
        self,
        num_envs: int,
        *,
        device: str | torch.device = "cpu",
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        render_mode: str | None = None,
        validate_actions: bool = True,
        compile: bool = False,
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
        self.params = FruitParams(**rules)
        self.num_envs = int(num_envs)
        self.device = resolve_device(device)
        self.render_mode = render_mode
        self.validate_actions = bool(validate_actions)
        mode = parse_autoreset_mode(autoreset_mode)
        self.metadata = {**self.metadata, "autoreset_mode": mode}
        self.autoreset_mode = mode  # as SyncVectorEnv has it; TorchRL reads this attribute

        p = self.params
        self.single_action_space = gym.spaces.Discrete(3)
        if p.obs_mode == "features":
            self.single_observation_space = gym.spaces.Box(0.0, 1.0, (p.obs_size,), np.float32)
        else:
            self.single_observation_space = gym.spaces.Box(0, 255, (1, p.height, p.width), np.uint8)

        transition = functools.partial(_TRANSITIONS[mode], p, core.OBSERVERS[p.obs_mode])
        self._transition = (
            torch.compile(
                transition,
                fullgraph=True,
                dynamic=False,
                options=_CPU_INDUCTOR_OPTIONS if self.device.type == "cpu" else None,
                **_COMPILE_OPTIONS,
            )
            if compile
            else transition
        )
        self._observe = functools.partial(core.OBSERVERS[p.obs_mode], p)
        keys = torch.from_numpy(rng.seed_keys(rng.fresh_seeds(self.num_envs)))
        self._state = core.empty_state(p, self.num_envs, self.device)._replace(
            key=keys.to(self.device)
        )
        self._needs_reset = True

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
        """Start new games. `options={"reset_mask": mask}` restarts only the masked sub-envs."""
        if options is not None and not isinstance(options, Mapping):
            raise ValueError(f"options must be a dict or None, got {options!r}")
        options = dict(options or {})
        mask = self._reset_mask(options.pop("reset_mask", None))
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; only 'reset_mask' is known")
        key, counter = self._key, self._counter
        seeded = self._seeded_mask(seed, mask)
        if seeded is not None:
            seeded_mask, keys = seeded
            key = torch.where(seeded_mask, keys, key)
            counter = torch.where(seeded_mask, 0, counter)
        game, pending = unpack(self._packed)
        game = core.restart(self.params, game, mask, core.draw(self.params, key, counter))
        self._packed = pack(game, pending & ~mask)
        self._key, self._counter = key, counter + mask
        self._needs_reset = False
        return self._observe(game), {}

    def step(
        self, actions: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError("call reset() before step()")
        actions = self._as_actions(actions)
        out = self._transition(self._packed, self._key, self._counter, actions)
        if self.validate_actions and out.invalid:  # one host sync; skip with validate_actions=False
            index = int(((actions < 0) | (actions > 2)).nonzero()[0, 0])
            raise ValueError(
                f"actions must be 0, 1 or 2; sub-env {index} got {int(actions[index])}"
            )
        self._packed, self._counter = out.packed, out.counter
        # One tensor each (not views of one): DLPack consumers such as JAX copy unaligned views.
        terminated, truncated, ended = (flag.to(torch.bool) for flag in out.flags)
        info: dict[str, Any] = {
            "episode": dict(zip(EPISODE_KEYS, out.episode, strict=True)),
            "_episode": ended,
        }
        if out.final_obs is not None:
            info["final_obs"] = out.final_obs
            info["_final_obs"] = ended
        return out.obs, out.reward, terminated, truncated, info

    def render(self) -> list[np.ndarray] | list[str] | None:
        """One frame (or text board) per sub-env; meant for small `num_envs`."""
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
        self._state = core.empty_state(self.params, 1, self.device)

    @property
    def max_episode_steps(self) -> int:
        """The episode limit these games were made with (truncation after that many steps)."""
        return self.params.max_episode_steps

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
        self._packed = self._packed.index_copy(1, index, snapshot.packed)
        self._key = self._key.index_copy(0, index, snapshot.key)
        self._counter = self._counter.index_copy(0, index, snapshot.counter)

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
        """The current game state (read-only by convention; for analysis and tests)."""
        return self._state

    @property
    def _state(self) -> core.FruitState:
        game, _ = unpack(self._packed)
        return game.state(self._key, self._counter)

    @_state.setter
    def _state(self, state: core.FruitState) -> None:
        """Replace the game state; pending NEXT_STEP restarts stay (tests plant states here)."""
        n = state.basket.shape[0]
        packed = getattr(self, "_packed", None)
        if packed is not None and packed.shape[1] == n:
            pending = unpack(packed)[1]
        else:
            pending = torch.zeros(n, dtype=torch.bool, device=state.basket.device)
        self._packed = pack(core.Game.of(state), pending)
        self._key, self._counter = state.key, state.counter

    @property
    def _pending(self) -> torch.Tensor:
        """NEXT_STEP: sub-envs whose episode ended on the last step (they restart next step)."""
        return unpack(self._packed)[1]

    # -- input checks --------------------------------------------------------------------------

    def _as_actions(self, actions: Any) -> torch.Tensor:
        if not isinstance(actions, torch.Tensor):
            actions = torch.from_numpy(_integer_array(actions, "actions"))
        elif actions.layout != torch.strided or actions.device.type == "meta":
            raise ValueError(
                f"actions must be a dense tensor with data, got {actions.layout} "
                f"on {actions.device}"
            )
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
        # The range check (or, with validate_actions=False, the clamp) runs inside the
        # transition: see `_clamp_actions`.
        return actions.to(self.device, non_blocking=True)

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
        elif mask.device.type == "meta" or mask.layout != torch.strided:
            raise ValueError("options['reset_mask'] must be a dense tensor with data")
        if mask.shape != (self.num_envs,) or mask.dtype != torch.bool:
            raise ValueError(
                f"options['reset_mask'] must be a bool array of shape ({self.num_envs},), "
                f"got {mask.dtype} {tuple(mask.shape)}"
            )
        return mask.to(self.device)

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
    elif resolved.type != "cpu":
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
