"""Advantages of a rollout's samples: each sample's return, compared with its group's at the
same row (`advantages.group_relative`). What the return is depends on `advantage`: one
estimator per setting, chosen once (`make_estimator`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from grpo_trainer.algorithm.advantages import (
    Advantages,
    episode_returns,
    group_relative,
    windowed_returns,
)
from grpo_trainer.algorithm.rollout import Rollout
from grpo_trainer.base.config import GRPOConfig

SumOverRanks = Callable[[torch.Tensor], torch.Tensor]


class GroupRelative:
    """Returns compared within each group; subclasses say what a return is."""

    def __init__(self, config: GRPOConfig, sum_over_ranks: SumOverRanks) -> None:
        self.group_size, self.scale = config.group_size, config.scale
        self.zero_std_eps, self.sum_over_ranks = config.zero_std_eps, sum_over_ranks

    def __call__(self, rollout: Rollout) -> Advantages:
        trained = rollout.valid[: rollout.obs.shape[0]]
        returns, compare = self.returns(rollout, trained)
        return group_relative(
            returns,
            compare,
            trained,
            self.group_size,
            scale=self.scale,
            zero_std_eps=self.zero_std_eps,
            sum_over_ranks=self.sum_over_ranks,
        )

    def returns(self, rollout: Rollout, trained: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(T, B)` returns of the trained rows, and which members each is compared with."""
        raise NotImplementedError


class StepReturns(GroupRelative):
    """`advantage="per_step"`: each step's discounted return over the rollout's window,
    compared with the members of its group still playing at the same row."""

    def __init__(self, config: GRPOConfig, sum_over_ranks: SumOverRanks) -> None:
        super().__init__(config, sum_over_ranks)
        self.gamma = config.gamma

    def returns(self, rollout: Rollout, trained: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = trained.shape[0]
        returns = windowed_returns(
            rollout.rewards, rollout.cut, rows=rows, window=rollout.window, gamma=self.gamma
        )
        return returns, trained


class OutcomeReturns(GroupRelative):
    """`advantage="outcome"`: every step of a member's episode gets the episode's return,
    compared with every member's."""

    def returns(self, rollout: Rollout, trained: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        returns = episode_returns(rollout.rewards, rollout.valid).expand_as(trained)
        return returns, torch.ones_like(trained)


def make_estimator(config: GRPOConfig, sum_over_ranks: SumOverRanks) -> GroupRelative:
    if config.advantage == "outcome":
        return OutcomeReturns(config, sum_over_ranks)
    return StepReturns(config, sum_over_ranks)
