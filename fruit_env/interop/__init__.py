"""Torch vector envs handed to other code: zero-copy numpy/DLPack views and on-device episode
statistics (`wrappers`), and adapters for third-party RL libraries, each in its own module that
alone imports its library, so `import fruit_env` never needs an optional dependency:

* `fruit_env.interop.sb3.SB3VecEnv`: a Stable-Baselines3 `VecEnv` (`pip install -e '.[sb3]'`).
* `fruit_env.interop.torchrl.FlatEpisodeInfo`: flat episode statistics, so that TorchRL's
  `GymWrapper` runs a SAME_STEP env (`pip install -e '.[torchrl]'`).
"""
