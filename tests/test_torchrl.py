"""TorchRL's GymWrapper drives the torch vector env: DISABLED autoreset with TorchRL's own
resets, and SAME_STEP through `fruit_env.interop.torchrl.FlatEpisodeInfo`."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("torchrl")

from tensordict.nn import TensorDictModule
from torchrl.data import Categorical
from torchrl.envs import GymWrapper
from torchrl.envs.utils import check_env_specs

from fruit_env import FruitCatcherVectorEnv
from fruit_env.cli import chase_policy

# A small, busy board: fruit lands every few steps, so rewards are not all zero.
RULES = {"width": 7, "height": 6, "max_fruits": 5, "min_fruits": 2, "min_spawn_gap": 1}
N = 4


def fruit_env(**kwargs: Any) -> FruitCatcherVectorEnv:
    return FruitCatcherVectorEnv(
        N, autoreset_mode="DISABLED", max_episode_steps=5, **RULES, **kwargs
    )


def test_specs_follow_the_env_and_pass_torchrl_checks() -> None:
    env = GymWrapper(fruit_env(), categorical_action_encoding=True)
    assert env.batch_size == torch.Size([N])
    assert isinstance(env.action_spec, Categorical) and env.action_spec.space.n == 3
    assert env.observation_spec["observation"].shape == torch.Size([N, 16])
    assert env.observation_spec["observation"].dtype == torch.float32
    check_env_specs(env)


def test_rollout_equals_driving_the_env_by_hand() -> None:
    """Same seed, same chase policy: TorchRL's rollout and resets match a manual DISABLED loop."""
    steps = 12
    env = GymWrapper(fruit_env(), categorical_action_encoding=True)
    policy = TensorDictModule(chase_policy, in_keys=["observation"], out_keys=["action"])
    start = env.reset(seed=5)
    rollout = env.rollout(
        steps, policy, auto_reset=False, tensordict=start, break_when_any_done=False
    )
    assert rollout.batch_size == torch.Size([N, steps])

    ref = fruit_env()
    obs, _ = ref.reset(seed=5)
    for t in range(steps):
        torch.testing.assert_close(rollout["observation"][:, t], obs, rtol=0, atol=0)
        action = chase_policy(obs)
        assert torch.equal(rollout["action"][:, t], action)
        obs, reward, terminated, truncated, _ = ref.step(action)
        nxt = rollout["next"]
        torch.testing.assert_close(nxt["observation"][:, t], obs, rtol=0, atol=0)
        assert torch.equal(nxt["reward"][:, t, 0], reward)
        assert torch.equal(nxt["terminated"][:, t, 0], terminated)
        assert torch.equal(nxt["truncated"][:, t, 0], truncated)
        done = terminated | truncated
        if done.any():  # TorchRL resets exactly these sub-envs through options["reset_mask"]
            obs, _ = ref.reset(options={"reset_mask": done})
    assert rollout["next", "done"].sum() == 2 * N  # two 5-step episodes per sub-env ended
    assert rollout["next", "reward"].abs().sum() > 0


def test_same_step_runs_with_flat_episode_info() -> None:
    """SAME_STEP through `FlatEpisodeInfo`: TorchRL's rollout equals the env driven by hand.
    An ended step's `("next", "observation")` is the episode's last observation (the env's
    `final_obs`), the next step starts from the env's own reset observation, and the episode
    statistics arrive under flat keys, those of the ended episode on an ended step. (When
    every sub-env ends on the same step, TorchRL resets the env itself instead; the games
    here end at different steps, checked below.)"""
    from fruit_env.interop.torchrl import FlatEpisodeInfo

    def same_step() -> FruitCatcherVectorEnv:
        rules = {**RULES, "win_score": 2, "lose_score": -2, "max_episode_steps": 9}
        return FruitCatcherVectorEnv(N, autoreset_mode="SAME_STEP", **rules)

    steps = 30
    env = GymWrapper(FlatEpisodeInfo(same_step()), categorical_action_encoding=True)
    policy = TensorDictModule(chase_policy, in_keys=["observation"], out_keys=["action"])
    start = env.reset(seed=5)
    rollout = env.rollout(
        steps, policy, auto_reset=False, tensordict=start, break_when_any_done=False
    )
    ref = same_step()
    obs, _ = ref.reset(seed=5)
    nxt = rollout["next"]
    ends = 0
    for t in range(steps):
        assert torch.equal(rollout["observation"][:, t], obs)
        action = chase_policy(obs)
        assert torch.equal(rollout["action"][:, t], action)
        obs, reward, terminated, truncated, info = ref.step(action)
        ended = info["_episode"]
        assert not ended.all()  # the precondition above
        ends += int(ended.sum())
        last = torch.where(ended[:, None], info["final_obs"], obs)
        assert torch.equal(nxt["observation"][:, t], last)
        assert torch.equal(nxt["reward"][:, t, 0], reward)
        assert torch.equal(nxt["done"][:, t, 0], terminated | truncated)
        for name, value in info["episode"].items():
            assert torch.equal(nxt[f"episode_{name}"][:, t], value)
    assert ends >= N
