"""`FruitCatcherVectorEnv`: the Gymnasium vector-env shell around the tensor rules.

The shell checks inputs, keeps seeds and autoreset bookkeeping, and calls one pure
*transition* function per step. There is one transition per autoreset mode, all with the
same signature, so the hot path has no mode flags and compiles as a single graph.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from fruit_env import core, rng
from fruit_env.params import FruitParams
from fruit_env.render import RENDER_FPS, RENDER_MODES, ansi_board, rgb_frame

Observer = Callable[[FruitParams, core.FruitState], torch.Tensor]


class Transition(NamedTuple):
    """Everything one vector step produces."""

    state: core.FruitState
    obs: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    ended: torch.Tensor  # (N,) bool: an episode ended on this step (the `_episode` mask)
    episode: tuple[torch.Tensor, ...]  # (return, length, caught, missed) of the ended episode
    final_obs: torch.Tensor | None  # SAME_STEP only: the last observation of ended episodes


def _episode_stats(state: core.FruitState) -> tuple[torch.Tensor, ...]:
    return state.score.to(torch.float32), state.t, state.caught, state.missed


def _next_step(
    params: FruitParams,
    observe: Observer,
    state: core.FruitState,
    action: torch.Tensor,
    pending: torch.Tensor,
) -> Transition:
    """NEXT_STEP: sub-envs whose episode ended last step restart now and ignore their action."""
    stepped, result = core.step(params, state, action)
    new = core.select(pending, core.new_game(params, state), stepped)
    terminated = result.terminated & ~pending
    truncated = result.truncated & ~pending
    reward = torch.where(pending, 0.0, result.reward)
    ended = terminated | truncated
    return Transition(
        new,
        observe(params, new),
        reward,
        terminated,
        truncated,
        ended,
        _episode_stats(stepped),
        None,
    )


def _same_step(
    params: FruitParams,
    observe: Observer,
    state: core.FruitState,
    action: torch.Tensor,
    pending: torch.Tensor,
) -> Transition:
    """SAME_STEP: an ended episode restarts at once; its last observation goes to `final_obs`."""
    stepped, result = core.step(params, state, action)
    ended = result.terminated | result.truncated
    new = core.select(ended, core.new_game(params, stepped), stepped)
    return Transition(
        new,
        observe(params, new),
        result.reward,
        result.terminated,
        result.truncated,
        ended,
        _episode_stats(stepped),
        observe(params, stepped),
    )


def _disabled(
    params: FruitParams,
    observe: Observer,
    state: core.FruitState,
    action: torch.Tensor,
    pending: torch.Tensor,
) -> Transition:
    """DISABLED: no restarts; the caller resets with `options={"reset_mask": ...}`."""
    stepped, result = core.step(params, state, action)
    ended = result.terminated | result.truncated
    return Transition(
        stepped,
        observe(params, stepped),
        result.reward,
        result.terminated,
        result.truncated,
        ended,
        _episode_stats(stepped),
        None,
    )


_TRANSITIONS = {
    AutoresetMode.NEXT_STEP: _next_step,
    AutoresetMode.SAME_STEP: _same_step,
    AutoresetMode.DISABLED: _disabled,
}
EPISODE_KEYS = ("r", "l", "caught", "missed")


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

        p = self.params
        self.single_action_space = gym.spaces.Discrete(3)
        if p.obs_mode == "features":
            self.single_observation_space = gym.spaces.Box(0.0, 1.0, (p.obs_size,), np.float32)
        else:
            self.single_observation_space = gym.spaces.Box(0, 255, (1, p.height, p.width), np.uint8)

        transition = functools.partial(_TRANSITIONS[mode], p, core.OBSERVERS[p.obs_mode])
        self._transition = (
            torch.compile(transition, fullgraph=True, dynamic=False) if compile else transition
        )
        self._observe = functools.partial(core.OBSERVERS[p.obs_mode], p)
        self._state = core.empty_state(p, self.num_envs, self.device)
        keys = torch.from_numpy(rng.seed_keys(rng.fresh_seeds(self.num_envs)))
        self._state = self._state._replace(key=keys.to(self.device))
        self._pending = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
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
        options = dict(options or {})
        mask = self._reset_mask(options.pop("reset_mask", None))
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; only 'reset_mask' is known")
        state = self._state
        seeded = self._seeded_mask(seed, mask)
        if seeded is not None:
            seeded_mask, keys = seeded
            state = state._replace(
                key=torch.where(seeded_mask, keys, state.key),
                counter=torch.where(seeded_mask, 0, state.counter),
            )
        self._state = core.reset(self.params, state, mask)
        self._pending = self._pending & ~mask
        self._needs_reset = False
        return self._observe(self._state), {}

    def step(
        self, actions: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError("call reset() before step()")
        out = self._transition(self._state, self._as_actions(actions), self._pending)
        self._state = out.state
        if self.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP:
            self._pending = out.ended
        info: dict[str, Any] = {
            "episode": dict(zip(EPISODE_KEYS, out.episode, strict=True)),
            "_episode": out.ended,
        }
        if out.final_obs is not None:
            info["final_obs"] = out.final_obs
            info["_final_obs"] = out.ended
        return out.obs, out.reward, out.terminated, out.truncated, info

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
    def state(self) -> core.FruitState:
        """The current game state (read-only by convention; for analysis and tests)."""
        return self._state

    # -- input checks --------------------------------------------------------------------------

    def _as_actions(self, actions: Any) -> torch.Tensor:
        if not isinstance(actions, torch.Tensor):
            array = np.asarray(actions)
            if array.dtype == object:
                raise ValueError(f"actions must be integers, got {actions!r}")
            actions = torch.from_numpy(array)
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
        actions = actions.to(self.device, non_blocking=True)
        if not self.validate_actions:
            return actions.clamp(0, 2)
        bad = (actions < 0) | (actions > 2)
        if bad.any():  # one host sync; skip with validate_actions=False
            index = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"actions must be 0, 1 or 2; sub-env {index} got {int(actions[index])}"
            )
        return actions

    def _reset_mask(self, mask: Any) -> torch.Tensor:
        if mask is None:
            return torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        if not isinstance(mask, torch.Tensor):
            mask = torch.from_numpy(np.asarray(mask))
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
    elif resolved.type not in ("cpu", "mps", "xpu"):
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
