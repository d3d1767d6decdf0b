"""How much of a run's budget is spent, and the learning-rate schedules that follow it."""

from __future__ import annotations

import math

from grpo_trainer.base.config import GRPOConfig

LR_FLOOR = 0.02  # linear and cosine schedules end at this fraction of `lr`, not at zero


def budget_spent(config: GRPOConfig, env_steps: int, train_s: float) -> float:
    """The share of a run's budget spent: of its env steps or, with a time budget, of its
    seconds, whichever is further along. A run cut by its clock then ends with its learning
    rate annealed, as one that ends at its env steps does (docs/trainer.md, "A time
    budget"); training ends at 1."""
    spent = env_steps / config.total_env_steps
    budget_s = config.time_budget_s
    return spent if budget_s is None else max(spent, train_s / budget_s)


def lr_factor(progress: float, schedule: str) -> float:
    """Learning-rate multiplier at `progress` in [0, 1] of the budget (`budget_spent`). No
    warm-up: one did not help (docs/trainer.md, "Flags decided by measurement")."""
    rest = min(max(progress, 0.0), 1.0)
    if schedule == "linear":
        return max(1.0 - rest, LR_FLOOR)
    if schedule == "cosine":
        return max(0.5 * (1.0 + math.cos(math.pi * rest)), LR_FLOOR)
    return 1.0
