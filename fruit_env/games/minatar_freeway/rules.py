"""MinAtar Freeway as pure tensor functions over a batch of games, with gymnax's rules.

The rules are those of gymnax's `Freeway-MinAtar` (itself a port of MinAtar's Freeway,
Young & Tian 2019): a chicken starts on the bottom row (9) of a 10 x 10 board, in column 4,
and crosses eight lanes of traffic (rows 1-8, one car each) to the top. It moves one row up
or down, at most once every `PLAYER_SPEED` steps. Reaching row 0 gives +1, puts the chicken
back on row 9 and draws a new speed and direction for every car; a car that meets the
chicken also sends it back to row 9. A car with speed `s` moves one column every `s + 1`
steps and wraps round at the edges. The game never ends by itself: episodes are truncated
at `MAX_STEPS_IN_EPISODE` steps. Like gymnax (and unlike MinAtar) there are no sticky
actions.

Every function maps `(N, ...)` tensors to new tensors: no Python branch on tensor values,
no host synchronisation, no per-game loop, constants built on the input's device (so the
functions also trace on `device="meta"`).

How the state is held, and why:

* gymnax keeps each car as a row `[x, lane, timer, speed]`. The lane of car `i` is always
  `i + 1` (a new game sets it, nothing changes it), so it is not stored; the other three are
  `(N, 8)` int32 fields, one column per car. Every other field is `(N,)` int32 or bool.
* The eight cars are stepped at once. gymnax steps them one after another, and each may send
  the chicken back to row 9; that order cannot matter, because a car can only meet a
  chicken on its own lane, and a chicken sent back to row 9 is on no lane.
* Randomness comes in as 32 bits per game and step (`car_speeds`); gymnax draws new speeds on
  every step and keeps them only when the chicken scores, and so do these rules.
* One field more than gymnax's: `score`, the crossings this episode, which is the episode's
  return (every reward is +1 for a crossing), for `episode`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

GRID = 10  # the board is GRID x GRID cells; row 0 is the top, the chicken starts in row 9
BOTTOM = GRID - 1
NUM_CARS = 8  # car i drives in row (lane) i + 1
CHICKEN_COLUMN = 4  # the chicken's column; a car meets it there
PLAYER_SPEED = 3  # gymnax's `EnvParams.player_speed`: steps between two moves of the chicken
MAX_SPEED = 5  # car speeds are 1..5, signed by direction (+ right, - left)
NUM_ACTIONS = 3  # gymnax's minimal action set: 0 no-op, 1 up, 2 down
MAX_STEPS_IN_EPISODE = 2500  # gymnax's `EnvParams.max_steps_in_episode`
# channels last, gymnax's order: chicken, car, then a car's trail in channel 1 + |speed|
OBS_SHAPE = (GRID, GRID, 2 + MAX_SPEED)
_OUTCOMES = 2 * MAX_SPEED  # one car's draw: a speed 1..5 times a direction


class FreewayState(NamedTuple):
    """The whole state of `N` games: gymnax's `EnvState` fields (its `cars` rows split into
    three `(N, 8)` fields, less the constant lane), and `score`.

    Plain data: a snapshot of some games is `FreewayState(*(f[index] for f in state))`.
    """

    pos: torch.Tensor  # (N,) int32 row of the chicken (9 = bottom; 0 is left at once)
    car_x: torch.Tensor  # (N, 8) int32 column of the car in row i + 1
    car_timer: torch.Tensor  # (N, 8) int32 steps before the car moves (0: it moves this step)
    car_speed: torch.Tensor  # (N, 8) int32 +-1..5: steps between moves, signed by direction
    move_timer: torch.Tensor  # (N,) int32 steps before the chicken may move again
    time: torch.Tensor  # (N,) int32 steps taken this episode
    terminal: torch.Tensor  # (N,) bool, always false (gymnax's field; the game never ends)
    score: torch.Tensor  # (N,) int32 crossings this episode (not in gymnax's state)


def car_speeds(bits: torch.Tensor) -> torch.Tensor:
    """Eight signed car speeds `(N, 8)` int32 from `(N,)` int64 random bits (32 per game).

    gymnax draws each car's speed uniformly in 1..5 and its direction uniformly in {-1, +1}:
    ten outcomes per car. Here car `i`'s outcome is the `i`-th decimal digit of the fraction
    `bits / 2**32`, `((bits * 10**(i+1)) >> 32) % 10` (below 2**59: exact in int64). Each
    car's outcome has probability 1/10 to within 3e-8, and each of the 10**8 outcomes of all
    eight cars 42 or 43 in 2**32 (1e-8 to within 2.3%): gymnax's law, not its JAX draws.
    Digits 0-4 are speeds -5..-1, digits 5-9 speeds 1..5.
    """
    # 10, 100, ..., 10**8 built on the device (not copied from the host on every step), by
    # integer products: a compiled `10 ** arange` goes through floating point and is inexact.
    scale = torch.full((NUM_CARS,), _OUTCOMES, dtype=torch.int64, device=bits.device).cumprod(0)
    digit = ((bits[:, None] * scale) >> 32) % _OUTCOMES
    return (digit - MAX_SPEED + (digit >= MAX_SPEED)).to(torch.int32)


def initial_state(bits: torch.Tensor) -> FreewayState:
    """`N` new games from `(N,)` int64 random bits (32 per game): the chicken on row 9, every
    car in column 0 with a speed from `car_speeds` and its timer at that speed, as gymnax's
    `reset_env` (whose first move of the chicken waits `PLAYER_SPEED` steps)."""
    if bits.dtype != torch.int64 or bits.dim() != 1:
        raise ValueError(f"bits must be an (N,) int64 tensor, got {bits.dtype} {tuple(bits.shape)}")
    speed = car_speeds(bits)
    zero = torch.zeros_like(bits, dtype=torch.int32)
    return FreewayState(
        pos=torch.full_like(zero, BOTTOM),
        car_x=torch.zeros_like(speed),
        car_timer=speed.abs(),
        car_speed=speed,
        move_timer=torch.full_like(zero, PLAYER_SPEED),
        time=zero,
        terminal=torch.zeros_like(zero, dtype=torch.bool),
        score=zero,
    )


def advance(
    state: FreewayState, action: torch.Tensor, bits: torch.Tensor
) -> tuple[FreewayState, torch.Tensor, torch.Tensor]:
    """One step of every game: `(new state, reward float32 (N,), terminated bool (N,))`.

    `action`: integer `(N,)` of 0 (no-op), 1 (up), 2 (down), gymnax's minimal action set
    (other values act as no-ops here and are the caller's to reject); `bits`: `(N,)` int64,
    the new car speeds should the chicken score (`car_speeds`).
    In the order of gymnax's `step_env`: the chicken moves if its timer is out (and the timer
    starts again); on row 0 it scores, goes back to row 9 and every car gets a new speed and
    direction, its timer set to the new speed (its column kept). Then each car whose timer is
    out moves one column (wrapping round) and its timer starts again at its speed, the
    others count down; a car in the chicken's row and column before or after this sends the
    chicken back to row 9. Last the chicken's timer counts down. `terminated` is always false.
    """
    ready = state.move_timer == 0
    up = ready & (action == 1)
    down = ready & (action == 2)
    # (A bool adds as 0/1; torch refuses to subtract one, hence the one cast.)
    pos = (state.pos - up.to(torch.int32) + down).clamp(0, BOTTOM)
    move_timer = torch.where(up | down, PLAYER_SPEED, state.move_timer)
    scored = pos == 0
    pos = pos.masked_fill(scored, BOTTOM)

    redraw = scored[:, None]
    speed = torch.where(redraw, car_speeds(bits), state.car_speed)
    timer = torch.where(redraw, speed.abs(), state.car_timer)
    moves = timer == 0
    step = (speed > 0).to(torch.int32) * 2 - 1  # +1 right, -1 left
    x = torch.where(moves, (state.car_x + step) % GRID, state.car_x)
    timer = torch.where(moves, speed.abs(), timer - 1)

    lanes = torch.arange(1, NUM_CARS + 1, dtype=torch.int32, device=pos.device)
    met = (state.car_x == CHICKEN_COLUMN) | (x == CHICKEN_COLUMN)
    hit = ((lanes == pos[:, None]) & met).any(1)
    new_state = FreewayState(
        pos=pos.masked_fill(hit, BOTTOM),
        car_x=x,
        car_timer=timer,
        car_speed=speed,
        move_timer=move_timer - (move_timer > 0).to(torch.int32),
        time=state.time + 1,
        terminal=torch.zeros_like(scored),
        score=state.score + scored,
    )
    return new_state, scored.to(torch.float32), torch.zeros_like(scored)


def truncated(state: FreewayState, limit: int = MAX_STEPS_IN_EPISODE) -> torch.Tensor:
    """bool `(N,)`: the episode reached the time limit, gymnax's by default (checked after a
    step, as there)."""
    return state.time >= limit


def episode(state: FreewayState) -> tuple[torch.Tensor, torch.Tensor]:
    """`(return float32 (N,), length int32 (N,))` of each game's episode so far."""
    return state.score.to(torch.float32), state.time.clone()


def observe(state: FreewayState, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """`(N, 10, 10, 7)` of `dtype`: gymnax's planes, channels last: the chicken (0), the cars
    (1), and each car's trail, the cell behind it (wrapping round), in channel 1 + its speed
    (2-6), so that the planes show where each car goes and how fast.

    gymnax returns the 0/1 values as float32 (`dtype=torch.float32` gives its array exactly);
    bool holds them in a quarter of the bytes. Built as gymnax builds it, by writes of ones
    into a zeroed board: one scatter of the 17 marked cells per game.
    """
    n = state.pos.shape[0]
    device = state.pos.device
    planes = OBS_SHAPE[2]
    board = torch.zeros((n, GRID, GRID, planes), dtype=dtype, device=device)
    lane_cells = torch.arange(1, NUM_CARS + 1, dtype=torch.int32, device=device) * GRID
    step = (state.car_speed > 0).to(torch.int32) * 2 - 1  # +1 right, -1 left
    behind = (state.car_x - step) % GRID
    marks = torch.cat(
        (
            ((state.pos * GRID + CHICKEN_COLUMN) * planes)[:, None],
            (lane_cells + state.car_x) * planes + 1,
            (lane_cells + behind) * planes + 1 + state.car_speed.abs(),
        ),
        1,
    )
    board.view(n, -1).scatter_(1, marks.to(torch.int64), 1)
    return board
