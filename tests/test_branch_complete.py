"""`branch_complete`: before the groups branch, the path each member is about to leave plays
`window - 1` more steps as inference only, and their discounted return completes the rows
before the branch. Checked against a twin run that does not branch at all and plays the
same steps for real: the completion must be exactly what that path brought."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import pytest
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig

WINDOW, BRANCH_EVERY = 16, 8


def _trainer(**cfg: Any) -> GRPOTrainer:
    envs = gym.make_vec("FruitCatcher-v0", num_envs=8, validate_actions=False)
    run = RunConfig(progress=False, device="cpu", seed=3)
    config = GRPOConfig(
        num_groups=4,
        group_size=2,
        rollout_steps=32,
        window=WINDOW,
        restart_every=BRANCH_EVERY,
        hidden_sizes=(16,),
        obs_storage="float32",
        run=run,
        **cfg,
    )
    return GRPOTrainer(envs, config)


def test_the_completion_is_what_the_path_left_behind_brings() -> None:
    # Neither run draws anything between the steps (no ended members: Fruit Catcher's games
    # last 200 steps), so the twin's steps after the branch row use the same random numbers,
    # env and policy as the completion did.
    completed = _trainer(branch_every=BRANCH_EVERY, branch_complete=True, branch_ended=False)
    twin = _trainer(branch_every=0, branch_ended=False)
    a, b = completed.collect(), twin.collect()
    first = WINDOW - 1  # the first collect's rows start after the (empty) look-ahead rows
    branch = first + BRANCH_EVERY - 1  # the row after which every group branches
    assert torch.equal(a.obs[: branch + 1], b.obs[: branch + 1])
    assert torch.equal(a.actions[: branch + 1], b.actions[: branch + 1])
    assert bool(a.cut[branch].all()) and not bool(b.cut[branch].any())
    gamma = completed.config.gamma
    future = b.rewards[branch + 1 : branch + WINDOW]
    discounts = gamma ** torch.arange(1, WINDOW, dtype=torch.float64)
    expected = b.rewards[branch].double() + (discounts[:, None] * future.double()).sum(0)
    assert torch.allclose(a.rewards[branch].double(), expected, atol=1e-5)
    assert bool((future != 0).any())  # the paths brought something: the check can fail
    assert torch.equal(a.rewards[:branch], b.rewards[:branch])


@pytest.mark.parametrize("branch_every", [0, 12])
def test_branch_complete_needs_branches_at_restart_checks(branch_every: int) -> None:
    with pytest.raises(ValueError, match="branch_complete needs branch_every > 0, a multiple"):
        GRPOConfig(branch_complete=True, branch_every=branch_every, restart_every=8)
    GRPOConfig(branch_complete=True, branch_every=16, restart_every=8)
