"""The "before" of benchmarks/env_throughput.py: Fruit Catcher written the straightforward way.

The same game as `FruitCatcherVectorEnv` with its defaults (the rules of `FruitParams`,
NEXT_STEP autoreset, feature or pixel observations), written the way a first torch version
usually is: `(num_envs, max_fruits)` tensors, `torch.where` for every masked update, the
first free slot by `argmax`, `torch.rand` / `torch.randint` from one generator, observations
by `torch.cat` / `torch.stack`. It leaves out what the real env adds on top of the rules: the
counter-based hash (per-sub-env reproducible randomness), episode statistics in `info`,
input checks and action validation. Its trajectories are therefore not those of the real
env (other random numbers); its work per step is the game's.

It exists so that the env's speed is a ratio measured on the same machine at the same
moment. It is a benchmark helper, not an env: no Gymnasium API beyond `reset` and `step`.

    python benchmarks/naive_env.py --num-envs 16384 --steps 200
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from fruit_env.params import FruitParams


class NaiveFruitCatcher:
    """`num_envs` games as `(num_envs, max_fruits)` tensors, eager torch, NEXT_STEP autoreset."""

    def __init__(
        self,
        num_envs: int,
        *,
        device: str | torch.device = "cpu",
        seed: int = 0,
        **rules: Any,
    ) -> None:
        self.params = p = FruitParams(**rules)
        self.num_envs, self.device = num_envs, torch.device(device)
        self.generator = torch.Generator(self.device).manual_seed(seed)
        n, s = num_envs, p.max_fruits
        self.basket = torch.zeros(n, dtype=torch.long, device=self.device)
        self.fruit_x = torch.zeros(n, s, dtype=torch.long, device=self.device)
        self.fruit_y = torch.zeros(n, s, dtype=torch.long, device=self.device)
        self.active = torch.zeros(n, s, dtype=torch.bool, device=self.device)
        self.score = torch.zeros(n, dtype=torch.long, device=self.device)
        self.t = torch.zeros(n, dtype=torch.long, device=self.device)
        self.pending = torch.zeros(n, dtype=torch.bool, device=self.device)
        self.slots = torch.arange(s, device=self.device)
        self.rows = torch.arange(p.height, device=self.device).view(1, -1, 1)
        self.cols = torch.arange(p.width, device=self.device).view(1, 1, -1)

    def reset(self) -> torch.Tensor:
        self._restart(torch.ones(self.num_envs, dtype=torch.bool, device=self.device))
        self.pending = torch.zeros_like(self.pending)
        return self.observe()

    def _restart(self, mask: torch.Tensor) -> None:
        p = self.params
        column = torch.randint(
            0, p.width, (self.num_envs,), generator=self.generator, device=self.device
        )
        first = (self.slots == 0).unsqueeze(0) & mask.unsqueeze(1)
        m = mask.unsqueeze(1)
        self.basket = torch.where(mask, p.max_basket_x // 2, self.basket)
        self.fruit_x = torch.where(first, column.unsqueeze(1), torch.where(m, 0, self.fruit_x))
        self.fruit_y = torch.where(m, 0, self.fruit_y)
        self.active = torch.where(m, first, self.active)
        self.score = torch.where(mask, 0, self.score)
        self.t = torch.where(mask, 0, self.t)

    def step(
        self, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        p = self.params
        restarting = self.pending
        self.basket = torch.clamp(self.basket + action - 1, 0, p.max_basket_x)
        self.fruit_y = torch.where(self.active, self.fruit_y + 1, self.fruit_y)
        landed = self.active & (self.fruit_y >= p.height - 1)
        basket = self.basket.unsqueeze(1)
        inside = (self.fruit_x >= basket) & (self.fruit_x < basket + p.basket_width)
        caught = (landed & inside).sum(1)
        missed = (landed & ~inside).sum(1)
        self.active = self.active & ~landed
        self.fruit_x = torch.where(self.active, self.fruit_x, 0)
        self.fruit_y = torch.where(self.active, self.fruit_y, 0)

        count = self.active.sum(1)
        highest = torch.where(self.active, self.fruit_y, p.height).min(1).values
        coin = torch.rand(self.num_envs, generator=self.generator, device=self.device)
        spawn = (count < p.min_fruits) | (
            (count < p.max_fruits) & (highest >= p.min_spawn_gap) & (coin < p.spawn_prob)
        )
        free = torch.argmax((~self.active).int(), dim=1)
        column = torch.randint(
            0, p.width, (self.num_envs,), generator=self.generator, device=self.device
        )
        new = spawn.unsqueeze(1) & (self.slots.unsqueeze(0) == free.unsqueeze(1))
        self.fruit_x = torch.where(new, column.unsqueeze(1), self.fruit_x)
        self.fruit_y = torch.where(new, 0, self.fruit_y)
        self.active = self.active | new

        reward = (caught - missed).float()
        self.score = self.score + (caught - missed)
        self.t = self.t + 1
        terminated = (self.score >= p.win_score) | (self.score <= p.lose_score)
        truncated = self.t >= p.max_episode_steps
        # NEXT_STEP: games that ended on the last step restart now and ignore their action.
        self._restart(restarting)
        reward = torch.where(restarting, 0.0, reward)
        terminated = terminated & ~restarting
        truncated = truncated & ~restarting
        self.pending = terminated | truncated
        return self.observe(), reward, terminated, truncated, {}

    def observe(self) -> torch.Tensor:
        p = self.params
        if p.obs_mode == "pixels":
            fruit = (
                self.active.unsqueeze(-1).unsqueeze(-1)
                & (self.fruit_y.view(-1, p.max_fruits, 1, 1) == self.rows.unsqueeze(1))
                & (self.fruit_x.view(-1, p.max_fruits, 1, 1) == self.cols.unsqueeze(1))
            ).any(1)
            left = self.basket.view(-1, 1, 1)
            basket = (
                (self.rows == p.height - 1)
                & (self.cols >= left)
                & (self.cols < left + p.basket_width)
            )
            image = torch.where(fruit, 255, torch.where(basket, 128, 0)).to(torch.uint8)
            return image.unsqueeze(1)
        centre = (self.basket.float() + (p.basket_width - 1) / 2) / (p.width - 1)
        per_fruit = torch.stack(
            [
                self.fruit_x.float() / (p.width - 1),
                self.fruit_y.float() / (p.height - 1),
                self.active.float(),
            ],
            dim=2,
        ).view(self.num_envs, -1)
        return torch.cat([centre.unsqueeze(1), per_fruit], dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--obs-mode", default="features")
    args = parser.parse_args()
    env = NaiveFruitCatcher(args.num_envs, obs_mode=args.obs_mode)
    env.reset()
    actions = torch.randint(0, 3, (64, args.num_envs))
    for i in range(10):
        env.step(actions[i])
    start = time.perf_counter()
    for i in range(args.steps):
        env.step(actions[i % 64])
    seconds = time.perf_counter() - start
    print(f"{args.num_envs * args.steps / seconds:,.0f} env-steps/s")


if __name__ == "__main__":
    main()
