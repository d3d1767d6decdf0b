"""Counter-based randomness: every draw is a hash of (sub-env key, counter).

A sub-env's key comes from its seed; its counter advances by one on every step and every
reset. A draw therefore depends on nothing but that sub-env's seed and history, so a game
plays out the same for any `num_envs`, any neighbours, and on any device. A game gets the
32 bits of a draw and decodes them itself.

The functions below take Python ints, numpy integer arrays or torch int64 tensors alike:
all arithmetic stays below 2**63, so signed 64-bit tensors never overflow.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch

MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9

T = TypeVar("T")


def signed32(c: int) -> int:
    """The member of `c`'s residue class mod 2**32 in [-2**31, 2**31)."""
    return (c + 2**31) % 2**32 - 2**31


def _mul32(x: T, c: int) -> T:
    """(x * c) mod 2**32 for 0 <= x < 2**32, in one multiply that never exceeds int64.

    With `signed32(c)` for `c`, `|x * c| < 2**63`; the low 32 bits of the (possibly
    negative) product are the same, and `& MASK32` reads them (two's complement, exact for
    Python ints, numpy and torch alike).
    """
    return (x * signed32(c)) & MASK32  # type: ignore[operator]


def mix32(x: T) -> T:
    """A 32-bit integer finaliser (Wellons' lowbias32): good avalanche in a few ops."""
    x = x ^ (x >> 16)  # type: ignore[operator]
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)  # type: ignore[operator]
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)  # type: ignore[operator]


def draw(key: T, counter: T) -> T:
    """The 32 random bits of a sub-env for one counter value."""
    return mix32(key ^ mix32(counter & MASK32))  # type: ignore[operator]


class EagerDraw:
    """`draw` for eager steps: the same bits in one fresh tensor, every operation in place on
    it or on a scratch tensor kept between calls (an eager operation that allocates costs
    more than one that does not)."""

    def __init__(self) -> None:
        self._tmp: torch.Tensor | None = None

    def __call__(self, key: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
        x = torch.bitwise_and(counter, MASK32)
        tmp = self._tmp
        if tmp is None or tmp.shape != x.shape or tmp.device != x.device:
            with torch.inference_mode(False):  # kept for steps outside inference mode too
                tmp = self._tmp = torch.empty_like(x)
        _mix32_(x, tmp)
        _mix32_(x.bitwise_xor_(key), tmp)
        return x


_C1, _C2 = signed32(0x7FEB352D), signed32(0x846CA68B)  # mix32's multipliers


def _mix32_(x: torch.Tensor, tmp: torch.Tensor) -> None:
    """`mix32` in place (int64 in [0, 2**32)), with `tmp` for the shifts."""
    x.bitwise_xor_(torch.bitwise_right_shift(x, 16, out=tmp))
    x.mul_(_C1).bitwise_and_(MASK32)
    x.bitwise_xor_(torch.bitwise_right_shift(x, 15, out=tmp))
    x.mul_(_C2).bitwise_and_(MASK32)
    x.bitwise_xor_(torch.bitwise_right_shift(x, 16, out=tmp))


def seed_keys(seeds: np.ndarray) -> np.ndarray:
    """Map 64-bit seeds (uint64 array) to 32-bit sub-env keys (int64 array)."""
    seeds = np.asarray(seeds, dtype=np.uint64)
    lo = (seeds & np.uint64(MASK32)).astype(np.int64)  # int64 keeps numpy 1.x off float64
    hi = (seeds >> np.uint64(32)).astype(np.int64)
    return mix32(lo ^ mix32(hi ^ _GOLDEN))


def seed_key(seed: int) -> int:
    """The key of a single seed, in Python ints (for single-game envs)."""
    seed %= 2**64
    return mix32((seed & MASK32) ^ mix32((seed >> 32) ^ _GOLDEN))


SEED_LIMIT = 2**64  # seeds are 64-bit: a larger one would play the game of its residue


def normalize_seed(seed: object, name: str = "seed") -> int:
    """Check that a seed is an int in [0, 2**64), as Gymnasium requires non-negative seeds and
    the key takes 64 bits (refused rather than folded: seed 2**70 would play seed 0's game)."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"{name} must be a non-negative int or None, got {seed!r}")
    if seed < 0:
        raise ValueError(f"{name} must be non-negative, got {seed}")
    if seed >= SEED_LIMIT:
        raise ValueError(f"{name} must be below 2**64 (seeds are 64-bit), got {seed}")
    return int(seed)


def fresh_seeds(n: int) -> np.ndarray:
    """n seeds from OS entropy (for a single env; a vector env takes `range_keys` of one)."""
    return np.random.SeedSequence().generate_state(n, dtype=np.uint64)


def range_keys(base: int, n: int, device: torch.device) -> torch.Tensor:
    """The keys of the seeds `base, base + 1, ..., base + n - 1` (mod 2**64), `seed_keys`'s
    values computed on `device`: no host array of `n` seeds, so that any `num_envs` (even
    2**31 on the meta device) is seeded at once."""
    base %= SEED_LIMIT
    low = torch.arange(n, dtype=torch.int64, device=device) + (base & MASK32)  # < 2**63
    high = (low >> 32) + (base >> 32)  # the carry of the low word
    return mix32((low & MASK32) ^ mix32((high & MASK32) ^ _GOLDEN))
