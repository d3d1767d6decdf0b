"""Giving a vector env the sub-env state protocol (docs/env.md), where its family allows it:
envs that offer it are used as they are, others get their family's adapter where one fits
(docs/integrations.md, "Sub-env state snapshots for other vector envs").
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from grpo_trainer.envs.array_state import ArrayStateVectorEnv, array_layout
from grpo_trainer.envs.async_state import picklable_or_none
from grpo_trainer.envs.copied_state import copyable_or_none

__all__ = ["has_state_protocol", "with_state_protocol"]


def has_state_protocol(envs: Any) -> bool:
    """Does `envs` (itself, not an env it wraps) offer sub-env state snapshots?"""
    return callable(getattr(envs, "snapshot_state", None)) and callable(
        getattr(envs, "restore_state", None)
    )


def with_state_protocol(envs: Any) -> Any:
    """`envs`, or `envs` wrapped in the adapter that gives its family the state protocol."""
    if has_state_protocol(envs) or not hasattr(envs, "unwrapped"):
        return envs
    layout = array_layout(envs)
    if layout is not None:
        return ArrayStateVectorEnv(envs, layout, autoreset=False)  # the trainer starts groups
    if isinstance(envs.unwrapped, gym.vector.SyncVectorEnv):
        return copyable_or_none(envs) or envs
    if isinstance(envs.unwrapped, gym.vector.AsyncVectorEnv):
        return picklable_or_none(envs) or envs
    return envs
