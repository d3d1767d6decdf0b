"""The rules of `core.py` once more, as few eager kernels on the packed state.

`core.py` is the readable source of truth: one `(N,)` tensor per field and fruit slot, which
the compiled step fuses into one loop. Run eagerly, that form costs one kernel per field and
slot (~200 per step), and an eager kernel has a fixed cost: a few microseconds of dispatch
on a CPU, a launch on a GPU. Here the same rules work on the packed state
(`transitions.Layout`: one int32 row per field and slot), a block of rows at a time, with 0/1
int32 masks in arithmetic instead of bool tensors (on the CPU a comparison into int32 is ~3x
faster than into bool, and `torch.where` several times slower than a multiply), and with
temporaries in buffers allocated once per env (`Scratch`). Measured in docs/performance.md.

The two forms agree bit for bit on every output, in every autoreset mode and observation mode:
tests/test_env_packed.py checks it over random rules, states and actions. This form relies on
properties of every state the rules reach (test_env_properties checks them; the `states`
strategy of test_env_packed draws states with just these): an inactive slot holds x = y = 0,
an active fruit is on the board above the bottom row, the basket is on the board, and the
0/1 rows hold 0 or 1.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from gymnasium.vector import AutoresetMode

from fruit_env import core, rng
from fruit_env.params import FruitParams
from fruit_env.transitions import Layout


class Rows(NamedTuple):
    """Views of the rows of one packed state (made once per buffer: a view costs a dispatch)."""

    packed: torch.Tensor  # (3*S + 6, N), see `transitions.Layout`
    basket: torch.Tensor  # (N,)
    x: torch.Tensor  # (S, N)
    y: torch.Tensor  # (S, N)
    active: torch.Tensor  # (S, N)
    x0: torch.Tensor  # (N,), slot 0
    active0: torch.Tensor  # (N,), slot 0
    fruit: torch.Tensor  # (3, S, N): x, y, active
    game: torch.Tensor  # (3*S + 5, N): everything but pending (what a restart clears)
    stats: torch.Tensor  # (4, N): score, t, caught, missed
    score: torch.Tensor  # (N,)
    t: torch.Tensor  # (N,)
    pending: torch.Tensor  # (N,)

    @classmethod
    def of(cls, packed: torch.Tensor) -> Rows:
        lay = Layout.of(packed)
        return cls(
            packed=packed,
            basket=packed[lay.basket],
            x=packed[lay.x],
            y=packed[lay.y],
            active=packed[lay.active],
            x0=packed[lay.x.start],
            active0=packed[lay.active.start],
            fruit=packed[lay.x.start : lay.active.stop].view(3, lay.slots, -1),
            game=packed[: lay.pending],
            stats=packed[lay.stats],
            score=packed[lay.stats.start],
            t=packed[lay.stats.start + 1],
            pending=packed[lay.pending],
        )


class Scratch:
    """Buffers for one env's temporaries, allocated once: the step writes them with `out=`
    instead of allocating (and, at large sizes, page-faulting in) fresh tensors. None of them
    ever leaves the env."""

    def __init__(self, params: FruitParams, num_envs: int, device: torch.device) -> None:
        s, n = params.max_fruits, num_envs

        def i32(*shape: int) -> torch.Tensor:
            return torch.empty(shape, dtype=torch.int32, device=device)

        def i64(*shape: int) -> torch.Tensor:
            return torch.empty(shape, dtype=torch.int64, device=device)

        self.bits, self.tmp = i64(n), i64(n)  # the hash
        self.column = i32(n)
        self.fall = i32(s, n)  # fruit rows after the fall
        self.lands = i32(s, n)
        self.stays = i32(s, n)
        self.inside = i32(s, n)
        self.new = i32(s, n)
        # Row k < S: slot k is falling and too high for a spawn; row S: the coin says no.
        self.no_spawn = i32(s + 1, n)
        self.too_high, self.coin_no = self.no_spawn[:-1], self.no_spawn[-1]
        self.count = i32(n)
        self.slot = i32(n)
        self.keep = i32(n)
        self.flag = i32(n)
        # Per-env change of (score, t, caught, missed): t always advances by 1. Row 0 is
        # the reward.
        self.delta = i32(4, n)
        self.delta[1] = 1
        self.reward, self.caught, self.missed = self.delta[0], self.delta[2], self.delta[3]
        self.slot_index = torch.arange(s, dtype=torch.int32, device=device).view(s, 1)
        # `features`: row j is observation column j; its fruit rows as (field, slot, env).
        self.features = torch.empty((1 + 3 * s, n), dtype=torch.float32, device=device)
        self.centre = self.features[0]
        self.fruit_features = self.features[1:].view(s, 3, n).transpose(0, 1)
        x_max, y_max = params.width - 1, params.height - 1
        self.divisors = torch.tensor([x_max, y_max, 1], dtype=torch.float32, device=device)
        self.divisors = self.divisors.view(3, 1, 1)
        # `pixels`: flat cell indices.
        self.cells = torch.arange(params.basket_width, dtype=torch.int64, device=device)
        self.left = i64(n)
        self.basket_cells = i64(n, params.basket_width)
        self.fruit_cells = i64(n, s)
        self.fruit_cells_t = self.fruit_cells.T


# -- randomness --------------------------------------------------------------------------------

_C1, _C2 = rng.signed32(0x7FEB352D), rng.signed32(0x846CA68B)  # rng.mix32's multipliers


def _mix32_(x: torch.Tensor, tmp: torch.Tensor) -> None:
    """`rng.mix32` in place (int64 in [0, 2**32))."""
    x.bitwise_xor_(torch.bitwise_right_shift(x, 16, out=tmp))
    x.mul_(_C1).bitwise_and_(rng.MASK32)
    x.bitwise_xor_(torch.bitwise_right_shift(x, 15, out=tmp))
    x.mul_(_C2).bitwise_and_(rng.MASK32)
    x.bitwise_xor_(torch.bitwise_right_shift(x, 16, out=tmp))


def draw(
    params: FruitParams, key: torch.Tensor, counter: torch.Tensor, scratch: Scratch
) -> tuple[torch.Tensor, torch.Tensor]:
    """`core.draw` as (column, spawn bits): the column (int32) in `scratch.column`, the low
    16 bits of the draw (`rng.spawn_bits`, int64) in `scratch.bits`."""
    x, tmp = scratch.bits, scratch.tmp
    torch.bitwise_and(counter, rng.MASK32, out=x)
    _mix32_(x, tmp)
    x.bitwise_xor_(key)
    # The second mix32, whose last xor-shift changes only the low 16 bits: the column's
    # high 16 bits are read before it, the coin's low 16 after it.
    x.bitwise_xor_(torch.bitwise_right_shift(x, 16, out=tmp))
    x.mul_(_C1).bitwise_and_(rng.MASK32)
    x.bitwise_xor_(torch.bitwise_right_shift(x, 15, out=tmp))
    x.mul_(_C2).bitwise_and_(rng.MASK32)
    high = torch.bitwise_right_shift(x, 16, out=tmp)
    x.bitwise_xor_(high).bitwise_and_(0xFFFF)
    column = torch.bitwise_right_shift(high.mul_(params.width), 16, out=scratch.column)
    return column, x


# -- the rules ---------------------------------------------------------------------------------


def advance(
    params: FruitParams,
    old: Rows,
    new: Rows,
    action: torch.Tensor,
    column: torch.Tensor,
    spawn_bits: torch.Tensor,
    scratch: Scratch,
) -> None:
    """`core.advance`: the board of `old` after one step into `new`'s board rows, and the
    per-env change of the statistics into `scratch.delta` (row 0: the reward). `new`'s
    statistics and pending rows are left alone. `action` holds 0/1/2; `column` and
    `spawn_bits` are the step's draw."""
    p, sc = params, scratch
    s = p.max_fruits

    basket = torch.add(old.basket, action, out=new.basket).sub_(1).clamp_(0, p.max_basket_x)

    # Every active fruit drops a row; an inactive one stays at y = 0 < height - 1.
    torch.add(old.y, old.active, out=sc.fall)
    torch.ge(sc.fall, p.height - 1, out=sc.lands)
    torch.sub(old.active, sc.lands, out=sc.stays)
    # Caught: landed with 0 <= x - basket < basket_width.
    inside = torch.sub(old.x, basket, out=sc.inside)
    torch.clamp(inside, 0, p.basket_width - 1, out=sc.new)  # `new` as a temporary
    torch.eq(sc.new, inside, out=inside).mul_(sc.lands)
    torch.sum(inside, 0, dtype=torch.int32, out=sc.caught)
    torch.sum(sc.lands, 0, dtype=torch.int32, out=sc.missed).sub_(sc.caught)
    torch.sub(sc.caught, sc.missed, out=sc.reward)

    # Spawn when count < min_fruits, or count < max_fruits, the coin says yes and no falling
    # fruit is above row min_spawn_gap: when count < (max_fruits if all that else min_fruits).
    torch.sum(sc.stays, 0, dtype=torch.int32, out=sc.count)
    # A falling fruit has 1 <= fall < height - 1; an inactive slot is masked by `active`.
    torch.lt(sc.fall, min(p.min_spawn_gap, p.height - 1), out=sc.too_high).mul_(old.active)
    torch.ge(spawn_bits, p.spawn_threshold, out=sc.coin_no)
    threshold = torch.amax(sc.no_spawn, 0, out=sc.flag)  # 1: only min_fruits counts
    threshold.mul_(p.min_fruits - p.max_fruits).add_(p.max_fruits)
    no_spawn = torch.ge(sc.count, threshold, out=sc.flag)
    # The new fruit takes the first free slot: the least `slot + S * stays`, pushed out of
    # range (to >= S) where nothing spawns.
    slots = torch.add(sc.slot_index, sc.stays, alpha=s, out=sc.new)
    torch.amin(slots, 0, out=sc.slot).add_(no_spawn, alpha=s)
    torch.eq(sc.slot_index, sc.slot, out=sc.new)

    torch.mul(old.x, sc.stays, out=new.x).addcmul_(sc.new, column)
    torch.mul(sc.fall, sc.stays, out=new.y)
    torch.add(sc.stays, sc.new, out=new.active)


def restart(
    params: FruitParams, rows: Rows, mask: torch.Tensor, column: torch.Tensor, scratch: Scratch
) -> None:
    """`core.restart` in place on everything but the pending row: where `mask` (int32 0/1)
    is 1, basket centred, one fruit in row 0 of slot 0 at `column`, statistics zeroed.
    Leaves `1 - mask` in `scratch.keep`."""
    keep = torch.bitwise_xor(mask, 1, out=scratch.keep)
    rows.game.mul_(keep)
    rows.basket.add_(mask, alpha=params.max_basket_x // 2)
    rows.x0.addcmul_(mask, column)
    rows.active0.add_(mask)


def terminated(params: FruitParams, rows: Rows) -> torch.Tensor:
    """The score reached win_score or lose_score (bool)."""
    inside = rows.score.clamp(params.lose_score + 1, params.win_score - 1)
    return torch.ne(inside, rows.score)


def truncated(params: FruitParams, rows: Rows) -> torch.Tensor:
    """t reached max_episode_steps (bool)."""
    return torch.ge(rows.t, params.max_episode_steps)


# -- observations ------------------------------------------------------------------------------


def features(params: FruitParams, rows: Rows, scratch: Scratch) -> torch.Tensor:
    """`core.features`: float32 `(N, 1 + 3*S)`.

    The columns are computed as the rows of `scratch.features`, with the same divisions as
    core's on the int32 rows (bit for bit), then transposed into the observation in one copy.
    """
    centre = torch.add(rows.basket, (params.basket_width - 1) / 2, out=scratch.centre)
    centre.div_(params.width - 1)
    torch.div(rows.fruit, scratch.divisors, out=scratch.fruit_features)
    columns = scratch.features
    obs = torch.empty(columns.shape[::-1], dtype=torch.float32, device=columns.device)
    obs.T.copy_(columns)
    return obs


def pixels(params: FruitParams, rows: Rows, scratch: Scratch) -> torch.Tensor:
    """`core.pixels`: uint8 `(N, 1, height, width)`.

    A zeroed image, one scatter of 255 into the fruit cells, then one of 128 into the basket
    cells. An inactive slot writes its 255 into the basket's first cell, which the basket
    then overwrites; active fruits are above the bottom row, so the basket never hides one.
    Cells written twice by one scatter get the same value both times: order does not matter.
    """
    n, w, sc = rows.basket.shape[0], params.width, scratch
    image = torch.zeros((n, params.height * w), dtype=torch.uint8, device=rows.basket.device)
    left = torch.add(rows.basket, (params.height - 1) * w, out=sc.left)
    torch.add(left.view(n, 1), sc.cells, out=sc.basket_cells)
    fruit = torch.add(rows.x, rows.y, alpha=w, out=sc.fruit_cells_t)  # y * width + x
    fruit.sub_(left).mul_(rows.active).add_(left)  # inactive: the basket's first cell
    image.scatter_(1, sc.fruit_cells, core.FRUIT_PIXEL)
    image.scatter_(1, sc.basket_cells, core.BASKET_PIXEL)
    return image.view(n, 1, params.height, w)


OBSERVERS = {"features": features, "pixels": pixels}


# -- transitions -------------------------------------------------------------------------------


class StepOutput(NamedTuple):
    """What `step` hands out besides the state, all fresh tensors."""

    obs: torch.Tensor
    reward: torch.Tensor  # (N,) float32
    terminated: torch.Tensor  # (N,) bool
    truncated: torch.Tensor  # (N,) bool
    ended: torch.Tensor  # (N,) bool, the `_episode` mask
    episode: tuple[torch.Tensor, ...]  # (return, length, caught, missed) of the ended episode
    final_obs: torch.Tensor | None  # SAME_STEP only


MODES = ("next_step", "same_step", "disabled")
MODE_NAMES = {  # the name `EagerStep` takes for each autoreset mode
    AutoresetMode.NEXT_STEP: "next_step",
    AutoresetMode.SAME_STEP: "same_step",
    AutoresetMode.DISABLED: "disabled",
}


class _Ending(NamedTuple):
    """What an autoreset mode makes of a stepped game (see `EagerStep`)."""

    reward: torch.Tensor
    flags: tuple[torch.Tensor, torch.Tensor]  # terminated, truncated
    ended: torch.Tensor
    final_obs: torch.Tensor | None


class EagerStep:
    """One autoreset mode's step as eager kernels on the packed state, with the random draws
    and outputs of that mode's transition in `transitions.py`.

    It keeps two state buffers and writes each step into the other one. `step(packed, ...)`
    takes the current state (a state it returned, or any other packed tensor, which it
    copies in), advances `counter` in place and returns the new state (one of its buffers:
    the caller must not hand it out) with the step's outputs. Its actions must be 0, 1 or 2;
    `clamped` and `flagged` take any integers (see `action_checks`).
    """

    def __init__(self, params: FruitParams, mode: str, num_envs: int, device: torch.device) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.params, self.mode = params, mode
        self.scratch = Scratch(params, num_envs, device)
        shape = (Layout(params.max_fruits).rows, num_envs)
        self._buffers = [
            Rows.of(torch.zeros(shape, dtype=torch.int32, device=device)) for _ in range(2)
        ]
        self._observe = OBSERVERS[params.obs_mode]
        # The mode's bookkeeping, chosen once: no mode test per step.
        self._end = {
            "next_step": self._next_step,
            "same_step": self._same_step,
            "disabled": self._disabled,
        }[mode]

    def rows(self, packed: torch.Tensor) -> Rows:
        """The current buffer, holding `packed`."""
        rows = self._buffers[0]
        if packed is not rows.packed:  # a new state from outside (a restore, say)
            rows.packed.copy_(packed)
        return rows

    def observe(self, packed: torch.Tensor) -> torch.Tensor:
        return self._observe(self.params, self.rows(packed), self.scratch)

    def reset(
        self, packed: torch.Tensor, key: torch.Tensor, counter: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """`core.reset` where `mask` (bool) is true, also dropping those sub-envs' pending
        NEXT_STEP restart; advances `counter` in place and returns the new state."""
        p, sc = self.params, self.scratch
        rows = self.rows(packed)
        column, _ = draw(p, key, counter, sc)
        restart(p, rows, mask.to(torch.int32), column, sc)
        rows.pending.mul_(sc.keep)
        counter.add_(mask)
        return rows.packed

    def __call__(
        self,
        packed: torch.Tensor,
        key: torch.Tensor,
        counter: torch.Tensor,
        action: torch.Tensor,
    ) -> tuple[torch.Tensor, StepOutput]:
        p, sc = self.params, self.scratch
        old = self.rows(packed)
        new = self._buffers[1]
        self._buffers.reverse()
        column, spawn_bits = draw(p, key, counter, sc)
        advance(p, old, new, action, column, spawn_bits, sc)
        # The stepped game's statistics, reported as the episode's: four rows, each starting
        # on a 64-byte boundary (DLPack consumers such as JAX copy unaligned arrays).
        stats = torch.add(old.stats, sc.delta, out=_aligned_rows(old.stats))
        new.stats.copy_(stats)
        end = self._end(old, new, key, counter, column)
        score, *counts = stats.unbind()
        episode = (score.to(torch.float32), *counts)
        obs = self._observe(p, new, sc)
        output = StepOutput(obs, end.reward, *end.flags, end.ended, episode, end.final_obs)
        return new.packed, output

    def clamped(
        self, packed: torch.Tensor, key: torch.Tensor, counter: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, StepOutput]:
        """The step with any integer actions, clamped into [0, 2]."""
        return self(packed, key, counter, action.clamp(0, 2))

    def flagged(
        self, packed: torch.Tensor, key: torch.Tensor, counter: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, StepOutput, torch.Tensor]:
        """`clamped`, and a () bool tensor: whether some action needed the clamp."""
        clamped = action.clamp(0, 2)
        invalid = (clamped != action).any()
        return (*self(packed, key, counter, clamped), invalid)

    # -- what each autoreset mode does after the rules' step -------------------------------

    def _next_step(
        self, old: Rows, new: Rows, key: torch.Tensor, counter: torch.Tensor, column: torch.Tensor
    ) -> _Ending:
        """Sub-envs whose episode ended last step restart instead, from this step's draw,
        with reward 0 and no flags (their restarted score and t are 0)."""
        p, sc = self.params, self.scratch
        restart(p, new, old.pending, column, sc)
        reward = torch.mul(sc.reward, sc.keep, out=_like(sc.reward, torch.float32))
        flags = terminated(p, new), truncated(p, new)
        ended = torch.bitwise_or(*flags)
        new.pending.copy_(ended)
        counter.add_(1)
        return _Ending(reward, flags, ended, None)

    def _disabled(
        self, old: Rows, new: Rows, key: torch.Tensor, counter: torch.Tensor, column: torch.Tensor
    ) -> _Ending:
        """No restart: the caller resets ended sub-envs."""
        p, sc = self.params, self.scratch
        reward = sc.reward.to(torch.float32)
        flags = terminated(p, new), truncated(p, new)
        ended = torch.bitwise_or(*flags)
        new.pending.copy_(old.pending)
        counter.add_(1)
        return _Ending(reward, flags, ended, None)

    def _same_step(
        self, old: Rows, new: Rows, key: torch.Tensor, counter: torch.Tensor, column: torch.Tensor
    ) -> _Ending:
        """Ended episodes restart now, from the next counter value; their last observation
        is the final one."""
        p, sc = self.params, self.scratch
        end = self._disabled(old, new, key, counter, column)
        final_obs = self._observe(p, new, sc)
        mask = sc.flag.copy_(end.ended)
        restart(p, new, mask, draw(p, key, counter, sc)[0], sc)
        counter.add_(mask)
        return end._replace(final_obs=final_obs)


def _like(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(tensor.shape, dtype=dtype, device=tensor.device)


def _aligned_rows(like: torch.Tensor) -> torch.Tensor:
    """A fresh tensor of `like`'s 2-D shape and dtype whose rows start at multiples of 64
    bytes from the first (which the allocator aligns)."""
    rows, n = like.shape
    per_line = 64 // like.element_size()
    padded = torch.empty((rows, n + -n % per_line), dtype=like.dtype, device=like.device)
    return padded[:, :n]
