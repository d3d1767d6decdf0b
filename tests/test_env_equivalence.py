"""The torch vector env agrees exactly with N independent numpy games.

The reference is `gymnasium.vector.SyncVectorEnv` over `gymnasium.make("FruitCatcher-v0")`
(plain-Python rules in `single_env.py`, truncation by Gymnasium's `TimeLimit`), so the
autoreset bookkeeping on the reference side is Gymnasium's own. Both sides get the same
seeds and the same random actions; every output is compared with exact equality.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import rule_sets as shared_rule_sets

from fruit_env import ENV_ID, FruitCatcherVectorEnv

CUSTOM = {
    "width": 7,
    "height": 6,
    "basket_width": 1,
    "max_fruits": 5,
    "min_fruits": 2,
    "spawn_prob": 0.7,
    "min_spawn_gap": 1,
    "win_score": 3,
    "lose_score": -4,
    "max_episode_steps": 13,
}


def make_pair(
    num_envs: int, mode: AutoresetMode, rules: dict[str, Any]
) -> tuple[FruitCatcherVectorEnv, SyncVectorEnv]:
    """The torch vector env from `make_vec` and the numpy reference with the same rules."""
    vec = gym.make_vec(ENV_ID, num_envs=num_envs, autoreset_mode=mode, **rules)
    assert isinstance(vec, FruitCatcherVectorEnv)
    single_rules = {k: v for k, v in rules.items() if k != "max_episode_steps"}
    max_steps = rules.get("max_episode_steps")  # None: the registered 200
    ref = SyncVectorEnv(
        [lambda: gym.make(ENV_ID, max_episode_steps=max_steps, **single_rules)] * num_envs,
        autoreset_mode=mode,
    )
    return vec, ref


class EpisodeTracker:
    """Accumulates return, length, caught and missed per sub-env from reference rewards.

    At most one fruit reaches the bottom per step (fruits spawn one per step, all in row 0,
    and fall together, so no two share a row), hence reward is -1, 0 or +1 and
    caught / missed are the counts of +1 / -1 rewards.
    """

    def __init__(self, num_envs: int) -> None:
        self.r = np.zeros(num_envs)
        self.l = np.zeros(num_envs, dtype=np.int64)
        self.caught = np.zeros(num_envs, dtype=np.int64)
        self.missed = np.zeros(num_envs, dtype=np.int64)

    def add(self, reward: np.ndarray, stepped: np.ndarray) -> None:
        assert np.all(np.isin(reward, (-1.0, 0.0, 1.0)))
        self.r += np.where(stepped, reward, 0.0)
        self.l += stepped
        self.caught += stepped & (reward > 0)
        self.missed += stepped & (reward < 0)

    def clear(self, mask: np.ndarray) -> None:
        for arr in (self.r, self.l, self.caught, self.missed):
            arr[mask] = 0

    def check(self, info: dict[str, Any], ended: np.ndarray) -> None:
        assert np.array_equal(info["_episode"].numpy(), ended)
        episode = {k: v.numpy() for k, v in info["episode"].items()}
        for key, expected in (
            ("r", self.r),
            ("l", self.l),
            ("caught", self.caught),
            ("missed", self.missed),
        ):
            assert np.array_equal(episode[key][ended], expected[ended]), key


def assert_step_equal(vec_out: tuple[Any, ...], ref_out: tuple[Any, ...]) -> None:
    obs, reward, terminated, truncated, _ = vec_out
    r_obs, r_reward, r_terminated, r_truncated, _ = ref_out
    assert obs.dtype == (torch.float32 if r_obs.dtype == np.float32 else torch.uint8)
    assert np.array_equal(obs.numpy(), r_obs)
    assert np.array_equal(reward.numpy(), r_reward.astype(np.float32))
    assert np.array_equal(terminated.numpy(), r_terminated)
    assert np.array_equal(truncated.numpy(), r_truncated)


def run_and_compare(
    mode: AutoresetMode,
    rules: dict[str, Any],
    *,
    num_envs: int,
    steps: int,
    seed: int,
    reset_at: int | None = None,
    extra_reset_prob: float = 0.05,
) -> tuple[int, int]:
    """Run both envs with random actions and compare every output; returns the numbers of
    terminations and truncations seen (so callers can check the run exercised them).
    In DISABLED mode, ended sub-envs and (with `extra_reset_prob`) running ones are reset."""
    vec, ref = make_pair(num_envs, mode, rules)
    rand = np.random.default_rng(seed)
    obs, _ = vec.reset(seed=seed)
    r_obs, _ = ref.reset(seed=seed)
    assert np.array_equal(obs.numpy(), r_obs)
    episodes = EpisodeTracker(num_envs)
    pending = np.zeros(num_envs, dtype=bool)  # NEXT_STEP: sub-envs that restart this step
    n_terminated = n_truncated = 0
    for k in range(steps):
        if k == reset_at:  # a full reset without a seed continues every sub-env's stream
            obs, _ = vec.reset()
            r_obs, _ = ref.reset()
            assert np.array_equal(obs.numpy(), r_obs)
            episodes.clear(np.ones(num_envs, dtype=bool))
            pending[:] = False
        actions = rand.integers(0, 3, num_envs)
        vec_actions = torch.from_numpy(actions) if k % 2 else actions  # both input kinds
        vec_out = vec.step(vec_actions)
        ref_out = ref.step(actions)
        assert_step_equal(vec_out, ref_out)
        reward, terminated, truncated = ref_out[1], ref_out[2], ref_out[3]
        info, r_info = vec_out[4], ref_out[4]
        ended = terminated | truncated
        n_terminated += int(terminated.sum())
        n_truncated += int(truncated.sum())

        if mode == AutoresetMode.NEXT_STEP:
            episodes.clear(pending)
            episodes.add(reward, ~pending)
            episodes.check(info, ended)
            pending = ended
        elif mode == AutoresetMode.SAME_STEP:
            episodes.add(reward, np.ones(num_envs, dtype=bool))
            episodes.check(info, ended)
            episodes.clear(ended)
            r_mask = r_info.get("_final_obs", np.zeros(num_envs, dtype=bool))
            assert np.array_equal(r_mask, ended)
            assert np.array_equal(info["_final_obs"].numpy(), ended)
            final = info["final_obs"].numpy()
            for i in np.flatnonzero(ended):
                assert np.array_equal(final[i], r_info["final_obs"][i])
        else:
            episodes.add(reward, np.ones(num_envs, dtype=bool))
            episodes.check(info, ended)
            # Reset what ended plus a few running games; vary how seeds are given.
            mask = ended | (rand.random(num_envs) < extra_reset_prob)
            if mask.any():
                reset_seed: int | list[int | None] | None = [None, 1000 + k, None][k % 3]
                if k % 3 == 2:
                    reset_seed = [None if i % 2 else 5000 + k + i for i in range(num_envs)]
                obs, _ = vec.reset(seed=reset_seed, options={"reset_mask": mask})
                r_obs, _ = ref.reset(seed=reset_seed, options={"reset_mask": mask.copy()})
                assert np.array_equal(obs.numpy(), r_obs)
                episodes.clear(mask)
    vec.close()
    ref.close()
    return n_terminated, n_truncated


MODES = list(AutoresetMode)


@pytest.mark.parametrize("obs_mode", ["features", "pixels"])
@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_default_rules_match_reference(mode: AutoresetMode, obs_mode: str) -> None:
    """Default rules (200-step episodes): 4 sub-envs for 450 steps, with a full unseeded
    reset at step 230, match the numpy games exactly, truncation included."""
    _, truncations = run_and_compare(
        mode,
        {"obs_mode": obs_mode},
        num_envs=4,
        steps=450,
        seed=2024,
        reset_at=230,
        extra_reset_prob=0.0,
    )
    assert truncations > 0


@pytest.mark.parametrize("obs_mode", ["features", "pixels"])
@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_custom_rules_match_reference(mode: AutoresetMode, obs_mode: str) -> None:
    """Non-default rules (7 columns, 1-wide basket, 2..5 fruits, 13-step episodes) with many
    terminations and truncations match the numpy games exactly."""
    terminations, truncations = run_and_compare(
        mode, {**CUSTOM, "obs_mode": obs_mode}, num_envs=5, steps=300, seed=7, reset_at=150
    )
    assert terminations >= 10
    assert truncations >= 10


def rule_sets() -> st.SearchStrategy[dict[str, Any]]:
    """Random valid rules, small enough that episodes end often."""
    return shared_rule_sets(max_width=10, max_height=9, max_score=4, max_steps=25)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rules=rule_sets(),
    mode=st.sampled_from(MODES),
    num_envs=st.integers(1, 3),
    seed=st.integers(0, 2**63),
)
def test_random_rules_match_reference(
    rules: dict[str, Any], mode: AutoresetMode, num_envs: int, seed: int
) -> None:
    """For random valid rules, seeds and actions, the vector env matches the numpy games."""
    run_and_compare(mode, rules, num_envs=num_envs, steps=40, seed=seed, reset_at=20)
