"""Group resets (`EnvIO.reset_groups`) and rollouts (`RolloutBuffer`, `collect`).

Rollouts are checked against an independent replay: the same seeds and the recorded actions
stepped through a fresh env give the rewards and episode ends the buffer must hold.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.env_io import EnvIO
from grpo_trainer.policy import Policy
from grpo_trainer.rollout import RolloutBuffer, collect
from grpo_trainer.trainer import storage_dtype

CPU = torch.device("cpu")


def _fruit(num_envs: int, **kwargs: object) -> gym.vector.VectorEnv:
    return gym.make_vec("FruitCatcher-v0", num_envs=num_envs, **kwargs)


def _cartpole(num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="vector_entry_point")


# -- group resets ------------------------------------------------------------------------------


def test_reset_groups_gives_identical_starts_within_groups() -> None:
    """Members of a group start alike, groups differ, and equal actions keep members alike."""
    groups, size = 3, 4
    envs = _fruit(groups * size)
    io = EnvIO(envs, CPU)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FruitCatcher takes per-env seeds: no fallback warning
        obs = io.reset_groups([101, 202, 303], size)
    assert io.per_env_seeds is True
    grouped = obs.unflatten(0, (groups, size))
    assert torch.equal(grouped, grouped[:, :1].expand_as(grouped))
    firsts = grouped[:, 0]
    assert not torch.equal(firsts[0], firsts[1]) and not torch.equal(firsts[1], firsts[2])
    # A sub-env's game depends on its seed and actions only: same actions, same games.
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        per_group = torch.randint(0, 3, (groups,), generator=generator)
        step = io.step(per_group.repeat_interleave(size))
        grouped = step.obs.unflatten(0, (groups, size))
        assert torch.equal(grouped, grouped[:, :1].expand_as(grouped))
        rewards = step.reward.unflatten(0, (groups, size))
        assert torch.equal(rewards, rewards[:, :1].expand_as(rewards))
    envs.close()


def test_reset_groups_with_numpy_sync_vector_env() -> None:
    """A Gymnasium SyncVectorEnv (numpy, per-env seeds) also gets identical group starts."""
    envs = gym.make_vec("Pendulum-v1", num_envs=4, vectorization_mode="sync")
    io = EnvIO(envs, CPU)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        obs = io.reset_groups([5, 6], 2)
    assert isinstance(obs, torch.Tensor) and io.numpy_actions is True
    assert torch.equal(obs[0], obs[1]) and torch.equal(obs[2], obs[3])
    assert not torch.equal(obs[0], obs[2])
    envs.close()


def test_cartpole_falls_back_with_a_runtime_warning_once() -> None:
    """CartPoleVectorEnv.reset takes only an int seed: one RuntimeWarning, then silence."""
    envs = _cartpole(4)
    io = EnvIO(envs, CPU)
    with pytest.warns(RuntimeWarning, match="list of seeds"):
        obs = io.reset_groups([1, 2], 2)
    assert io.per_env_seeds is False
    assert obs.shape == (4, 4) and obs.dtype == torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = io.reset_groups([1, 2], 2)
    # The fallback seeds the whole vector env with the first group's seed: reproducible.
    assert torch.equal(obs, again)
    step = io.step(torch.ones(4, dtype=torch.long))
    assert step.obs.shape == (4, 4) and step.reward.tolist() == [1.0] * 4
    envs.close()


def test_env_io_rejects_a_single_env() -> None:
    """EnvIO needs a vector env; a plain gymnasium.Env is refused with ValueError."""
    env = gym.make("CartPole-v1")
    with pytest.raises(ValueError, match="VectorEnv"):
        EnvIO(env, CPU)  # type: ignore[arg-type]
    env.close()


# -- buffer layout -----------------------------------------------------------------------------


def _trainer(envs: gym.vector.VectorEnv, **cfg: object) -> GRPOTrainer:
    run = RunConfig(progress=False, device="cpu", seed=0)
    return GRPOTrainer(envs, GRPOConfig(num_groups=2, group_size=2, run=run, **cfg))  # type: ignore[arg-type]


def test_fruit_features_cost_at_most_32_bytes_per_step() -> None:
    """FruitCatcher features: float16 obs x 10 (20 B) + uint8 action (1) + float32 logp (4)
    + float32 reward (4) = 29 bytes per env-step."""
    trainer = _trainer(_fruit(4), max_episode_steps=8)
    buffer = trainer.buffer
    assert buffer.obs.dtype == torch.float16 and buffer.obs.shape[2:] == (10,)
    assert buffer.actions.dtype == torch.uint8
    assert buffer.bytes_per_step == 10 * 2 + 1 + 4 + 4
    assert buffer.bytes_per_step <= 32


def test_storage_dtype_follows_the_observation_space() -> None:
    """auto: uint8 images stay uint8, bounded floats go float16, unbounded floats float32."""
    pixels = _fruit(1, obs_mode="pixels").single_observation_space
    features = _fruit(1).single_observation_space
    cartpole = _cartpole(1).single_observation_space  # has infinite bounds
    assert storage_dtype(pixels, "auto") == torch.uint8
    assert storage_dtype(features, "auto") == torch.float16
    assert storage_dtype(cartpole, "auto") == torch.float32
    assert storage_dtype(features, "float32") == torch.float32
    assert storage_dtype(features, "bfloat16") == torch.bfloat16


def test_pixel_buffer_stores_uint8_frames() -> None:
    """Pixels: 1 x 15 x 20 uint8 (300 B) + action (1) + logp (4) + reward (4) = 309 B/step."""
    trainer = _trainer(_fruit(4, obs_mode="pixels"), max_episode_steps=8, hidden_sizes=(8,))
    assert trainer.buffer.obs.dtype == torch.uint8
    assert trainer.buffer.bytes_per_step == 1 * 15 * 20 + 1 + 4 + 4


# -- collect -----------------------------------------------------------------------------------


def _replay(
    seeds: list[int], actions: torch.Tensor, **env_kwargs: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw (reward, done) per step from a fresh env fed the recorded actions."""
    envs = _fruit(actions.shape[1], **env_kwargs)
    envs.reset(seed=seeds)
    rewards, dones = [], []
    for a in actions:
        _, reward, terminated, truncated, _ = envs.step(a.long())
        rewards.append(reward.float())
        dones.append(terminated | truncated)
    envs.close()
    return torch.stack(rewards), torch.stack(dones)


def _collect(
    num_groups: int, size: int, horizon: int, seed: int, **env_kwargs: object
) -> tuple[RolloutBuffer, list[int], object]:
    envs = _fruit(num_groups * size, **env_kwargs)
    io = EnvIO(envs, CPU)
    torch.manual_seed(seed)
    policy = Policy(io.observation_space, io.action_space, (16,))
    buffer = RolloutBuffer(horizon, io.num_envs, (10,), torch.float16, policy.head, CPU)
    group_seeds = [seed * 100 + g for g in range(num_groups)]
    obs = io.reset_groups(group_seeds, size)
    stats = collect(
        io, obs, policy.sample, policy.head, buffer, horizon, torch.Generator().manual_seed(seed)
    )
    envs.close()
    return buffer, [s for s in group_seeds for _ in range(size)], stats


def test_collect_masks_steps_after_an_episode_ends() -> None:
    """Lengths, valid masks and rewards match a replay; rewards after an end are zero."""
    horizon = 48
    # Scores of +-2 end games early, at different steps for different members.
    kwargs = {"win_score": 2, "lose_score": -2}
    buffer, seeds, stats = _collect(4, 4, horizon, seed=1, **kwargs)
    raw_reward, raw_done = _replay(seeds, buffer.actions, **kwargs)

    steps = torch.arange(horizon)[:, None]
    first_done = torch.where(raw_done, steps, horizon).min(0).values
    expected_lengths = torch.clamp(first_done + 1, max=horizon)
    assert torch.equal(buffer.lengths, expected_lengths)
    valid = buffer.valid(horizon)
    assert torch.equal(valid, steps < expected_lengths[None, :])
    assert torch.equal(buffer.rewards, torch.where(valid, raw_reward, 0.0))
    assert torch.equal(stats.finished, first_done < horizon)

    # The scenario exercises what it claims: episodes end at different times, and the env
    # (auto-reset into a new game) paid rewards after some ends, which the buffer dropped.
    assert len(set(buffer.lengths.tolist())) > 1 and bool(stats.finished.any())
    assert bool((raw_reward[~valid] != 0).any())
    assert torch.count_nonzero(buffer.rewards[~valid]) == 0


def test_collect_stores_what_the_policy_saw_and_did() -> None:
    """Stored logp is the policy's log-prob of the stored action on the stored observation."""
    buffer, _, _ = _collect(2, 2, 16, seed=2)
    torch.manual_seed(2)
    policy = Policy(_fruit(1).single_observation_space, gym.spaces.Discrete(3), (16,))
    logp, _ = policy.log_prob_entropy(buffer.obs.flatten(0, 1), buffer.actions.flatten(0, 1))
    torch.testing.assert_close(buffer.logp.flatten(), logp.detach())


def test_episode_info_is_averaged_over_finished_episodes() -> None:
    """info['episode'] fields are summed over episodes that ended inside the horizon."""
    buffer, _, stats = _collect(4, 4, 48, seed=3, win_score=2, lose_score=-2)
    finished = stats.finished
    count = int(finished.sum())
    assert count > 0
    assert {"r", "l", "caught", "missed"} <= set(stats.info_sums)
    assert int(stats.info_counts["r"]) == count
    # FruitCatcher's episode return "r" is the score: the sum of the episode's rewards.
    returns = buffer.rewards.sum(0)
    assert stats.info_sums["r"].item() == pytest.approx(returns[finished].sum().item())
    assert stats.info_sums["l"].item() == buffer.lengths[finished].sum().item()


def test_env_truncation_shorter_than_the_horizon() -> None:
    """An env limit of 7 steps inside a 12-step horizon: every length is 7, later rewards 0."""
    buffer, _, stats = _collect(2, 2, 12, seed=4, max_episode_steps=7)
    assert buffer.lengths.tolist() == [7] * 4
    assert bool(stats.finished.all())
    assert torch.count_nonzero(buffer.rewards[7:]) == 0


def test_trainer_horizon_cuts_long_episodes() -> None:
    """A config horizon shorter than the env limit: every member plays exactly that many steps."""
    trainer = _trainer(_fruit(4), max_episode_steps=10)
    metrics = trainer.update()
    assert trainer.buffer.lengths.tolist() == [10] * 4
    assert metrics["frac_finished"] == 0.0
    assert metrics["length_mean"] == 10.0
    assert metrics["valid_steps"] == 40.0 and trainer.env_steps == 40


def test_trainer_shortens_the_horizon_when_every_episode_ends_early() -> None:
    """When all episodes finished, the next horizon is ceil16(1.25 * longest + 8) (at least 16)."""
    trainer = _trainer(_fruit(4, max_episode_steps=20), max_episode_steps=100)
    first = trainer.update()
    assert first["horizon"] == 100 and first["frac_finished"] == 1.0
    assert first["length_max"] == 20.0
    # 1.25 * 20 + 8 = 33 -> rounded up to a multiple of 16: 48.
    assert trainer.horizon == 48
    second = trainer.update()
    assert second["horizon"] == 48 and second["simulated_steps"] == 48 * 4
    assert trainer.buffer.lengths.tolist() == [20] * 4


def test_reset_groups_passes_each_member_its_group_seed() -> None:
    """reset_groups hands each member its group's seed (checked through a recording env)."""
    seen: list[object] = []

    class Recording(gym.vector.VectorWrapper):
        def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
            seen.append(seed)
            return super().reset(seed=seed, options=options)

    envs = Recording(_fruit(6))
    EnvIO(envs, CPU).reset_groups([7, 8, 9], 2)
    assert seen == [[7, 7, 8, 8, 9, 9]]
