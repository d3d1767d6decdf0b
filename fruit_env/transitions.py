"""The step of the vector env as pure functions of the packed state: one per autoreset mode.

Each transition is `core`'s rules plus the mode's autoreset bookkeeping, with the same
signature, so that the shell calls it with no mode flags and it compiles as a single graph
(`compiled.py`). They are also the reference that `packed.EagerStep`, the eager step, is
tested against bit for bit.

Between steps the game state lives in one packed int32 tensor (`Layout`, `pack`), and a
transition reports its flags as int32 rows that the shell turns into bool tensors. Few
tensors, none of them bool, cross the compiled graph's boundary: inductor's CPU code loads
and stores bool tensors element by element (measured in docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from gymnasium.vector import AutoresetMode

from fruit_env import core
from fruit_env.params import FruitParams

Observer = Callable[[FruitParams, core.Game], torch.Tensor]


class Layout(NamedTuple):
    """Where each field sits in the packed state of `slots` fruit slots: one int32 row per
    field and slot, in this order: basket, x of each slot, y of each slot, active of each slot
    (0/1), score, t, caught, missed, pending (0/1). The one definition of the layout: `pack`,
    `unpack` and the eager step's row views (`packed.Rows`) all read it."""

    slots: int

    @classmethod
    def of(cls, packed: torch.Tensor) -> Layout:
        """The layout of a packed state, from its number of rows."""
        return cls((packed.shape[0] - 6) // 3)

    @property
    def rows(self) -> int:
        return 3 * self.slots + 6

    @property
    def basket(self) -> int:
        return 0

    @property
    def x(self) -> slice:
        return slice(1, 1 + self.slots)

    @property
    def y(self) -> slice:
        return slice(1 + self.slots, 1 + 2 * self.slots)

    @property
    def active(self) -> slice:
        return slice(1 + 2 * self.slots, 1 + 3 * self.slots)

    @property
    def stats(self) -> slice:
        """score, t, caught, missed."""
        return slice(1 + 3 * self.slots, 5 + 3 * self.slots)

    @property
    def pending(self) -> int:
        return 3 * self.slots + 5


def pack(game: core.Game, pending: torch.Tensor) -> torch.Tensor:
    """The game and the NEXT_STEP `pending` mask as one int32 `(3*S + 6, N)` tensor laid out
    as `Layout` says."""
    lay = Layout(len(game.fruit_x))
    rows: list[torch.Tensor] = [game.basket] * lay.rows
    rows[lay.x] = game.fruit_x
    rows[lay.y] = game.fruit_y
    rows[lay.active] = [active.to(torch.int32) for active in game.active]
    rows[lay.stats] = [game.score, game.t, game.caught, game.missed]
    rows[lay.pending] = pending.to(torch.int32)
    return torch.stack(rows)


def unpack(packed: torch.Tensor) -> tuple[core.Game, torch.Tensor]:
    """The inverse of `pack`: views of its rows (0/1 rows are compared with 0), and the
    pending mask."""
    lay = Layout.of(packed)
    rows = packed.unbind()
    score, t, caught, missed = rows[lay.stats]
    game = core.Game(
        basket=rows[lay.basket],
        fruit_x=rows[lay.x],
        fruit_y=rows[lay.y],
        active=tuple(row != 0 for row in rows[lay.active]),
        score=score,
        t=t,
        caught=caught,
        missed=missed,
    )
    return game, rows[lay.pending] != 0


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


def next_step(
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


def same_step(
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


def disabled(
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


def scattered_pixels(params: FruitParams, game: core.Game) -> torch.Tensor:
    """`core.pixels` built by scattering into a zeroed image, as the compiled step does:
    compiled, `core.pixels` compares every pixel with every fruit and the basket, while this
    writes each pixel once plus one write per fruit and basket cell (docs/performance.md).

    An inactive slot writes its 255 into the basket's first cell, which the basket then
    overwrites; active fruits are above the bottom row, so the basket never hides one.
    Cells written twice by one scatter get the same value both times: order does not matter.
    Equal to `core.pixels` on the states the rules reach (tests/test_env_packed.py).
    """
    n, w, h = game.basket.shape[0], params.width, params.height
    image = torch.zeros((n, h * w), dtype=torch.uint8, device=game.basket.device)
    left = game.basket.to(torch.int64) + (h - 1) * w  # the basket's first cell
    cells = [
        (y.to(torch.int64) * w + x - left) * active + left
        for x, y, active in zip(game.fruit_x, game.fruit_y, game.active, strict=True)
    ]
    image = image.scatter(1, torch.stack(cells, 1), core.FRUIT_PIXEL)
    basket = left.view(n, 1) + torch.arange(params.basket_width, device=left.device)
    return image.scatter(1, basket, core.BASKET_PIXEL).view(n, 1, h, w)


# What the compiled step observes with: the same values as core.OBSERVERS.
COMPILED_OBSERVERS = {"features": core.features, "pixels": scattered_pixels}

TRANSITIONS = {
    AutoresetMode.NEXT_STEP: next_step,
    AutoresetMode.SAME_STEP: same_step,
    AutoresetMode.DISABLED: disabled,
}
