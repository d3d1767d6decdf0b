"""Adapters that plug the torch vector env into third-party RL libraries.

Each adapter lives in its own module and imports its library only there, so
`import fruit_env` never needs an optional dependency:

* `fruit_env.adapters.sb3.SB3VecEnv`: a Stable-Baselines3 `VecEnv` (`pip install -e '.[sb3]'`).
* `fruit_env.adapters.torchrl.FlatEpisodeInfo`: flat episode statistics, so that TorchRL's
  `GymWrapper` runs a SAME_STEP env (`pip install -e '.[torchrl]'`).
"""
