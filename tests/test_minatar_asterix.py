"""MinAtar Asterix in torch against gymnax's `Asterix-MinAtar`, whose rules it copies.

States convert field by field between gymnax's `EnvState` and `AsterixState` (the `(8, 5)`
entity table splits into four `(N, 8)` fields; its row column is `slot + 1` where a row is
in use; `shot_timer` is always 0; `score`, which gymnax does not keep, is the return so far).

From the same states, reached by random play in gymnax and drawn over the fields' ranges
(crowded and empty slot tables, ghosts, every timer and speed), both step with every action
and must agree exactly: every field of the next state, the reward, termination and the
observation. gymnax's `step` resets ended games, so the comparison is against `step_env`.

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
from tests.minatar_laws import assert_same_law

jax = pytest.importorskip(
    "jax", reason="the reference rules are gymnax's Asterix, which needs jax (the gymnax extra)"
)
gymnax = pytest.importorskip("gymnax", reason="the reference rules are gymnax's Asterix")
jnp = jax.numpy
from gymnax.environments.minatar.asterix import EnvState, spawn_entity  # noqa: E402

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


@pytest.fixture(scope="module")
def gym() -> Any:
    """gymnax's env with its jitted, vmapped functions (compiled once per module)."""
    env, params = gymnax.make("Asterix-MinAtar")
    env.params = params
    env.vreset = jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))
    env.vstep_env = jax.jit(jax.vmap(env.step_env, in_axes=(0, 0, 0, None)))
    env.vget_obs = jax.jit(jax.vmap(env.get_obs))
    env.vdecisions = jax.jit(jax.vmap(gymnax_decisions))
    return env


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
    fields = {name: jnp.asarray(getattr(state, name).numpy()) for name in SCALARS}
    x, right, gold, on = (getattr(state, name).numpy().astype(np.int32) for name in ENTITY_FIELDS)
    in_use = (on | right | gold | (x != 0)).astype(bool)
    row = np.where(in_use, np.arange(1, SLOTS + 1, dtype=np.int32), 0)
    entities = np.stack([x, row, right, gold, on], -1)
    return EnvState(
        shot_timer=jnp.zeros(len(x), jnp.int32),
        entities=jnp.asarray(entities),
        terminal=jnp.asarray(state.terminal.numpy()),
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
    fields = {n: torch.from_numpy(np.array(getattr(state, n), np.int32)) for n in SCALARS}
    n = len(x)
    return AsterixState(
        entity_x=torch.from_numpy(x.astype(np.int32)),
        entity_right=torch.from_numpy(right.astype(bool)),
        entity_gold=torch.from_numpy(gold.astype(bool)),
        entity_on=torch.from_numpy(on.astype(bool)),
        terminal=torch.from_numpy(np.array(state.terminal, np.bool_)),
        score=torch.zeros(n, dtype=torch.int32) if score is None else score,
        **fields,
    )


def assert_same_gymnax_states(a: EnvState, b: EnvState) -> None:
    for name in (*SCALARS, "shot_timer", "entities", "terminal"):
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)


def assert_same_states(a: AsterixState, b: AsterixState) -> None:
    for name, x, y in zip(AsterixState._fields, a, b, strict=True):
        assert x.dtype == y.dtype, name
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


def cat_states(*states: AsterixState) -> AsterixState:
    return AsterixState(*(torch.cat(fields) for fields in zip(*states, strict=True)))


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
    return random_play_states(gym, num_envs=64, num_steps=64, seed=0)


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
    theirs = played
    ours = from_gymnax(theirs)
    assert_same_gymnax_states(to_gymnax(ours), theirs)
    ours = cat_states(ours, ranged_states(256, torch.Generator().manual_seed(1)))
    assert_same_states(from_gymnax(to_gymnax(ours), ours.score), ours)
    assert ours.entity_x.dtype == torch.int32 and ours.entity_on.dtype == torch.bool


def test_a_row_outside_its_slot_does_not_convert(played: EnvState) -> None:
    with pytest.raises(AssertionError, match="slot i is row i"):
        from_gymnax(played.replace(entities=played.entities.at[:, 2, 1].set(7)))


def test_every_action_steps_as_gymnax_step_env(gym: Any, states: AsterixState) -> None:
    """Same next state (every field), reward, termination and observation, for every action
    from every state, given gymnax's spawn draw; and the states reach every rule (so
    agreement is not vacuous)."""
    n = len(states.time)
    theirs = to_gymnax(states)
    events = dict.fromkeys(
        ("spawn", "overwrite", "gold before move", "gold after move", "enemy before move",
         "enemy after move", "off the board", "ghost cleared", "ramp", "slower moves"), 0,
    )  # fmt: skip
    for a in range(NUM_ACTIONS):
        keys = jax.random.split(jax.random.PRNGKey(a), n)
        bits = conditioned_bits(gym, keys, states)
        action = torch.full((n,), a, dtype=torch.int64)
        new, reward, terminated = advance(states, action, bits)
        obs_j, new_j, reward_j, terminated_j, _ = gym.vstep_env(
            keys, theirs, jnp.full((n,), a), gym.params
        )
        assert_same_states(new, from_gymnax(new_j, states.score + reward.to(torch.int32)))
        assert reward.dtype == torch.float32 and terminated.dtype == torch.bool
        np.testing.assert_array_equal(reward.numpy(), np.asarray(reward_j))
        np.testing.assert_array_equal(terminated.numpy(), np.asarray(terminated_j))
        np.testing.assert_array_equal(np.asarray(obs_j), observe(new, torch.float32).numpy())

        spawn = (states.spawn_timer == 0) & ~spawn_choice(bits, states.entity_on).fills
        move = states.move_timer == 0
        events["spawn"] += int((states.spawn_timer == 0).sum())
        events["overwrite"] += int(spawn.sum())
        events["gold before move"] += int(((reward > 0) & ~move).sum())
        events["gold after move"] += int(((reward > 0) & move).sum())
        events["enemy before move"] += int((terminated & ~move).sum())
        events["enemy after move"] += int((terminated & move).sum())
        gone = states.entity_on & ~new.entity_on & move[:, None]
        events["off the board"] += int(
            (gone & ((states.entity_x == 0) | (states.entity_x == 9))).sum()
        )
        ghosts = ~states.entity_on & (states.entity_x != 0) & move[:, None]
        events["ghost cleared"] += int(ghosts.sum())
        events["ramp"] += int((new.ramp_index > states.ramp_index).sum())
        events["slower moves"] += int((new.move_speed < states.move_speed).sum())
    assert min(events.values()) >= 50, events


def test_observations_are_gymnax_planes(gym: Any, states: AsterixState) -> None:
    obs = observe(states)
    assert obs.shape == (len(states.time), *OBS_SHAPE) and obs.dtype == torch.bool
    np.testing.assert_array_equal(obs.numpy(), np.asarray(gym.vget_obs(to_gymnax(states))))


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
    n = 64
    ours = initial_state(torch.randint(0, 2**32, (n,), generator=torch.Generator().manual_seed(4)))
    _, theirs = gym.vreset(jax.random.split(jax.random.PRNGKey(4), n), gym.params)
    assert_same_states(ours, from_gymnax(theirs))
    assert_same_gymnax_states(to_gymnax(ours), theirs)


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


def torch_episodes(num_envs: int, per_env: int, seed: int) -> np.ndarray:
    """The same as `gymnax_episodes` with our rules: random bits and actions from a torch
    generator, ended games restarted in place; returns and lengths from `episode`."""
    generator = torch.Generator().manual_seed(seed)

    def bits() -> torch.Tensor:
        return torch.randint(0, 2**32, (num_envs,), generator=generator)

    state = initial_state(bits())
    episodes = np.zeros((num_envs, per_env, 2), np.float32)
    done = np.zeros(num_envs, np.int64)
    ret = torch.zeros(num_envs)
    fresh = initial_state(bits())
    while (done < per_env).any():
        action = torch.randint(0, NUM_ACTIONS, (num_envs,), generator=generator)
        state, reward, terminated = advance(state, action, bits())
        ret += reward
        ended_t = terminated | truncated(state)
        ended = ended_t.numpy() & (done < per_env)
        rows = np.flatnonzero(ended)
        returns, lengths = episode(state)
        assert torch.equal(returns[rows], ret[rows])  # the score is the sum of the rewards
        episodes[rows, done[rows]] = torch.stack((returns, lengths.float()), 1).numpy()[rows]
        done += ended
        state = AsterixState(
            *(torch.where(_rows(ended_t, s), f, s) for f, s in zip(fresh, state, strict=True))
        )
        ret = torch.where(ended_t, 0.0, ret)
    return episodes.reshape(-1, 2)


def _rows(mask: torch.Tensor, field: torch.Tensor) -> torch.Tensor:
    """`mask` (N,) shaped to select whole rows of `field` (N,) or (N, 8)."""
    return mask.view(-1, *[1] * (field.dim() - 1))


@pytest.mark.slow
def test_random_play_returns_and_lengths_agree_with_gymnax(gym: Any) -> None:
    ours = torch_episodes(num_envs=2048, per_env=4, seed=0)
    theirs = gymnax_episodes(gym, num_envs=2048, per_env=4, seed=0)
    assert ours[:, 0].max() >= 3 and theirs[:, 0].max() >= 3  # not all-zero returns
    assert_same_law(ours[:, 0], theirs[:, 0], "return")
    assert_same_law(ours[:, 1], theirs[:, 1], "length")
