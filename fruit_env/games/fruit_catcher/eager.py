"""The rules of `rules.py` once more, as few eager kernels on the packed state: the form the
kit runs when it does not compile (`FruitCatcher.eager_form`).

`rules.py` is the readable source of truth: one `(N,)` tensor per field and fruit slot, which
the compiled step fuses into one loop. Run eagerly, that form costs one kernel per field and
slot (~200 per step), and an eager kernel has a fixed cost: a few microseconds of dispatch
on a CPU, a launch on a GPU. Here the same rules work on the packed state (`kit.layout`: one
int32 row per field and slot), a block of rows at a time, with 0/1 int32 masks in arithmetic
instead of bool tensors (on the CPU a comparison into int32 is ~3x faster than into bool, and
`torch.where` several times slower than a multiply), with temporaries in buffers allocated
once per env (`Scratch`), and restarts in place. The readable form run eagerly takes 1.6x
this one's time (docs/performance.md).

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

from fruit_env.games.fruit_catcher.params import BASKET_PIXEL, FRUIT_PIXEL, FruitParams
from fruit_env.kit import Step, TensorGame
from fruit_env.kit.layout import Packed


class Rows(NamedTuple):
    """Views of the rows of one packed state (made once per buffer: a view costs a dispatch).
    The rows are `Board`'s fields in order: basket, x of each slot, y of each slot, active of
    each slot (0/1), score, t, caught, missed."""

    packed: torch.Tensor  # (3*S + 5, N)
    state: Packed  # the same rows as the kit's state
    basket: torch.Tensor  # (N,)
    x: torch.Tensor  # (S, N)
    y: torch.Tensor  # (S, N)
    active: torch.Tensor  # (S, N)
    x0: torch.Tensor  # (N,), slot 0
    active0: torch.Tensor  # (N,), slot 0
    fruit: torch.Tensor  # (3, S, N): x, y, active
    stats: torch.Tensor  # (4, N): score, t, caught, missed
    score: torch.Tensor  # (N,)
    t: torch.Tensor  # (N,)

    @classmethod
    def of(cls, packed: torch.Tensor) -> Rows:
        s = (packed.shape[0] - 5) // 3
        stats = 1 + 3 * s
        return cls(
            packed=packed,
            state=Packed(packed.T),
            basket=packed[0],
            x=packed[1 : 1 + s],
            y=packed[1 + s : 1 + 2 * s],
            active=packed[1 + 2 * s : stats],
            x0=packed[1],
            active0=packed[1 + 2 * s],
            fruit=packed[1:stats].view(3, s, -1),
            stats=packed[stats:],
            score=packed[stats],
            t=packed[stats + 1],
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

        self.bits, self.tmp = i64(n), i64(n)  # the draw's decoding
        self.column = i32(n)
        self.mask = i32(n)
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
        self.x_max = self.divisors[0, 0, 0]  # a tensor: CUDA multiplies by a number's reciprocal
        # `pixels`: flat cell indices.
        self.cells = torch.arange(params.basket_width, dtype=torch.int64, device=device)
        self.left = i64(n)
        self.basket_cells = i64(n, params.basket_width)
        self.fruit_cells = i64(n, s)
        self.fruit_cells_t = self.fruit_cells.T


# -- randomness --------------------------------------------------------------------------------


def decode(
    params: FruitParams, bits: torch.Tensor, scratch: Scratch
) -> tuple[torch.Tensor, torch.Tensor]:
    """`params.column` and `params.spawn_bits` of a draw, into `scratch.column` (int32) and
    `scratch.bits` (int64)."""
    high = torch.bitwise_right_shift(bits, 16, out=scratch.tmp)
    column = torch.bitwise_right_shift(high.mul_(params.width), 16, out=scratch.column)
    return column, torch.bitwise_and(bits, 0xFFFF, out=scratch.bits)


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
    """`FruitCatcher.advance`: the board of `old` after one step into `new`'s board rows, and
    the per-env change of the statistics into `scratch.delta` (row 0: the reward). `new`'s
    statistics rows are left alone. `action` holds int32 0/1/2; `column` and
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
    """`FruitCatcher.restart` in place: where `mask` (int32 0/1) is 1, basket centred, one
    fruit in row 0 of slot 0 at `column`, statistics zeroed."""
    keep = torch.bitwise_xor(mask, 1, out=scratch.keep)
    rows.packed.mul_(keep)
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
    """`FruitCatcher.features`: float32 `(N, 1 + 3*S)`.

    The columns are computed as the rows of `scratch.features`, with the same divisions as
    the rules' on the int32 rows (bit for bit), then transposed into the observation in one copy.
    """
    centre = torch.add(rows.basket, (params.basket_width - 1) / 2, out=scratch.centre)
    centre.div_(scratch.x_max)
    torch.div(rows.fruit, scratch.divisors, out=scratch.fruit_features)
    columns = scratch.features
    obs = torch.empty(columns.shape[::-1], dtype=torch.float32, device=columns.device)
    obs.T.copy_(columns)
    return obs


def pixels(params: FruitParams, rows: Rows, scratch: Scratch) -> torch.Tensor:
    """`FruitCatcher.pixels`: uint8 `(N, 1, height, width)`.

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
    image.scatter_(1, sc.fruit_cells, FRUIT_PIXEL)
    image.scatter_(1, sc.basket_cells, BASKET_PIXEL)
    return image.view(n, 1, params.height, w)


OBSERVERS = {"features": features, "pixels": pixels}


# -- the game ----------------------------------------------------------------------------------


class PackedFruitCatcher(TensorGame[Packed]):
    """`FruitCatcher`'s step, restart, observation and episode on `Packed` rows kept in two
    buffers of its own, used in turns: a step reads one and writes the other, and a restart
    works in place. A state it did not write (a restore, a planted state) is copied in first.
    Nothing it hands out is a view of its buffers. The kit asks it for nothing else (spaces,
    rendering and the rest are the readable game's)."""

    packed_state = True

    def __init__(self, params: FruitParams, num_envs: int, device: torch.device) -> None:
        self.params = params
        self.scratch = Scratch(params, num_envs, device)
        shape = (3 * params.max_fruits + 5, num_envs)
        self._buffers = [
            Rows.of(torch.zeros(shape, dtype=torch.int32, device=device)) for _ in range(2)
        ]
        self._observe = features if params.obs_mode == "features" else pixels
        self._decoded: tuple[torch.Tensor | None, tuple[torch.Tensor, torch.Tensor]] = (
            None,
            (self.scratch.column, self.scratch.bits),
        )

    def rows(self, state: Packed) -> Rows:
        """The current buffer, holding `state`."""
        rows = self._buffers[0]
        if state is not rows.state:  # a state from outside
            rows.packed.copy_(state.board.T)
        return rows

    def advance(self, state: Packed, action: torch.Tensor, bits: torch.Tensor) -> Step:
        p, sc = self.params, self.scratch
        old, new = self.rows(state), self._buffers[1]
        self._buffers.reverse()
        column, spawn_bits = self._decode(bits)
        advance(p, old, new, action, column, spawn_bits, sc)
        torch.add(old.stats, sc.delta, out=new.stats)
        reward = sc.reward.to(torch.float32)
        return Step(new.state, reward, terminated(p, new), truncated(p, new))

    def episode(self, state: Packed) -> tuple[torch.Tensor, ...]:
        # Four rows, each starting on a 64-byte boundary (DLPack consumers such as JAX copy
        # unaligned arrays).
        rows = self.rows(state)
        score, *counts = _aligned_rows(rows.stats).copy_(rows.stats).unbind()
        return (score.to(torch.float32), *counts)

    def restart(self, state: Packed, mask: torch.Tensor, bits: torch.Tensor) -> Packed:
        rows = self.rows(state)
        column, _ = self._decode(bits)
        restart(self.params, rows, self.scratch.mask.copy_(mask), column, self.scratch)
        return rows.state

    def observe(self, state: Packed) -> torch.Tensor:
        return self._observe(self.params, self.rows(state), self.scratch)

    def _decode(self, bits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`decode`, once per draw: a NEXT_STEP restart reuses its step's draw."""
        if bits is not self._decoded[0]:
            self._decoded = (bits, decode(self.params, bits, self.scratch))
        return self._decoded[1]


def _aligned_rows(like: torch.Tensor) -> torch.Tensor:
    """A fresh tensor of `like`'s 2-D shape and dtype whose rows start at multiples of 64
    bytes from the first (which the allocator aligns)."""
    rows, n = like.shape
    per_line = 64 // like.element_size()
    padded = torch.empty((rows, n + -n % per_line), dtype=like.dtype, device=like.device)
    return padded[:, :n]
