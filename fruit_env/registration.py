"""Register the games' ids with Gymnasium (idempotent, so re-imports are harmless)."""

from __future__ import annotations

import gymnasium as gym

ENV_ID = "FruitCatcher-v0"
MAX_EPISODE_STEPS = 200
BREAKOUT_ID = "Breakout-MinAtar-v0"
BREAKOUT_MAX_EPISODE_STEPS = 1000  # gymnax's `max_steps_in_episode`
ASTERIX_ID = "Asterix-MinAtar-v0"
ASTERIX_MAX_EPISODE_STEPS = 1000  # gymnax's `max_steps_in_episode`
FREEWAY_ID = "Freeway-MinAtar-v0"
FREEWAY_MAX_EPISODE_STEPS = 2500  # gymnax's `max_steps_in_episode`
SPACE_INVADERS_ID = "SpaceInvaders-MinAtar-v0"
SPACE_INVADERS_MAX_EPISODE_STEPS = 1000  # gymnax's `max_steps_in_episode`


def register_envs() -> None:
    """FruitCatcher-v0: `make` gives the numpy single game (truncated by `TimeLimit`),
    `make_vec` the torch batch. The MinAtar games (Breakout, Asterix, Freeway, Space
    Invaders, each `<Game>-MinAtar-v0`): `make_vec` only (the torch batch)."""
    if ENV_ID not in gym.registry:
        gym.register(
            id=ENV_ID,
            entry_point="fruit_env.games.fruit_catcher.single_env:FruitCatcherEnv",
            vector_entry_point="fruit_env.games.fruit_catcher.env:FruitCatcherVectorEnv",
            max_episode_steps=MAX_EPISODE_STEPS,
        )
    if BREAKOUT_ID not in gym.registry:
        gym.register(
            id=BREAKOUT_ID,
            vector_entry_point="fruit_env.games.minatar_breakout.env:BreakoutVectorEnv",
            max_episode_steps=BREAKOUT_MAX_EPISODE_STEPS,
        )
    if ASTERIX_ID not in gym.registry:  # Asterix-MinAtar-v0: `make_vec` only, as Breakout
        gym.register(
            id=ASTERIX_ID,
            vector_entry_point="fruit_env.games.minatar_asterix.env:AsterixVectorEnv",
            max_episode_steps=ASTERIX_MAX_EPISODE_STEPS,
        )
    if FREEWAY_ID not in gym.registry:
        gym.register(
            id=FREEWAY_ID,
            vector_entry_point="fruit_env.games.minatar_freeway.env:FreewayVectorEnv",
            max_episode_steps=FREEWAY_MAX_EPISODE_STEPS,
        )
    if SPACE_INVADERS_ID not in gym.registry:  # `make_vec` only, like Breakout
        gym.register(
            id=SPACE_INVADERS_ID,
            vector_entry_point=(
                "fruit_env.games.minatar_space_invaders.env:SpaceInvadersVectorEnv"
            ),
            max_episode_steps=SPACE_INVADERS_MAX_EPISODE_STEPS,
        )
