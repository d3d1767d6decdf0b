"""The kit: any game written as pure tensor functions (`TensorGame`), run as a Gymnasium vector
env on one torch device (`TensorVectorEnv`), with everything around the rules written once.

    class MyGame(TensorGame[MyState]):  # initial, advance, observe, episode
        ...

    envs = TensorVectorEnv(MyGame(), num_envs=4096, device="cuda")

Nothing here imports a game. docs/env.md ("Write your own env") walks through an example.
"""

from fruit_env.kit.game import Step, TensorGame
from fruit_env.kit.vector_env import SubEnvSnapshot, TensorVectorEnv

__all__ = ["Step", "SubEnvSnapshot", "TensorGame", "TensorVectorEnv"]
