"""Game parameters: every rule of Fruit Catcher as one validated, immutable value, and how a
step's 32 random bits decide what spawns (shared by every form of the rules, as the hash is).

The parameters are plain Python numbers, so the compiled step has them as constants instead
of reading them from tensors (one compiled package per set of rules).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TypeVar

OBS_MODES = ("features", "pixels")
# Pixel values of the image observation (and of the rendered grid).
FRUIT_PIXEL = 255
BASKET_PIXEL = 128
_INT32_LIMIT = 2**31

T = TypeVar("T")  # a Python int, a numpy integer array or an int64 tensor


@dataclasses.dataclass(frozen=True)
class FruitParams:
    """The rules of one Fruit Catcher game (the defaults are the game docs/env.md describes)."""

    width: int = 20
    height: int = 15
    basket_width: int = 3
    max_fruits: int = 3
    min_fruits: int = 1
    spawn_prob: float = 0.5
    min_spawn_gap: int = 5
    win_score: int = 30
    lose_score: int = -30
    max_episode_steps: int = 200
    obs_mode: str = "features"

    def __post_init__(self) -> None:
        for name in (
            "width",
            "height",
            "basket_width",
            "max_fruits",
            "min_fruits",
            "min_spawn_gap",
            "win_score",
            "lose_score",
            "max_episode_steps",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
            if not -_INT32_LIMIT < value < _INT32_LIMIT:  # the state is int32
                raise ValueError(f"{name} must be within ±{_INT32_LIMIT - 1}, got {value}")
        _require(self.width >= 2, "width", self.width, "at least 2")
        _require(self.height >= 2, "height", self.height, "at least 2")
        _require(
            1 <= self.basket_width <= self.width,
            "basket_width",
            self.basket_width,
            f"between 1 and width={self.width}",
        )
        _require(self.max_fruits >= 1, "max_fruits", self.max_fruits, "at least 1")
        _require(
            1 <= self.min_fruits <= self.max_fruits,
            "min_fruits",
            self.min_fruits,
            f"between 1 and max_fruits={self.max_fruits}",
        )
        if isinstance(self.spawn_prob, bool) or not isinstance(self.spawn_prob, (int, float)):
            raise ValueError(f"spawn_prob must be a number, got {self.spawn_prob!r}")
        _require(
            math.isfinite(self.spawn_prob) and 0.0 <= self.spawn_prob <= 1.0,
            "spawn_prob",
            self.spawn_prob,
            "in [0, 1]",
        )
        _require(self.min_spawn_gap >= 0, "min_spawn_gap", self.min_spawn_gap, "at least 0")
        _require(self.win_score >= 1, "win_score", self.win_score, "at least 1")
        _require(self.lose_score <= -1, "lose_score", self.lose_score, "at most -1")
        _require(
            self.max_episode_steps >= 1, "max_episode_steps", self.max_episode_steps, "at least 1"
        )
        _require(self.obs_mode in OBS_MODES, "obs_mode", self.obs_mode, f"one of {OBS_MODES}")

    @property
    def obs_size(self) -> int:
        """Length of the feature observation: basket, then (x, y, active) per fruit slot."""
        return 1 + 3 * self.max_fruits

    @property
    def max_basket_x(self) -> int:
        """Largest left edge the basket can have."""
        return self.width - self.basket_width

    @property
    def spawn_threshold(self) -> int:
        """`spawn_prob` as a 16-bit integer threshold: spawn when a 16-bit draw is below it."""
        return round(self.spawn_prob * 65536)


def _require(ok: bool, name: str, value: object, expected: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def spawn_bits(bits: T) -> T:
    """The low 16 bits of a draw: a fruit may spawn when they are below `spawn_threshold`."""
    return bits & 0xFFFF  # type: ignore[operator]


def column(bits: T, width: int) -> T:
    """The column in [0, width) of a new fruit, from the high 16 bits of a draw."""
    return ((bits >> 16) * width) >> 16  # type: ignore[operator]
