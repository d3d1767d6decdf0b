"""Learning-rate schedules over the env-step budget."""

from __future__ import annotations

import math

LR_FLOOR = 0.02  # linear and cosine schedules end at this fraction of `lr`, not at zero
WARMUP_FLOOR = 1e-3  # the first update of a warm-up already moves, at this fraction of `lr`


def lr_factor(progress: float, schedule: str, warmup: float) -> float:
    """Learning-rate multiplier at `progress` in [0, 1] of the env-step budget."""
    if warmup > 0 and progress < warmup:
        return max(progress / warmup, WARMUP_FLOOR)
    rest = min(max((progress - warmup) / max(1.0 - warmup, 1e-8), 0.0), 1.0)
    if schedule == "linear":
        return max(1.0 - rest, LR_FLOOR)
    if schedule == "cosine":
        return max(0.5 * (1.0 + math.cos(math.pi * rest)), LR_FLOOR)
    return 1.0
