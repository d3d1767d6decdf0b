"""MinAtar Space Invaders in torch against gymnax's `SpaceInvaders-MinAtar`, whose rules it copies.

States convert field by field between gymnax's `EnvState` and `SpaceInvadersState` (each
10x10 map packs into ten int32 columns, bit r for row r; `score`, which gymnax does not
keep, is the return so far). From the same states, reached by random play in gymnax (as
they are and with thinned alien blocks) and drawn uniformly over the fields' ranges, both
step with every action and must agree exactly: every field of the next state, the reward,
termination and the observation. gymnax's `step` resets ended games, so the comparison is
against its `step_env`.

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
from tests.minatar_laws import assert_same_law

jax = pytest.importorskip(
    "jax", reason="the reference rules are gymnax's SpaceInvaders, which needs jax (gymnax extra)"
)
gymnax = pytest.importorskip("gymnax", reason="the reference rules are gymnax's SpaceInvaders")
jnp = jax.numpy
from gymnax.environments.minatar.space_invaders import EnvState  # noqa: E402

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


@pytest.fixture(scope="module")
def gym() -> Any:
    """gymnax's env with its jitted, vmapped functions (compiled once per module)."""
    env, params = gymnax.make("SpaceInvaders-MinAtar")
    env.params = params
    env.vreset = jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))
    env.vstep_env = jax.jit(jax.vmap(env.step_env, in_axes=(0, 0, 0, None)))
    env.vget_obs = jax.jit(jax.vmap(env.get_obs))
    return env


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
    fields = {name: jnp.asarray(getattr(state, name).numpy()) for name in INT_FIELDS}
    fields |= {name: jnp.asarray(getattr(state, name).numpy()) for name in BOOL_FIELDS}
    fields |= {theirs: map_to_gymnax(getattr(state, ours)) for ours, theirs in MAPS.items()}
    return EnvState(**fields)


def from_gymnax(state: EnvState, score: torch.Tensor | None = None) -> SpaceInvadersState:
    """Our state for a batched gymnax `EnvState`, with `score` (zeros unless given)."""
    fields = {
        name: torch.from_numpy(np.array(getattr(state, name), np.int32)) for name in INT_FIELDS
    }
    fields |= {
        name: torch.from_numpy(np.array(getattr(state, name), np.bool_)) for name in BOOL_FIELDS
    }
    fields |= {ours: map_from_gymnax(getattr(state, theirs)) for ours, theirs in MAPS.items()}
    if score is None:
        score = torch.zeros(len(fields["pos"]), dtype=torch.int32)
    return SpaceInvadersState(score=score, **fields)


def assert_same_gymnax_states(a: EnvState, b: EnvState) -> None:
    for name in (*INT_FIELDS, *BOOL_FIELDS, *MAPS.values()):
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)


def assert_same_states(a: SpaceInvadersState, b: SpaceInvadersState) -> None:
    for name, x, y in zip(SpaceInvadersState._fields, a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


def cat_states(*states: SpaceInvadersState) -> SpaceInvadersState:
    return SpaceInvadersState(*(torch.cat(fields) for fields in zip(*states, strict=True)))


# --- states to compare from ----------------------------------------------------------------


def random_play_states(gym: Any, num_envs: int, num_steps: int, seed: int) -> EnvState:
    """The `num_envs * num_steps` states that random play in gymnax passes through (its `step`
    resets ended games, so none is terminal)."""

    def play(key: jax.Array) -> EnvState:
        reset_key, key = jax.random.split(key)
        _, state = jax.vmap(gym.reset, in_axes=(0, None))(
            jax.random.split(reset_key, num_envs), gym.params
        )

        def one_step(state: EnvState, key: jax.Array) -> tuple[EnvState, EnvState]:
            action_key, step_key = jax.random.split(key)
            action = jax.random.randint(action_key, (num_envs,), 0, NUM_ACTIONS)
            _, new_state, *_ = jax.vmap(gym.step, in_axes=(0, 0, 0, None))(
                jax.random.split(step_key, num_envs), state, action, gym.params
            )
            return new_state, state

        _, states = jax.lax.scan(one_step, state, jax.random.split(key, num_steps))
        return jax.tree.map(lambda leaf: leaf.reshape(-1, *leaf.shape[2:]), states)

    return jax.jit(play)(jax.random.PRNGKey(seed))


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
    return random_play_states(gym, num_envs=64, num_steps=128, seed=0)


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
    theirs = played
    ours = from_gymnax(theirs)
    assert_same_gymnax_states(to_gymnax(ours), theirs)
    ours = ours._replace(score=torch.arange(len(ours.score), dtype=torch.int32))
    assert_same_states(from_gymnax(to_gymnax(ours), ours.score), ours)
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


def count_events(
    states: SpaceInvadersState, new: SpaceInvadersState, reward: torch.Tensor, events: dict
) -> None:
    """Add up how often each rule acted in this step, so that agreement is not vacuous."""
    marched = states.alien_move_timer == 0
    turned = new.alien_dir != states.alien_dir
    refilled = (states.aliens != 0).any(1) & (reward > 0) & (new.aliens == _block()).all(1)
    updates = {
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
    for name, hits in updates.items():
        events[name] = events.get(name, 0) + int(hits.sum())


def _block() -> torch.Tensor:
    return initial_state(torch.zeros(1, dtype=torch.int64)).aliens


def test_every_action_steps_as_gymnax_step_env(gym: Any, states: SpaceInvadersState) -> None:
    """Same next state (every field), reward, termination and observation, for every action
    from every state; and the states reach every rule (so agreement is not vacuous)."""
    n = len(states.pos)
    keys = jax.random.split(jax.random.PRNGKey(3), n)  # step_env draws nothing from them
    theirs = to_gymnax(states)
    events: dict[str, int] = {}
    for a in range(NUM_ACTIONS):
        action = torch.full((n,), a, dtype=torch.int64)
        new, reward, terminated = advance(states, action)
        obs_j, new_j, reward_j, terminated_j, _ = gym.vstep_env(
            keys, theirs, jnp.full((n,), a), gym.params
        )
        assert_same_states(new, from_gymnax(new_j, states.score + reward.to(torch.int32)))
        assert reward.dtype == torch.float32 and terminated.dtype == torch.bool
        np.testing.assert_array_equal(reward.numpy(), np.asarray(reward_j))
        np.testing.assert_array_equal(terminated.numpy(), np.asarray(terminated_j))
        np.testing.assert_array_equal(observe(new).numpy(), np.asarray(obs_j).astype(bool))
        np.testing.assert_array_equal(np.asarray(obs_j), observe(new, torch.float32).numpy())
        count_events(states, new, reward, events)
    assert min(events.values()) >= 50, events


def test_observations_are_gymnax_planes(gym: Any, states: SpaceInvadersState) -> None:
    obs = observe(states)
    assert obs.shape == (len(states.pos), *OBS_SHAPE) and obs.dtype == torch.bool
    np.testing.assert_array_equal(obs.numpy(), np.asarray(gym.vget_obs(to_gymnax(states))))


def test_starts_are_gymnax_start(gym: Any) -> None:
    """gymnax has one start whatever the key; ours is it whatever the bits."""
    n = 64
    ours = initial_state(torch.randint(0, 2**32, (n,), generator=torch.Generator().manual_seed(4)))
    _, theirs = gym.vreset(jax.random.split(jax.random.PRNGKey(4), n), gym.params)
    assert_same_states(ours, from_gymnax(theirs))
    assert_same_gymnax_states(to_gymnax(ours), theirs)


# --- random play ---------------------------------------------------------------------------


def restarted(
    state: SpaceInvadersState, fresh: SpaceInvadersState, ended: torch.Tensor
) -> SpaceInvadersState:
    """`fresh` where `ended` holds, else `state`, field by field."""
    return SpaceInvadersState(
        *(
            torch.where(ended.view(-1, *[1] * (s.dim() - 1)), f, s)
            for f, s in zip(fresh, state, strict=True)
        )
    )


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


def gymnax_episodes(gym: Any, num_envs: int, per_env: int, seed: int) -> np.ndarray:
    """(return, length) of the first `per_env` episodes of each of `num_envs` random players:
    every episode that starts counts, so short ones are not over-represented."""

    def play(key: jax.Array) -> jax.Array:
        reset_key, key = jax.random.split(key)
        _, state = jax.vmap(gym.reset, in_axes=(0, None))(
            jax.random.split(reset_key, num_envs), gym.params
        )
        episodes = jnp.zeros((num_envs, per_env, 2), jnp.float32)
        done = jnp.zeros(num_envs, jnp.int32)
        ret = jnp.zeros(num_envs, jnp.float32)

        def unfinished(carry: tuple) -> jax.Array:
            return (carry[2] < per_env).any()

        def one_step(carry: tuple) -> tuple:
            state, episodes, done, ret, key = carry
            key, action_key, step_key = jax.random.split(key, 3)
            action = jax.random.randint(action_key, (num_envs,), 0, NUM_ACTIONS)
            _, new, reward, term, trunc, _ = jax.vmap(gym.step, in_axes=(0, 0, 0, None))(
                jax.random.split(step_key, num_envs), state, action, gym.params
            )
            ret = ret + reward
            ended = (term | trunc) & (done < per_env)
            row = jnp.stack([ret, (state.time + 1).astype(jnp.float32)], 1)
            slot = jnp.minimum(done, per_env - 1)
            current = episodes[jnp.arange(num_envs), slot]
            episodes = episodes.at[jnp.arange(num_envs), slot].set(
                jnp.where(ended[:, None], row, current)
            )
            ret = jnp.where(term | trunc, 0.0, ret)
            return new, episodes, done + ended, ret, key

        carry = jax.lax.while_loop(unfinished, one_step, (state, episodes, done, ret, key))
        return carry[1]

    return np.asarray(jax.jit(play)(jax.random.PRNGKey(seed))).reshape(-1, 2)


def torch_episodes(num_envs: int, per_env: int, seed: int) -> np.ndarray:
    """The same as `gymnax_episodes` with our rules: actions from a torch generator, ended
    games restarted in place; returns and lengths from `episode`."""
    generator = torch.Generator().manual_seed(seed)
    fresh = initial_state(torch.zeros(num_envs, dtype=torch.int64))
    state = fresh
    episodes = np.zeros((num_envs, per_env, 2), np.float32)
    done = np.zeros(num_envs, np.int64)
    ret = torch.zeros(num_envs)
    while (done < per_env).any():
        action = torch.randint(0, NUM_ACTIONS, (num_envs,), generator=generator)
        state, reward, terminated = advance(state, action)
        ret += reward
        ended_t = terminated | truncated(state)
        ended = ended_t.numpy() & (done < per_env)
        rows = np.flatnonzero(ended)
        returns, lengths = episode(state)
        assert torch.equal(returns[rows], ret[rows])  # the score is the sum of the rewards
        episodes[rows, done[rows]] = torch.stack((returns, lengths.float()), 1).numpy()[rows]
        done += ended
        state = restarted(state, fresh, ended_t)
        ret = torch.where(ended_t, 0.0, ret)
    return episodes.reshape(-1, 2)


@pytest.mark.slow
def test_random_play_returns_and_lengths_agree_with_gymnax(gym: Any) -> None:
    """Independent random actions on each side: the laws of returns and lengths agree."""
    ours = torch_episodes(num_envs=1024, per_env=3, seed=0)
    theirs = gymnax_episodes(gym, num_envs=1024, per_env=3, seed=0)
    assert ours[:, 0].max() >= 10 and theirs[:, 0].max() >= 10  # not all-zero returns
    assert_same_law(ours[:, 0], theirs[:, 0], "return")
    assert_same_law(ours[:, 1], theirs[:, 1], "length")
