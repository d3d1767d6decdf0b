"""MinAtar Breakout in torch against gymnax's `Breakout-MinAtar`, whose rules it copies.

States convert field by field between gymnax's `EnvState` and `BreakoutState` (the brick map
packs into the bits of one int32; `score`, which gymnax does not keep, is the return so
far). From the same states, reached by random play in gymnax and drawn
uniformly over the fields' ranges, both step with every action and must agree exactly:
every field of the next state, the reward, termination and the observation. gymnax's
`step` resets ended games, so the comparison is against its `step_env`. Starts and
random-play episodes are random on both sides (JAX keys there, our counter-based bits
here): they are compared as distributions.
"""

from __future__ import annotations

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
from tests.minatar_laws import assert_same_law

jax = pytest.importorskip(
    "jax", reason="the reference rules are gymnax's Breakout, which needs jax (the gymnax extra)"
)
gymnax = pytest.importorskip("gymnax", reason="the reference rules are gymnax's Breakout")
jnp = jax.numpy
from gymnax.environments.minatar.breakout import EnvState  # noqa: E402

BRICK_BITS = np.arange(1, 31)  # the wall's bits: row 1 + k // 10, column k % 10 for bit k + 1
INT_FIELDS = ("ball_y", "ball_x", "ball_dir", "pos", "last_y", "last_x", "time")
BOOL_FIELDS = ("strike", "terminal")


@pytest.fixture(scope="module")
def gym() -> Any:
    """gymnax's env with its jitted, vmapped functions (compiled once per module)."""
    env, params = gymnax.make("Breakout-MinAtar")
    env.params = params
    env.vreset = jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))
    env.vstep_env = jax.jit(jax.vmap(env.step_env, in_axes=(0, 0, 0, None)))
    env.vget_obs = jax.jit(jax.vmap(env.get_obs))
    return env


# --- conversions ---------------------------------------------------------------------------


def to_gymnax(state: BreakoutState) -> EnvState:
    """gymnax's batched `EnvState` for our state (less `score`, which gymnax does not keep),
    with the dtypes of gymnax's own states."""
    fields = {name: jnp.asarray(getattr(state, name).numpy()) for name in INT_FIELDS}
    fields |= {name: jnp.asarray(getattr(state, name).numpy()) for name in BOOL_FIELDS}
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
    fields = {
        name: torch.from_numpy(np.array(getattr(state, name), np.int32)) for name in INT_FIELDS
    }
    fields |= {
        name: torch.from_numpy(np.array(getattr(state, name), np.bool_)) for name in BOOL_FIELDS
    }
    bricks = torch.from_numpy((wall << BRICK_BITS).sum(1).astype(np.int32))
    if score is None:
        score = torch.zeros(len(bricks), dtype=torch.int32)
    return BreakoutState(bricks=bricks, score=score, **fields)


def assert_same_gymnax_states(a: EnvState, b: EnvState) -> None:
    for name in (*INT_FIELDS, *BOOL_FIELDS, "brick_map"):
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)


def assert_same_states(a: BreakoutState, b: BreakoutState) -> None:
    for name, x, y in zip(BreakoutState._fields, a, b, strict=True):
        assert x.dtype == y.dtype, name
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


def cat_states(*states: BreakoutState) -> BreakoutState:
    return BreakoutState(*(torch.cat(fields) for fields in zip(*states, strict=True)))


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
    return random_play_states(gym, num_envs=128, num_steps=48, seed=0)


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
    theirs = played
    ours = from_gymnax(theirs)
    assert_same_gymnax_states(to_gymnax(ours), theirs)
    ours = ours._replace(score=torch.arange(len(ours.score), dtype=torch.int32))
    assert_same_states(from_gymnax(to_gymnax(ours), ours.score), ours)
    assert ours.bricks.dtype == torch.int32 and ours.strike.dtype == torch.bool


def test_a_brick_map_outside_rows_1_to_3_does_not_convert(played: EnvState) -> None:
    with pytest.raises(AssertionError, match="outside rows 1-3"):
        from_gymnax(played.replace(brick_map=played.brick_map.at[:, 5, 5].set(1.0)))


def test_every_action_steps_as_gymnax_step_env(gym: Any, states: BreakoutState) -> None:
    """Same next state (every field), reward, termination and observation, for every action
    from every state; and the states reach every rule (so agreement is not vacuous)."""
    n = len(states.pos)
    keys = jax.random.split(jax.random.PRNGKey(3), n)  # step_env draws nothing from them
    theirs = to_gymnax(states)
    events = dict.fromkeys(
        ("brick", "strike kept", "refill", "back", "sideways", "end", "side", "ceiling"), 0
    )
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
        np.testing.assert_array_equal(np.asarray(obs_j), observe(new).numpy().astype(np.float32))

        down = states.ball_dir >= 2
        paddle = (states.ball_y == 8) & down & (new.ball_y == 8) & ~new.strike
        events["brick"] += int((reward > 0).sum())
        events["strike kept"] += int((states.strike & new.strike & (reward == 0)).sum())
        events["refill"] += int(((states.bricks == 0) & (new.bricks != 0)).sum())
        events["back"] += int((paddle & (states.ball_x == new.pos)).sum())
        events["sideways"] += int((paddle & (states.ball_x != new.pos)).sum())
        events["end"] += int(terminated.sum())
        right = (states.ball_dir == 1) | (states.ball_dir == 2)
        side = ((states.ball_x == 0) & ~right) | ((states.ball_x == 9) & right)
        events["side"] += int(side.sum())
        events["ceiling"] += int(((states.ball_y == 0) & ~down).sum())
    assert min(events.values()) >= 50, events


def test_observations_are_gymnax_planes(gym: Any, states: BreakoutState) -> None:
    obs = observe(states)
    assert obs.shape == (len(states.pos), *OBS_SHAPE) and obs.dtype == torch.bool
    np.testing.assert_array_equal(obs.numpy(), np.asarray(gym.vget_obs(to_gymnax(states))))


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


# --- random play as distributions ----------------------------------------------------------


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


def torch_episodes(num_envs: int, per_env: int, seed: int, rules: Any = advance) -> np.ndarray:
    """The same as `gymnax_episodes` with our rules: starts from random bits, actions from a
    torch generator, ended games restarted in place; returns and lengths from `episode`."""
    generator = torch.Generator().manual_seed(seed)

    def bits() -> torch.Tensor:
        return torch.randint(0, 2**32, (num_envs,), generator=generator)

    state = initial_state(bits())
    episodes = np.zeros((num_envs, per_env, 2), np.float32)
    done = np.zeros(num_envs, np.int64)
    ret = torch.zeros(num_envs)
    while (done < per_env).any():
        action = torch.randint(0, NUM_ACTIONS, (num_envs,), generator=generator)
        state, reward, terminated = rules(state, action)
        ret += reward
        ended_t = terminated | truncated(state)
        ended = ended_t.numpy() & (done < per_env)
        rows = np.flatnonzero(ended)
        returns, lengths = episode(state)
        assert torch.equal(returns[rows], ret[rows])  # the score is the sum of the rewards
        episodes[rows, done[rows]] = torch.stack((returns, lengths.float()), 1).numpy()[rows]
        done += ended
        fresh = initial_state(bits())
        state = BreakoutState(
            *(torch.where(ended_t, f, s) for f, s in zip(fresh, state, strict=True))
        )
        ret = torch.where(ended_t, 0.0, ret)
    return episodes.reshape(-1, 2)


@pytest.mark.slow
def test_random_play_returns_and_lengths_agree_with_gymnax(gym: Any) -> None:
    ours = torch_episodes(num_envs=2048, per_env=4, seed=0)
    theirs = gymnax_episodes(gym, num_envs=2048, per_env=4, seed=0)
    assert ours[:, 0].max() >= 3 and theirs[:, 0].max() >= 3  # not all-zero returns
    assert_same_law(ours[:, 0], theirs[:, 0], "return")
    assert_same_law(ours[:, 1], theirs[:, 1], "length")
