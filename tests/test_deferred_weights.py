"""`deferred_weights="truncated"`: a row an earlier policy played weighs min(1, π/π_played)
in the loss; a row the current policy played weighs what it did."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.algorithm.optimizer_step import Samples
from grpo_trainer.envs import make_envs


def _samples(weights: list[float]) -> Samples:
    n = len(weights)
    zeros = torch.zeros(n)
    return Samples(zeros[:, None], zeros.long(), zeros, zeros, torch.tensor(weights), zeros + 1)


def test_each_weight_is_scaled_by_the_truncated_importance_weight() -> None:
    played = torch.tensor([-1.0, -1.0, -2.0, -0.5, -0.3])
    now = torch.tensor([-1.0, -1.0 - math.log(4.0), -0.5, -150.5, -0.3])
    out = _samples([1.0, 1.0, 1.0, 1.0, 0.0]).importance_weighted(now, played)
    # unchanged, a quarter as likely now, likelier now (capped at 1), all but given up, flat
    assert out.weights.tolist() == pytest.approx([1.0, 0.25, 1.0, 0.0, 0.0], abs=1e-7)
    assert out.weights[0].item() == 1.0  # a row played by this policy: exactly its weight
    assert out.weights[3].item() == 0.0  # underflows to 0: the CPU's passes leave it out
    assert out.rows_to_train(penalised=False).tolist() == [True, True, True, False, False]


def _trainer(deferred_weights: str) -> GRPOTrainer:
    config = GRPOConfig(
        num_groups=4,
        group_size=4,
        hidden_sizes=(16,),
        rollout_steps=8,
        window=16,  # every trained row waits two updates for its look-ahead
        epochs=2,
        minibatch_size=64,
        lr=0.05,  # large steps, so that the waiting rows' log-probs move
        deferred_weights=deferred_weights,  # type: ignore[arg-type]
        run=RunConfig(progress=False, device="cpu", compile=False, seed=3),
    )
    return GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)


def _learn_summing_weights(trainer: GRPOTrainer, rollout: Any) -> float:
    """`learn(rollout)`, returning the sum of the weights its loss calls were given."""
    total = [0.0]
    loss = trainer.loss

    def recording(*args: Any) -> Any:
        total[0] += float(args[4].double().sum())  # obs, actions, old_logp, adv, weights, ...
        return loss(*args)

    trainer.loss = recording  # type: ignore[assignment]
    trainer.learn(rollout)
    trainer.loss = loss  # type: ignore[assignment]
    return total[0]


def test_the_trainer_weighs_rows_an_earlier_policy_played_by_their_importance() -> None:
    plain, truncated = _trainer("none"), _trainer("truncated")
    for _ in range(2):  # no row that weighs anything was played by an earlier policy yet
        plain.update(), truncated.update()
    for a, b in zip(plain.policy.parameters(), truncated.policy.parameters(), strict=True):
        assert torch.equal(a, b)  # so the two took the same steps, bit for bit

    rollout, plain_rollout = truncated.collect(), plain.collect()
    assert rollout.earlier_policy_rows == rollout.obs.shape[0] == 8
    with torch.no_grad():  # what the update's start sees: the current policy, the stored one
        now = truncated.log_prob(rollout.obs.flatten(0, 1), rollout.actions.flatten(0, 1))
        weights = truncated.advantages(rollout).weights.flatten()
    factor = (now - rollout.logp.flatten()).clamp_max(0.0).exp()
    assert bool((factor[weights > 0] < 0.999).any())  # some rows' actions are now rarer

    plain_sum = _learn_summing_weights(plain, plain_rollout)
    truncated_sum = _learn_summing_weights(truncated, rollout)
    epochs = 2
    assert plain_sum == pytest.approx(epochs * float(weights.sum()), rel=1e-6)
    assert truncated_sum == pytest.approx(epochs * float((weights * factor).sum()), rel=1e-5)
    assert truncated_sum < plain_sum


def test_the_config_refuses_an_unknown_weighting() -> None:
    with pytest.raises(ValueError, match="deferred_weights must be one of"):
        GRPOConfig(deferred_weights="clipped")  # type: ignore[arg-type]
