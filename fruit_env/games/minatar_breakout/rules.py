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

* Every field is an `(N,)` bool or int32 tensor: a step is a short chain of elementwise
  kernels (on the CPU, eager cost is mostly a fixed price per kernel: fewer is faster), and
  a state packs into int32 rows as it is.
* The brick map is one int32 per game: bit `10 * row + column - 9` is set where a brick
  stands. Bricks only ever occupy rows 1-3 (bits 1-30): the start and every refill fill
  exactly those rows and a strike only removes, so this is the whole map. A lookup is a
  shift, a strike an XOR, a refill a constant, "all cleared" a compare with zero. Bits 0
  and 31 stay clear, so a cell of row 0 or of rows 4-9, its bit clamped to them, reads empty.
* Directions are gymnax's codes (0 up-left, 1 up-right, 2 down-right, 3 down-left), so a
  state converts to gymnax's field by field. In these codes every bounce is an XOR:
  `d ^ 1` reverses the horizontal motion, `d ^ 3` the vertical, `d ^ 2` both; XORs
  commute, so a step's bounces combine in any order.
* One field more than gymnax's: `score`, the bricks broken this episode, which is the
  episode's return (every reward is +1 for a brick), for `episode`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

GRID = 10  # the board is GRID x GRID cells; row 0 is the top, the paddle lives in row 9
BOTTOM = GRID - 1
BRICK_ROWS = (1, 2, 3)  # the rows that hold bricks
FULL_WALL = ((1 << (GRID * len(BRICK_ROWS))) - 1) << 1  # all 30 bricks: bits 1-30
NUM_ACTIONS = 3  # gymnax's minimal action set: 0 no-op, 1 left, 2 right
MAX_STEPS_IN_EPISODE = 1000  # gymnax's `EnvParams.max_steps_in_episode`
OBS_SHAPE = (GRID, GRID, 4)  # channels last: paddle, ball, trail, brick (gymnax's order)
START_ROW = 3  # the ball starts here, in column 0 or 9
START_PADDLE = 4
HORIZONTAL, VERTICAL, BOTH = 1, 3, 2  # XOR a direction code with these to bounce


class BreakoutState(NamedTuple):
    """The whole state of `N` games: gymnax's `EnvState` fields, one tensor each, and `score`.

    Plain data: a snapshot of some games is `BreakoutState(*(f[index] for f in state))`.
    """

    ball_y: torch.Tensor  # (N,) int32 row of the ball (0 = top)
    ball_x: torch.Tensor  # (N,) int32 column of the ball
    ball_dir: torch.Tensor  # (N,) int32 0 up-left, 1 up-right, 2 down-right, 3 down-left
    pos: torch.Tensor  # (N,) int32 column of the paddle (in row 9)
    bricks: torch.Tensor  # (N,) int32 bit 10*row+column-9 set where a brick stands
    strike: torch.Tensor  # (N,) bool, the ball moved into a brick cell on the last step
    last_y: torch.Tensor  # (N,) int32 row of the ball before the last step (the trail)
    last_x: torch.Tensor  # (N,) int32 column of the ball before the last step
    time: torch.Tensor  # (N,) int32 steps taken this episode
    terminal: torch.Tensor  # (N,) bool, the ball reached the bottom row past the paddle
    score: torch.Tensor  # (N,) int32 bricks broken this episode (not in gymnax's state)


def initial_state(bits: torch.Tensor) -> BreakoutState:
    """`N` new games from `(N,)` int64 random bits (32 per game; the lowest one is used).

    gymnax picks the ball's start with `jax.random.choice` over {left, right}; one fair bit
    picks it here, so starts follow the same distribution (not the same draws as a JAX key).
    Left: column 0, moving down-right (2); right: column 9, moving down-left (3).
    """
    if bits.dtype != torch.int64 or bits.dim() != 1:
        raise ValueError(f"bits must be an (N,) int64 tensor, got {bits.dtype} {tuple(bits.shape)}")
    right = (bits & 1).to(torch.int32)
    row = torch.full_like(right, START_ROW)
    column = right * BOTTOM
    zero = torch.zeros_like(right)
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
        time=zero,
        terminal=false,
        score=zero,
    )


def advance(
    state: BreakoutState, action: torch.Tensor
) -> tuple[BreakoutState, torch.Tensor, torch.Tensor]:
    """One step of every game: `(new state, reward float32 (N,), terminated bool (N,))`.

    `action`: integer `(N,)` of 0 (no-op), 1 (left), 2 (right), gymnax's minimal action set
    (other values act as no-ops here and are the caller's to reject; gymnax would clamp them).
    In the order of gymnax's `step_agent` then `step_ball_brick`: the paddle moves; the ball
    moves one cell along its diagonal, bouncing off the side walls and the ceiling; moving
    into a brick breaks it (+1) and sends the ball back to its row, vertically reversed,
    unless the ball entered a brick on the previous step too (`strike`: then it passes into
    the cell). On the bottom row an empty wall is refilled, and the paddle sends the ball
    back to its row: vertically reversed if the ball came from the paddle's (new) column,
    fully reversed if it lands on the paddle; else the game ends.
    """
    d, x0, y0 = state.ball_dir, state.ball_x, state.ball_y
    # (A bool adds as 0/1; torch refuses to subtract one, hence the one cast.)
    pos = (state.pos - (action == 1).to(torch.int32) + (action == 2)).clamp(0, BOTTOM)

    # The diagonal step: down for directions 2 and 3, right for directions 1 and 2.
    y = y0 + (d & 2) - 1
    x = x0 + ((d + 1) & 2) - 1
    side = (x < 0) | (x > BOTTOM)
    x = x.clamp(0, BOTTOM)
    ceiling = y < 0
    y = y.clamp(min=0)

    # Bricks: gymnax's strike_toggle (the ball is in a brick cell; never on row 0, so never
    # after a ceiling bounce) and strike_bool (the brick breaks).
    bit = _brick_bit(y, x)
    in_brick = ((state.bricks >> bit) & 1).bool()
    breaks = in_brick & ~state.strike
    bricks = state.bricks ^ (breaks.to(torch.int32) << bit)  # a breaking brick's bit is set

    # The bottom row (never a brick cell): refill an empty wall, then the paddle or the end.
    bottom = y == BOTTOM
    bricks = torch.where(bottom & (bricks == 0), FULL_WALL, bricks)
    back = bottom & (x0 == pos)  # the ball came from the paddle's column: straight back
    sideways = bottom & ~back & (x == pos)  # the ball lands on the paddle
    terminal = bottom & ~(back | sideways)

    d = d ^ side  # a bool XORs as 0/1: HORIZONTAL
    d = torch.where(ceiling | breaks | back, d ^ VERTICAL, d)
    d = torch.where(sideways, d ^ BOTH, d)
    y = torch.where(breaks | back | sideways, y0, y)
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
        score=state.score + breaks,
    )
    return new_state, breaks.to(torch.float32), terminal


def truncated(state: BreakoutState, limit: int = MAX_STEPS_IN_EPISODE) -> torch.Tensor:
    """bool `(N,)`: the episode reached the time limit, gymnax's by default (checked after a
    step, as there)."""
    return state.time >= limit


def episode(state: BreakoutState) -> tuple[torch.Tensor, torch.Tensor]:
    """`(return float32 (N,), length int32 (N,))` of each game's episode so far."""
    return state.score.to(torch.float32), state.time.clone()


def observe(state: BreakoutState, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """`(N, 10, 10, 4)` of `dtype`: gymnax's planes, channels last: paddle, ball, trail, brick.

    gymnax returns the 0/1 values as float32 (`dtype=torch.float32` gives its array exactly);
    bool holds them in a quarter of the bytes. The board is built in `dtype` directly: a
    conversion afterwards would read and write the whole board once more.

    Built as gymnax builds it, by writes into a zeroed board: the wall's bits unpacked into
    the brick plane of rows 1-3, then one scatter of the paddle, ball and trail cells.
    (Comparing every cell with each object's position costs several times more: it reads
    and writes the whole board once per object.) A ball below the board (only after the
    game ended) shows in no cell, as gymnax drops its out-of-bounds write: its index is
    redirected to the paddle's cell, which is set anyway.
    """
    n = state.pos.shape[0]
    device = state.pos.device
    planes = OBS_SHAPE[2]
    board = torch.zeros((n, GRID, GRID, planes), dtype=dtype, device=device)
    bits = torch.arange(1, FULL_WALL.bit_length(), dtype=torch.int32, device=device)
    wall = (state.bricks[:, None] >> bits) & 1
    board[:, BRICK_ROWS[0] : BRICK_ROWS[-1] + 1, :, 3] = wall.view(n, len(BRICK_ROWS), GRID)

    paddle = (state.pos + BOTTOM * GRID) * planes

    def index(y: torch.Tensor, x: torch.Tensor, plane: int) -> torch.Tensor:
        return torch.where(y <= BOTTOM, (y * GRID + x) * planes + plane, paddle)

    marks = torch.stack(
        (paddle, index(state.ball_y, state.ball_x, 1), index(state.last_y, state.last_x, 2)), 1
    )
    board.view(n, -1).scatter_(1, marks.to(torch.int64), 1)
    return board


def _brick_bit(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The brick-map bit of cell (y, x): `10 * y + x - 9` in rows 1-3, else bit 0 (row 0) or
    bit 31 (rows 4 and below), which are never set."""
    return (y * GRID + (x - (GRID - 1))).clamp(0, 31)
