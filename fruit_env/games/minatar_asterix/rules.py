"""MinAtar Asterix as pure tensor functions over a batch of games, with gymnax's rules.

The rules are those of gymnax's `Asterix-MinAtar` (a port of MinAtar's Asterix, Young & Tian
2019): the player moves in the four directions on rows 1-8 of a 10x10 board; every few steps
an enemy or a piece of gold (one time in three) enters row `slot + 1` of a free slot from the
left or the right edge and crosses the board one cell per move tick; gold is +1, an enemy ends
the game. The spawn and move intervals shrink every `RAMP_INTERVAL` steps or so. Like gymnax
(and unlike MinAtar) there are no sticky actions: the only randomness is the spawn.

Every function maps `(N, ...)` tensors to new tensors: no Python branch on tensor values,
no host synchronisation, no per-game loop, constants built on the input's device (so the
functions also trace on `device="meta"`).

gymnax's quirks, kept (a state steps to exactly gymnax's next state):

* The free-slot search walks a random permutation of the 8 slots but starts at its second
  entry: the first (`skip` here) is never taken while another slot is free. When no slot but
  the skipped one is free, the spawn overwrites a uniformly chosen other slot with an *unused*
  entity: the entity there disappears, and the row keeps the new entity's fields with its
  `on` flag clear (a "ghost", invisible, which the next move tick clears).
* A spawn happens when `spawn_timer` is 0 and resets it to `spawn_speed`, and the timers
  count down after the step, so spawns are `spawn_speed + 1` steps apart; moves likewise.
* Collisions are checked before the entities move and again after (with the player's new
  position both times); an entity that moves off the board disappears.

How the state is held, and why: gymnax's `(8, 5)` entity table becomes four `(N, 8)` fields
(column, direction, gold, on); its row column is `slot + 1` for every row in use (0 for an
all-zero row), so it is not stored. gymnax's `shot_timer` never changes from 0 and is not
stored either. One field more than gymnax's: `score`, the gold taken this episode (the return).

Randomness: a step's 32 bits decide the spawn (used only when one happens): bit 0 the
direction (gymnax's fair `lr`), bits 1-3 the skipped slot (the permutation's first entry,
uniform over 8), and the 28 bits above, `v`, gold (`v % 3 == 0`, gymnax's 1/3) and which of
the eligible slots is taken (`v // 3` modulo their number, uniform over them as gymnax's
search is). The distribution is gymnax's to within about 1e-7 (28 bits do not split
exactly into thirds and sevenths); the draws are not those of a JAX key.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

GRID = 10  # the board is GRID x GRID cells; row 0 is the top
SLOTS = 8  # entity slots; slot i moves along row i + 1
NUM_ACTIONS = 5  # gymnax's minimal action set: 0 no-op, 1 left, 2 up, 3 right, 4 down
MAX_STEPS_IN_EPISODE = 1000  # gymnax's `EnvParams.max_steps_in_episode`
OBS_SHAPE = (GRID, GRID, 4)  # channels last: player, enemy, trail, gold (gymnax's order)
START = 5  # the player starts at row 5, column 5
INIT_SPAWN_SPEED = 10  # gymnax's `init_spawn_speed`
INIT_MOVE_INTERVAL = 5  # gymnax's `init_move_interval`
RAMP_INTERVAL = 100  # gymnax's `ramp_interval` (and `ramping` is on)
TOP_ROW, BOTTOM_ROW = 1, SLOTS  # the player's rows
SKIP_BITS = 3  # bits 1-3: the slot the free-slot search skips
CHOICE_SHIFT = 1 + SKIP_BITS  # the bits from here on: gold and which slot


class AsterixState(NamedTuple):
    """The whole state of `N` games: gymnax's `EnvState` fields (less the constant
    `shot_timer`), its entity table as four `(N, 8)` fields, and `score`.

    Plain data: a snapshot of some games is `AsterixState(*(f[index] for f in state))`.
    """

    player_x: torch.Tensor  # (N,) int32 column of the player
    player_y: torch.Tensor  # (N,) int32 row of the player (1-8)
    spawn_speed: torch.Tensor  # (N,) int32 what `spawn_timer` restarts from after a spawn
    spawn_timer: torch.Tensor  # (N,) int32 steps until the next spawn (spawns at 0)
    move_speed: torch.Tensor  # (N,) int32 what `move_timer` restarts from after a move
    move_timer: torch.Tensor  # (N,) int32 steps until the entities next move (at 0)
    ramp_timer: torch.Tensor  # (N,) int32 steps until the next difficulty ramp
    ramp_index: torch.Tensor  # (N,) int32 ramps so far
    entity_x: torch.Tensor  # (N, 8) int32 column of slot i's entity (row i + 1)
    entity_right: torch.Tensor  # (N, 8) bool, it moves right (gymnax's `lr`)
    entity_gold: torch.Tensor  # (N, 8) bool, it is gold (else an enemy)
    entity_on: torch.Tensor  # (N, 8) bool, the slot holds an entity (gymnax's column 4)
    time: torch.Tensor  # (N,) int32 steps taken this episode
    terminal: torch.Tensor  # (N,) bool, the player met an enemy
    score: torch.Tensor  # (N,) int32 gold taken this episode (not in gymnax's state)


def initial_state(bits: torch.Tensor) -> AsterixState:
    """`N` new games; `bits` `(N,)` int64 give only the batch size and device: gymnax's start
    is always the same (player in the middle, no entities, the initial speeds)."""
    if bits.dtype != torch.int64 or bits.dim() != 1:
        raise ValueError(f"bits must be an (N,) int64 tensor, got {bits.dtype} {tuple(bits.shape)}")
    n, device = bits.shape[0], bits.device

    def full(value: int) -> torch.Tensor:
        return torch.full((n,), value, dtype=torch.int32, device=device)

    slots = torch.zeros((n, SLOTS), dtype=torch.int32, device=device)
    no = torch.zeros((n, SLOTS), dtype=torch.bool, device=device)
    return AsterixState(
        player_x=full(START),
        player_y=full(START),
        spawn_speed=full(INIT_SPAWN_SPEED),
        spawn_timer=full(INIT_SPAWN_SPEED),
        move_speed=full(INIT_MOVE_INTERVAL),
        move_timer=full(INIT_MOVE_INTERVAL),
        ramp_timer=full(RAMP_INTERVAL),
        ramp_index=full(0),
        entity_x=slots,
        entity_right=no,
        entity_gold=no.clone(),
        entity_on=no.clone(),
        time=full(0),
        terminal=torch.zeros(n, dtype=torch.bool, device=device),
        score=full(0),
    )


class Spawn(NamedTuple):
    """What a step's bits decide, were a spawn due: `(N,)` direction and kind, the `(N, 8)`
    one-hot slot it takes, and whether that slot was free (else the entity is a ghost)."""

    right: torch.Tensor  # (N,) bool
    gold: torch.Tensor  # (N,) bool
    slot: torch.Tensor  # (N, 8) bool, exactly one set per game
    fills: torch.Tensor  # (N,) bool


def spawn_choice(bits: torch.Tensor, on: torch.Tensor) -> Spawn:
    """Decode `bits` `(N,)` int64 into a spawn for games whose slots in use are `on` (N, 8),
    as gymnax's `spawn_entity` decides it (see the module's docstring)."""
    index = torch.arange(SLOTS, device=bits.device)
    skip = (bits >> 1) & ((1 << SKIP_BITS) - 1)
    v = bits >> CHOICE_SHIFT
    others = index != skip[:, None]
    free = others & ~on
    count = free.sum(1)
    fills = count > 0
    eligible = torch.where(fills[:, None], free, others)  # else gymnax's last-resort overwrite
    pick = (v // 3) % torch.where(fills, count, SLOTS - 1)
    slot = eligible & (eligible.cumsum(1) == pick[:, None] + 1)
    return Spawn((bits & 1).bool(), v % 3 == 0, slot, fills)


def advance(
    state: AsterixState, action: torch.Tensor, bits: torch.Tensor
) -> tuple[AsterixState, torch.Tensor, torch.Tensor]:
    """One step of every game: `(new state, reward float32 (N,), terminated bool (N,))`.

    `action`: integer `(N,)` of 0 (no-op), 1 (left), 2 (up), 3 (right), 4 (down), gymnax's
    minimal action set (other values act as no-ops here and are the caller's to reject).
    `bits`: the step's `(N,)` int64 random bits, for the spawn. In the order of gymnax's
    `step_env`: spawn, move the player, collide, move the entities, collide, count down.
    """
    # The spawn, into the slot the bits choose, when its timer is up.
    due = state.spawn_timer == 0
    spawn = spawn_choice(bits, state.entity_on)
    put = spawn.slot & due[:, None]
    x = torch.where(put, (~spawn.right).to(torch.int32)[:, None] * (GRID - 1), state.entity_x)
    right = torch.where(put, spawn.right[:, None], state.entity_right)
    gold = torch.where(put, spawn.gold[:, None], state.entity_gold)
    on = torch.where(put, spawn.fills[:, None], state.entity_on)
    spawn_timer = torch.where(due, state.spawn_speed, state.spawn_timer)

    # The player (a bool adds as 0/1; torch refuses to subtract one, hence the casts).
    px = (state.player_x - (action == 1).to(torch.int32) + (action == 3)).clamp(0, GRID - 1)
    py = (state.player_y - (action == 2).to(torch.int32) + (action == 4)).clamp(TOP_ROW, BOTTOM_ROW)
    in_row = torch.arange(1, SLOTS + 1, device=px.device) == py[:, None]  # (N, 8)

    # Collisions where the entities stand: gold is taken (its row cleared), an enemy ends it.
    hit = on & in_row & (x == px[:, None])
    taken = hit & gold
    met = hit & ~gold
    kept = on & ~taken

    # The move tick: every entity in use steps one cell, and another collision check; an
    # entity off the board, a taken one and an unused row (a ghost) clear. Between ticks only
    # taken rows clear.
    move = state.move_timer == 0
    tick = move[:, None]
    move_timer = torch.where(move, state.move_speed, state.move_timer)
    moved = x + right.to(torch.int32) * 2 - 1
    hit = kept & in_row & (moved == px[:, None]) & tick  # (off the board is never the player)
    taken_now = hit & gold
    met = met | (hit & ~gold)
    used = torch.where(tick, kept & (moved >= 0) & (moved < GRID) & ~taken_now, ~taken)
    x = torch.where(tick, moved, x) * used
    right = right & used
    gold = gold & used
    on = on & used

    reward = taken.sum(1) + taken_now.sum(1)
    terminal = met.any(1)
    speeds = _ramp(state)
    new_state = AsterixState(
        player_x=px,
        player_y=py,
        spawn_speed=speeds[0],
        spawn_timer=spawn_timer - 1,
        move_speed=speeds[1],
        move_timer=move_timer - 1,
        ramp_timer=speeds[2],
        ramp_index=speeds[3],
        entity_x=x,
        entity_right=right,
        entity_gold=gold,
        entity_on=on,
        time=state.time + 1,
        terminal=terminal,
        score=state.score + reward.to(torch.int32),
    )
    return new_state, reward.to(torch.float32), terminal


def _ramp(state: AsterixState) -> tuple[torch.Tensor, ...]:
    """gymnax's `step_timers` difficulty ramp: `(spawn_speed, move_speed, ramp_timer,
    ramp_index)`. While either speed is above 1, the ramp timer counts down past 0 to -1;
    the step after, it restarts and the spawn interval (and every other ramp, the move
    interval, while above 0) shrinks by one."""
    ramping = (state.spawn_speed > 1) | (state.move_speed > 1)
    counting = ramping & (state.ramp_timer >= 0)
    ramp = ramping & ~counting
    ramp_timer = torch.where(counting, state.ramp_timer - 1, RAMP_INTERVAL)
    slower_moves = ramp & (state.move_speed != 0) & (state.ramp_index % 2 != 0)
    fewer_spawns = ramp & (state.spawn_speed > 1)
    return (
        state.spawn_speed - fewer_spawns.to(torch.int32),
        state.move_speed - slower_moves.to(torch.int32),
        ramp_timer,
        state.ramp_index + ramp,
    )


def truncated(state: AsterixState, limit: int = MAX_STEPS_IN_EPISODE) -> torch.Tensor:
    """bool `(N,)`: the episode reached the time limit, gymnax's by default (checked after a
    step, as there)."""
    return state.time >= limit


def episode(state: AsterixState) -> tuple[torch.Tensor, torch.Tensor]:
    """`(return float32 (N,), length int32 (N,))` of each game's episode so far."""
    return state.score.to(torch.float32), state.time.clone()


def observe(state: AsterixState, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """`(N, 10, 10, 4)` of `dtype`: gymnax's planes, channels last: player, enemy, trail, gold.

    gymnax returns the 0/1 values as float32 (`dtype=torch.float32` gives its array exactly).
    One scatter into a zeroed board, as gymnax writes it: the player; each entity in use in
    its row (enemy or gold plane); its trail one cell behind it, where that cell is on the
    board. A mark with nothing to show (an unused slot, a trail off the board) is redirected
    to the player's cell, which is set anyway.
    """
    n = state.player_x.shape[0]
    device = state.player_x.device
    planes = OBS_SHAPE[2]
    board = torch.zeros((n, GRID, GRID, planes), dtype=dtype, device=device)
    player = ((state.player_y * GRID + state.player_x) * planes)[:, None]
    row_start = torch.arange(1, SLOTS + 1, device=device) * GRID  # (8,)
    x = state.entity_x
    body = (row_start + x) * planes + 1 + 2 * state.entity_gold.to(torch.int32)
    back = x + 1 - 2 * state.entity_right.to(torch.int32)
    trail = (row_start + back) * planes + 2
    on = state.entity_on
    body = torch.where(on, body, player)
    trail = torch.where(on & (back >= 0) & (back < GRID), trail, player)
    marks = torch.cat((player, body, trail), 1)
    board.view(n, -1).scatter_(1, marks.to(torch.int64), 1)
    return board
