"""One game of Fruit Catcher in plain Python: `gymnasium.make("FruitCatcher-v0")`.

This is written independently of the tensor rules in `rules.py` (it shares only the hash in
`kit.rng` and how a draw decides a spawn, in `params.py`), so it doubles as the reference that
the vector env is tested against, and as the per-game Python baseline in
`benchmarks/env_throughput.py`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from fruit_env.games.fruit_catcher.params import (
    BASKET_PIXEL,
    FRUIT_PIXEL,
    FruitParams,
    column,
    spawn_bits,
)
from fruit_env.games.fruit_catcher.render import RENDER_FPS, RENDER_MODES, ansi_board, rgb_frame
from fruit_env.kit import rng


class FruitCatcherEnv(gym.Env[np.ndarray, np.int64]):
    """A single Fruit Catcher game with numpy observations. Arguments as in `FruitParams`.

    As usual in Gymnasium, the time limit is the `TimeLimit` wrapper's job: `gymnasium.make`
    adds it (200 steps, or `make(..., max_episode_steps=N)`); the class itself never truncates.
    """

    metadata = {"render_modes": list(RENDER_MODES), "render_fps": RENDER_FPS}

    def __init__(self, *, render_mode: str | None = None, **rules: Any) -> None:
        if "max_episode_steps" in rules:
            raise ValueError(
                "max_episode_steps is set by gymnasium.make(..., max_episode_steps=N) "
                "(the TimeLimit wrapper), not by FruitCatcherEnv"
            )
        self.params = FruitParams(**rules)
        if render_mode is not None and render_mode not in RENDER_MODES:
            raise ValueError(
                f"render_mode must be one of {RENDER_MODES} or None, got {render_mode!r}"
            )
        self.render_mode = render_mode
        p = self.params
        self.action_space = gym.spaces.Discrete(3)
        if p.obs_mode == "features":
            self.observation_space = gym.spaces.Box(0.0, 1.0, (p.obs_size,), np.float32)
        else:
            self.observation_space = gym.spaces.Box(0, 255, (1, p.height, p.width), np.uint8)
        self._key = rng.seed_key(int(rng.fresh_seeds(1)[0]))
        self._counter = 0
        self._new_game()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self._key = rng.seed_key(rng.normalize_seed(seed))
            self._counter = 0
        self._new_game()
        return self._observe(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not self.action_space.contains(action):
            raise ValueError(f"action must be 0, 1 or 2, got {action!r}")
        p = self.params
        self.basket = min(max(self.basket + int(action) - 1, 0), p.max_basket_x)
        caught = missed = 0
        for i, fruit in enumerate(self.slots):
            if fruit is None:
                continue
            x, y = fruit[0], fruit[1] + 1
            if y < p.height - 1:
                self.slots[i] = (x, y)
            else:
                self.slots[i] = None
                if self.basket <= x < self.basket + p.basket_width:
                    caught += 1
                else:
                    missed += 1

        bits = rng.draw(self._key, self._counter)
        self._counter += 1
        falling = [fruit for fruit in self.slots if fruit is not None]
        highest = min((y for _, y in falling), default=p.height)
        if len(falling) < p.min_fruits or (
            len(falling) < p.max_fruits
            and highest >= p.min_spawn_gap
            and spawn_bits(bits) < p.spawn_threshold
        ):
            self.slots[self.slots.index(None)] = (column(bits, p.width), 0)

        reward = caught - missed
        self.caught += caught
        self.missed += missed
        self.score += reward
        self.t += 1
        terminated = self.score >= p.win_score or self.score <= p.lose_score
        return self._observe(), float(reward), terminated, False, {}

    def render(self) -> np.ndarray | str | None:
        if self.render_mode == "rgb_array":
            return rgb_frame(self._pixels()[0])
        if self.render_mode == "ansi":
            return ansi_board(self._pixels()[0], score=self.score, step=self.t)
        return None

    # -- internals -------------------------------------------------------------------------

    def _new_game(self) -> None:
        p = self.params
        bits = rng.draw(self._key, self._counter)
        self._counter += 1
        self.basket = p.max_basket_x // 2
        # A fruit slot holds (column, row) or None; new fruits take the first free slot.
        self.slots: list[tuple[int, int] | None] = [None] * p.max_fruits
        self.slots[0] = (column(bits, p.width), 0)
        self.score = self.t = self.caught = self.missed = 0

    def _observe(self) -> np.ndarray:
        return self._features() if self.params.obs_mode == "features" else self._pixels()

    def _features(self) -> np.ndarray:
        p = self.params
        f32 = np.float32  # float32 division, as the tensor rules do it
        x_max, y_max = f32(p.width - 1), f32(p.height - 1)
        obs = np.zeros(p.obs_size, dtype=np.float32)
        obs[0] = f32(self.basket + (p.basket_width - 1) / 2) / x_max
        for i, fruit in enumerate(self.slots):
            if fruit is not None:
                obs[1 + 3 * i : 4 + 3 * i] = (f32(fruit[0]) / x_max, f32(fruit[1]) / y_max, 1.0)
        return obs

    def _pixels(self) -> np.ndarray:
        p = self.params
        image = np.zeros((1, p.height, p.width), dtype=np.uint8)
        image[0, p.height - 1, self.basket : self.basket + p.basket_width] = BASKET_PIXEL
        for fruit in self.slots:
            if fruit is not None:
                image[0, fruit[1], fruit[0]] = FRUIT_PIXEL
        return image
