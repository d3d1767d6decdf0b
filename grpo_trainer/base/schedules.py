"""Learning-rate schedules over the env-step budget."""

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
