"""`FruitCatcherVectorEnv`: Fruit Catcher on the kit, what `make_vec("FruitCatcher-v0")` gives.

The kit does the vector env; this module only turns the rules' keyword arguments into a game
and keeps the names this env has always had: `params`, and `state` with the random keys and
counters alongside the board.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from gymnasium.vector import AutoresetMode

from fruit_env.games.fruit_catcher.params import FruitParams
from fruit_env.games.fruit_catcher.rules import Board, FruitCatcher
from fruit_env.kit import TensorVectorEnv


class FruitState(NamedTuple):
    """The whole state of `num_envs` games: the board, then the sub-envs' randomness."""

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

    @property
    def board(self) -> Board:
        """The board, its fruit slots unrolled as the rules keep them."""
        return Board(
            self.basket,
            self.fruit_x.unbind(1),
            self.fruit_y.unbind(1),
            self.active.unbind(1),
            self.score,
            self.t,
            self.caught,
            self.missed,
        )

    @classmethod
    def of(cls, board: Board, key: torch.Tensor, counter: torch.Tensor) -> FruitState:
        """The board with its fruit slots stacked into `(N, S)` tensors, and the randomness."""
        slots = (torch.stack(field, 1) for field in (board.fruit_x, board.fruit_y, board.active))
        return cls(board.basket, *slots, board.score, board.t, board.caught, board.missed,
                   key, counter)  # fmt: skip


class FruitCatcherVectorEnv(TensorVectorEnv):
    """`num_envs` Fruit Catcher games stepped together as torch tensors on one device.

    Rules arguments (`width`, `height`, ...) are those of `FruitParams`; the others are the
    kit's (`TensorVectorEnv`): `device`, `autoreset_mode`, `render_mode`, `validate_actions`
    and `compile`.
    """

    def __init__(
        self,
        num_envs: int,
        *,
        device: str | torch.device = "cpu",
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        render_mode: str | None = None,
        validate_actions: bool | str = True,
        compile: bool | str = "auto",
        **rules: Any,
    ) -> None:
        self.params = FruitParams(**rules)
        super().__init__(
            FruitCatcher(self.params),
            num_envs,
            device=device,
            autoreset_mode=autoreset_mode,
            render_mode=render_mode,
            validate_actions=validate_actions,
            compile=compile,
        )

    @property
    def state(self) -> FruitState:
        """A copy of the current game state and randomness (for analysis and tests)."""
        return FruitState.of(self.game_state, self._key.clone(), self._counter.clone())

    @state.setter
    def state(self, state: FruitState) -> None:
        """Plant a game state (for analysis and tests: a scenario built by hand). Pending
        NEXT_STEP restarts stay; the state must be one the rules can reach."""
        self.game_state = state.board
        self._key, self._counter = state.key.clone(), state.counter.clone()
