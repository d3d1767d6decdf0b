"""Register `FruitCatcher-v0` with Gymnasium (idempotent, so re-imports are harmless)."""

from __future__ import annotations

import gymnasium as gym

ENV_ID = "FruitCatcher-v0"
MAX_EPISODE_STEPS = 200


def register_envs() -> None:
    """`make` gives the numpy single game (truncated by `TimeLimit`), `make_vec` the torch batch."""
    if ENV_ID in gym.registry:
        return
    gym.register(
        id=ENV_ID,
        entry_point="fruit_env.games.fruit_catcher.single_env:FruitCatcherEnv",
        vector_entry_point="fruit_env.games.fruit_catcher.env:FruitCatcherVectorEnv",
        max_episode_steps=MAX_EPISODE_STEPS,
    )
