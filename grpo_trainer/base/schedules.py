"""Schedules over the env-step budget: the learning rate, the sampling temperature."""

from __future__ import annotations

import math

LR_FLOOR = 0.02  # linear and cosine schedules end at this fraction of `lr`, not at zero


def lr_factor(progress: float, schedule: str) -> float:
    """Learning-rate multiplier at `progress` in [0, 1] of the env-step budget. No warm-up:
    one did not help (docs/trainer.md, "Flags decided by measurement")."""
    rest = min(max(progress, 0.0), 1.0)
    if schedule == "linear":
        return max(1.0 - rest, LR_FLOOR)
    if schedule == "cosine":
        return max(0.5 * (1.0 + math.cos(math.pi * rest)), LR_FLOOR)
    return 1.0


TEMPERATURE_FROM = 0.5  # the temperature stays 1 until this fraction of the budget


def temperature_at(progress: float, final: float) -> float:
    """The sampling temperature at `progress` in [0, 1] of the budget: 1 until
    `TEMPERATURE_FROM`, then linear to `final` at the end. The sharper the last updates play,
    the closer the policy they train is to the greedy one users evaluate (docs/trainer.md,
    "Freeway's greedy policy")."""
    rest = min(max((progress - TEMPERATURE_FROM) / (1.0 - TEMPERATURE_FROM), 0.0), 1.0)
    return 1.0 + (final - 1.0) * rest
