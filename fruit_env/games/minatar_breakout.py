"""MinAtar Breakout as pure tensor functions over a batch of games, with gymnax's rules.

The rules are those of gymnax's `Breakout-MinAtar` (itself a port of MinAtar's Breakout,
Young & Tian 2019): a paddle on the bottom row, a ball that moves one cell along a diagonal
per step, three rows of bricks (rows 1-3) worth +1 each, refilled when the ball reaches the
bottom row with none left, and the game over when the ball reaches the bottom row past the
paddle. Like gymnax (and unlike MinAtar) there are no sticky actions: the only randomness is
the ball's start, left or right. Episodes are truncated at `MAX_STEPS_IN_EPISODE` steps.

Every function maps `(N, ...)` tensors to new tensors: no Python branch on tensor values,
no host synchronisation, no per-game loop, constants built on the input's device (so the
functions also trace on `device="meta"`).

How the state is held, and why:

* The brick map is one int32 per game, bit `10 * (row - 1) + column` for the 30 cells of
  rows 1-3. Bricks never occupy another row (the start and every refill fill exactly rows
  1-3; a strike only removes), so this is the whole map: a lookup is a shift, a refill a
  constant, "all cleared" a compare with zero, and every other field is an `(N,)` tensor
  too, so a step is a short chain of elementwise kernels.
* Directions are gymnax's codes (0 up-left, 1 up-right, 2 down-right, 3 down-left), so a
  state converts to gymnax's field by field. Their bounces are bit operations: `d ^ 1`
  reverses the horizontal motion, `3 - d` the vertical, `d ^ 2` both.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

GRID = 10  # the board is GRID x GRID cells; row 0 is the top, the paddle lives in row 9
BOTTOM = GRID - 1
BRICK_ROWS = (1, 2, 3)  # the rows that hold bricks
FULL_WALL = (1 << (GRID * len(BRICK_ROWS))) - 1  # all 30 bricks present
NUM_ACTIONS = 3  # gymnax's minimal action set: 0 no-op, 1 left, 2 right
MAX_STEPS_IN_EPISODE = 1000  # gymnax's `EnvParams.max_steps_in_episode`
OBS_SHAPE = (GRID, GRID, 4)  # channels last: paddle, ball, trail, brick (gymnax's order)
START_ROW = 3  # the ball starts here, in column 0 or 9
START_PADDLE = 4
_NO_BRICK_SHIFT = 31  # a shift that reads 0 from any brick map (which uses bits 0-29)


class BreakoutState(NamedTuple):
    """The whole state of `N` games: gymnax's `EnvState` fields, one tensor each.

    Plain data: a snapshot of some games is `BreakoutState(*(f[index] for f in state))`.
    """

    ball_y: torch.Tensor  # (N,) int32 row of the ball (0 = top)
    ball_x: torch.Tensor  # (N,) int32 column of the ball
    ball_dir: torch.Tensor  # (N,) int32 0 up-left, 1 up-right, 2 down-right, 3 down-left
    pos: torch.Tensor  # (N,) int32 column of the paddle (in row 9)
    bricks: torch.Tensor  # (N,) int32 bit 10*(row-1)+column set where rows 1-3 hold a brick
    strike: torch.Tensor  # (N,) bool, the ball moved into a brick cell on the last step
    last_y: torch.Tensor  # (N,) int32 row of the ball before the last step (the trail)
    last_x: torch.Tensor  # (N,) int32 column of the ball before the last step
    time: torch.Tensor  # (N,) int32 steps taken this episode
    terminal: torch.Tensor  # (N,) bool, the ball reached the bottom row past the paddle


def initial_state(bits: torch.Tensor) -> BreakoutState:
    """`N` new games from `(N,)` int64 random bits (32 per game; the lowest one is used).

    gymnax picks the ball's start with `jax.random.choice` over {left, right}; one fair bit
    picks it here, so starts follow the same distribution (not the same draws as a JAX key).
    Left: column 0, moving down-right (2); right: column 9, moving down-left (3).
    """
    right = (bits & 1).to(torch.int32)
    row = torch.full_like(right, START_ROW)
    column = right * BOTTOM
    false = torch.zeros_like(right, dtype=torch.bool)
    return BreakoutState(
        ball_y=row,
        ball_x=column,
        ball_dir=right + 2,
        pos=torch.full_like(right, START_PADDLE),
        bricks=torch.full_like(right, FULL_WALL),
        strike=false,
        last_y=row,
        last_x=column,
        time=torch.zeros_like(right),
        terminal=false,
    )


def advance(
    state: BreakoutState, action: torch.Tensor
) -> tuple[BreakoutState, torch.Tensor, torch.Tensor]:
    """One step of every game: `(new state, reward float32 (N,), terminated bool (N,))`.

    `action`: integer `(N,)` of 0 (no-op), 1 (left), 2 (right), gymnax's minimal action set.
    The order of gymnax's `step_agent` then `step_ball_brick`: the paddle moves; the ball
    moves one cell along its diagonal, bouncing off the side walls and the ceiling; moving
    into a brick breaks it (+1) and bounces the ball back to its row, unless the ball
    entered a brick on the previous step too (`strike`: then it passes into the cell); on
    reaching the bottom row with no brick left, the wall is refilled; on the bottom row the
    ball bounces back up if it came from the paddle's new column (straight back) or lands on
    it (reflected sideways), else the game ends.
    """
    d, x0, y0 = state.ball_dir, state.ball_x, state.ball_y
    pos = (state.pos + (action == 2).to(torch.int32) - (action == 1).to(torch.int32)).clamp(
        0, BOTTOM
    )

    # The diagonal step: down for directions 2 and 3, right for directions 1 and 2.
    y = y0 + ((d >> 1) * 2 - 1)
    x = x0 + (((d ^ (d >> 1)) & 1) * 2 - 1)
    side = (x < 0) | (x > BOTTOM)
    x = x.clamp(0, BOTTOM)
    d = torch.where(side, d ^ 1, d)
    ceiling = y < 0
    y = y.clamp(min=0)
    d = torch.where(ceiling, 3 - d, d)

    # Bricks: gymnax's strike_toggle (the ball is in a brick cell) and strike_bool (it breaks).
    in_brick = ~ceiling & (_brick_at(state.bricks, y, x) != 0)
    breaks = in_brick & ~state.strike
    bricks = state.bricks & ~(breaks.to(torch.int32) << _brick_shift(y, x))
    y = torch.where(breaks, y0, y)
    d = torch.where(breaks, 3 - d, d)

    # The bottom row: refill an empty wall, then the paddle returns the ball or the game ends.
    bottom = ~in_brick & (y == BOTTOM)
    bricks = torch.where(bottom & (bricks == 0), FULL_WALL, bricks)
    back = bottom & (x0 == pos)  # the ball left the paddle's (new) column: straight back up
    sideways = bottom & ~back & (x == pos)  # the ball lands on the paddle: reflected
    d = torch.where(back, 3 - d, torch.where(sideways, d ^ 2, d))
    y = torch.where(back | sideways, y0, y)
    terminal = bottom & ~back & ~sideways

    new_state = BreakoutState(
        ball_y=y,
        ball_x=x,
        ball_dir=d,
        pos=pos,
        bricks=bricks,
        strike=in_brick,
        last_y=y0,
        last_x=x0,
        time=state.time + 1,
        terminal=terminal,
    )
    return new_state, breaks.to(torch.float32), terminal


def truncated(state: BreakoutState) -> torch.Tensor:
    """bool `(N,)`: the episode reached gymnax's time limit (checked after a step, as there)."""
    return state.time >= MAX_STEPS_IN_EPISODE


def observe(state: BreakoutState) -> torch.Tensor:
    """bool `(N, 10, 10, 4)`: gymnax's planes, channels last: paddle, ball, trail, brick.

    gymnax returns the same 0/1 values as float32; bool holds them in a quarter of the bytes
    and a consumer's `.to(torch.float32)` gives gymnax's array exactly. A ball below the
    board (only after the game ended) shows in no cell, as gymnax's out-of-bounds write is
    dropped.
    """
    device = state.pos.device
    cells = torch.arange(GRID * GRID, device=device, dtype=torch.int32)
    cell = torch.stack(
        (
            state.pos + BOTTOM * GRID,
            state.ball_y * GRID + state.ball_x,
            state.last_y * GRID + state.last_x,
        ),
        dim=1,
    )  # (N, 3) cell index of the paddle, the ball and its trail
    marks = cells[None, :, None] == cell[:, None, :]
    shifts = _brick_shift(cells // GRID, cells % GRID)
    brick = ((state.bricks[:, None] >> shifts) & 1).to(torch.bool)
    return torch.cat((marks, brick[:, :, None]), dim=2).view(-1, *OBS_SHAPE)


def _brick_shift(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The bit of cell (y, x) in a brick map; `_NO_BRICK_SHIFT` (reads 0) outside rows 1-3."""
    inside = (y >= BRICK_ROWS[0]) & (y <= BRICK_ROWS[-1])
    return torch.where(inside, (y - BRICK_ROWS[0]) * GRID + x, _NO_BRICK_SHIFT)


def _brick_at(bricks: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """int32 `(N,)`: 1 where cell (y, x) holds a brick, else 0."""
    return (bricks >> _brick_shift(y, x)) & 1
