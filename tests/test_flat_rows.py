"""Rows of weight 0 (group steps without spread) are left out of the CPU's optimiser passes:
the same steps on the same minibatches, fewer rows through the network."""

from __future__ import annotations

from typing import Any

import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.envs import make_envs


def _trainer(device: str = "cpu", window: int = 4) -> GRPOTrainer:
    config = GRPOConfig(
        num_groups=4,
        group_size=4,
        hidden_sizes=(16,),
        rollout_steps=16,
        window=window,
        epochs=2,
        minibatch_size=64,
        run=RunConfig(progress=False, device=device, compile=False, seed=1),
    )
    return GRPOTrainer(make_envs(config, config.num_envs, torch.device(device)), config)


def _learn_recording_rows(trainer: GRPOTrainer) -> tuple[dict[str, float], list[torch.Tensor]]:
    """One update, after one to warm up; the weights of every row the loss was given."""
    trainer.update()
    weights: list[torch.Tensor] = []
    loss = trainer.loss

    def recording(*args: Any) -> Any:
        weights.append(args[4].clone())  # obs, actions, old_logp, advantages, weights, ...
        return loss(*args)

    trainer.loss = recording  # type: ignore[assignment]
    return trainer.update(), weights


def test_the_cpu_trains_only_rows_that_weigh_something_and_takes_the_same_step() -> None:
    every, dropping = _trainer(), _trainer()
    assert dropping.drop_flat_rows is True  # the CPU's choice
    every.drop_flat_rows = False
    kept_metrics, kept = _learn_recording_rows(every)
    dropped_metrics, dropped = _learn_recording_rows(dropping)

    # The same optimiser steps, each given exactly its minibatch's rows of weight > 0.
    assert len(dropped) == len(kept) == 2 * 4  # epochs x minibatches
    assert [len(w) for w in kept] == [64] * 8
    assert [len(w) for w in dropped] == [int((w > 0).sum()) for w in kept]
    assert all(bool((w > 0).all()) for w in dropped)
    assert sum(len(w) for w in dropped) < sum(len(w) for w in kept)  # some rows had no spread

    # Rows of weight 0 add exact zeros: the step and the metrics differ by rounding only.
    for a, b in zip(every.policy.parameters(), dropping.policy.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for name in ("loss", "policy_loss", "entropy", "clip_fraction", "grad_norm"):
        assert abs(kept_metrics[name] - dropped_metrics[name]) <= 1e-5 * (
            1 + abs(kept_metrics[name])
        ), name


def test_an_update_with_no_row_that_weighs_something_takes_its_steps_on_nothing() -> None:
    """A window of 64 steps has no complete look-ahead after one 16-step rollout, so no row
    weighs anything: the update runs its steps on empty minibatches, and they leave the
    policy exactly where steps on rows of weight 0 leave it."""
    every, dropping = _trainer(window=64), _trainer(window=64)
    every.drop_flat_rows = False
    rows: list[int] = []
    loss = dropping.loss
    dropping.loss = lambda *args: (rows.append(len(args[0])), loss(*args))[1]  # type: ignore
    kept, dropped = every.update(), dropping.update()
    assert rows and set(rows) == {0}
    assert kept["loss"] == dropped["loss"] == 0.0 and dropped["skipped_steps"] == 0
    for a, b in zip(every.policy.parameters(), dropping.policy.parameters(), strict=True):
        assert torch.equal(a, b)


def test_off_the_cpu_every_row_is_kept() -> None:
    """On a GPU finding the rows would read a count on the host: there the shapes stay fixed
    (the meta device stands in for it)."""
    assert _trainer("meta").drop_flat_rows is False


def test_rows_of_weight_0_stay_where_the_bound_penalty_is_on() -> None:
    """The bound penalty counts on every valid row (its weight is `valid`): where it is on,
    a valid row of weight 0 stays in the passes; an invalid one, and every row of weight 0
    where it is off, are left out. Non-finite rows stay either way."""
    from grpo_trainer.algorithm.optimizer_step import Samples

    weights = torch.tensor([1.0, 0.0, 0.0, 0.0])
    valid = torch.tensor([1.0, 1.0, 0.0, 0.0])
    advantages = torch.tensor([0.5, 0.0, 0.0, float("nan")])
    part = Samples(torch.zeros(4, 3), torch.zeros(4), torch.zeros(4), advantages, weights, valid)
    assert part.rows_to_train(penalised=False).tolist() == [True, False, False, True]
    assert part.rows_to_train(penalised=True).tolist() == [True, True, False, True]


def test_a_bounded_gaussian_head_keeps_its_valid_rows_and_a_discrete_one_does_not() -> None:
    import gymnasium as gym

    envs = gym.make_vec("Pendulum-v1", num_envs=8, vectorization_mode="sync")
    run = RunConfig(progress=False, device="cpu", compile=False)
    for coef, penalised in ((1.0, True), (0.0, False)):
        cfg = GRPOConfig(num_groups=2, group_size=4, window=4, mean_bound_coef=coef, run=run)
        assert GRPOTrainer(envs, cfg).penalised is penalised
    envs.close()
    assert _trainer().penalised is False  # FruitCatcher's actions are discrete
