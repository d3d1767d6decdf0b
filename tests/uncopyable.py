"""A tiny env that cannot be copied: it holds a lock, as envs holding a handle (a Box2D world,
a socket, a render window) do. Its class is importable, so an `AsyncVectorEnv` can send it to
a worker as a factory and build it there, while its instances neither deepcopy nor pickle."""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym
import numpy as np


class LockedEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.position = np.zeros(2, np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-0.5, 0.5, 2).astype(np.float32)
        return self.position.copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.position = np.clip(self.position + (0.1 if action else -0.1), -1, 1)
        return self.position.copy(), float(self.position[0]), bool(self.position[0] >= 1), False, {}
