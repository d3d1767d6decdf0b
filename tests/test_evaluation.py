"""`grpo_trainer.run.evaluation`: whole-episode evaluation, loading policies, making envs."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.algorithm.policy import Policy
from grpo_trainer.base import checkpoint
from grpo_trainer.base.checkpoint import CheckpointError
from grpo_trainer.run.evaluation import evaluate, load_policy, make_envs

CPU = torch.device("cpu")
GAME_STEPS = 30  # short games keep evaluation quick


def _fruit(num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec("FruitCatcher-v0", num_envs=num_envs, max_episode_steps=GAME_STEPS)


def _policy(seed: int = 0) -> Policy:
    envs = _fruit(1)
    torch.manual_seed(seed)
    policy = Policy(envs.single_observation_space, envs.single_action_space, (16,))
    envs.close()
    return policy.eval()


def test_evaluate_counts_episodes_and_reports_env_figures() -> None:
    """8 episodes on 4 sub-envs (two rounds): every game runs to its 30-step limit, and the
    env's own figures agree with the returns (score = caught - missed)."""
    result = evaluate(_policy(), _fruit(4), 8)
    assert result["episodes"] == 8.0
    assert result["length_mean"] == GAME_STEPS
    assert result["episode_l"] == GAME_STEPS
    assert result["episode_r"] == pytest.approx(result["return_mean"])
    assert result["episode_caught"] - result["episode_missed"] == pytest.approx(
        result["return_mean"]
    )
    assert result["return_std"] >= 0.0
    # The ratio the env declares in its metadata: every game is counted, so it is the ratio
    # of the per-game means.
    caught, missed = result["episode_caught"], result["episode_missed"]
    assert caught + missed > 0
    assert result["catch_rate"] == pytest.approx(caught / (caught + missed))


def test_env_declared_ratios_are_reported_and_skipped_when_undefined() -> None:
    """A ratio over nothing is left out (games cut after 5 steps never end, so no episode
    is counted), and other ratios can be declared through the env's metadata."""
    assert "catch_rate" not in evaluate(_policy(), _fruit(2), 2, max_episode_steps=5)
    envs = _fruit(2)
    envs.metadata = {**envs.metadata, "episode_ratios": {"miss_rate": ("missed", "caught")}}
    result = evaluate(_policy(), envs, 2)
    caught, missed = result["episode_caught"], result["episode_missed"]
    assert result["miss_rate"] == pytest.approx(missed / (caught + missed))
    assert "catch_rate" not in result


def test_episode_fields_cover_the_same_episodes_as_the_returns() -> None:
    """With 5 episodes on 4 sub-envs, episode_r averages the same 5 games as return_mean."""
    result = evaluate(_policy(), _fruit(4), 5)
    assert result["episodes"] == 5.0
    assert result["episode_r"] == pytest.approx(result["return_mean"])


def test_greedy_evaluation_is_reproducible_and_seeded() -> None:
    """Greedy play with the same seed gives the same result; other seeds other games."""
    policy = _policy(1)
    a = evaluate(policy, _fruit(4), 8, seed=7)
    b = evaluate(policy, _fruit(4), 8, seed=7)
    assert a == b
    others = [evaluate(policy, _fruit(4), 8, seed=s)["return_mean"] for s in (8, 9, 10)]
    assert any(r != a["return_mean"] for r in others)


def test_sampled_evaluation_is_reproducible() -> None:
    """Sampled actions come from a seeded generator: the same seed gives the same result."""
    policy = _policy(2)
    a = evaluate(policy, _fruit(4), 4, greedy=False, seed=3)
    b = evaluate(policy, _fruit(4), 4, greedy=False, seed=3)
    assert a == b


def test_max_episode_steps_caps_the_games() -> None:
    """evaluate(max_episode_steps=n) stops every game after n steps."""
    result = evaluate(_policy(), _fruit(2), 2, max_episode_steps=5)
    assert result["length_mean"] == 5.0
    # Within 5 steps no fruit reaches the bottom row (it falls 14 rows): the score is 0.
    assert result["return_mean"] == 0.0


def test_no_finished_game_reports_no_episode_figures() -> None:
    """Games cut by max_episode_steps never ended: no env episode figures exist to average."""
    result = evaluate(_policy(), _fruit(2), 2, max_episode_steps=5)
    assert "episode_l" not in result or math.isnan(result["episode_l"]), result["episode_l"]


def test_evaluate_on_cartpole() -> None:
    """A numpy env (CartPole): returns equal lengths (+1 per step), within the 500 limit."""
    envs = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="vector_entry_point")
    torch.manual_seed(0)
    policy = Policy(envs.single_observation_space, envs.single_action_space, (8,)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # int-only seeding
        result = evaluate(policy, envs, 4)
    assert result["return_mean"] == pytest.approx(result["length_mean"])
    assert 1.0 <= result["length_mean"] <= 500.0
    assert set(result) == {"episodes", "return_mean", "return_std", "length_mean"}
    envs.close()


def _save_checkpoint(path: Path, hidden_sizes: tuple[int, ...] = (16,)) -> GRPOTrainer:
    cfg = GRPOConfig(
        num_groups=2,
        group_size=2,
        hidden_sizes=hidden_sizes,
        max_episode_steps=GAME_STEPS,
        run=RunConfig(progress=False, device="cpu", env_kwargs={"max_episode_steps": GAME_STEPS}),
    )
    envs = make_envs(cfg, cfg.num_envs, CPU)
    trainer = GRPOTrainer(envs, cfg)
    trainer.update()
    checkpoint.atomic_save(trainer.state_dict(), path)
    return trainer


def test_load_policy_restores_the_trained_weights(tmp_path: Path) -> None:
    """load_policy rebuilds the network from the checkpoint's config with the same weights."""
    path = tmp_path / "c.pt"
    trainer = _save_checkpoint(path)
    policy, config, payload = load_policy(path, CPU)
    assert config == trainer.config
    assert not policy.training
    for (name, a), b in zip(
        trainer.policy.state_dict().items(), policy.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    assert payload["update_index"] == 1
    # The loaded policy evaluates on the env its config describes.
    envs = make_envs(config, 2, CPU)
    assert evaluate(policy, envs, 2)["length_mean"] == GAME_STEPS


def test_load_policy_refuses_bad_files(tmp_path: Path) -> None:
    """A missing or corrupted checkpoint raises CheckpointError."""
    with pytest.raises(CheckpointError, match="does not exist"):
        load_policy(tmp_path / "missing.pt", CPU)
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError):
        load_policy(broken, CPU)


def test_make_envs_passes_device_and_names_unknown_envs() -> None:
    """make_envs builds the config's env (importing 'module:Id'), passing the device to envs
    that take one; an unknown env id is a ValueError naming it."""
    cfg = GRPOConfig(num_groups=1, group_size=2, run=RunConfig(env="fruit_env:FruitCatcher-v0"))
    envs = make_envs(cfg, 2, CPU)
    assert envs.num_envs == 2 and envs.unwrapped.device == CPU
    envs.close()
    cartpole = GRPOConfig(
        num_groups=1,
        group_size=2,
        run=RunConfig(env="CartPole-v1", env_kwargs={"vectorization_mode": "vector_entry_point"}),
    )
    envs = make_envs(cartpole, 2, CPU)  # CartPoleVectorEnv takes no device argument
    assert envs.num_envs == 2
    envs.close()
    bad = GRPOConfig(num_groups=1, group_size=2, run=RunConfig(env="NoSuchEnv-v9"))
    with pytest.raises(ValueError, match="NoSuchEnv-v9"):
        make_envs(bad, 2, CPU)
