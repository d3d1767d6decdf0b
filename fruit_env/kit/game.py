"""What a game supplies to the kit: pure tensor functions over a batch of its own states.

A game is a `TensorGame`: a state type (a NamedTuple of `(num_envs, ...)` tensors: bool,
integers of at most 32 bits, or float32), and functions from states to states. Each function
works on every sub-env at once, with no Python branch on tensor values and no host read, so
that the same code runs eagerly on any device and compiles into one graph. Randomness comes
in as data: each call gets 32 random bits per sub-env (an int64 tensor in [0, 2**32)), drawn
by the kit from the sub-env's key and counter.

The kit (`TensorVectorEnv`) does everything else once for every game: the Gymnasium API,
the three autoreset modes, seeding, snapshots, action checks, episode statistics, rendering
calls and the compiled path. Like gymnax's `Environment`, the game says what one step does
and the kit decides when a game starts again.
"""

from __future__ import annotations

from typing import Any, Generic, NamedTuple, TypeVar

import gymnasium as gym
import torch

S = TypeVar("S")  # a game's state: a NamedTuple of (num_envs, ...) tensors


class Step(NamedTuple):
    """What one step of a game gives: the next state and its outcome, all fresh tensors, none
    of them a field of the state (the kit hands them out, and masks the reward in place)."""

    state: Any  # the game's state type
    reward: torch.Tensor  # (N,) float32
    terminated: torch.Tensor  # (N,) bool: the game reached an end state
    truncated: torch.Tensor  # (N,) bool: the game ran out of time


class TensorGame(Generic[S]):
    """The rules of a game over a batch of states. Subclass it and define the four functions
    that raise `NotImplementedError`, and the attributes below.

    Attributes:
    * `observation_space`: the space of one sub-env's observation (what `observe` gives per row).
    * `num_actions`: actions are the integers `0 .. num_actions - 1`; the kit checks them
      and hands `advance` only those.
    * `episode_fields`: the names of what `episode` returns, reported in `info["episode"]`
      (Gymnasium's "r" and "l" first, then the game's own).
    * `max_episode_steps`: the time limit `advance` truncates at, if any (trainers read it).
    * `render_modes`, `render_fps`: what `render` draws (none by default).
    * `metadata`: more entries for the env's `metadata`.
    * `packed_state`: whether the state is a `layout.Packed` (a faster form's) rather than
      the game's own NamedTuple.
    """

    observation_space: gym.Space
    num_actions: int
    episode_fields: tuple[str, ...] = ("r", "l")
    max_episode_steps: int | None = None
    render_modes: tuple[str, ...] = ()
    render_fps: int = 30
    metadata: dict[str, Any] = {}
    packed_state = False  # True: the functions take and give `layout.Packed` states

    def initial(self, bits: torch.Tensor) -> S:
        """A new game per sub-env, from `bits` (N,) int64 random bits (a faster form that
        defines `restart` needs none)."""
        raise NotImplementedError

    def advance(self, state: S, action: torch.Tensor, bits: torch.Tensor) -> Step:
        """One step of every game: `action` (N,) int32 in `[0, num_actions)`, `bits` the
        step's random bits. Must not change `state`'s tensors."""
        raise NotImplementedError

    def observe(self, state: S) -> torch.Tensor:
        """The observation of every game: a fresh `(N, *observation_space.shape)` tensor."""
        raise NotImplementedError

    def episode(self, state: S) -> tuple[torch.Tensor, ...]:
        """The statistics of each game's episode so far, one fresh `(N,)` tensor per name in
        `episode_fields` (the return as float32 and the length first). The kit reports them for
        the sub-envs whose episode just ended."""
        raise NotImplementedError

    def restart(self, state: S, mask: torch.Tensor, bits: torch.Tensor) -> S:
        """`state` where `mask` (N,) bool is false, a new game from `bits` where it is true.
        A game may define it faster (in place, even: the kit never reads a state again after
        restarting it)."""
        fresh = self.initial(bits)
        return _select(mask, fresh, state)

    def render(self, state: S, mode: str) -> list[Any]:
        """One frame (or text board) per sub-env in `mode`, one of `render_modes`."""
        raise NotImplementedError(f"{type(self).__name__} renders nothing")

    def eager_form(self, num_envs: int, device: torch.device) -> TensorGame[Any]:
        """The game as an env with `num_envs` sub-envs on `device` runs it without
        compiling: this game itself, unless the game has a faster form of the same rules
        (which must give the same games bit for bit, and keep its state as `layout.Packed`)."""
        return self

    def rules_key(self) -> str:
        """What tells these rules apart from other rules of the same game (part of the
        compiled path's cache key): by default the game's attributes as `repr` shows them.
        Override it where an attribute's `repr` does not show its value."""
        return repr(sorted(vars(self).items()))


def _select(mask: torch.Tensor, fresh: Any, state: Any) -> Any:
    """Field by field, `fresh` where `mask` holds, else `state` (nested NamedTuples too)."""
    if isinstance(state, torch.Tensor):
        where = mask.view(-1, *([1] * (state.dim() - 1)))
        return torch.where(where, fresh, state)
    fields = [_select(mask, f, s) for f, s in zip(fresh, state, strict=True)]
    return type(state)(*fields) if hasattr(state, "_fields") else tuple(fields)
