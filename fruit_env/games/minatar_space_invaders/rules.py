"""MinAtar Space Invaders as pure tensor functions over a batch of games, with gymnax's rules.

The rules are those of gymnax's `SpaceInvaders-MinAtar` (a port of MinAtar's Space
Invaders, Young & Tian 2019): a cannon on the bottom row that moves and fires upwards (one
shot per `SHOT_COOL_DOWN` steps), a 4x6 block of aliens that marches sideways every few
steps and one row down (reversing) at a side wall, and fires at the cannon every
`ENEMY_SHOT_INTERVAL` steps; +1 per alien shot, a cleared block refilled (marching faster,
down to every `MIN_MOVE_INTERVAL` steps), the game over when an alien or an alien's bullet
reaches the cannon. Like gymnax there is no randomness at all: no sticky actions, and one
start. Episodes are truncated at `MAX_STEPS_IN_EPISODE` steps.

gymnax's quirks are kept, among them: a cannon's bullet is fired from the cannon's column
before it moves and climbs a row in the same step; an alien's bullet starts in the shooting
alien's own cell; a block that steps down from row 9 wraps to row 0 (and the game ends); a
refill keeps the march's direction and timer.

Every function maps `(N, ...)` tensors to new tensors: no Python branch on tensor values,
no host synchronisation, no per-game loop, constants built on the input's device (so the
functions also trace on `device="meta"`).

How the state is held, and why: each of gymnax's 10x10 maps (aliens, the cannon's bullets,
the aliens' bullets) is an `(N, 10)` int32 tensor of columns, bit `r` of column `c` set
where cell (row `r`, column `c`) is occupied. Every move of gymnax's maps is then a shift:
bullets climb by `>> 1` (dropping row 0) and fall by `<< 1` (dropping row 9), the block
steps down by a 10-bit rotation and sideways by rolling the columns; a side wall is a
column being non-zero. The other fields are `(N,)` int32 or bool tensors, gymnax's scalars
as they are (the march's direction is -1 or +1, as there). One field more than gymnax's:
`score`, the aliens shot this episode, which is the episode's return.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

GRID = 10  # the board is GRID x GRID cells; row 0 is the top, the cannon lives in row 9
BOTTOM = GRID - 1
COLUMN_MASK = (1 << GRID) - 1  # a column's 10 row bits
NUM_ACTIONS = 4  # gymnax's minimal action set: 0 no-op, 1 left, 2 right, 3 fire
LEFT, RIGHT, FIRE = 1, 2, 3
MAX_STEPS_IN_EPISODE = 1000  # gymnax's `EnvParams.max_steps_in_episode`
SHOT_COOL_DOWN = 5  # gymnax's `EnvParams` defaults
ENEMY_MOVE_INTERVAL = 12
ENEMY_SHOT_INTERVAL = 10
MIN_MOVE_INTERVAL = 6  # a refill speeds the march up while the interval is above this
START_POS = 5
START_DIR = -1
BLOCK_COLUMN = 0b1111  # a new block: rows 0-3 ...
BLOCK_COLUMNS = range(2, 8)  # ... of columns 2-7
# channels last, gymnax's order: cannon, alien, alien marching left, alien marching right,
# the cannon's bullet, an alien's bullet
OBS_SHAPE = (GRID, GRID, 6)


class SpaceInvadersState(NamedTuple):
    """The whole state of `N` games: gymnax's `EnvState` fields, one tensor each, and `score`.

    Plain data: a snapshot of some games is `SpaceInvadersState(*(f[index] for f in state))`.
    """

    pos: torch.Tensor  # (N,) int32 column of the cannon (in row 9)
    f_bullets: torch.Tensor  # (N, 10) int32 per column, bit r: a cannon's bullet in row r
    e_bullets: torch.Tensor  # (N, 10) int32 per column, bit r: an alien's bullet in row r
    aliens: torch.Tensor  # (N, 10) int32 per column, bit r: an alien in row r
    alien_dir: torch.Tensor  # (N,) int32 the march's direction: -1 left, +1 right
    enemy_move_interval: torch.Tensor  # (N,) int32 steps between marches (12 down to 6)
    alien_move_timer: torch.Tensor  # (N,) int32 steps until the next march
    alien_shot_timer: torch.Tensor  # (N,) int32 steps until the aliens' next shot
    ramp_index: torch.Tensor  # (N,) int32 how often the march sped up
    shot_timer: torch.Tensor  # (N,) int32 steps until the cannon can fire again
    ramping: torch.Tensor  # (N,) bool the march speeds up on a refill (always true)
    time: torch.Tensor  # (N,) int32 steps taken this episode
    terminal: torch.Tensor  # (N,) bool an alien or an alien's bullet reached the cannon
    score: torch.Tensor  # (N,) int32 aliens shot this episode (not in gymnax's state)


def start_block(device: torch.device) -> torch.Tensor:
    """`(10,)` int32 columns of a new block of aliens."""
    columns = torch.arange(GRID, dtype=torch.int32, device=device)
    inside = (columns >= BLOCK_COLUMNS.start) & (columns < BLOCK_COLUMNS.stop)
    return inside.to(torch.int32) * BLOCK_COLUMN


def initial_state(bits: torch.Tensor) -> SpaceInvadersState:
    """`N` new games. `bits` ((N,) int64 random bits) decide nothing: gymnax's reset
    ignores its key, and every game starts the same way (the block in rows 0-3 of columns
    2-7 marching left, the cannon in column 5, gymnax's timers)."""
    if bits.dtype != torch.int64 or bits.dim() != 1:
        raise ValueError(f"bits must be an (N,) int64 tensor, got {bits.dtype} {tuple(bits.shape)}")
    n, device = bits.shape[0], bits.device

    def full(value: int) -> torch.Tensor:
        return torch.full((n,), value, dtype=torch.int32, device=device)

    empty = torch.zeros((n, GRID), dtype=torch.int32, device=device)
    false = torch.zeros((n,), dtype=torch.bool, device=device)
    return SpaceInvadersState(
        pos=full(START_POS),
        f_bullets=empty,
        e_bullets=empty.clone(),
        aliens=start_block(device).expand(n, GRID).clone(),
        alien_dir=full(START_DIR),
        enemy_move_interval=full(ENEMY_MOVE_INTERVAL),
        alien_move_timer=full(ENEMY_MOVE_INTERVAL),
        alien_shot_timer=full(ENEMY_SHOT_INTERVAL),
        ramp_index=full(0),
        shot_timer=full(0),
        ramping=~false,
        time=full(0),
        terminal=false,
        score=full(0),
    )


def advance(
    state: SpaceInvadersState, action: torch.Tensor
) -> tuple[SpaceInvadersState, torch.Tensor, torch.Tensor]:
    """One step of every game: `(new state, reward float32 (N,), terminated bool (N,))`.

    `action`: integer `(N,)` of 0 (no-op), 1 (left), 2 (right), 3 (fire), gymnax's minimal
    action set (other values act as no-ops here and are the caller's to reject). In the order
    of gymnax's `step_env`: the cannon (`_cannon`), the march (`_march`), the shots
    (`_shots`), then the timers and the refill of a cleared block.
    """
    columns = torch.arange(GRID, dtype=torch.int32, device=state.pos.device)
    pos, f_bullets, e_bullets, shot_timer, hit = _cannon(state, action, columns)
    aliens, alien_dir, move_timer, invaded = _march(state, pos)
    aliens, f_bullets, e_bullets, kills = _shots(state, pos, aliens, f_bullets, e_bullets, columns)

    cleared = (aliens == 0).all(1)
    ramp = cleared & state.ramping & (state.enemy_move_interval > MIN_MOVE_INTERVAL)
    terminal = state.terminal | hit | invaded
    new_state = SpaceInvadersState(
        pos=pos,
        f_bullets=f_bullets,
        e_bullets=e_bullets,
        aliens=torch.where(cleared[:, None], start_block(columns.device), aliens),
        alien_dir=alien_dir,
        enemy_move_interval=state.enemy_move_interval - ramp.to(torch.int32),
        alien_move_timer=move_timer - 1,
        alien_shot_timer=torch.where(
            state.alien_shot_timer == 0, ENEMY_SHOT_INTERVAL, state.alien_shot_timer
        )
        - 1,
        ramp_index=state.ramp_index + ramp,
        shot_timer=shot_timer - (shot_timer > 0).to(torch.int32),
        ramping=state.ramping.clone(),
        time=state.time + 1,
        terminal=terminal,
        score=state.score + kills,
    )
    return new_state, kills.to(torch.float32), terminal.clone()


def _cannon(
    state: SpaceInvadersState, action: torch.Tensor, columns: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """gymnax's `step_agent`: fire from the cannon's column (if the cool-down is over), move,
    then every bullet moves a row (the new one too). `(pos, f_bullets, e_bullets, shot_timer,
    hit)`, `hit`: an alien's bullet reached the cannon's (new) cell."""
    fire = (action == FIRE) & (state.shot_timer == 0)
    muzzle = (columns == state.pos[:, None]) & fire[:, None]
    f_bullets = (state.f_bullets | (muzzle.to(torch.int32) << BOTTOM)) >> 1
    e_bullets = (state.e_bullets << 1) & COLUMN_MASK
    shot_timer = torch.where(fire, SHOT_COOL_DOWN, state.shot_timer)
    pos = (state.pos - (action == LEFT).to(torch.int32) + (action == RIGHT)).clamp(0, BOTTOM)
    hit = _at_bottom(e_bullets, pos)
    return pos, f_bullets, e_bullets, shot_timer, hit


def _march(
    state: SpaceInvadersState, pos: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """gymnax's `step_aliens`: when the timer is 0 the block moves a column along its
    direction, or, at a side wall, a row down (rotating row 9 to row 0) and turns; the timer
    restarts at the number of aliens, at most the interval. `(aliens, alien_dir, timer,
    invaded)`, `invaded`: an alien is in the cannon's cell before or after the move, or the
    block steps down with an alien in row 9."""
    aliens, direction = state.aliens, state.alien_dir
    move = state.alien_move_timer == 0
    timer = torch.where(
        move, torch.minimum(_count(aliens), state.enemy_move_interval), state.alien_move_timer
    )
    at_wall = ((aliens[:, 0] != 0) & (direction < 0)) | ((aliens[:, BOTTOM] != 0) & (direction > 0))
    turn = move & at_wall
    direction = torch.where(turn, -direction, direction)
    landed = turn & ((aliens >> BOTTOM) & 1).bool().any(1)
    down = ((aliens << 1) | (aliens >> BOTTOM)) & COLUMN_MASK
    sideways = torch.where(
        (direction < 0)[:, None], aliens.roll(-1, 1), aliens.roll(1, 1)
    )  # gymnax's roll by the direction, which never wraps: a wall turns the block first
    moved = torch.where(turn[:, None], down, sideways)
    new = torch.where(move[:, None], moved, aliens)
    invaded = _at_bottom(aliens, pos) | landed | (move & _at_bottom(new, pos))
    return new, direction, timer, invaded


def _shots(
    state: SpaceInvadersState,
    pos: torch.Tensor,
    aliens: torch.Tensor,
    f_bullets: torch.Tensor,
    e_bullets: torch.Tensor,
    columns: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """gymnax's `step_shoot`: when the shot timer is 0 the lowest alien of the nearest column
    with aliens (the left one of two as near) puts a bullet in its own cell; then every alien
    that shares its cell with a cannon's bullet dies with it. `(aliens, f_bullets, e_bullets,
    kills int32 (N,))`."""
    occupied = aliens != 0
    # Nearer first, left before right at the same distance: gymnax's stable argsort.
    distance = 2 * (columns - pos[:, None]).abs() + (columns > pos[:, None])
    nearest = torch.where(occupied, distance, 2 * GRID * 2).argmin(1, keepdim=True)
    column = aliens.gather(1, nearest)  # (N, 1)
    powers = 1 << torch.arange(1, GRID, dtype=torch.int32, device=columns.device)
    lowest = (column >= powers).sum(1, keepdim=True, dtype=torch.int32)  # its top set bit
    shoot = (state.alien_shot_timer == 0) & occupied.any(1)
    aimed = (columns == nearest) & shoot[:, None]
    e_bullets = e_bullets | (aimed.to(torch.int32) << lowest)
    kills = aliens & f_bullets
    return aliens ^ kills, f_bullets ^ kills, e_bullets, _count(kills)


def _at_bottom(columns: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """bool `(N,)`: the map `columns` has row 9 of column `pos` set."""
    return (columns.gather(1, pos[:, None].to(torch.int64))[:, 0] >> BOTTOM).bool()


def _count(columns: torch.Tensor) -> torch.Tensor:
    """int32 `(N,)`: the set cells of a map (gymnax's `count_nonzero`)."""
    rows = torch.arange(GRID, dtype=torch.int32, device=columns.device)
    return ((columns[:, :, None] >> rows) & 1).sum((1, 2), dtype=torch.int32)


def truncated(state: SpaceInvadersState, limit: int = MAX_STEPS_IN_EPISODE) -> torch.Tensor:
    """bool `(N,)`: the episode reached the time limit, gymnax's by default (checked after a
    step, as there)."""
    return state.time >= limit


def episode(state: SpaceInvadersState) -> tuple[torch.Tensor, torch.Tensor]:
    """`(return float32 (N,), length int32 (N,))` of each game's episode so far."""
    return state.score.to(torch.float32), state.time.clone()


def observe(state: SpaceInvadersState, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """`(N, 10, 10, 6)` of `dtype`: gymnax's planes, channels last: cannon, alien, alien
    marching left, alien marching right (the alien plane again, in the plane of the march's
    direction), the cannon's bullets, the aliens' bullets.

    gymnax returns the 0/1 values as float32 (`dtype=torch.float32` gives its array exactly).
    The six maps are stacked as columns and unpacked by row in one broadcast.
    """
    device = state.pos.device
    columns = torch.arange(GRID, dtype=torch.int32, device=device)
    cannon = (columns == state.pos[:, None]).to(torch.int32) << BOTTOM
    left = (state.alien_dir < 0)[:, None]
    aliens = state.aliens
    zero = torch.zeros_like(aliens)
    maps = torch.stack(
        (
            cannon,
            aliens,
            torch.where(left, aliens, zero),
            torch.where(left, zero, aliens),
            state.f_bullets,
            state.e_bullets,
        ),
        2,
    )  # (N, column, plane)
    rows = torch.arange(GRID, dtype=torch.int32, device=device).view(1, GRID, 1, 1)
    board = (maps[:, None] >> rows) & 1  # (N, row, column, plane)
    return board.bool() if dtype == torch.bool else board.to(dtype)
