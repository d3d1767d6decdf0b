"""MinAtar Space Invaders in torch against gymnax's `SpaceInvaders-MinAtar`, whose rules it copies.

What is compared and why it is exact: `tests/minatar_reference.py`. Here: states convert
field by field (each 10x10 map packs into ten int32 columns, bit r for row r). The states
stepped from are those reached by random play in gymnax (as they are and with thinned alien
blocks) and states drawn uniformly over the fields' ranges.

The comparison is exact without conditioning on any random decision because gymnax's
Space Invaders makes none: `step_env` and `reset_env` never read their keys (a test below
checks that different keys give the same step and the same start). So random play is
compared twice: step for step, with the same actions on both sides (every observation,
reward and end equal), and as distributions of returns and lengths, with each side's own
random actions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from fruit_env.games.minatar_space_invaders.rules import (
    MAX_STEPS_IN_EPISODE,
    NUM_ACTIONS,
    OBS_SHAPE,
    SpaceInvadersState,
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
    assert_the_one_start_is_gymnax_start,
    cat_states,
    gymnax_env,
    gymnax_game,
    jax,
    jnp,
    random_play_states,
    restarted,
    same_fields_for_gymnax,
    same_fields_from_gymnax,
)

EnvState = gymnax_game("space_invaders").EnvState

MAPS = {"f_bullets": "f_bullet_map", "e_bullets": "e_bullet_map", "aliens": "alien_map"}
INT_FIELDS = (
    "pos",
    "alien_dir",
    "enemy_move_interval",
    "alien_move_timer",
    "alien_shot_timer",
    "ramp_index",
    "shot_timer",
    "time",
)
BOOL_FIELDS = ("ramping", "terminal")
ROW_BITS = np.arange(10)


# --- conversions ---------------------------------------------------------------------------


def map_to_gymnax(columns: torch.Tensor) -> jax.Array:
    """`(N, 10)` int32 columns -> gymnax's `(N, 10, 10)` float32 0/1 map (row, column)."""
    cells = (columns.numpy()[:, None, :] >> ROW_BITS[None, :, None]) & 1
    return jnp.asarray(cells.astype(np.float32))


def map_from_gymnax(cells: jax.Array) -> torch.Tensor:
    cells = np.asarray(cells)
    assert np.isin(cells, (0.0, 1.0)).all(), "a map holds 0 or 1"
    columns = (cells.astype(np.int64) << ROW_BITS[None, :, None]).sum(1)
    return torch.from_numpy(columns.astype(np.int32))


def to_gymnax(state: SpaceInvadersState) -> EnvState:
    """gymnax's batched `EnvState` for our state (less `score`, which gymnax does not keep),
    with the dtypes of gymnax's own states."""
    fields = same_fields_for_gymnax(state, (*INT_FIELDS, *BOOL_FIELDS))
    fields |= {theirs: map_to_gymnax(getattr(state, ours)) for ours, theirs in MAPS.items()}
    return EnvState(**fields)


def from_gymnax(state: EnvState, score: torch.Tensor | None = None) -> SpaceInvadersState:
    """Our state for a batched gymnax `EnvState`, with `score` (zeros unless given)."""
    fields = same_fields_from_gymnax(state, INT_FIELDS, BOOL_FIELDS)
    fields |= {ours: map_from_gymnax(getattr(state, theirs)) for ours, theirs in MAPS.items()}
    if score is None:
        score = torch.zeros(len(fields["pos"]), dtype=torch.int32)
    return SpaceInvadersState(score=score, **fields)


REF = Reference(
    gymnax_id="SpaceInvaders-MinAtar",
    num_actions=NUM_ACTIONS,
    obs_shape=OBS_SHAPE,
    gymnax_fields=(*INT_FIELDS, *BOOL_FIELDS, *MAPS.values()),
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


def thinned(
    state: SpaceInvadersState, keep: float, generator: torch.Generator
) -> SpaceInvadersState:
    """`state` with each alien kept with probability `keep`: the few-alien blocks (fast
    marches, a last alien, refills) that random play rarely reaches."""
    mask = torch.rand(len(state.pos), 10, 10, generator=generator) < keep
    bits = (mask.to(torch.int32) << torch.arange(10, dtype=torch.int32)).sum(2, dtype=torch.int32)
    return state._replace(aliens=state.aliens & bits)


def uniform_states(n: int, generator: torch.Generator) -> SpaceInvadersState:
    """States drawn uniformly over each field's range, reachable or not: any maps (dense
    and sparse), cannon, direction, timers and flags the rules could be asked about."""

    def ints(low: int, high: int) -> torch.Tensor:
        return torch.randint(low, high, (n,), generator=generator, dtype=torch.int32)

    def flags() -> torch.Tensor:
        return torch.randint(0, 2, (n,), generator=generator).to(torch.bool)

    def cells(density: float) -> torch.Tensor:
        mask = torch.rand(n, 10, 10, generator=generator) < density
        return (mask.to(torch.int32) << torch.arange(10, dtype=torch.int32)).sum(
            2, dtype=torch.int32
        )

    return SpaceInvadersState(
        pos=ints(0, 10),
        f_bullets=cells(0.15),
        e_bullets=cells(0.15),
        aliens=cells(0.3),
        alien_dir=ints(0, 2) * 2 - 1,
        enemy_move_interval=ints(6, 13),
        alien_move_timer=ints(0, 4),
        alien_shot_timer=ints(0, 3),
        ramp_index=ints(0, 7),
        shot_timer=ints(0, 6),
        ramping=flags(),
        time=ints(0, MAX_STEPS_IN_EPISODE),
        terminal=flags(),
        score=ints(0, 100),
    )


@pytest.fixture(scope="module")
def played(gym: Any) -> EnvState:
    """gymnax states from random play."""
    return random_play_states(gym, REF, num_envs=64, num_steps=128, seed=0)


@pytest.fixture(scope="module")
def states(played: EnvState) -> SpaceInvadersState:
    """Random-play states (as they are, and with thinned blocks) and uniform states."""
    generator = torch.Generator().manual_seed(0)
    played = from_gymnax(played)
    return cat_states(
        played,
        thinned(played, 0.1, generator),
        thinned(played, 0.02, generator),
        thinned(played, 0.0, generator),
        uniform_states(4096, generator),
    )


# --- the comparisons -----------------------------------------------------------------------


def test_states_convert_both_ways(played: EnvState) -> None:
    ours = assert_converts_both_ways(REF, played)
    assert ours.aliens.shape == (len(ours.pos), 10) and ours.aliens.dtype == torch.int32


def test_gymnax_draws_nothing_from_its_keys(gym: Any, played: EnvState) -> None:
    """What makes the step comparison exact without conditioning: two keys, one step."""
    n = len(played.pos)
    action = jnp.asarray(np.arange(n) % NUM_ACTIONS)
    outs = [
        gym.vstep_env(jax.random.split(jax.random.PRNGKey(k), n), played, action, gym.params)
        for k in (1, 2)
    ]
    for a, b in zip(*(jax.tree.leaves(out) for out in outs), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    starts = [gym.vreset(jax.random.split(jax.random.PRNGKey(k), 4), gym.params) for k in (1, 2)]
    for a, b in zip(*(jax.tree.leaves(start) for start in starts), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def events(
    a: int,
    states: SpaceInvadersState,
    new: SpaceInvadersState,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    bits: None,
) -> dict[str, torch.Tensor]:
    """Where each of Space Invaders' rules acted in one step: fire, kills (and two at once),
    marches and turns, alien shots, refills, ramps and ends."""
    marched = states.alien_move_timer == 0
    turned = new.alien_dir != states.alien_dir
    refilled = (states.aliens != 0).any(1) & (reward > 0) & (new.aliens == _block()).all(1)
    return {
        "fire": (new.shot_timer == 4) & (states.shot_timer == 0),
        "kill": reward > 0,
        "double kill": reward > 1,
        "march": marched & ~turned,
        "turn": turned,
        "alien shot": (states.alien_shot_timer == 0) & (states.aliens != 0).any(1),
        "refill": refilled,
        "ramp": new.ramp_index > states.ramp_index,
        "end": new.terminal & ~states.terminal,
    }


def _block() -> torch.Tensor:
    return initial_state(torch.zeros(1, dtype=torch.int64)).aliens


def test_every_action_steps_as_gymnax_step_env(gym: Any, states: SpaceInvadersState) -> None:
    keys = jax.random.split(jax.random.PRNGKey(3), len(states.time))  # step_env draws nothing
    assert_every_action_steps_as_gymnax(gym, REF, states, lambda a: (keys, None), events)


def test_observations_are_gymnax_planes(gym: Any, states: SpaceInvadersState) -> None:
    assert_observations_are_gymnax_planes(gym, REF, states)


def test_starts_are_gymnax_start(gym: Any) -> None:
    """gymnax has one start whatever the key; ours is it whatever the bits."""
    assert_the_one_start_is_gymnax_start(gym, REF)


# --- random play ---------------------------------------------------------------------------


def gymnax_play(gym: Any, actions: np.ndarray, limit: int) -> tuple[np.ndarray, ...]:
    """gymnax's `step` (which resets ended games) under `actions` `(steps, N)`, episodes
    truncated at `limit` steps: per step `(obs, reward, terminated, truncated)`."""
    params = gym.params.replace(max_steps_in_episode=limit)

    def play(actions: jax.Array) -> tuple[jax.Array, ...]:
        n = actions.shape[1]
        _, state = jax.vmap(gym.reset, in_axes=(0, None))(
            jax.random.split(jax.random.PRNGKey(0), n), params
        )

        def one_step(state: EnvState, action: jax.Array) -> tuple[EnvState, tuple]:
            obs, new, reward, term, trunc, _ = jax.vmap(gym.step, in_axes=(0, 0, 0, None))(
                jax.random.split(jax.random.PRNGKey(1), n), state, action, params
            )
            return new, (obs, reward, term, trunc)

        return jax.lax.scan(one_step, state, actions)[1]

    return tuple(np.asarray(x) for x in jax.jit(play)(jnp.asarray(actions)))


def test_random_play_is_gymnax_play_step_for_step(gym: Any) -> None:
    """With the same actions, every observation, reward and end of 800 steps of 64 games
    equal gymnax's, through ends by aliens and by a time limit (200 steps on both sides,
    which random play sometimes reaches), and restarts."""
    steps, n, limit = 800, 64, 200
    actions = np.random.default_rng(0).integers(0, NUM_ACTIONS, (steps, n))
    obs_j, reward_j, term_j, trunc_j = gymnax_play(gym, actions, limit)
    fresh = initial_state(torch.zeros(n, dtype=torch.int64))
    state = fresh
    for t in range(steps):
        state, reward, terminated = advance(state, torch.from_numpy(actions[t]))
        cut = truncated(state, limit)
        state = restarted(state, fresh, terminated | cut)
        np.testing.assert_array_equal(reward.numpy(), reward_j[t], err_msg=f"step {t}")
        np.testing.assert_array_equal(terminated.numpy(), term_j[t], err_msg=f"step {t}")
        np.testing.assert_array_equal(cut.numpy(), trunc_j[t], err_msg=f"step {t}")
        np.testing.assert_array_equal(observe(state, torch.float32).numpy(), obs_j[t])
    ends = (term_j.sum(), trunc_j.sum(), reward_j.sum())
    assert ends[0] > 50 and ends[1] > 5 and ends[2] > 100, ends


@pytest.mark.slow
def test_random_play_returns_and_lengths_agree_with_gymnax(gym: Any) -> None:
    """Independent random actions on each side: the laws of returns and lengths agree."""
    assert_random_play_agrees(gym, REF, num_envs=1024, per_env=3, least_best_return=10)
