"""`final_temperature`: the last half of a run samples and learns at a falling temperature,
the greedy action and the checkpoint stay as they were, and only discrete heads take it."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.algorithm.policy import make_head
from grpo_trainer.base.schedules import temperature_at
from grpo_trainer.envs import make_envs

NUM_ENVS, ROLLOUT = 16, 16
STEPS_PER_UPDATE = NUM_ENVS * ROLLOUT


def _trainer(final_temperature: float, updates: int) -> GRPOTrainer:
    cfg = GRPOConfig(
        num_groups=4,
        group_size=4,
        rollout_steps=ROLLOUT,
        window=ROLLOUT,  # no row waits: every trained row was sampled in this update
        minibatch_size=128,
        hidden_sizes=(16,),
        total_env_steps=updates * STEPS_PER_UPDATE,
        final_temperature=final_temperature,
        run=RunConfig(progress=False, device="cpu", eval_every=0),
    )
    return GRPOTrainer(make_envs(cfg, cfg.num_envs, torch.device("cpu")), cfg)


def test_temperature_schedule_holds_one_then_falls_linearly() -> None:
    assert temperature_at(0.0, 0.25) == 1.0
    assert temperature_at(0.5, 0.25) == 1.0
    assert temperature_at(0.75, 0.25) == pytest.approx(0.625)
    assert temperature_at(1.0, 0.25) == pytest.approx(0.25)
    assert temperature_at(1.2, 0.25) == pytest.approx(0.25)  # the last update may overshoot
    assert temperature_at(0.9, 1.0) == 1.0


def test_late_updates_sample_and_score_at_the_scheduled_temperature() -> None:
    """At 3/4 of the budget the rollout's fresh actions are drawn from softmax(logits / T),
    T = temperature_at(3/4): their stored log-probs are those of the tempered distribution,
    and the loss's anchor scores them alike (the ratio starts at 1)."""
    trainer = _trainer(0.25, updates=4)
    for _ in range(3):
        trainer.update()
    rollout = trainer.collect()
    fresh = slice(rollout.earlier_policy_rows, None)  # rows this update's policy sampled
    obs, actions = rollout.obs[fresh].flatten(0, 1), rollout.actions[fresh].flatten(0, 1)
    stored = rollout.logp[fresh].flatten()
    with torch.no_grad():
        logits = trainer.policy(obs)
    index = actions.long()[:, None]
    tempered = torch.log_softmax(logits / temperature_at(3 / 4, 0.25), -1).gather(-1, index)
    torch.testing.assert_close(stored, tempered.squeeze(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(trainer.log_prob(obs, actions), stored, rtol=1e-5, atol=1e-5)
    plain = torch.log_softmax(logits, -1).gather(-1, index).squeeze(-1)
    assert not torch.allclose(stored, plain, atol=1e-3)


def test_temperature_changes_neither_the_greedy_action_nor_the_checkpoint() -> None:
    head = make_head(gym.spaces.Discrete(3))
    logits = torch.randn(64, 3)
    greedy = head.greedy(logits)
    head.set_temperature(0.1)
    assert torch.equal(head.greedy(logits), greedy)
    _, entropy = head.log_prob_entropy(logits, greedy)
    _, entropy_at_one = make_head(gym.spaces.Discrete(3)).log_prob_entropy(logits, greedy)
    assert (entropy < entropy_at_one).all()  # sharper, toward the greedy action
    assert "inv_temperature" not in head.state_dict()


def test_a_trained_policy_plays_at_temperature_one_once_loaded() -> None:
    trainer = _trainer(0.25, updates=4)
    trainer.train()
    last = temperature_at(3 / 4, 0.25)  # the last update starts at 3/4 of the budget
    assert float(trainer.policy.head.inv_temperature) == pytest.approx(1 / last)
    fresh = _trainer(1.0, updates=2)
    fresh.policy.load_state_dict(trainer.policy.state_dict())
    assert float(fresh.policy.head.inv_temperature) == 1.0


def test_box_actions_refuse_a_final_temperature() -> None:
    envs = gym.make_vec("Pendulum-v1", num_envs=8, vectorization_mode="sync")
    cfg = GRPOConfig(
        num_groups=2,
        group_size=4,
        window=4,
        final_temperature=0.5,
        run=RunConfig(progress=False, device="cpu"),
    )
    with pytest.raises(ValueError, match="final_temperature applies to discrete actions"):
        GRPOTrainer(envs, cfg)
