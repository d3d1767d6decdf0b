"""Torch-native Gymnasium vector envs: a kit for writing them, and the games built with it.

* `fruit_env.kit`: any game written as pure tensor functions (`TensorGame`) as a vector env
  whose whole state lives in torch tensors on one device (`TensorVectorEnv`).
* `fruit_env.games`: Fruit Catcher and four MinAtar games (Breakout, Asterix, Freeway, Space
  Invaders; gymnax's rules) on the kit.
* `fruit_env.interop`: zero-copy views for numpy/JAX/CuPy, and adapters for other RL code.

Importing this package registers `FruitCatcher-v0` and the MinAtar games (`Breakout-MinAtar-v0`,
`Asterix-MinAtar-v0`, `Freeway-MinAtar-v0`, `SpaceInvaders-MinAtar-v0`; `make_vec` only):

    envs = gymnasium.make_vec("FruitCatcher-v0", num_envs=4096, device="cuda")  # torch tensors
    env = gymnasium.make("FruitCatcher-v0")                                   # one numpy game
    envs = gymnasium.make_vec("Breakout-MinAtar-v0", num_envs=4096)           # torch tensors
"""

from fruit_env.games.fruit_catcher import FruitCatcherEnv, FruitCatcherVectorEnv, FruitParams
from fruit_env.kit import TensorGame, TensorVectorEnv
from fruit_env.registration import BREAKOUT_ID, ENV_ID, register_envs

register_envs()

__all__ = [
    "BREAKOUT_ID",
    "ENV_ID",
    "FruitCatcherEnv",
    "FruitCatcherVectorEnv",
    "FruitParams",
    "TensorGame",
    "TensorVectorEnv",
    "register_envs",
]
__version__ = "0.1.0"
