"""The rules of Fruit Catcher as pure tensor functions over a batch of games.

Every function maps tensors of shape `(num_envs, ...)` to new tensors: no Python branch on
tensor values, no host synchronisation, no per-env loop. They compile with
`torch.compile(fullgraph=True)`. The Gymnasium shell in `vector_env.py` wraps them.

One step, in order: the basket moves (clamped to the board); every falling fruit drops one
row; fruits that reach the bottom row score +1 inside the basket and -1 outside, and vanish;
then at most one fruit spawns in row 0 (always when fewer than `min_fruits` fall, else with
`spawn_prob` when fewer than `max_fruits` fall and the highest is `min_spawn_gap` rows down).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fruit_env import rng
from fruit_env.params import FruitParams

# Pixel values of the image observation.
FRUIT_PIXEL = 255
BASKET_PIXEL = 128


class FruitState(NamedTuple):
    """The whole state of `num_envs` games. Inactive fruit slots hold x = y = 0."""

    basket: torch.Tensor  # (N,) int32, left edge of the basket
    fruit_x: torch.Tensor  # (N, S) int32 column of each fruit slot
    fruit_y: torch.Tensor  # (N, S) int32 row of each fruit slot (0 = top)
    active: torch.Tensor  # (N, S) bool, slot holds a falling fruit
    score: torch.Tensor  # (N,) int32, caught minus missed this episode
    t: torch.Tensor  # (N,) int32, steps taken this episode
    caught: torch.Tensor  # (N,) int32, fruits caught this episode
    missed: torch.Tensor  # (N,) int32, fruits missed this episode
    key: torch.Tensor  # (N,) int64, 32-bit random key derived from the seed
    counter: torch.Tensor  # (N,) int64, random-draw counter (one per step or reset)


class StepResult(NamedTuple):
    """What one step of the rules reports besides the new state."""

    reward: torch.Tensor  # (N,) float32
    terminated: torch.Tensor  # (N,) bool, score reached win_score or lose_score
    truncated: torch.Tensor  # (N,) bool, t reached max_episode_steps


def empty_state(params: FruitParams, num_envs: int, device: torch.device) -> FruitState:
    """Zeroed state; call `reset` with a full mask before stepping."""

    def zeros(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=device)

    n, s = num_envs, params.max_fruits
    return FruitState(
        basket=zeros(n),
        fruit_x=zeros(n, s),
        fruit_y=zeros(n, s),
        active=zeros(n, s, dtype=torch.bool),
        score=zeros(n),
        t=zeros(n),
        caught=zeros(n),
        missed=zeros(n),
        key=zeros(n, dtype=torch.int64),
        counter=zeros(n, dtype=torch.int64),
    )


def select(mask: torch.Tensor, a: FruitState, b: FruitState) -> FruitState:
    """Per sub-env choice: `a` where mask is true, `b` elsewhere."""
    return FruitState(*(_where(mask, x, y) for x, y in zip(a, b, strict=True)))


def _where(mask: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.view(-1, *([1] * (x.dim() - 1))), x, y)


def reset(params: FruitParams, state: FruitState, mask: torch.Tensor) -> FruitState:
    """Start a new game where `mask` is true; other sub-envs keep their state."""
    return select(mask, new_game(params, state), state)


def new_game(params: FruitParams, state: FruitState) -> FruitState:
    """A new game in every sub-env: basket centred, one fruit in row 0.

    The fruit's column is drawn from the sub-env's current counter, which then advances.
    Keys are kept: reseeding is the caller's job.
    """
    slots = torch.arange(params.max_fruits, device=state.key.device)
    first = (slots == 0).expand_as(state.active)
    col = rng.column(rng.draw(state.key, state.counter), params.width).to(torch.int32)
    zero = torch.zeros_like(state.score)
    return FruitState(
        basket=torch.full_like(state.basket, params.max_basket_x // 2),
        fruit_x=torch.where(first, col[:, None], 0),
        fruit_y=torch.zeros_like(state.fruit_y),
        active=first,
        score=zero,
        t=zero,
        caught=zero,
        missed=zero,
        key=state.key,
        counter=state.counter + 1,
    )


def step(
    params: FruitParams, state: FruitState, action: torch.Tensor
) -> tuple[FruitState, StepResult]:
    """Advance every game by one step. `action` is an integer tensor of 0/1/2 (left/stay/right)."""
    height, width = params.height, params.width
    basket = (state.basket + action.to(torch.int32) - 1).clamp(0, params.max_basket_x)

    fall_y = state.fruit_y + state.active.to(torch.int32)
    landed = state.active & (fall_y >= height - 1)
    in_basket = (state.fruit_x >= basket[:, None]) & (
        state.fruit_x < basket[:, None] + params.basket_width
    )
    caught = (landed & in_basket).sum(1, dtype=torch.int32)
    missed = (landed & ~in_basket).sum(1, dtype=torch.int32)
    active = state.active & ~landed

    bits = rng.draw(state.key, state.counter)
    count = active.sum(1)
    highest = torch.where(active, fall_y, height).amin(1)
    spawn = (count < params.min_fruits) | (
        (count < params.max_fruits)
        & (highest >= params.min_spawn_gap)
        & (rng.spawn_bits(bits) < params.spawn_threshold)
    )
    slots = torch.arange(params.max_fruits, device=active.device)
    first_free = (~active).to(torch.uint8).argmax(1)
    new_fruit = spawn[:, None] & (slots == first_free[:, None])
    col = rng.column(bits, width).to(torch.int32)

    score = state.score + caught - missed
    t = state.t + 1
    new_state = FruitState(
        basket=basket,
        fruit_x=torch.where(new_fruit, col[:, None], torch.where(active, state.fruit_x, 0)),
        fruit_y=torch.where(active, fall_y, 0),
        active=active | new_fruit,
        score=score,
        t=t,
        caught=state.caught + caught,
        missed=state.missed + missed,
        key=state.key,
        counter=state.counter + 1,
    )
    result = StepResult(
        reward=(caught - missed).to(torch.float32),
        terminated=(score >= params.win_score) | (score <= params.lose_score),
        truncated=t >= params.max_episode_steps,
    )
    return new_state, result


def observe_features(params: FruitParams, state: FruitState) -> torch.Tensor:
    """float32 `(N, 1 + 3*max_fruits)`: basket centre, then (x, y, active) per slot, in [0, 1].

    The basket centre and fruit columns share one scale, so "fruit above basket" is equality.
    Divisions (not multiplications by a reciprocal) keep results bit-identical to numpy's.
    """
    x_max, y_max = params.width - 1, params.height - 1
    centre = (state.basket.to(torch.float32) + (params.basket_width - 1) / 2) / x_max
    per_slot = torch.stack(
        (
            state.fruit_x.to(torch.float32) / x_max,
            state.fruit_y.to(torch.float32) / y_max,
            state.active.to(torch.float32),
        ),
        dim=-1,
    )
    return torch.cat((centre[:, None], per_slot.flatten(1)), dim=1)


def observe_pixels(params: FruitParams, state: FruitState) -> torch.Tensor:
    """uint8 `(N, 1, height, width)`: fruit 255, basket 128, empty 0."""
    device = state.basket.device
    rows = torch.arange(params.height, device=device).view(1, 1, -1, 1)
    cols = torch.arange(params.width, device=device).view(1, 1, 1, -1)
    fruit = (
        state.active[:, :, None, None]
        & (state.fruit_y[:, :, None, None] == rows)
        & (state.fruit_x[:, :, None, None] == cols)
    ).any(1, keepdim=True)
    left = state.basket.view(-1, 1, 1, 1)
    basket = (rows == params.height - 1) & (cols >= left) & (cols < left + params.basket_width)
    image = torch.where(fruit, FRUIT_PIXEL, torch.where(basket, BASKET_PIXEL, 0))
    return image.to(torch.uint8)


OBSERVERS = {"features": observe_features, "pixels": observe_pixels}
