"""Property-based tests: invariants of the game for random valid rules and actions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import rule_sets as shared_rule_sets

from fruit_env import FruitCatcherVectorEnv, FruitParams
from fruit_env.games.fruit_catcher.env import FruitState
from fruit_env.games.fruit_catcher.params import OBS_MODES

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rule_sets() -> st.SearchStrategy[dict[str, Any]]:
    """Random valid rules covering every FruitParams field, small boards included."""
    return shared_rule_sets(max_width=12, max_height=10, max_score=6, max_steps=40)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, Any], AutoresetMode, int, np.ndarray]:
    """Rules, autoreset mode, seed and an action sequence of shape (steps, num_envs)."""
    rules = draw(rule_sets())
    mode = draw(st.sampled_from(list(AutoresetMode)))
    num_envs = draw(st.integers(1, 4))
    row = st.lists(st.integers(0, 2), min_size=num_envs, max_size=num_envs)
    actions = draw(st.lists(row, min_size=10, max_size=60))
    seed = draw(st.integers(0, 2**64 - num_envs))
    return rules, mode, seed, np.array(actions, dtype=np.int64)


def check_state(p: FruitParams, state: FruitState) -> None:
    """Invariants of every reachable state."""
    active = state.active
    count = active.sum(1)
    assert ((count >= 1) & (count <= p.max_fruits)).all(), count
    x, y = state.fruit_x, state.fruit_y
    assert ((x >= 0) & (x < p.width))[active].all()
    assert ((y >= 0) & (y <= p.height - 2))[active].all()  # a fruit in the bottom row has landed
    assert (x[~active] == 0).all() and (y[~active] == 0).all()
    # One spawn per step, in row 0, after everything fell: no two fruits share a row.
    for rows, act in zip(y.tolist(), active.tolist(), strict=True):
        live = [r for r, a in zip(rows, act, strict=True) if a]
        assert len(set(live)) == len(live)
    assert ((state.basket >= 0) & (state.basket <= p.width - p.basket_width)).all()
    assert torch.equal(state.score, state.caught - state.missed)
    assert ((state.score >= p.lose_score) & (state.score <= p.win_score)).all()
    assert ((state.t >= 0) & (state.t <= p.max_episode_steps)).all()


def check_obs(env: FruitCatcherVectorEnv, obs: torch.Tensor) -> None:
    """Each row lies in single_observation_space and shows exactly the current state."""
    p, state = env.params, env.state
    array = obs.numpy()
    assert all(env.single_observation_space.contains(row) for row in array)
    if p.obs_mode == "features":
        f32 = np.float32
        basket = state.basket.numpy().astype(f32)
        centre = (basket + f32((p.basket_width - 1) / 2)) / f32(p.width - 1)
        assert np.array_equal(array[:, 0], centre)
        slots = array[:, 1:].reshape(env.num_envs, p.max_fruits, 3)
        assert np.array_equal(np.rint(slots[..., 0] * (p.width - 1)), state.fruit_x.numpy())
        assert np.array_equal(np.rint(slots[..., 1] * (p.height - 1)), state.fruit_y.numpy())
        assert np.array_equal(slots[..., 2], state.active.numpy().astype(np.float32))
    else:
        grid = array[:, 0]
        assert np.isin(grid, (0, 128, 255)).all()
        for i in range(env.num_envs):
            fruits = {
                (y, x)
                for x, y, a in zip(
                    state.fruit_x[i].tolist(),
                    state.fruit_y[i].tolist(),
                    state.active[i].tolist(),
                    strict=True,
                )
                if a
            }
            assert set(zip(*np.nonzero(grid[i] == 255), strict=True)) == fruits
            left = int(state.basket[i])
            assert np.array_equal(
                np.flatnonzero(grid[i, -1] == 128), np.arange(left, left + p.basket_width)
            )
            assert (grid[i, :-1] != 128).all()


@SETTINGS
@given(scenario=scenarios())
def test_invariants_hold_after_every_step(
    scenario: tuple[dict[str, Any], AutoresetMode, int, np.ndarray],
) -> None:
    """For random rules and actions: observations in the space and faithful to the state,
    1..max_fruits fruits on the board, fruits and basket in range, |reward| <= max_fruits
    (in fact <= 1: at most one fruit lands per step), score == caught - missed within the
    score limits, `_episode` == terminated | truncated."""
    rules, mode, seed, actions = scenario
    env = FruitCatcherVectorEnv(actions.shape[1], autoreset_mode=mode, **rules)
    p = env.params
    obs, _ = env.reset(seed=seed)
    check_state(p, env.state)
    check_obs(env, obs)
    for row in actions:
        obs, reward, terminated, truncated, info = env.step(row)
        check_state(p, env.state)
        check_obs(env, obs)
        assert reward.dtype == torch.float32
        assert ((reward >= -p.max_fruits) & (reward <= p.max_fruits)).all()
        assert torch.isin(reward, torch.tensor([-1.0, 0.0, 1.0])).all()
        ended = terminated | truncated
        assert torch.equal(info["_episode"], ended)
        if mode == AutoresetMode.SAME_STEP:
            # the restarted game is already in the state; the ended one is in final_obs
            assert (env.state.t[ended] == 0).all()
            final = info["final_obs"][ended].numpy()
            assert all(env.single_observation_space.contains(o) for o in final)
        if mode == AutoresetMode.DISABLED and ended.any():
            obs, _ = env.reset(options={"reset_mask": ended})
            check_state(p, env.state)
            check_obs(env, obs)


@SETTINGS
@given(scenario=scenarios())
def test_episode_ends_exactly_at_limits(
    scenario: tuple[dict[str, Any], AutoresetMode, int, np.ndarray],
) -> None:
    """In DISABLED mode (no restarts hide the state): terminated iff the score sits at
    win_score or lose_score, truncated iff t == max_episode_steps, and the episode
    statistics equal the state's score, t, caught and missed."""
    rules, _, seed, actions = scenario
    env = FruitCatcherVectorEnv(actions.shape[1], autoreset_mode="DISABLED", **rules)
    p = env.params
    env.reset(seed=seed)
    for row in actions:
        _, _, terminated, truncated, info = env.step(row)
        s = env.state
        assert torch.equal(terminated, (s.score == p.win_score) | (s.score == p.lose_score))
        assert torch.equal(truncated, s.t == p.max_episode_steps)
        episode = info["episode"]
        assert torch.equal(episode["r"], s.score.float())
        assert torch.equal(episode["l"], s.t)
        assert torch.equal(episode["caught"], s.caught)
        assert torch.equal(episode["missed"], s.missed)
        ended = terminated | truncated
        if ended.any():
            env.reset(options={"reset_mask": ended})


@SETTINGS
@given(
    rules=rule_sets(),
    seeds=st.lists(st.integers(0, 2**64 - 1), min_size=2, max_size=4),
    index=st.integers(0, 3),
    data=st.data(),
)
def test_sub_env_trajectory_independent_of_batch(
    rules: dict[str, Any], seeds: list[int], index: int, data: st.DataObject
) -> None:
    """For random rules, sub-env `index` of a batch (NEXT_STEP) plays exactly like a
    1-env batch with its seed and actions, whatever the other sub-envs do."""
    index %= len(seeds)
    steps = data.draw(st.integers(1, 50))
    rand = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    actions = rand.integers(0, 3, (steps, len(seeds)))
    batch = FruitCatcherVectorEnv(len(seeds), **rules)
    alone = FruitCatcherVectorEnv(1, **rules)
    obs_b, _ = batch.reset(seed=list(seeds))
    obs_a, _ = alone.reset(seed=[seeds[index]])
    assert torch.equal(obs_b[index], obs_a[0])
    for row in actions:
        out_b = batch.step(row)
        out_a = alone.step(row[index : index + 1])
        for b, a in zip(out_b[:4], out_a[:4], strict=True):
            assert torch.equal(b[index], a[0])


@pytest.mark.parametrize("obs_mode", OBS_MODES)
@SETTINGS
@given(rules=rule_sets())
def test_spaces_match_rules(rules: dict[str, Any], obs_mode: str) -> None:
    """single_observation_space has the documented shape and dtype for any rules, and the
    batched spaces stack num_envs of them."""
    rules = {**rules, "obs_mode": obs_mode}
    env = FruitCatcherVectorEnv(3, **rules)
    p = env.params
    space = env.single_observation_space
    if obs_mode == "features":
        assert (space.shape, space.dtype) == ((1 + 3 * p.max_fruits,), np.float32)
        assert (space.low == 0).all() and (space.high == 1).all()
    else:
        assert (space.shape, space.dtype) == ((1, p.height, p.width), np.uint8)
    assert env.observation_space.shape == (3, *space.shape)
    assert env.action_space.shape == (3,)
    assert env.single_action_space.n == 3
