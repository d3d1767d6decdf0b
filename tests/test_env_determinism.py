"""Seeding and determinism: a sub-env's game is a function of its seed and its actions.

Also: seeding conventions (`int` -> seed + i, list -> per env, `None` -> fresh entropy, then
the stream continues), the counter-based hash agreeing across Python ints, numpy and torch,
and outputs that do not alias the env's internal buffers (the compiled step: test_env_compile).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from hypothesis import given, settings
from hypothesis import strategies as st

from fruit_env import FruitCatcherVectorEnv
from fruit_env.games.fruit_catcher import params as rules_params
from fruit_env.games.fruit_catcher.env import FruitState
from fruit_env.kit import rng

SHORT = {"width": 8, "height": 6, "win_score": 3, "lose_score": -3, "max_episode_steps": 11}
MODES = list(AutoresetMode)
MODE_IDS = [m.name for m in MODES]


Rollout = dict[str, np.ndarray]


def rollout(
    env: FruitCatcherVectorEnv,
    actions: np.ndarray,
    seed: int | list[int | None] | None = None,
) -> Rollout:
    """Reset, then step through `actions` (steps, num_envs). Returns every output stacked
    over steps: "reset_obs" (one row per reset), then per step the obs, reward, flags,
    `_episode`, SAME_STEP's final_obs and the basket/fruit columns of the state. In DISABLED
    mode the ended sub-envs are reset after each step."""
    obs, _ = env.reset(seed=seed)
    outs: dict[str, list[np.ndarray]] = {"reset_obs": [obs.numpy().copy()]}
    disabled = env.metadata["autoreset_mode"] == AutoresetMode.DISABLED
    for row in actions:
        obs, reward, terminated, truncated, info = env.step(row)
        ended = info["_episode"].numpy().copy()
        for name, value in (
            ("obs", obs),
            ("reward", reward),
            ("terminated", terminated),
            ("truncated", truncated),
            ("ended", info["_episode"]),
            ("final_obs", info.get("final_obs", obs)),
            ("basket", env.state.basket),
            ("fruit_x", env.state.fruit_x),
        ):
            outs.setdefault(name, []).append(value.numpy().copy())
        if disabled and ended.any():
            obs, _ = env.reset(options={"reset_mask": ended})
            outs["reset_obs"].append(obs.numpy().copy())
    return {k: np.stack(v) for k, v in outs.items()}


def sub_env(outputs: Rollout, index: int) -> Rollout:
    """The per-step outputs of one sub-env (reset rows left out: in DISABLED mode their
    number depends on the neighbours)."""
    return {k: v[:, index] for k, v in outputs.items() if k != "reset_obs"}


def assert_same(a: Rollout, b: Rollout) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), key


def differs(a: Rollout, b: Rollout) -> bool:
    return any(a[k].shape != b[k].shape or not np.array_equal(a[k], b[k]) for k in a)


def random_actions(steps: int, num_envs: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 3, (steps, num_envs))


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_same_seed_and_actions_same_trajectory(mode: AutoresetMode) -> None:
    """Two envs with the same seed and actions produce identical outputs, step by step."""
    actions = random_actions(120, 4, seed=1)
    runs = [
        rollout(FruitCatcherVectorEnv(4, autoreset_mode=mode, **SHORT), actions, seed=77)
        for _ in range(2)
    ]
    assert_same(runs[0], runs[1])


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_sub_env_ignores_batch_size_and_neighbours(mode: AutoresetMode) -> None:
    """Sub-env 1 of a 3-env batch plays exactly like a 1-env batch with its seed, whatever
    its neighbours' seeds and actions (and, in DISABLED mode, their resets)."""
    steps = 150
    own = random_actions(steps, 1, seed=3)[:, 0]
    alone = rollout(
        FruitCatcherVectorEnv(1, autoreset_mode=mode, **SHORT), own[:, None], seed=[1234]
    )
    for neighbour_seed in (4, 5):
        actions = random_actions(steps, 3, seed=neighbour_seed)
        actions[:, 1] = own
        batch = rollout(
            FruitCatcherVectorEnv(3, autoreset_mode=mode, **SHORT),
            actions,
            seed=[neighbour_seed, 1234, 10 * neighbour_seed],
        )
        assert_same(sub_env(batch, 1), sub_env(alone, 0))
        if mode != AutoresetMode.DISABLED:
            assert np.array_equal(batch["reset_obs"][:, 1], alone["reset_obs"][:, 0])


def test_different_seeds_give_different_games() -> None:
    """Each sub-env seeded differently plays a different game under the same actions."""
    actions = random_actions(100, 6, seed=8)
    a = rollout(FruitCatcherVectorEnv(6, **SHORT), actions, seed=[0, 1, 2, 3, 4, 5])
    b = rollout(FruitCatcherVectorEnv(6, **SHORT), actions, seed=[6, 7, 8, 9, 10, 11])
    for i in range(6):
        assert differs(sub_env(a, i), sub_env(b, i))


def test_int_seed_means_seed_plus_index() -> None:
    """reset(seed=s) gives sub-env i the seed s + i: identical to the list [s, s+1, ...]."""
    actions = random_actions(60, 5, seed=9)
    from_int = rollout(FruitCatcherVectorEnv(5, **SHORT), actions, seed=100)
    seeds: list[int | None] = [100, 101, 102, 103, 104]
    from_list = rollout(FruitCatcherVectorEnv(5, **SHORT), actions, seed=seeds)
    assert_same(from_int, from_list)


def test_huge_int_seed_wraps_like_list_seeds() -> None:
    """Near 2**64 the per-env seeds s + i wrap modulo 2**64, as list seeds are reduced."""
    actions = random_actions(30, 3, seed=10)
    base = 2**64 - 2
    from_int = rollout(FruitCatcherVectorEnv(3, **SHORT), actions, seed=base)
    from_list = rollout(FruitCatcherVectorEnv(3, **SHORT), actions, seed=[base, base + 1, 0])
    assert_same(from_int, from_list)


def test_seed_list_with_none_keeps_those_streams() -> None:
    """reset(seed=[None, 5, None]) reseeds only sub-env 1; sub-envs 0 and 2 continue the
    stream they had, exactly as after reset(seed=None)."""
    first = random_actions(25, 3, seed=11)
    then = random_actions(40, 3, seed=12)
    env_a = FruitCatcherVectorEnv(3, **SHORT)
    env_b = FruitCatcherVectorEnv(3, **SHORT)
    rollout(env_a, first, seed=[1, 2, 3])
    rollout(env_b, first, seed=[1, 2, 3])
    mixed = rollout(env_a, then, seed=[None, 5, None])
    unseeded = rollout(env_b, then, seed=None)
    fresh5 = rollout(FruitCatcherVectorEnv(1, **SHORT), then[:, 1:2], seed=[5])
    for i in (0, 2):
        assert_same(sub_env(mixed, i), sub_env(unseeded, i))
    assert_same(sub_env(mixed, 1), sub_env(fresh5, 0))
    assert differs(sub_env(mixed, 1), sub_env(unseeded, 1))


def test_unseeded_fresh_envs_draw_fresh_entropy() -> None:
    """Two fresh envs reset with seed=None play different games. 16 sub-envs: for all
    trajectories to coincide every first fruit column alone would have to match,
    probability (1/20)**16 < 1e-20."""
    actions = random_actions(30, 16, seed=13)
    a = rollout(FruitCatcherVectorEnv(16), actions, seed=None)
    b = rollout(FruitCatcherVectorEnv(16), actions, seed=None)
    assert differs(a, b)


def test_unseeded_reset_continues_the_seeded_stream() -> None:
    """After reset(seed=7) and 40 steps, reset() starts a game that is not a replay of the
    first episode, and is the same in two envs with the same history (the stream continues;
    it is not re-drawn from entropy)."""
    actions = random_actions(40, 4, seed=14)
    env_a = FruitCatcherVectorEnv(4, **SHORT)
    env_b = FruitCatcherVectorEnv(4, **SHORT)
    first_a = rollout(env_a, actions, seed=7)
    first_b = rollout(env_b, actions, seed=7)
    second_a = rollout(env_a, actions, seed=None)
    second_b = rollout(env_b, actions, seed=None)
    assert_same(first_a, first_b)
    assert_same(second_a, second_b)
    for i in range(4):
        assert differs(sub_env(second_a, i), sub_env(first_a, i))


def test_unseeded_reset_of_fresh_env_does_not_repeat() -> None:
    """On a never-seeded env, a second reset() does not replay the first episode
    (16 sub-envs; same bound as for two fresh envs)."""
    actions = random_actions(30, 16, seed=15)
    env = FruitCatcherVectorEnv(16)
    first = rollout(env, actions, seed=None)
    second = rollout(env, actions, seed=None)
    assert differs(first, second)


def test_seed_keys_distinct_below_2_pow_32() -> None:
    """Seeds below 2**32 map to distinct keys (the seed hash is a bijection there), so
    reset(seed=s) never gives two sub-envs of one batch the same game."""
    seeds = np.arange(2**18, dtype=np.uint64) * np.uint64(16381)  # spread over [0, 2**32)
    keys = rng.seed_keys(seeds)
    assert len(np.unique(keys)) == len(seeds)
    assert keys.min() >= 0 and keys.max() < 2**32


@settings(max_examples=50, deadline=None)
@given(
    seeds=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=8),
    counters=st.lists(st.integers(0, 2**40), min_size=8, max_size=8),
    width=st.integers(2, 1000),
)
def test_hash_agrees_across_python_numpy_and_torch(
    seeds: list[int], counters: list[int], width: int
) -> None:
    """Every random draw is the same computed on Python ints, numpy int64 and torch int64,
    functionally or in place (what makes CPU and CUDA, eager and compiled games identical);
    columns fall in [0, width)."""
    keys_np = rng.seed_keys(np.array(seeds, dtype=np.uint64))
    assert keys_np.tolist() == [rng.seed_key(s) for s in seeds]
    for key in keys_np.tolist():
        expected = [rng.draw(key, c) for c in counters]
        assert all(0 <= bits < 2**32 for bits in expected)
        ctr_np = np.array(counters, dtype=np.int64)
        assert rng.draw(np.full(8, key, dtype=np.int64), ctr_np).tolist() == expected
        ctr_t = torch.tensor(counters, dtype=torch.int64)
        assert rng.draw(torch.full((8,), key, dtype=torch.int64), ctr_t).tolist() == expected
        eager = rng.EagerDraw()  # the eager steps' in-place form, its scratch reused
        for size in (8, 3, 8):
            key_t = torch.full((size,), key, dtype=torch.int64)
            assert eager(key_t, ctr_t[:size]).tolist() == expected[:size]
        columns = [rules_params.column(b, width) for b in expected]
        assert all(0 <= c < width for c in columns)


def _lowbias32(x: int) -> int:
    """The hash as published (products reduced mod 2**32): what `rng.mix32` must compute."""
    x ^= x >> 16
    x = x * 0x7FEB352D % 2**32
    x ^= x >> 15
    x = x * 0x846CA68B % 2**32
    return x ^ (x >> 16)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=16))
def test_mix32_is_lowbias32_for_every_input_kind(values: list[int]) -> None:
    """`rng.mix32`'s one-multiply products (signed constants, never beyond int64) give the
    published hash exactly, on Python ints, numpy int64 and torch int64, edge values included."""
    values = [*values, 0, 1, 2**31 - 1, 2**31, 2**32 - 1]
    expected = [_lowbias32(v) for v in values]
    assert [rng.mix32(v) for v in values] == expected
    assert rng.mix32(np.array(values, dtype=np.int64)).tolist() == expected
    assert rng.mix32(torch.tensor(values, dtype=torch.int64)).tolist() == expected


# -- outputs do not alias the env's state --------------------------------------------------------


def mutate_outputs(step_out: tuple[Any, ...]) -> None:
    """Overwrite, in place, every tensor a step handed out."""
    obs, reward, terminated, truncated, info = step_out
    tensors = [obs, reward, terminated, truncated, *info["episode"].values()]
    tensors += [v for k, v in info.items() if isinstance(v, torch.Tensor)]
    for tensor in tensors:
        tensor.fill_(True if tensor.dtype == torch.bool else 0)


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=MODE_IDS)
def test_mutating_outputs_does_not_change_the_game(mode: AutoresetMode) -> None:
    """Outputs are fresh tensors (docs/architecture.md): writing into every returned tensor
    after each step leaves the env's trajectory identical to an untouched twin's."""
    actions = random_actions(60, 3, seed=16)
    clean = FruitCatcherVectorEnv(3, autoreset_mode=mode, **SHORT)
    dirty = FruitCatcherVectorEnv(3, autoreset_mode=mode, **SHORT)
    clean.reset(seed=3)
    dirty.reset(seed=3)
    for row in actions:
        expected = clean.step(row)
        got = dirty.step(row)
        for a, b in zip(got[:4], expected[:4], strict=True):
            assert torch.equal(a, b)
        assert torch.equal(got[4]["_episode"], expected[4]["_episode"])
        mutate_outputs(got)
    for name, a, b in zip(FruitState._fields, dirty.state, clean.state, strict=True):
        assert torch.equal(a, b), name
