"""Register the games' ids with Gymnasium (idempotent, so re-imports are harmless).

The MinAtar games are registered the way docs/env.md shows for a user's game: a
`vector_entry_point` function that returns the kit's `TensorVectorEnv` around the game, so
nothing about them is special to a trainer (it reads the device and the fast options from the
env instance).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from fruit_env.games.minatar_asterix import MinAtarAsterix
from fruit_env.games.minatar_breakout import MinAtarBreakout
from fruit_env.games.minatar_freeway import MinAtarFreeway
from fruit_env.games.minatar_space_invaders import MinAtarSpaceInvaders
from fruit_env.kit import TensorGame, TensorVectorEnv

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

# id -> (the game, given its time limit; gymnax's limit)
MINATAR_GAMES: dict[str, tuple[Callable[[int], TensorGame[Any]], int]] = {
    BREAKOUT_ID: (MinAtarBreakout, BREAKOUT_MAX_EPISODE_STEPS),
    ASTERIX_ID: (MinAtarAsterix, ASTERIX_MAX_EPISODE_STEPS),
    FREEWAY_ID: (MinAtarFreeway, FREEWAY_MAX_EPISODE_STEPS),
    SPACE_INVADERS_ID: (MinAtarSpaceInvaders, SPACE_INVADERS_MAX_EPISODE_STEPS),
}


def game_env(game: Callable[[int], TensorGame[Any]], limit: int) -> Callable[..., TensorVectorEnv]:
    """A `vector_entry_point` for a game whose one argument is its time limit:
    `make(num_envs, max_episode_steps=limit, **kit_kwargs)` is
    `TensorVectorEnv(game(max_episode_steps), num_envs, **kit_kwargs)`. The limit goes to the
    game (which refuses a bad one by name); every other keyword is the kit's."""

    def make(num_envs: int, *, max_episode_steps: int = limit, **kwargs: Any) -> TensorVectorEnv:
        return TensorVectorEnv(game(max_episode_steps), num_envs, **kwargs)

    return make


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
    for env_id, (game, limit) in MINATAR_GAMES.items():
        if env_id not in gym.registry:
            gym.register(
                id=env_id, vector_entry_point=game_env(game, limit), max_episode_steps=limit
            )
