"""What the MinAtar games on the kit share besides their rules and palettes: the time limit
check, gymnax's observation Box and the render settings, written once."""

from __future__ import annotations

from typing import Any, TypeVar

import gymnasium as gym
import numpy as np

from fruit_env.kit import TensorGame

S = TypeVar("S")


class MinAtarGame(TensorGame[S]):
    """A MinAtar game with gymnax's float32 `obs_shape` Box of 0/1 planes (so that a trainer
    builds for it the network it builds for gymnax's game), truncated after
    `max_episode_steps` steps, which the int32 step counter must hold."""

    obs_shape: tuple[int, ...]
    render_modes = ("rgb_array", "ansi")
    render_fps = 10

    def __init__(self, max_episode_steps: Any) -> None:
        limit = max_episode_steps
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)):
            raise ValueError(f"max_episode_steps must be an int, got {limit!r}")
        if not 1 <= limit < 2**31:  # the step counter is int32
            raise ValueError(f"max_episode_steps must be in [1, 2**31), got {limit}")
        self.max_episode_steps = int(limit)
        self.observation_space = gym.spaces.Box(0.0, 1.0, self.obs_shape, np.float32)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_episode_steps={self.max_episode_steps})"
