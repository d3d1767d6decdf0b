"""No host sync inside a rollout or an update, counted on the CPU with the env built the way
the trainer builds it (`make_envs`: FruitCatcher's fast options).

A sync on a GPU stalls the pipeline until every queued kernel has run. The one device-to-host
copy an update makes on purpose, its metrics, is a plain `.cpu()` of one stacked tensor, which
reads no data on the host side of the dispatcher and is not counted here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.envs import make_envs
from grpo_trainer.tools.syncs import SyncCounter


def _trainer(**cfg: Any) -> GRPOTrainer:
    config = GRPOConfig(
        num_groups=4,
        group_size=4,
        hidden_sizes=(8,),
        **{"window": 4, "minibatch_size": 64, **cfg},
        run=RunConfig(progress=False, device="cpu"),
    )
    trainer = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
    # As on a GPU, where this counter's findings matter: on the CPU the update finds the rows
    # of weight 0 on the host on purpose, to skip their passes (tests/test_flat_rows.py).
    trainer.drop_flat_rows = False
    return trainer


@pytest.mark.parametrize(
    "cfg",
    [
        {"rollout_steps": 8, "epochs": 1},
        {"rollout_steps": 32, "epochs": 3, "minibatch_size": 32},  # more steps, more minibatches
        {"rollout_steps": 16, "restart_every": 1, "branch_every": 4},  # restarts and branches
        {"rollout_steps": 16, "kl_coef": 0.1, "micro_batches": 2, "scale": "group_std"},
        {"rollout_steps": 16, "anchor_samples": 64},  # four trust regions, each re-anchored
    ],
    ids=["short", "long", "branching", "kl", "trust regions"],
)
def test_an_update_makes_no_host_sync(cfg: dict[str, Any]) -> None:
    trainer = _trainer(**cfg)
    trainer.update()  # past the first update's set-up
    with SyncCounter() as syncs:
        rollout = trainer.collect()
    assert syncs.count == 0, syncs.calls
    with SyncCounter() as syncs:
        trainer.learn(rollout)
    assert syncs.count == 0, syncs.calls


def test_the_cpus_choice_to_drop_flat_rows_is_the_only_sync_it_adds() -> None:
    """The control of the setting above: on the CPU's own choice each minibatch's filter is
    counted (one boolean-mask index per optimiser step), and nothing else is."""
    trainer = _trainer(rollout_steps=8, epochs=1)
    trainer.update()
    trainer.drop_flat_rows = True
    rollout = trainer.collect()
    with SyncCounter() as syncs:
        trainer.learn(rollout)
    minibatches = 16 * 8 // 64  # sub-envs x rollout steps / minibatch size, one epoch
    assert syncs.calls == ["aten.index.Tensor"] * minibatches


def test_the_counter_sees_a_sync() -> None:
    """The control: an `.item()` in the loop would be counted."""
    with SyncCounter() as syncs:
        torch.ones(2).sum().item()
    assert syncs.count == 1
