"""What a checkpoint holds of a rollout, for one rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from grpo_trainer.base.collective import Collective
from grpo_trainer.base.config import GRPOConfig

# Settings a windowed rollout's saved episodes depend on: with others they cannot continue.
ROLLOUT_FIELDS = ("rollout", "rollout_steps", "window", "num_groups", "group_size")


class SavedRollout(NamedTuple):
    state: dict[str, Any] | None  # this rank's state_dict(); None: other settings or ranks
    horizon: int  # the steps per sub-env the next collect plays
    updates: int  # updates done
    source: Path  # the checkpoint file, for messages


def saved_rollout(
    payload: dict[str, Any], config: GRPOConfig, collective: Collective, found: Path
) -> SavedRollout:
    """This rank's rollout state in a checkpoint, where it was written with the same rollout
    settings and number of ranks (else `state` is None)."""
    states, saved = payload.get("rollouts") or [], payload["config"]
    same = all(saved.get(k) == getattr(config, k) for k in ROLLOUT_FIELDS)
    ranks = collective.world_size
    state = states[collective.rank] if same and len(states) == ranks else None
    return SavedRollout(state, int(payload["horizon"]), int(payload["update_index"]), found)
