"""MinAtar Breakout in torch against gymnax's `Breakout-MinAtar`, whose rules it copies.

What is compared and why it is exact: `tests/minatar_reference.py`. Here: states convert
field by field (the brick map packs into the bits of one int32). The states stepped from are
those reached by random play in gymnax, the same with thinned walls, and states drawn
uniformly over the fields' ranges. gymnax's `step_env` draws nothing, so no conditioning is
needed. Starts (a fair coin between two) and random-play episodes are random on both sides
(JAX keys there, our counter-based bits here): they are compared as distributions.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
import torch

from fruit_env.games.minatar_breakout.rules import (
    MAX_STEPS_IN_EPISODE,
    NUM_ACTIONS,
    OBS_SHAPE,
    BreakoutState,
    advance,
    episode,
    initial_state,
    observe,
    truncated,
)
from tests.minatar_reference import (
    Reference,
    assert_converts_both_ways,
    assert_every_action_steps_as_gymnax,
    assert_observations_are_gymnax_planes,
    assert_random_play_agrees,
    cat_states,
    gymnax_env,
    gymnax_game,
    jax,
    jnp,
    random_play_states,
    same_fields_for_gymnax,
    same_fields_from_gymnax,
)

EnvState = gymnax_game("breakout").EnvState

BRICK_BITS = np.arange(1, 31)  # the wall's bits: row 1 + k // 10, column k % 10 for bit k + 1
INT_FIELDS = ("ball_y", "ball_x", "ball_dir", "pos", "last_y", "last_x", "time")
BOOL_FIELDS = ("strike", "terminal")


# --- conversions ---------------------------------------------------------------------------


def to_gymnax(state: BreakoutState) -> EnvState:
    """gymnax's batched `EnvState` for our state (less `score`, which gymnax does not keep),
    with the dtypes of gymnax's own states."""
    fields = same_fields_for_gymnax(state, (*INT_FIELDS, *BOOL_FIELDS))
    brick_map = np.zeros((len(state.bricks), 10, 10), np.float32)
    wall = (state.bricks.numpy()[:, None] >> BRICK_BITS) & 1
    brick_map[:, 1:4, :] = wall.reshape(-1, 3, 10)
    return EnvState(brick_map=jnp.asarray(brick_map), **fields)


def from_gymnax(state: EnvState, score: torch.Tensor | None = None) -> BreakoutState:
    """Our state for a batched gymnax `EnvState` (whose bricks must lie in rows 1-3), with
    `score` (zeros unless given)."""
    brick_map = np.asarray(state.brick_map)
    assert np.isin(brick_map, (0.0, 1.0)).all(), "a brick map holds 0 or 1"
    outside = np.delete(brick_map, (1, 2, 3), axis=1)
    assert not outside.any(), "bricks outside rows 1-3 have no place in a BreakoutState"
    wall = brick_map[:, 1:4, :].reshape(-1, 30).astype(np.int64)
    fields = same_fields_from_gymnax(state, INT_FIELDS, BOOL_FIELDS)
    bricks = torch.from_numpy((wall << BRICK_BITS).sum(1).astype(np.int32))
    if score is None:
        score = torch.zeros(len(bricks), dtype=torch.int32)
    return BreakoutState(bricks=bricks, score=score, **fields)


REF = Reference(
    gymnax_id="Breakout-MinAtar",
    num_actions=NUM_ACTIONS,
    obs_shape=OBS_SHAPE,
    gymnax_fields=(*INT_FIELDS, *BOOL_FIELDS, "brick_map"),
    to_gymnax=to_gymnax,
    from_gymnax=from_gymnax,
    step=lambda state, action, bits: advance(state, action),
    initial_state=initial_state,
    observe=observe,
    truncated=truncated,
    episode=episode,
)


@pytest.fixture(scope="module")
def gym() -> Any:
    return gymnax_env(REF)


# --- states to compare from ----------------------------------------------------------------


def thinned(state: BreakoutState, keep: float, generator: torch.Generator) -> BreakoutState:
    """`state` with each brick kept with probability `keep`: sparse and empty walls, whose
    refills random play rarely reaches."""
    mask = torch.rand(len(state.bricks), 30, generator=generator) < keep
    bits = (mask.long() << torch.from_numpy(BRICK_BITS)).sum(1).to(torch.int32)
    return state._replace(bricks=state.bricks & bits)


def uniform_states(n: int, generator: torch.Generator) -> BreakoutState:
    """States drawn uniformly over each field's range, reachable or not: every combination of
    ball, direction, paddle, strike and wall that the rules could be asked about. The ball may
    sit on the bottom row (after a step down it is below the board, as in gymnax)."""

    def ints(high: int) -> torch.Tensor:
        return torch.randint(0, high, (n,), generator=generator, dtype=torch.int32)

    def flags() -> torch.Tensor:
        return torch.randint(0, 2, (n,), generator=generator).to(torch.bool)

    full = torch.randint(0, 2**30, (n,), generator=generator, dtype=torch.int32) << 1
    state = BreakoutState(
        ball_y=ints(10),
        ball_x=ints(10),
        ball_dir=ints(4),
        pos=ints(10),
        bricks=full,
        strike=flags(),
        last_y=ints(10),
        last_x=ints(10),
        time=ints(MAX_STEPS_IN_EPISODE),
        terminal=flags(),
        score=ints(100),
    )
    return cat_states(state, thinned(state, 0.1, generator), thinned(state, 0.0, generator))


@pytest.fixture(scope="module")
def played(gym: Any) -> EnvState:
    """gymnax states from random play."""
    return random_play_states(gym, REF, num_envs=128, num_steps=48, seed=0)


@pytest.fixture(scope="module")
def states(played: EnvState) -> BreakoutState:
    """Random-play states (as they are, and with thinned walls) and uniform states."""
    generator = torch.Generator().manual_seed(0)
    played = from_gymnax(played)
    return cat_states(
        played,
        thinned(played, 0.2, generator),
        thinned(played, 0.0, generator),
        uniform_states(2048, generator),
    )


# --- the comparisons -----------------------------------------------------------------------


def test_states_convert_both_ways(played: EnvState) -> None:
    ours = assert_converts_both_ways(REF, played)
    assert ours.bricks.dtype == torch.int32 and ours.strike.dtype == torch.bool


def test_a_brick_map_outside_rows_1_to_3_does_not_convert(played: EnvState) -> None:
    with pytest.raises(AssertionError, match="outside rows 1-3"):
        from_gymnax(played.replace(brick_map=played.brick_map.at[:, 5, 5].set(1.0)))


def events(
    a: int,
    states: BreakoutState,
    new: BreakoutState,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    bits: None,
) -> dict[str, torch.Tensor]:
    """Where each of Breakout's rules acted in one step: bricks hit, a strike kept, a wall
    refilled, the ball sent back or sideways by the paddle, an end, side and ceiling
    bounces."""
    down = states.ball_dir >= 2
    paddle = (states.ball_y == 8) & down & (new.ball_y == 8) & ~new.strike
    right = (states.ball_dir == 1) | (states.ball_dir == 2)
    return {
        "brick": reward > 0,
        "strike kept": states.strike & new.strike & (reward == 0),
        "refill": (states.bricks == 0) & (new.bricks != 0),
        "back": paddle & (states.ball_x == new.pos),
        "sideways": paddle & (states.ball_x != new.pos),
        "end": terminated,
        "side": ((states.ball_x == 0) & ~right) | ((states.ball_x == 9) & right),
        "ceiling": (states.ball_y == 0) & ~down,
    }


def test_every_action_steps_as_gymnax_step_env(gym: Any, states: BreakoutState) -> None:
    keys = jax.random.split(jax.random.PRNGKey(3), len(states.time))  # step_env draws nothing
    assert_every_action_steps_as_gymnax(gym, REF, states, lambda a: (keys, None), events)


def test_a_rule_that_is_not_gymnax_fails_the_comparison(gym: Any, states: BreakoutState) -> None:
    """The comparison can fail: with bricks worth nothing (reward 0, score unchanged), the
    first action already shows gymnax's rewards of 1."""

    def worthless_bricks(
        state: BreakoutState, action: torch.Tensor, bits: Any
    ) -> tuple[BreakoutState, torch.Tensor, torch.Tensor]:
        new, reward, terminated = advance(state, action)
        return new._replace(score=state.score), torch.zeros_like(reward), terminated

    keys = jax.random.split(jax.random.PRNGKey(3), len(states.time))
    wrong = dataclasses.replace(REF, step=worthless_bricks)
    with pytest.raises(AssertionError, match="reward"):
        assert_every_action_steps_as_gymnax(gym, wrong, states, lambda a: (keys, None), events)


def test_observations_are_gymnax_planes(gym: Any, states: BreakoutState) -> None:
    assert_observations_are_gymnax_planes(gym, REF, states)


def test_starts_are_gymnax_starts(gym: Any) -> None:
    """Both of gymnax's starts, each about half the time, from our bits and from JAX keys."""
    n = 4096
    ours = initial_state(torch.randint(0, 2**32, (n,), generator=torch.Generator().manual_seed(4)))
    _, theirs_j = gym.vreset(jax.random.split(jax.random.PRNGKey(4), n), gym.params)
    theirs = from_gymnax(theirs_j)

    def starts(state: BreakoutState) -> dict[tuple[int, ...], int]:
        rows = torch.stack([f.to(torch.int64) for f in state], 1).unique(dim=0, return_counts=True)
        return {tuple(row.tolist()): int(count) for row, count in zip(*rows, strict=True)}

    ours_counts, theirs_counts = starts(ours), starts(theirs)
    assert ours_counts.keys() == theirs_counts.keys() and len(ours_counts) == 2
    for counts in (ours_counts, theirs_counts):  # a fair coin: within 5 standard deviations
        assert abs(min(counts.values()) - n / 2) < 5 * math.sqrt(n / 4), counts


@pytest.mark.slow
def test_random_play_returns_and_lengths_agree_with_gymnax(gym: Any) -> None:
    assert_random_play_agrees(gym, REF, num_envs=2048, per_env=4, least_best_return=3)
