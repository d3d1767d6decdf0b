"""Checking what callers hand the host-side env adapters: indices, masks and seeds, as numpy.

The reference for each rule is `fruit_env.kit.inputs` (`as_index`, `as_reset_mask`,
`seeded_keys`), which grpo_trainer does not import; tests/test_shared_concepts.py keeps the
copies in agreement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["host_index", "host_mask", "per_env_seeds"]


def host_index(index: Any, num_envs: int) -> np.ndarray:
    """A 1-D integer tensor or array of sub-env indices, as a numpy array."""
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    array = np.asarray(index)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"index must be a 1-D integer array, got {array.dtype} {array.shape}")
    if array.size and (array.min() < 0 or array.max() >= num_envs):
        raise ValueError(f"index must be in [0, {num_envs}), got {array.min()}..{array.max()}")
    return array.astype(np.int64)


def host_mask(mask: Any, num_envs: int) -> np.ndarray:
    """An `(num_envs,)` bool tensor or array, as a numpy array."""
    if isinstance(mask, torch.Tensor):
        mask = mask.detach().cpu().numpy()
    array = np.asarray(mask)
    if array.shape != (num_envs,) or array.dtype != np.bool_:
        raise ValueError(
            f"reset_mask must be a ({num_envs},) bool array, got {array.dtype} {array.shape}"
        )
    return array


def per_env_seeds(seed: int | Sequence[int | None] | None, num_envs: int) -> list[int | None]:
    """One 64-bit seed (or None) per sub-env; an int `s` gives sub-env `i` `s + i` (Gymnasium)."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an int in [0, 2**64), got {seed}")
        return [(int(seed) + i) % 2**64 for i in range(num_envs)]
    if isinstance(seed, Sequence) and not isinstance(seed, str) and len(seed) == num_envs:
        for s in seed:
            if s is not None and not (isinstance(s, (int, np.integer)) and 0 <= s < 2**64):
                raise ValueError(f"seeds must be ints in [0, 2**64) or None, got {s!r}")
        return [None if s is None else int(s) for s in seed]
    raise ValueError(f"seed must be an int, None or a list of {num_envs} seeds, got {seed!r}")
