"""Non-finite numbers: a skipped update changes nothing, is counted and warned about, and N in a
row stop training with the last good checkpoint intact. Fused and foreach AdamW alike."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig, TrainingStopped
from grpo_trainer.base import checkpoint

LENGTH = 4  # steps per episode
EPOCHS, MINIBATCHES = 1, 2


class PoisonBandit(gym.vector.VectorEnv):
    """Reward 1 for action 2, else 0, on random features; numpy I/O like Gymnasium's own envs.

    Rollouts number from 1 (one reset each); during those in `poison`, every reward (or
    observation) is NaN. Actions are random early on, so group members differ and a clean
    update has real gradients.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int, poison: Iterable[int] = (), what: str = "reward") -> None:
        self.num_envs = num_envs
        self.single_observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.single_action_space = gym.spaces.Discrete(3)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.poison, self.what = set(poison), what
        self.rollouts, self.t = 0, 0
        self.seeds = np.zeros(num_envs, dtype=np.int64)

    def reset(self, *, seed: Any = None, options: Any = None) -> tuple[np.ndarray, dict]:
        self.rollouts += 1
        self.t = 0
        seeds = seed if isinstance(seed, list) else [seed or 0] * self.num_envs
        self.seeds = np.asarray(seeds, dtype=np.int64)
        return self._obs(), {}

    def step(self, actions: Any) -> tuple[Any, ...]:
        self.t += 1
        obs = self._obs()
        reward = (np.asarray(actions) == 2).astype(np.float32)
        if self.rollouts in self.poison:
            (reward if self.what == "reward" else obs)[:] = np.nan
        done = np.full(self.num_envs, self.t >= LENGTH)
        return obs, reward, done, np.zeros(self.num_envs, dtype=bool), {}

    def _obs(self) -> np.ndarray:
        rows = [np.random.default_rng([s, self.t]).uniform(-1, 1, 3) for s in self.seeds]
        return np.asarray(rows, dtype=np.float32)


def make_trainer(
    poison: Iterable[int] = (),
    what: str = "reward",
    fused: bool = True,
    run_dir: Path | None = None,
    **run: Any,
) -> GRPOTrainer:
    config = GRPOConfig(
        num_groups=2,
        group_size=2,
        rollout="episodes",
        max_episode_steps=LENGTH,
        total_env_steps=10_000,
        epochs=EPOCHS,
        minibatch_size=4 * LENGTH // MINIBATCHES,
        hidden_sizes=(8,),
        entropy_coef=0.0,
        run=RunConfig(
            device="cpu",
            progress=False,
            compile=False,
            fused_optimizer=fused,
            run_dir=str(run_dir) if run_dir else None,
            **run,
        ),
    )
    trainer = GRPOTrainer(PoisonBandit(4, poison, what), config)
    assert trainer.optimizer_step.fused is fused
    return trainer


def snapshot(trainer: GRPOTrainer) -> tuple[dict, dict]:
    return copy.deepcopy(trainer.policy.state_dict()), copy.deepcopy(
        trainer.optimizer.state_dict()["state"]
    )


def same(a: Any, b: Any) -> bool:
    """Deep equality where tensors must match exactly (bit for bit, NaN never equal)."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
@pytest.mark.parametrize("what", ["reward", "obs"])
def test_skipped_update_changes_neither_weights_nor_optimizer_state(fused: bool, what: str) -> None:
    trainer = make_trainer(poison={2}, what=what, fused=fused)
    assert trainer.update()["skipped_steps"] == 0
    params, state = snapshot(trainer)

    poisoned = trainer.update()
    assert poisoned["skipped_steps"] == EPOCHS * MINIBATCHES
    assert math.isnan(poisoned["loss"])
    assert same(trainer.policy.state_dict(), params)
    assert same(trainer.optimizer.state_dict()["state"], state)  # incl. Adam's step count

    clean = trainer.update()  # the control: a clean update does move the weights
    assert clean["skipped_steps"] == 0
    assert not same(trainer.policy.state_dict(), params)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_nan_loss_with_finite_gradients_is_skipped(fused: bool) -> None:
    """A NaN added as a constant leaves the gradients finite: only the loss check sees it."""
    trainer = make_trainer(fused=fused)
    trainer.update()
    params, state = snapshot(trainer)
    loss_fn = trainer.loss

    def nan_loss(*args: torch.Tensor) -> Any:
        out = loss_fn(*args)
        return out._replace(loss=out.loss + math.nan)

    trainer.loss = nan_loss  # type: ignore[method-assign]
    metrics = trainer.update()
    assert metrics["skipped_steps"] == EPOCHS * MINIBATCHES
    assert math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert same(trainer.policy.state_dict(), params)
    assert same(trainer.optimizer.state_dict()["state"], state)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_consecutive_skips_stop_training_with_the_last_good_checkpoint(
    tmp_path: Path, fused: bool, caplog: pytest.LogCaptureFixture
) -> None:
    trainer = make_trainer(
        poison=range(3, 100),
        fused=fused,
        run_dir=tmp_path,
        checkpoint_every=1,
        max_consecutive_skips=3,
    )
    with (
        caplog.at_level(logging.WARNING, "grpo_trainer"),
        pytest.raises(TrainingStopped, match=r"3 updates in a row.*update-0000002\.pt"),
    ):
        trainer.train()

    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["update"], r["skipped_steps"]) for r in rows] == [
        (1, 0),
        (2, 0),
        (3, EPOCHS * MINIBATCHES),
        (4, EPOCHS * MINIBATCHES),
        (5, EPOCHS * MINIBATCHES),
    ]
    skipped_logs = [r for r in caplog.records if "non-finite loss or gradient" in r.message]
    assert [r.levelno for r in skipped_logs] == [logging.WARNING] * 3

    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.glob("update-*")) == [
        "update-0000001.pt",
        "update-0000002.pt",
    ]
    good, where = checkpoint.load_for_resume(tmp_path)
    assert (good["update_index"], where.name) == (2, "update-0000002.pt")
    assert same(good["policy"], trainer.policy.state_dict())  # skips changed nothing since

    resumed = make_trainer(fused=fused, resume=str(tmp_path))  # and it loads for a new run
    assert resumed.update_index == 2
    assert resumed.update()["skipped_steps"] == 0


def test_a_due_checkpoint_waits_for_a_clean_update(tmp_path: Path) -> None:
    """Update 2 is due (every 2) but skipped: its checkpoint is written after update 3."""
    trainer = make_trainer(poison={2, 4}, run_dir=tmp_path, checkpoint_every=2)
    trainer.config = dataclasses.replace(trainer.config, total_env_steps=5 * 4 * LENGTH)
    trainer.train()  # two isolated skips: below max_consecutive_skips, training goes on
    folder = tmp_path / "checkpoints"
    numbered = sorted(p.name for p in folder.glob("update-*"))
    assert numbered == ["update-0000003.pt", "update-0000005.pt"]  # 5: the final one
    for name in numbered:
        assert checkpoint.load(folder / name)["update_index"] == int(name[7:14])
