"""Write your own env: a small game on fruit_env's kit (docs/env.md, "Write your own env").

A treasure hunt on a row of cells: each step moves the hunter left or right; reaching the
treasure pays 1 and ends the game, any other step costs 0.01. The game is four pure tensor
functions over a NamedTuple of tensors; the kit makes them a Gymnasium vector env with
seeding, the three autoreset modes, snapshots, action checks, episode statistics and a
compiled path. This script checks the env with the trainer's conformance checker:

    python examples/own_env.py                        # all three autoreset modes
    python -m grpo_trainer check own_env:TreasureHunt-v0   # with examples/ on PYTHONPATH
"""

from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from fruit_env.kit import Step, TensorGame, TensorVectorEnv


class Hunt(NamedTuple):
    hunter: torch.Tensor  # (N,) int32, the hunter's cell
    treasure: torch.Tensor  # (N,) int32, the treasure's cell
    t: torch.Tensor  # (N,) int32, steps this episode
    ret: torch.Tensor  # (N,) float32, return this episode


class TreasureHunt(TensorGame[Hunt]):
    num_actions = 2  # 0: left, 1: right
    max_episode_steps = 40

    def __init__(self, cells: int = 12) -> None:
        self.cells = cells
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)

    def __repr__(self) -> str:  # the rules, for the compiled path's cache
        return f"TreasureHunt(cells={self.cells})"

    def initial(self, bits: torch.Tensor) -> Hunt:
        hunter = bits % self.cells  # the low bits place the hunter, the high bits the treasure
        treasure = (hunter + 1 + (bits >> 16) % (self.cells - 1)) % self.cells  # elsewhere
        zero = torch.zeros_like(bits, dtype=torch.int32)
        return Hunt(hunter.to(torch.int32), treasure.to(torch.int32), zero, zero.float())

    def advance(self, state: Hunt, action: torch.Tensor, bits: torch.Tensor) -> Step:
        hunter = (state.hunter + 2 * action - 1).clamp(0, self.cells - 1)
        found = hunter == state.treasure
        reward = torch.where(found, 1.0, -0.01)
        t = state.t + 1
        new = Hunt(hunter, state.treasure, t, state.ret + reward)
        return Step(new, reward, terminated=found, truncated=t >= self.max_episode_steps)

    def observe(self, state: Hunt) -> torch.Tensor:
        return torch.stack([state.hunter, state.treasure], 1) / (self.cells - 1)

    def episode(self, state: Hunt) -> tuple[torch.Tensor, ...]:
        return state.ret.clone(), state.t.clone()  # "r" and "l", fresh tensors


def make(num_envs: int, **kwargs: Any) -> TensorVectorEnv:
    return TensorVectorEnv(TreasureHunt(), num_envs, **kwargs)


gym.register("TreasureHunt-v0", vector_entry_point=make)

if __name__ == "__main__":
    from grpo_trainer.tools.checker import check_vector_env

    for mode in ("NEXT_STEP", "SAME_STEP", "DISABLED"):
        env = gym.make_vec("TreasureHunt-v0", num_envs=8, autoreset_mode=mode)
        obs, _ = env.reset(seed=0)
        snapshot = env.unwrapped.snapshot_state(torch.tensor([0, 0]))  # sub-env 0, twice
        env.unwrapped.restore_state(torch.tensor([6, 7]), snapshot)
        report = check_vector_env(env, make_env=lambda n, m=mode: make(n, autoreset_mode=m))
        print(report)
        assert report.ok, f"{mode}: the checker failed"
