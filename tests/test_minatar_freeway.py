"""MinAtar Freeway in torch against gymnax's `Freeway-MinAtar`, whose rules it copies.

What is compared and why it is exact: `tests/minatar_reference.py`. Here: states convert
field by field (gymnax's car rows `[x, lane, timer, speed]` are three `(N, 8)` fields, the
lane being always car + 1). The states stepped from are those reached by random play in
gymnax (through the time limit), the same placed one row below the top, and states drawn
uniformly over the fields' ranges.

gymnax's step draws new car speeds from its key (kept only when the chicken scores); our
rules take them from 32 random bits. The comparison stays exact by conditioning on that
draw: the test reads the speeds gymnax draws from each key (`gymnax_draws`, the two calls of
gymnax's `step_env` and `reset_env` on the key) and hands our rules the bits that decode to
exactly those speeds (`bits_for`, the inverse of `car_speeds`). A wrong reading of gymnax's
draw would fail the comparison on every state that scores. Starts are compared the same way
(exactly, for the same draw), and as distributions from independent draws; random-play
returns and lengths are compared as distributions.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from fruit_env.games.minatar_freeway.rules import (
    MAX_STEPS_IN_EPISODE,
    NUM_ACTIONS,
    NUM_CARS,
    OBS_SHAPE,
    FreewayState,
    advance,
    car_speeds,
    episode,
    initial_state,
    observe,
    truncated,
)
from tests.minatar_laws import assert_same_law
from tests.minatar_reference import (
    Reference,
    assert_converts_both_ways,
    assert_every_action_steps_as_gymnax,
    assert_observations_are_gymnax_planes,
    assert_same_states,
    cat_states,
    gymnax_env,
    gymnax_game,
    jax,
    jnp,
    random_play_states,
    same_fields_for_gymnax,
    same_fields_from_gymnax,
)

EnvState = gymnax_game("freeway").EnvState

LANES = np.arange(1, NUM_CARS + 1, dtype=np.int32)
SCALAR_FIELDS = ("pos", "move_timer", "time", "terminal")
CAR_FIELDS = ("car_x", "car_timer", "car_speed")  # gymnax's cars[:, :, 0], [2] and [3]


# --- conversions ---------------------------------------------------------------------------


def to_gymnax(state: FreewayState) -> EnvState:
    """gymnax's batched `EnvState` for our state (less `score`), with gymnax's dtypes."""
    n = len(state.pos)
    columns = [getattr(state, name).numpy() for name in CAR_FIELDS]
    cars = np.stack([columns[0], np.broadcast_to(LANES, (n, NUM_CARS)), *columns[1:]], -1)
    fields = same_fields_for_gymnax(state, SCALAR_FIELDS)
    return EnvState(cars=jnp.asarray(cars), **fields)


def from_gymnax(state: EnvState, score: torch.Tensor | None = None) -> FreewayState:
    """Our state for a batched gymnax `EnvState` (whose car `i` must drive in lane `i + 1`),
    with `score` (zeros unless given)."""
    cars = np.array(state.cars, np.int32)
    assert (cars[:, :, 1] == LANES).all(), "car i drives in lane i + 1 in a FreewayState"
    fields = {
        name: torch.from_numpy(np.ascontiguousarray(cars[:, :, column]))
        for name, column in zip(CAR_FIELDS, (0, 2, 3), strict=True)
    }
    fields |= same_fields_from_gymnax(state, ("pos", "move_timer", "time"), ("terminal",))
    if score is None:
        score = torch.zeros(len(cars), dtype=torch.int32)
    return FreewayState(score=score, **fields)


REF = Reference(
    gymnax_id="Freeway-MinAtar",
    num_actions=NUM_ACTIONS,
    obs_shape=OBS_SHAPE,
    gymnax_fields=("cars", *SCALAR_FIELDS),
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
    return gymnax_env(REF)


# --- gymnax's random draw, and the bits that give it to our rules --------------------------


def gymnax_draws(keys: jax.Array) -> torch.Tensor:
    """The signed car speeds `(N, 8)` that gymnax's `step_env` and `reset_env` draw from each
    key: they split it in two, a uniform speed in 1..5 from the first half and a uniform
    direction in {-1, +1} from the second."""

    def draw(key: jax.Array) -> jax.Array:
        speed_key, direction_key = jax.random.split(key)
        speeds = jax.random.randint(speed_key, (NUM_CARS,), 1, 6)
        return jax.random.choice(direction_key, jnp.array([-1, 1]), (NUM_CARS,)) * speeds

    return torch.from_numpy(np.array(jax.jit(jax.vmap(draw))(keys), np.int32))


def bits_for(speeds: torch.Tensor) -> torch.Tensor:
    """`(N,)` int64 bits that `car_speeds` decodes to `speeds` `(N, 8)`: car `i`'s outcome
    (0-4 for speeds -5..-1, 5-9 for 1..5) is the `i`-th decimal digit of `bits / 2**32`, so
    the bits are the least integer whose fraction starts with those eight digits."""
    digits = (speeds + 5 - (speeds > 0).to(torch.int32)).to(torch.int64)
    number = (digits * 10 ** torch.arange(NUM_CARS - 1, -1, -1)).sum(1)
    return -((-number << 32) // 10**NUM_CARS)  # ceil(number * 2**32 / 10**8)


# --- states to compare from ----------------------------------------------------------------


def one_row_below_the_top(state: FreewayState) -> FreewayState:
    """`state` with the chicken on row 1, free to move: up scores (random play rarely
    crosses the road, and a crossing draws the new speeds)."""
    return state._replace(pos=torch.ones_like(state.pos), move_timer=torch.zeros_like(state.pos))


def uniform_states(n: int, generator: torch.Generator) -> FreewayState:
    """States drawn uniformly over each field's range, reachable or not: every combination of
    chicken, car positions, timers, speeds and directions that the rules could be asked
    about (a chicken on row 0 even, which scores whatever the action, as in gymnax)."""

    def ints(low: int, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(low, high, (n, *shape), generator=generator, dtype=torch.int32)

    magnitude = ints(1, 6, NUM_CARS)
    return FreewayState(
        pos=ints(0, 10),
        car_x=ints(0, 10, NUM_CARS),
        car_timer=ints(0, 6, NUM_CARS),
        car_speed=torch.where(ints(0, 2, NUM_CARS) == 1, magnitude, -magnitude),
        move_timer=ints(0, 4),
        time=ints(0, MAX_STEPS_IN_EPISODE),
        terminal=ints(0, 2).bool(),
        score=ints(0, 100),
    )


@pytest.fixture(scope="module")
def played(gym: Any) -> EnvState:
    """gymnax states from random play, through a time limit: every 20th state of 32 games
    over 2600 steps."""
    states = random_play_states(gym, REF, num_envs=32, num_steps=2600, seed=0)
    return jax.tree.map(lambda leaf: leaf[::20], states)


@pytest.fixture(scope="module")
def states(played: EnvState) -> FreewayState:
    """Random-play states (as they are and one row below the top) and uniform states."""
    generator = torch.Generator().manual_seed(0)
    played = from_gymnax(played)
    return cat_states(played, one_row_below_the_top(played), uniform_states(4096, generator))


# --- the comparisons -----------------------------------------------------------------------


def test_states_convert_both_ways(played: EnvState) -> None:
    ours = assert_converts_both_ways(REF, played)
    assert ours.car_x.shape == (len(ours.pos), NUM_CARS) and ours.terminal.dtype == torch.bool
    assert int(ours.time.max()) == MAX_STEPS_IN_EPISODE - 1  # play went through the limit


def test_a_car_out_of_its_lane_does_not_convert(played: EnvState) -> None:
    with pytest.raises(AssertionError, match="lane i \\+ 1"):
        from_gymnax(played.replace(cars=played.cars.at[:, 3, 1].set(2)))


def test_bits_for_gives_car_speeds_any_draw() -> None:
    """The inverse used to condition on gymnax's draw: every speed in every car, and the
    extreme draws (all digits 0 and all 9)."""
    generator = torch.Generator().manual_seed(1)
    magnitude = torch.randint(1, 6, (5000, NUM_CARS), generator=generator, dtype=torch.int32)
    sign = torch.randint(0, 2, (5000, NUM_CARS), generator=generator, dtype=torch.int32) * 2 - 1
    extremes = torch.tensor([[-5], [5]], dtype=torch.int32).expand(2, NUM_CARS)
    speeds = torch.cat((magnitude * sign, extremes))
    bits = bits_for(speeds)
    assert bits.dtype == torch.int64 and int(bits.min()) >= 0 and int(bits.max()) < 2**32
    assert torch.equal(car_speeds(bits), speeds)


def events(
    a: int,
    states: FreewayState,
    new: FreewayState,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    bits: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Where each of Freeway's rules acted in one step: the chicken up, down or waiting,
    scores (and the new speeds they draw), hits by a still and by a moving car, car moves,
    wraps and moves at top speed."""
    ready = states.move_timer == 0
    scored = reward > 0
    moved = new.car_x != states.car_x
    lane = states.pos[:, None] == torch.from_numpy(LANES)
    kept = ~scored & (states.pos != 0)
    hit = kept & (new.pos == 9) & (states.pos != 9)
    return {
        "up": kept & ready & (a == 1) & (new.pos == states.pos - 1),
        "down": ready & (a == 2) & (new.pos == states.pos + 1),
        "waits": ~ready & (a != 0) & (new.pos == states.pos),
        "scores": scored,
        "new speeds": (new.car_speed != states.car_speed).any(1),
        "hit still": hit[:, None] & lane & (states.car_x == 4) & ~moved,
        "hit moving": hit[:, None] & lane & (new.car_x == 4) & moved,
        "car moves": moved,
        "wraps": moved & ((new.car_x - states.car_x).abs() == 9),
        "max speed": moved & (new.car_speed.abs() == 5),
    }


def test_every_action_steps_as_gymnax_step_env(gym: Any, states: FreewayState) -> None:
    """gymnax's draw of new speeds is given to our rules as bits."""
    keys = jax.random.split(jax.random.PRNGKey(3), len(states.time))
    bits = bits_for(gymnax_draws(keys))
    assert_every_action_steps_as_gymnax(gym, REF, states, lambda a: (keys, bits), events)


def test_observations_are_gymnax_planes(gym: Any, states: FreewayState) -> None:
    assert_observations_are_gymnax_planes(gym, REF, states)


def test_a_start_is_gymnax_start_for_the_same_draw(gym: Any) -> None:
    keys = jax.random.split(jax.random.PRNGKey(5), 2048)
    obs_j, theirs = gym.vreset(keys, gym.params)
    ours = initial_state(bits_for(gymnax_draws(keys)))
    assert_same_states(ours, from_gymnax(theirs))
    np.testing.assert_array_equal(np.asarray(obs_j), observe(ours, torch.float32).numpy())


def chi_square(counts: np.ndarray) -> float:
    """Pearson's statistic of `counts` against equal probabilities."""
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


def chi_square_limit(cells: int) -> float:
    """A bound that the statistic of a uniform law with `cells` outcomes exceeds with
    probability about 3e-7 (the normal approximation to chi-square, mean + 5 SD)."""
    df = cells - 1
    return df + 5 * math.sqrt(2 * df)


def test_starts_are_distributed_as_gymnax_starts(gym: Any) -> None:
    """From independent draws (our bits, JAX keys): each car's ten speeds, and each pair of
    neighbouring cars' hundred, uniform on both sides (chi-square, mean + 5 SD); every other
    field is the same constant on both sides."""
    n = 20000
    bits = torch.randint(0, 2**32, (n,), generator=torch.Generator().manual_seed(4))
    ours = initial_state(bits)
    _, theirs_j = gym.vreset(jax.random.split(jax.random.PRNGKey(4), n), gym.params)
    theirs = from_gymnax(theirs_j)
    for state in (ours, theirs):
        outcome = (state.car_speed + 5 - (state.car_speed > 0).to(torch.int32)).numpy()
        assert ((outcome >= 0) & (outcome < 10)).all()
        for car in range(NUM_CARS):
            counts = np.bincount(outcome[:, car], minlength=10)
            assert chi_square(counts) < chi_square_limit(10), (car, counts)
        for car in range(NUM_CARS - 1):
            pairs = np.bincount(outcome[:, car] * 10 + outcome[:, car + 1], minlength=100)
            assert chi_square(pairs) < chi_square_limit(100), car
        assert torch.equal(state.car_timer, state.car_speed.abs())
    for name in ("pos", "car_x", "move_timer", "time", "terminal", "score"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name


# --- random play as distributions ----------------------------------------------------------


def gymnax_returns(gym: Any, num_envs: int, probs: tuple[float, ...], seed: int) -> np.ndarray:
    """The return of one whole episode (2500 steps: Freeway never ends sooner) of each of
    `num_envs` random players that pick actions with probabilities `probs`, through gymnax's
    `step`; asserts that every episode is truncated at its last step and not before."""

    def play(key: jax.Array) -> tuple[jax.Array, jax.Array]:
        reset_key, key = jax.random.split(key)
        _, state = jax.vmap(gym.reset, in_axes=(0, None))(
            jax.random.split(reset_key, num_envs), gym.params
        )

        def one_step(carry: tuple, key: jax.Array) -> tuple[tuple, jax.Array]:
            state, ret = carry
            action_key, step_key = jax.random.split(key)
            action = jax.random.choice(action_key, NUM_ACTIONS, (num_envs,), p=jnp.array(probs))
            _, new, reward, term, trunc, _ = jax.vmap(gym.step, in_axes=(0, 0, 0, None))(
                jax.random.split(step_key, num_envs), state, action, gym.params
            )
            return (new, ret + reward), (term | trunc).sum()

        keys = jax.random.split(key, MAX_STEPS_IN_EPISODE)
        (_, ret), ends = jax.lax.scan(one_step, (state, jnp.zeros(num_envs)), keys)
        return ret, ends

    ret, ends = jax.jit(play)(jax.random.PRNGKey(seed))
    ends = np.asarray(ends)
    assert ends[-1] == num_envs and not ends[:-1].any()
    return np.asarray(ret)


def torch_returns(num_envs: int, probs: tuple[float, ...], seed: int) -> np.ndarray:
    """The same as `gymnax_returns` with our rules (starts and new speeds from random bits,
    actions from a torch generator); the returns from `episode`, checked against the sum of
    the rewards, and every episode truncated at its last step."""
    generator = torch.Generator().manual_seed(seed)

    def bits() -> torch.Tensor:
        return torch.randint(0, 2**32, (num_envs,), generator=generator)

    state = initial_state(bits())
    ret = torch.zeros(num_envs)
    weights = torch.tensor(probs).expand(num_envs, -1)
    for step in range(MAX_STEPS_IN_EPISODE):
        assert not truncated(state).any(), step
        action = torch.multinomial(weights, 1, generator=generator)[:, 0]
        state, reward, terminated = advance(state, action, bits())
        assert not terminated.any()
        ret += reward
    assert truncated(state).all()
    returns, lengths = episode(state)
    assert torch.equal(returns, ret) and (lengths == MAX_STEPS_IN_EPISODE).all()
    return returns.numpy()


@pytest.mark.slow
@pytest.mark.parametrize(
    "probs", [(1 / 3, 1 / 3, 1 / 3), (0.2, 0.6, 0.2)], ids=["uniform", "mostly-up"]
)
def test_random_play_returns_and_lengths_agree_with_gymnax(
    gym: Any, probs: tuple[float, ...]
) -> None:
    """Returns of 1024 whole episodes each side: means within 4 standard errors, KS below its
    alpha = 1e-4 threshold. Lengths are 2500 on both sides (asserted in the players)."""
    ours = torch_returns(num_envs=1024, probs=probs, seed=0)
    theirs = gymnax_returns(gym, num_envs=1024, probs=probs, seed=0)
    assert ours.max() >= 2 and theirs.max() >= 2  # not all-zero returns
    assert_same_law(ours, theirs, "return")
