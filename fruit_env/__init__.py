"""Fruit Catcher: a Gymnasium vector environment whose whole state lives in torch tensors.

Importing this package registers `FruitCatcher-v0`:

    envs = gymnasium.make_vec("FruitCatcher-v0", num_envs=4096, device="cuda")  # torch tensors
    env = gymnasium.make("FruitCatcher-v0")                                   # one numpy game
"""

from fruit_env.params import FruitParams
from fruit_env.registration import ENV_ID, register_envs
from fruit_env.single_env import FruitCatcherEnv
from fruit_env.vector_env import FruitCatcherVectorEnv

register_envs()

__all__ = ["ENV_ID", "FruitCatcherEnv", "FruitCatcherVectorEnv", "FruitParams", "register_envs"]
__version__ = "0.1.0"
