"""The harness the four MinAtar rules tests share: each of our torch games against the gymnax
game whose rules it copies.

What is compared, and why the comparison can be exact: states convert field by field between
gymnax's `EnvState` and our state (`score`, which gymnax does not keep, is the return so far).
From the same states (reached by random play in gymnax, and drawn over the fields' ranges,
reachable or not), both step with every action and must agree exactly: every field of the
next state, the reward, termination and the observation. gymnax's `step` resets ended games,
so the comparison is against its `step_env`. Where gymnax's step draws something random from
its key, the game's test reads that draw and hands our rules the bits that encode the same
decisions; the step is then a function of (state, action, draw) on both sides. Whatever is
random on both sides with different streams (starts, random-play episodes) can only agree as
laws, and is compared as distributions (`tests/minatar_laws.py`).

A game's module describes itself with a `Reference` (its rules and its converters) and keeps
what is its own: the converters, the drawing of states over its fields' ranges, the reading
of gymnax's draws, and the events that show its comparison reaches every rule.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from tests.minatar_laws import assert_same_law

jax = pytest.importorskip(
    "jax", reason="the reference rules are gymnax's MinAtar games, which need jax (gymnax extra)"
)
gymnax = pytest.importorskip("gymnax", reason="the reference rules are gymnax's MinAtar games")
jnp = jax.numpy


def gymnax_game(name: str) -> ModuleType:
    """gymnax's module of one MinAtar game (`"breakout"`, ...), imported only once the skips
    above have passed."""
    return importlib.import_module(f"gymnax.environments.minatar.{name}")


Bits = Callable[[], torch.Tensor]
"""Random bits on demand, `(N,)` int64: a game whose step draws nothing never asks, so its
random streams stay as they were."""


@dataclass(frozen=True)
class Reference:
    """One game's rules and its converters, as the shared checks call them."""

    gymnax_id: str
    num_actions: int
    obs_shape: tuple[int, ...]
    gymnax_fields: tuple[str, ...]
    """The fields of gymnax's `EnvState` that a conversion must give back exactly."""
    to_gymnax: Callable[[Any], Any]
    from_gymnax: Callable[..., Any]
    """`(EnvState, score=None) -> state`, zero scores unless given."""
    step: Callable[[Any, torch.Tensor, Bits], tuple[Any, torch.Tensor, torch.Tensor]]
    """Our `advance`, with bits on demand for games whose step draws."""
    initial_state: Callable[[torch.Tensor], Any]
    observe: Callable[..., torch.Tensor]
    truncated: Callable[..., torch.Tensor]
    episode: Callable[[Any], tuple[torch.Tensor, torch.Tensor]]


def gymnax_env(ref: Reference) -> Any:
    """gymnax's env with its jitted, vmapped functions (compiled once per test module); its
    action count must be ours."""
    env, params = gymnax.make(ref.gymnax_id)
    assert env.num_actions == ref.num_actions, (env.num_actions, ref.num_actions)
    env.params = params
    env.vreset = jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))
    env.vstep_env = jax.jit(jax.vmap(env.step_env, in_axes=(0, 0, 0, None)))
    env.vget_obs = jax.jit(jax.vmap(env.get_obs))
    return env


# --- fields both sides keep alike -------------------------------------------------------


def same_fields_for_gymnax(state: tuple, names: tuple[str, ...]) -> dict[str, Any]:
    """The named fields of our state as JAX arrays, for those gymnax keeps under the same
    name and dtype."""
    return {name: jnp.asarray(getattr(state, name).numpy()) for name in names}


def same_fields_from_gymnax(
    state: Any, ints: tuple[str, ...] = (), bools: tuple[str, ...] = ()
) -> dict[str, torch.Tensor]:
    """The named fields of a gymnax `EnvState` as our int32 and bool tensors."""
    fields = {name: torch.from_numpy(np.array(getattr(state, name), np.int32)) for name in ints}
    return fields | {
        name: torch.from_numpy(np.array(getattr(state, name), np.bool_)) for name in bools
    }


# --- field-by-field equality -------------------------------------------------------------


def assert_same_gymnax_states(a: Any, b: Any, fields: tuple[str, ...]) -> None:
    """Equal values and dtypes in every named field of two gymnax `EnvState`s."""
    for name in fields:
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)


def assert_same_states(a: tuple, b: tuple) -> None:
    """Equal values, dtypes and shapes in every field of two of our states."""
    for name, x, y in zip(type(a)._fields, a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


def cat_states(*states: tuple) -> Any:
    """One batch of the given batches of one state type."""
    return type(states[0])(*(torch.cat(fields) for fields in zip(*states, strict=True)))


def restarted(state: tuple, fresh: tuple, ended: torch.Tensor) -> Any:
    """`fresh` where `ended` `(N,)` holds, else `state`, field by field (fields `(N, ...)`)."""
    return type(state)(
        *(
            torch.where(ended.view(-1, *[1] * (s.dim() - 1)), f, s)
            for f, s in zip(fresh, state, strict=True)
        )
    )


# --- the shared checks -------------------------------------------------------------------


def random_play_states(gym: Any, ref: Reference, num_envs: int, num_steps: int, seed: int) -> Any:
    """The `num_envs * num_steps` gymnax states that random play passes through (its `step`
    resets ended games, so none is terminal)."""

    def play(key: jax.Array) -> Any:
        reset_key, key = jax.random.split(key)
        _, state = jax.vmap(gym.reset, in_axes=(0, None))(
            jax.random.split(reset_key, num_envs), gym.params
        )

        def one_step(state: Any, key: jax.Array) -> tuple[Any, Any]:
            action_key, step_key = jax.random.split(key)
            action = jax.random.randint(action_key, (num_envs,), 0, ref.num_actions)
            _, new_state, *_ = jax.vmap(gym.step, in_axes=(0, 0, 0, None))(
                jax.random.split(step_key, num_envs), state, action, gym.params
            )
            return new_state, state

        _, states = jax.lax.scan(one_step, state, jax.random.split(key, num_steps))
        return jax.tree.map(lambda leaf: leaf.reshape(-1, *leaf.shape[2:]), states)

    return jax.jit(play)(jax.random.PRNGKey(seed))


def assert_converts_both_ways(ref: Reference, theirs: Any, more: tuple | None = None) -> Any:
    """gymnax -> ours -> gymnax gives gymnax's states back; ours -> gymnax -> ours gives ours
    back (numbered scores, so a lost score shows, and `more` of ours where given). Returns
    the converted states for the game's own checks."""
    ours = ref.from_gymnax(theirs)
    assert_same_gymnax_states(ref.to_gymnax(ours), theirs, ref.gymnax_fields)
    ours = ours._replace(score=torch.arange(len(ours.score), dtype=torch.int32))
    if more is not None:
        ours = cat_states(ours, more)
    assert_same_states(ref.from_gymnax(ref.to_gymnax(ours), ours.score), ours)
    return ours


Draw = Callable[[int], tuple[jax.Array, torch.Tensor | None]]
"""For an action: gymnax's keys `(N,)`, and our bits that encode gymnax's draws from them
(None where the step draws nothing)."""
Events = Callable[..., Mapping[str, torch.Tensor]]
"""`(action, states, new, reward, terminated, bits)` -> where each rule acted in this step."""


def assert_every_action_steps_as_gymnax(
    gym: Any, ref: Reference, states: Any, draw: Draw, events: Events
) -> None:
    """From every state, for every action: the same next state (every field), reward,
    termination and observation as gymnax's `step_env`; and each of the game's events
    happens at least 50 times, so that agreement is not vacuous."""
    n = len(states.time)
    theirs = ref.to_gymnax(states)
    counts: dict[str, int] = {}
    for a in range(ref.num_actions):
        keys, bits = draw(a)
        action = torch.full((n,), a, dtype=torch.int64)
        new, reward, terminated = ref.step(states, action, lambda bits=bits: bits)
        obs_j, new_j, reward_j, terminated_j, _ = gym.vstep_env(
            keys, theirs, jnp.full((n,), a), gym.params
        )
        assert_same_states(new, ref.from_gymnax(new_j, states.score + reward.to(torch.int32)))
        assert reward.dtype == torch.float32 and terminated.dtype == torch.bool
        np.testing.assert_array_equal(reward.numpy(), np.asarray(reward_j), err_msg="reward")
        np.testing.assert_array_equal(terminated.numpy(), np.asarray(terminated_j), "terminated")
        obs = np.asarray(obs_j)
        np.testing.assert_array_equal(ref.observe(new).numpy(), obs.astype(bool), "observation")
        np.testing.assert_array_equal(obs, ref.observe(new, torch.float32).numpy(), "observation")
        for name, hits in events(a, states, new, reward, terminated, bits).items():
            counts[name] = counts.get(name, 0) + int(hits.sum())
    assert min(counts.values()) >= 50, counts


def assert_observations_are_gymnax_planes(gym: Any, ref: Reference, states: Any) -> None:
    """Our bool planes, in gymnax's shape, are gymnax's `get_obs` of the same states."""
    obs = ref.observe(states)
    assert obs.shape == (len(states.time), *ref.obs_shape) and obs.dtype == torch.bool
    np.testing.assert_array_equal(obs.numpy(), np.asarray(gym.vget_obs(ref.to_gymnax(states))))


def assert_the_one_start_is_gymnax_start(gym: Any, ref: Reference) -> None:
    """For games whose start draws nothing: ours from any bits is gymnax's from any key."""
    n = 64
    bits = torch.randint(0, 2**32, (n,), generator=torch.Generator().manual_seed(4))
    ours = ref.initial_state(bits)
    _, theirs = gym.vreset(jax.random.split(jax.random.PRNGKey(4), n), gym.params)
    assert_same_states(ours, ref.from_gymnax(theirs))
    assert_same_gymnax_states(ref.to_gymnax(ours), theirs, ref.gymnax_fields)


# --- random play as distributions ----------------------------------------------------------


def gymnax_episodes(gym: Any, ref: Reference, num_envs: int, per_env: int, seed: int) -> np.ndarray:
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
            action = jax.random.randint(action_key, (num_envs,), 0, ref.num_actions)
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


def torch_episodes(ref: Reference, num_envs: int, per_env: int, seed: int) -> np.ndarray:
    """The same as `gymnax_episodes` with our rules: starts and draws from random bits,
    actions from a torch generator, ended games restarted in place; returns and lengths from
    `episode`, each return checked against the sum of the rewards."""
    generator = torch.Generator().manual_seed(seed)

    def bits() -> torch.Tensor:
        return torch.randint(0, 2**32, (num_envs,), generator=generator)

    state = ref.initial_state(bits())
    episodes = np.zeros((num_envs, per_env, 2), np.float32)
    done = np.zeros(num_envs, np.int64)
    ret = torch.zeros(num_envs)
    while (done < per_env).any():
        action = torch.randint(0, ref.num_actions, (num_envs,), generator=generator)
        state, reward, terminated = ref.step(state, action, bits)
        ret += reward
        ended_t = terminated | ref.truncated(state)
        ended = ended_t.numpy() & (done < per_env)
        rows = np.flatnonzero(ended)
        returns, lengths = ref.episode(state)
        assert torch.equal(returns[rows], ret[rows])  # the score is the sum of the rewards
        episodes[rows, done[rows]] = torch.stack((returns, lengths.float()), 1).numpy()[rows]
        done += ended
        state = restarted(state, ref.initial_state(bits()), ended_t)
        ret = torch.where(ended_t, 0.0, ret)
    return episodes.reshape(-1, 2)


def assert_random_play_agrees(
    gym: Any, ref: Reference, num_envs: int, per_env: int, least_best_return: float
) -> None:
    """Independent random play on each side: the laws of returns and of lengths agree, and
    on both sides some episode scores `least_best_return` (not all-zero returns)."""
    ours = torch_episodes(ref, num_envs=num_envs, per_env=per_env, seed=0)
    theirs = gymnax_episodes(gym, ref, num_envs=num_envs, per_env=per_env, seed=0)
    assert ours[:, 0].max() >= least_best_return and theirs[:, 0].max() >= least_best_return
    assert_same_law(ours[:, 0], theirs[:, 0], "return")
    assert_same_law(ours[:, 1], theirs[:, 1], "length")
