"""The rules of Fruit Catcher as pure tensor functions over a batch of games.

Every function maps tensors of shape `(num_envs, ...)` to new tensors: no Python branch on
tensor values, no host synchronisation, no per-env loop. `transitions.py` builds the vector
step from them, which `compiled.py` compiles whole (torch.export, AOTInductor); `packed.py`
states the same rules again as few eager kernels, tested equal. The Gymnasium shell in
`vector_env.py` wraps both.

One step, in order: the basket moves (clamped to the board); every falling fruit drops one
row; fruits that reach the bottom row score +1 inside the basket and -1 outside, and vanish;
then at most one fruit spawns in row 0 (always when fewer than `min_fruits` fall, else with
`spawn_prob` when fewer than `max_fruits` fall and the highest is `min_spawn_gap` rows down).

Two forms of the state: `FruitState` holds `(N, S)` tensors per fruit slot (the public form),
`Game` holds the same fields with the `S` slots unrolled into tuples of `(N,)` tensors (the
form the rules compute on). Why the rules are written this way (measured in
docs/performance.md):

* Unrolled slots: every value is an `(N,)` tensor, so inductor fuses the whole step
  into one vectorised loop over the envs. (With `(S, N)` blocks or reductions over the slot
  axis, inductor splits the step into several loops and stores bool intermediates.)
* Bool masks select by arithmetic (`x * keep` for `torch.where(keep, x, 0)`): the same
  integers, and on the CPU eager `torch.where` costs several times more than a multiply.
* One hash per step: `draw` gives the step's random outcomes, shared by the step and by the
  restart that NEXT_STEP autoreset applies to the same state.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
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


class Game(NamedTuple):
    """`FruitState` without key and counter, fruit slots unrolled: `fruit_x[s]` is slot s."""

    basket: torch.Tensor  # (N,) int32
    fruit_x: tuple[torch.Tensor, ...]  # S x (N,) int32
    fruit_y: tuple[torch.Tensor, ...]  # S x (N,) int32
    active: tuple[torch.Tensor, ...]  # S x (N,) bool
    score: torch.Tensor  # (N,) int32
    t: torch.Tensor  # (N,) int32
    caught: torch.Tensor  # (N,) int32
    missed: torch.Tensor  # (N,) int32

    @classmethod
    def of(cls, state: FruitState) -> Game:
        """The game part of a `FruitState` (views)."""
        return cls(
            state.basket,
            state.fruit_x.unbind(1),
            state.fruit_y.unbind(1),
            state.active.unbind(1),
            state.score,
            state.t,
            state.caught,
            state.missed,
        )

    def state(self, key: torch.Tensor, counter: torch.Tensor) -> FruitState:
        """The `FruitState` of this game with the given random key and counter."""
        return FruitState(
            self.basket,
            torch.stack(self.fruit_x, 1),
            torch.stack(self.fruit_y, 1),
            torch.stack(self.active, 1),
            self.score,
            self.t,
            self.caught,
            self.missed,
            key,
            counter,
        )


class StepResult(NamedTuple):
    """What one step of the rules reports besides the new state."""

    reward: torch.Tensor  # (N,) float32
    terminated: torch.Tensor  # (N,) bool, score reached win_score or lose_score
    truncated: torch.Tensor  # (N,) bool, t reached max_episode_steps


class Draw(NamedTuple):
    """The random outcomes of one counter value: one hash, two uses."""

    coin: torch.Tensor  # (N,) bool, the spawn_prob coin flip
    column: torch.Tensor  # (N,) int32, the column of a new fruit


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


def draw(params: FruitParams, key: torch.Tensor, counter: torch.Tensor) -> Draw:
    """The random outcomes of each sub-env's counter value."""
    bits = rng.draw(key, counter)
    return Draw(
        coin=rng.spawn_bits(bits) < params.spawn_threshold,
        column=rng.column(bits, params.width).to(torch.int32),
    )


def advance(
    params: FruitParams, game: Game, action: torch.Tensor, rand: Draw
) -> tuple[Game, StepResult]:
    """One step of every game. `action`: integer tensor of 0/1/2 (left/stay/right); `rand`:
    the draw of the game's current counter (which the caller advances)."""
    height = params.height
    basket = (game.basket + action.to(torch.int32) - 1).clamp(0, params.max_basket_x)
    basket_end = basket + params.basket_width

    fall_y, falling, landed, caught, too_high = [], [], [], [], []
    for x, y, active in zip(game.fruit_x, game.fruit_y, game.active, strict=True):
        y = y + active  # active fruits drop one row
        lands = active & (y >= height - 1)
        stays = active ^ lands  # lands implies active
        fall_y.append(y)
        falling.append(stays)
        landed.append(lands)
        caught.append(lands & (x >= basket) & (x < basket_end))
        too_high.append(stays & (y < params.min_spawn_gap))  # blocks a spawn_prob spawn
    n_caught = _count(caught)
    n_missed = _count(landed) - n_caught
    reward = n_caught - n_missed

    count = _count(falling)
    spawn = (count < params.min_fruits) | (
        (count < params.max_fruits) & ~_any(too_high) & rand.coin
    )
    fruit_x, fruit_y, active = [], [], []
    for x, y, stays in zip(game.fruit_x, fall_y, falling, strict=True):
        new = spawn & ~stays  # the new fruit, if any, takes the first free slot
        spawn = spawn & stays
        fruit_x.append(x * stays + rand.column * new)
        fruit_y.append(y * stays)
        active.append(stays | new)

    score = game.score + reward
    t = game.t + 1
    new_game = Game(
        basket=basket,
        fruit_x=tuple(fruit_x),
        fruit_y=tuple(fruit_y),
        active=tuple(active),
        score=score,
        t=t,
        caught=game.caught + n_caught,
        missed=game.missed + n_missed,
    )
    result = StepResult(
        reward=reward.to(torch.float32),
        terminated=(score >= params.win_score) | (score <= params.lose_score),
        truncated=t >= params.max_episode_steps,
    )
    return new_game, result


def restart(params: FruitParams, game: Game, mask: torch.Tensor, rand: Draw) -> Game:
    """`game` where `mask` is false; a new game where it is true: basket centred, one fruit in
    row 0 of slot 0 at `rand.column`."""
    keep = ~mask
    (x0, *xs), (a0, *actives) = game.fruit_x, game.active
    return Game(
        basket=game.basket + (params.max_basket_x // 2 - game.basket) * mask,
        fruit_x=(x0 * keep + rand.column * mask, *(x * keep for x in xs)),
        fruit_y=tuple(y * keep for y in game.fruit_y),
        active=(a0 & keep | mask, *(a & keep for a in actives)),
        score=game.score * keep,
        t=game.t * keep,
        caught=game.caught * keep,
        missed=game.missed * keep,
    )


def features(params: FruitParams, game: Game) -> torch.Tensor:
    """float32 `(N, 1 + 3*max_fruits)`: basket centre, then (x, y, active) per slot, in [0, 1].

    The basket centre and fruit columns share one scale, so "fruit above basket" is equality.
    Divisions (not multiplications by a reciprocal) keep results bit-identical to numpy's.
    """
    x_max, y_max = params.width - 1, params.height - 1
    columns = [(game.basket.to(torch.float32) + (params.basket_width - 1) / 2) / x_max]
    for x, y, active in zip(game.fruit_x, game.fruit_y, game.active, strict=True):
        columns += [x / x_max, y / y_max, active.to(torch.float32)]
    if torch.compiler.is_compiling() or game.basket.device.type != "cpu":
        # Compiled, inductor writes each column inside the fused loop; on a GPU one kernel
        # beats a launch per column. (Decided while tracing: no branch in compiled code.)
        return torch.stack(columns, 1)
    # CPU eager: copying the columns into one buffer is ~2.5x faster than torch.stack.
    obs = columns[0].new_empty((len(game.basket), len(columns)))
    for i, column in enumerate(columns):
        obs[:, i] = column
    return obs


def pixels(params: FruitParams, game: Game) -> torch.Tensor:
    """uint8 `(N, 1, height, width)`: fruit 255, basket 128, empty 0."""
    device = game.basket.device
    rows = torch.arange(params.height, device=device).view(1, -1, 1)
    cols = torch.arange(params.width, device=device).view(1, 1, -1)
    fruit = _any(
        [
            active.view(-1, 1, 1) & (y.view(-1, 1, 1) == rows) & (x.view(-1, 1, 1) == cols)
            for x, y, active in zip(game.fruit_x, game.fruit_y, game.active, strict=True)
        ]
    )
    left = game.basket.view(-1, 1, 1)
    basket = (rows == params.height - 1) & (cols >= left) & (cols < left + params.basket_width)
    image = torch.where(fruit, FRUIT_PIXEL, torch.where(basket, BASKET_PIXEL, 0))
    return image.to(torch.uint8)[:, None]


OBSERVERS = {"features": features, "pixels": pixels}


def _count(masks: Sequence[torch.Tensor]) -> torch.Tensor:
    """How many of the bool masks are true, per env (int32)."""
    first, *others = masks
    return functools.reduce(operator.add, others, first.to(torch.int32))


def _any(masks: Sequence[torch.Tensor]) -> torch.Tensor:
    return functools.reduce(operator.or_, masks)


# -- the same rules over `FruitState`, for analysis and tests ----------------------------------


def step(
    params: FruitParams, state: FruitState, action: torch.Tensor
) -> tuple[FruitState, StepResult]:
    """Advance every game by one step. `action` is an integer tensor of 0/1/2 (left/stay/right)."""
    game, result = advance(params, Game.of(state), action, draw(params, state.key, state.counter))
    return game.state(state.key, state.counter + 1), result


def reset(params: FruitParams, state: FruitState, mask: torch.Tensor) -> FruitState:
    """Start a new game where `mask` is true; other sub-envs keep their state.

    The fruit's column is drawn from the sub-env's current counter, which then advances.
    Keys are kept: reseeding is the caller's job.
    """
    game = restart(params, Game.of(state), mask, draw(params, state.key, state.counter))
    return game.state(state.key, state.counter + mask)


def observe_features(params: FruitParams, state: FruitState) -> torch.Tensor:
    """`features` of a `FruitState`."""
    return features(params, Game.of(state))


def observe_pixels(params: FruitParams, state: FruitState) -> torch.Tensor:
    """`pixels` of a `FruitState`."""
    return pixels(params, Game.of(state))
