"""Fruit Catcher: a basket on the bottom row catches fruit falling from the top.

`rules` is the game's source of truth; `eager` the same rules as few eager kernels (what the
env runs when it does not compile); `env` the vector env on the kit; `single_env` one game in
plain Python, the independent reference the others are tested against.
"""

from fruit_env.games.fruit_catcher.env import FruitCatcherVectorEnv, FruitState
from fruit_env.games.fruit_catcher.params import FruitParams
from fruit_env.games.fruit_catcher.rules import Board, FruitCatcher
from fruit_env.games.fruit_catcher.single_env import FruitCatcherEnv

__all__ = [
    "Board",
    "FruitCatcher",
    "FruitCatcherEnv",
    "FruitCatcherVectorEnv",
    "FruitParams",
    "FruitState",
]
