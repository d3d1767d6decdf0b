"""MinAtar Asterix in torch against gymnax's `Asterix-MinAtar`, whose rules it copies.

What is compared and why it is exact: `tests/minatar_reference.py`. Here: states convert
field by field (the `(8, 5)` entity table splits into four `(N, 8)` fields; its row column
is `slot + 1` where a row is in use; `shot_timer` is always 0). The states stepped from are
those reached by random play in gymnax and states drawn over the fields' ranges (crowded and
empty slot tables, ghosts, every timer and speed).

gymnax's step draws a spawn from its JAX key; the comparison stays exact by conditioning on
that draw: from each step's key we read gymnax's own decisions as `spawn_entity` makes them
(the direction, gold or not, the permutation's first entry, which the slot search skips, and
the slot it takes) and hand our rules the bits that encode those same decisions. Which bits
encode a slot is found by asking `spawn_choice` (every candidate index is tried); that the
encoding draws each decision as often as gymnax does is tested separately, as distributions
over many keys and many bits from the same states. Starts (always the same state) and
random-play episodes are compared too, the episodes as distributions.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from fruit_env.games.minatar_asterix.rules import (
    CHOICE_SHIFT,
    MAX_STEPS_IN_EPISODE,
    NUM_ACTIONS,
    OBS_SHAPE,
    SLOTS,
    AsterixState,
    advance,
    episode,
    initial_state,
    observe,
    spawn_choice,
    truncated,
)
from tests.minatar_reference import (
    Reference,
    assert_converts_both_ways,
    assert_every_action_steps_as_gymnax,
    assert_observations_are_gymnax_planes,
    assert_random_play_agrees,
    assert_the_one_start_is_gymnax_start,
    cat_states,
    gymnax_env,
    gymnax_game,
    jax,
    jnp,
    random_play_states,
    same_fields_for_gymnax,
    same_fields_from_gymnax,
)

_gymnax_asterix = gymnax_game("asterix")
EnvState, spawn_entity = _gymnax_asterix.EnvState, _gymnax_asterix.spawn_entity

SCALARS = (
    "player_x",
    "player_y",
    "spawn_speed",
    "spawn_timer",
    "move_speed",
    "move_timer",
    "ramp_timer",
    "ramp_index",
    "time",
)
ENTITY_FIELDS = ("entity_x", "entity_right", "entity_gold", "entity_on")


def gymnax_decisions(key: jax.Array, state: EnvState) -> jax.Array:
    """gymnax's spawn decisions for one key, as `spawn_entity` draws them: `[lr, gold, the
    permutation's first slot, the slot taken, whether it was free]`."""
    _, _, key_slot = jax.random.split(key, 3)
    skip = jax.random.permutation(key_slot, jnp.arange(SLOTS))[0]
    entity, slot = spawn_entity(key, state)
    return jnp.stack([entity[2], entity[3], skip, slot, entity[4]])


# --- conversions ---------------------------------------------------------------------------


def to_gymnax(state: AsterixState) -> EnvState:
    """gymnax's batched `EnvState` for our state (less `score`), with gymnax's dtypes."""
    fields = same_fields_for_gymnax(state, (*SCALARS, "terminal"))
    x, right, gold, on = (getattr(state, name).numpy().astype(np.int32) for name in ENTITY_FIELDS)
    in_use = (on | right | gold | (x != 0)).astype(bool)
    row = np.where(in_use, np.arange(1, SLOTS + 1, dtype=np.int32), 0)
    entities = np.stack([x, row, right, gold, on], -1)
    return EnvState(
        shot_timer=jnp.zeros(len(x), jnp.int32),
        entities=jnp.asarray(entities),
        **fields,
    )


def from_gymnax(state: EnvState, score: torch.Tensor | None = None) -> AsterixState:
    """Our state for a batched gymnax `EnvState` (whose rows must sit in their slot's row and
    whose `shot_timer` must be 0), with `score` (zeros unless given)."""
    entities = np.asarray(state.entities)
    x, row, right, gold, on = np.moveaxis(entities, -1, 0)
    assert np.isin(entities[..., 2:], (0, 1)).all(), "direction, gold and use are 0 or 1"
    in_use = (on | right | gold | (x != 0)).astype(bool)
    assert (row == np.where(in_use, np.arange(1, SLOTS + 1), 0)).all(), "slot i is row i + 1"
    assert not np.asarray(state.shot_timer).any(), "shot_timer is always 0"
    fields = same_fields_from_gymnax(state, SCALARS, ("terminal",))
    n = len(x)
    return AsterixState(
        entity_x=torch.from_numpy(x.astype(np.int32)),
        entity_right=torch.from_numpy(right.astype(bool)),
        entity_gold=torch.from_numpy(gold.astype(bool)),
        entity_on=torch.from_numpy(on.astype(bool)),
        score=torch.zeros(n, dtype=torch.int32) if score is None else score,
        **fields,
    )


REF = Reference(
    gymnax_id="Asterix-MinAtar",
    num_actions=NUM_ACTIONS,
    obs_shape=OBS_SHAPE,
    gymnax_fields=(*SCALARS, "shot_timer", "entities", "terminal"),
    to_gymnax=to_gymnax,
    from_gymnax=from_gymnax,
    step=lambda state, action, bits: advance(state, action, bits()),
    initial_state=initial_state,
    observe=observe,
    truncated=truncated,
    episode=episode,
)


@pytest.fixture(scope="module")
def gym() -> Any:
    """gymnax's env, and its spawn decisions for a batch of keys and states."""
    env = gymnax_env(REF)
    env.vdecisions = jax.jit(jax.vmap(gymnax_decisions))
    return env


# --- states to compare from ----------------------------------------------------------------


def ranged_states(n: int, generator: torch.Generator) -> AsterixState:
    """States drawn over each field's range, reachable or not: late ramps and speeds down to
    0, timers due and past due, slot tables from empty to full, ghosts (unused rows with a
    spawn's fields), the player anywhere on its rows."""

    def ints(low: int, high: int, shape: tuple[int, ...] = (n,)) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=generator, dtype=torch.int32)

    def flags(p: float | torch.Tensor, shape: tuple[int, ...] = (n,)) -> torch.Tensor:
        return torch.rand(shape, generator=generator) < p

    spawn_speed, move_speed = ints(1, 11), ints(0, 6)
    density = torch.tensor([0.0, 0.3, 0.7, 0.95, 1.0])[ints(0, 5)][:, None]
    on = flags(density, (n, SLOTS))
    right = flags(0.5, (n, SLOTS))
    ghost = ~on & flags(0.3, (n, SLOTS))
    x = torch.where(on, ints(0, 10, (n, SLOTS)), (~right).to(torch.int32) * 9)
    x = x * (on | ghost)
    return AsterixState(
        player_x=ints(0, 10),
        player_y=ints(1, 9),
        spawn_speed=spawn_speed,
        spawn_timer=torch.where(flags(0.5), 0, ints(1, 11)).to(torch.int32),
        move_speed=move_speed,
        move_timer=torch.where(flags(0.5), 0, ints(-3, 6)).to(torch.int32),
        ramp_timer=ints(-1, 101),
        ramp_index=ints(0, 14),
        entity_x=x,
        entity_right=right & (on | ghost),
        entity_gold=flags(1 / 3, (n, SLOTS)) & (on | ghost),
        entity_on=on,
        time=ints(0, MAX_STEPS_IN_EPISODE),
        terminal=flags(0.5),
        score=ints(0, 50),
    )


@pytest.fixture(scope="module")
def played(gym: Any) -> EnvState:
    """gymnax states from random play."""
    return random_play_states(gym, REF, num_envs=64, num_steps=64, seed=0)


@pytest.fixture(scope="module")
def states(played: EnvState) -> AsterixState:
    """Random-play states and ranged states."""
    return cat_states(from_gymnax(played), ranged_states(4096, torch.Generator().manual_seed(0)))


def conditioned_bits(gym: Any, keys: jax.Array, states: AsterixState) -> torch.Tensor:
    """Our bits for gymnax's spawn draw from each key: its direction, gold and skipped slot
    as they are, and the slot-choice index that makes `spawn_choice` take gymnax's slot."""
    decided = np.asarray(gym.vdecisions(keys, to_gymnax(states))).astype(np.int64)
    lr, gold, skip, slot, free = (torch.from_numpy(column) for column in decided.T)
    base = lr | (skip << 1) | ((1 - gold) << CHOICE_SHIFT)
    bits, found = base.clone(), torch.zeros(len(base), dtype=torch.bool)
    for index in range(SLOTS - 1):
        candidate = base + ((3 * index) << CHOICE_SHIFT)
        takes = spawn_choice(candidate, states.entity_on).slot.to(torch.int64).argmax(1)
        match = (takes == slot) & ~found
        bits, found = torch.where(match, candidate, bits), found | match
    assert found.all(), "gymnax took a slot our spawn never takes from those slots"
    spawn = spawn_choice(bits, states.entity_on)
    assert torch.equal(spawn.right, lr.bool()) and torch.equal(spawn.gold, gold.bool())
    assert torch.equal(spawn.fills, free.bool()), "free slot found or not, as gymnax"
    return bits


# --- the comparisons -----------------------------------------------------------------------


def test_states_convert_both_ways(played: EnvState) -> None:
    more = ranged_states(256, torch.Generator().manual_seed(1))
    ours = assert_converts_both_ways(REF, played, more)
    assert ours.entity_x.dtype == torch.int32 and ours.entity_on.dtype == torch.bool


def test_a_row_outside_its_slot_does_not_convert(played: EnvState) -> None:
    with pytest.raises(AssertionError, match="slot i is row i"):
        from_gymnax(played.replace(entities=played.entities.at[:, 2, 1].set(7)))


def events(
    a: int,
    states: AsterixState,
    new: AsterixState,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    bits: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Where each of Asterix's rules acted in one step: spawns (and overwrites of a full
    table), gold and enemies met before and after the move, entities off the board, ghosts
    cleared, ramps and slower moves."""
    spawn = (states.spawn_timer == 0) & ~spawn_choice(bits, states.entity_on).fills
    move = states.move_timer == 0
    gone = states.entity_on & ~new.entity_on & move[:, None]
    return {
        "spawn": states.spawn_timer == 0,
        "overwrite": spawn,
        "gold before move": (reward > 0) & ~move,
        "gold after move": (reward > 0) & move,
        "enemy before move": terminated & ~move,
        "enemy after move": terminated & move,
        "off the board": gone & ((states.entity_x == 0) | (states.entity_x == 9)),
        "ghost cleared": ~states.entity_on & (states.entity_x != 0) & move[:, None],
        "ramp": new.ramp_index > states.ramp_index,
        "slower moves": new.move_speed < states.move_speed,
    }


def test_every_action_steps_as_gymnax_step_env(gym: Any, states: AsterixState) -> None:
    """Given gymnax's spawn draw from each action's keys."""

    def draw(a: int) -> tuple[jax.Array, torch.Tensor]:
        keys = jax.random.split(jax.random.PRNGKey(a), len(states.time))
        return keys, conditioned_bits(gym, keys, states)

    assert_every_action_steps_as_gymnax(gym, REF, states, draw, events)


def test_observations_are_gymnax_planes(gym: Any, states: AsterixState) -> None:
    assert_observations_are_gymnax_planes(gym, REF, states)


@pytest.mark.parametrize("pattern", ["empty", "one free", "full", "half"])
def test_spawn_decisions_are_drawn_as_gymnax_draws_them(gym: Any, pattern: str) -> None:
    """From one slot table, the frequency of every (slot, free) outcome, of gold and of each
    direction, from our random bits and from gymnax's keys: within 5 standard errors of
    their difference (the 'one free' table is where gymnax's skipped first slot shows)."""
    n = 16384
    on = {
        "empty": [0] * 8,
        "one free": [1, 1, 1, 0, 1, 1, 1, 1],
        "full": [1] * 8,
        "half": [0, 1, 1, 0, 0, 1, 0, 1],
    }[pattern]
    state = initial_state(torch.zeros(n, dtype=torch.int64))
    state = state._replace(entity_on=torch.tensor(on, dtype=torch.bool).expand(n, SLOTS).clone())
    keys = jax.random.split(jax.random.PRNGKey(9), n)
    theirs = np.asarray(gym.vdecisions(keys, to_gymnax(state))).astype(np.int64)
    spawn = spawn_choice(
        torch.randint(0, 2**32, (n,), generator=torch.Generator().manual_seed(9)), state.entity_on
    )
    ours = np.stack(
        [spawn.right, spawn.gold, spawn.slot.to(torch.int64).argmax(1), spawn.fills], 1
    ).astype(np.int64)
    theirs = theirs[:, [0, 1, 3, 4]]

    def close(a: np.ndarray, b: np.ndarray, what: str) -> None:
        p = (a.mean() + b.mean()) / 2
        se = math.sqrt(max(p * (1 - p), 1 / n) * 2 / n)
        assert abs(a.mean() - b.mean()) < 5 * se, f"{what}: {a.mean():.4f} vs {b.mean():.4f}"

    close(ours[:, 0], theirs[:, 0], "right")
    close(ours[:, 1], theirs[:, 1], "gold")
    assert abs(theirs[:, 1].mean() - 1 / 3) < 5 * math.sqrt(2 / 9 / n)  # gymnax's own 1/3
    for slot in range(SLOTS):
        for free in (0, 1):
            ours_at = (ours[:, 2] == slot) & (ours[:, 3] == free)
            theirs_at = (theirs[:, 2] == slot) & (theirs[:, 3] == free)
            close(ours_at, theirs_at, f"slot {slot} free {free}")


def test_starts_are_gymnax_starts(gym: Any) -> None:
    """gymnax's start is one state whatever the key; ours is the same whatever the bits."""
    assert_the_one_start_is_gymnax_start(gym, REF)


@pytest.mark.slow
def test_random_play_returns_and_lengths_agree_with_gymnax(gym: Any) -> None:
    assert_random_play_agrees(gym, REF, num_envs=2048, per_env=4, least_best_return=3)
