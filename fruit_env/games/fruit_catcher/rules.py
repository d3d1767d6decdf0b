"""The rules of Fruit Catcher as pure tensor functions over a batch of games: the source of
truth, which the kit steps, compiles and checks the other forms against.

One step, in order: the basket moves (clamped to the board); every falling fruit drops one
row; fruits that reach the bottom row score +1 inside the basket and -1 outside, and vanish;
then at most one fruit spawns in row 0 (always when fewer than `min_fruits` fall, else with
`spawn_prob` when fewer than `max_fruits` fall and the highest is `min_spawn_gap` rows down).
A new game has the basket centred and one fruit in row 0 of slot 0.

The state holds the fruit slots unrolled, one `(N,)` tensor per slot and field, so that the
compiled step fuses into one vectorised loop over the envs (with `(N, S)` or `(S, N)` blocks
inductor splits it into several loops and stores bool blocks element by element:
docs/performance.md). Masks select by arithmetic (`x * keep` for `torch.where(keep, x, 0)`):
the same integers.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from fruit_env.games.fruit_catcher import render
from fruit_env.games.fruit_catcher.eager import PackedFruitCatcher
from fruit_env.games.fruit_catcher.params import (
    BASKET_PIXEL,
    FRUIT_PIXEL,
    FruitParams,
    column,
    spawn_bits,
)
from fruit_env.kit import Step, TensorGame


class Board(NamedTuple):
    """The state of `num_envs` games. Inactive fruit slots hold x = y = 0."""

    basket: torch.Tensor  # (N,) int32, left edge of the basket
    fruit_x: tuple[torch.Tensor, ...]  # S x (N,) int32, the column of each fruit slot
    fruit_y: tuple[torch.Tensor, ...]  # S x (N,) int32, the row of each slot (0 = top)
    active: tuple[torch.Tensor, ...]  # S x (N,) bool, the slot holds a falling fruit
    score: torch.Tensor  # (N,) int32, caught minus missed this episode
    t: torch.Tensor  # (N,) int32, steps taken this episode
    caught: torch.Tensor  # (N,) int32, fruits caught this episode
    missed: torch.Tensor  # (N,) int32, fruits missed this episode


class FruitCatcher(TensorGame[Board]):
    """Fruit Catcher with the rules `params`: actions 0/1/2 move the basket left, keep it,
    move it right."""

    num_actions = 3
    episode_fields = ("r", "l", "caught", "missed")
    render_modes = render.RENDER_MODES
    render_fps = render.RENDER_FPS
    metadata = {
        # Success ratios of the episode fields: catch_rate = caught / (caught + missed).
        "episode_ratios": {"catch_rate": ("caught", "missed")},
        # What counts as having learned the game (a greedy catch rate the project's default
        # training run reaches on every seed studied): trainers may report when they get there.
        "episode_goals": {"catch_rate": 0.70},
    }

    def __init__(self, params: FruitParams) -> None:
        self.params = p = params
        self.max_episode_steps = p.max_episode_steps
        if p.obs_mode == "features":
            self.observation_space = gym.spaces.Box(0.0, 1.0, (p.obs_size,), np.float32)
        else:
            self.observation_space = gym.spaces.Box(0, 255, (1, p.height, p.width), np.uint8)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"

    def initial(self, bits: torch.Tensor) -> Board:
        p, others = self.params, range(self.params.max_fruits - 1)

        def zeros(dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.zeros(bits.shape, dtype=dtype, device=bits.device)

        return Board(  # slot 0 holds the new fruit
            basket=zeros() + p.max_basket_x // 2,
            fruit_x=(column(bits, p.width).to(torch.int32), *(zeros() for _ in others)),
            fruit_y=tuple(zeros() for _ in range(p.max_fruits)),
            active=(zeros(torch.bool) | True, *(zeros(torch.bool) for _ in others)),
            score=zeros(),
            t=zeros(),
            caught=zeros(),
            missed=zeros(),
        )

    def advance(self, state: Board, action: torch.Tensor, bits: torch.Tensor) -> Step:
        p, height = self.params, self.params.height
        coin = spawn_bits(bits) < p.spawn_threshold
        new_column = column(bits, p.width).to(torch.int32)
        basket = (state.basket + action - 1).clamp(0, p.max_basket_x)
        basket_end = basket + p.basket_width

        fall_y, falling, landed, caught, too_high = [], [], [], [], []
        for x, y, active in zip(state.fruit_x, state.fruit_y, state.active, strict=True):
            y = y + active  # active fruits drop one row
            lands = active & (y >= height - 1)
            stays = active ^ lands  # lands implies active
            fall_y.append(y)
            falling.append(stays)
            landed.append(lands)
            caught.append(lands & (x >= basket) & (x < basket_end))
            too_high.append(stays & (y < p.min_spawn_gap))  # blocks a spawn_prob spawn
        n_caught = _count(caught)
        n_missed = _count(landed) - n_caught
        reward = n_caught - n_missed

        count = _count(falling)
        spawn = (count < p.min_fruits) | ((count < p.max_fruits) & ~_any(too_high) & coin)
        fruit_x, fruit_y, active = [], [], []
        for x, y, stays in zip(state.fruit_x, fall_y, falling, strict=True):
            new = spawn & ~stays  # the new fruit, if any, takes the first free slot
            spawn = spawn & stays
            fruit_x.append(x * stays + new_column * new)
            fruit_y.append(y * stays)
            active.append(stays | new)

        score = state.score + reward
        t = state.t + 1
        board = Board(
            basket=basket,
            fruit_x=tuple(fruit_x),
            fruit_y=tuple(fruit_y),
            active=tuple(active),
            score=score,
            t=t,
            caught=state.caught + n_caught,
            missed=state.missed + n_missed,
        )
        return Step(
            board,
            reward.to(torch.float32),
            terminated=(score >= p.win_score) | (score <= p.lose_score),
            truncated=t >= p.max_episode_steps,
        )

    def episode(self, state: Board) -> tuple[torch.Tensor, ...]:
        return (state.score.to(torch.float32), state.t.clone(), state.caught.clone(),
                state.missed.clone())  # fmt: skip

    def observe(self, state: Board) -> torch.Tensor:
        return self.features(state) if self.params.obs_mode == "features" else self.pixels(state)

    def features(self, state: Board) -> torch.Tensor:
        """float32 `(N, 1 + 3*max_fruits)`: basket centre, then (x, y, active) per slot, in
        [0, 1]. The basket centre and fruit columns share one scale, so "fruit above basket"
        is equality. Divisions (not multiplications by a reciprocal) keep results
        bit-identical to numpy's, and the divisors are tensors on the state's device: CUDA
        divides by a host scalar as a multiplication by its reciprocal."""
        p = self.params
        device = state.basket.device
        x_max, y_max = (
            torch.full((), float(d), device=device) for d in (p.width - 1, p.height - 1)
        )
        columns = [(state.basket.to(torch.float32) + (p.basket_width - 1) / 2) / x_max]
        for x, y, active in zip(state.fruit_x, state.fruit_y, state.active, strict=True):
            columns += [x / x_max, y / y_max, active.to(torch.float32)]
        return torch.stack(columns, 1)

    def pixels(self, state: Board) -> torch.Tensor:
        """uint8 `(N, 1, height, width)`: fruit 255, basket 128, empty 0.

        Cells are written by scatters taking the larger value, so that a fruit shows over
        the basket and an inactive slot (value 0) over nothing: compiled, this writes each
        pixel once plus one write per fruit and basket cell, where comparing every pixel with
        every fruit does far more work (docs/performance.md).
        """
        p = self.params
        n, h, w, device = state.basket.shape[0], p.height, p.width, state.basket.device
        image = torch.zeros((n, h * w), dtype=torch.uint8, device=device)
        fruit_y, fruit_x = torch.stack(state.fruit_y, 1), torch.stack(state.fruit_x, 1)
        fruit_cells = (fruit_y * w + fruit_x).to(torch.int64)
        fruit = torch.stack(state.active, 1).to(torch.uint8) * FRUIT_PIXEL
        image = image.scatter_reduce(1, fruit_cells, fruit, "amax")
        left = (state.basket.to(torch.int64) + (h - 1) * w)[:, None]
        basket_cells = left + torch.arange(p.basket_width, device=device)
        basket = torch.full_like(basket_cells, BASKET_PIXEL, dtype=torch.uint8)
        return image.scatter_reduce(1, basket_cells, basket, "amax").view(n, 1, h, w)

    def render(self, state: Board, mode: str) -> list[Any]:
        grids = self.pixels(state)[:, 0].cpu().numpy()
        if mode == "rgb_array":
            return [render.rgb_frame(g) for g in grids]
        scores, steps = state.score.tolist(), state.t.tolist()
        return [
            render.ansi_board(g, score=s, step=t)
            for g, s, t in zip(grids, scores, steps, strict=True)
        ]

    def eager_form(self, num_envs: int, device: torch.device) -> TensorGame[Any]:
        """The same rules as few eager kernels on packed rows (`eager.py`)."""
        return PackedFruitCatcher(self.params, num_envs, device)


def _count(masks: Sequence[torch.Tensor]) -> torch.Tensor:
    """How many of the bool masks are true, per env (int32)."""
    first, *others = masks
    return functools.reduce(operator.add, others, first.to(torch.int32))


def _any(masks: Sequence[torch.Tensor]) -> torch.Tensor:
    return functools.reduce(operator.or_, masks)
