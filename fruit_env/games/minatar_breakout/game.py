"""MinAtar Breakout as a `TensorGame`: the rules module's pure functions, handed to the kit.

The rules (`rules.py`) are gymnax's and are tested against gymnax; this module only says what
the kit needs besides them: the spaces, the time limit, the episode statistics and the
pictures. The observation is gymnax's float32 `(10, 10, 4)` Box, so that a trainer builds
for it the network it builds for `gymnax:Breakout-MinAtar` (a bool Box of planes would be
an image to a trainer that encodes images with a CNN).
"""

from __future__ import annotations

from typing import Any

import torch

from fruit_env.games.minatar_breakout import rules
from fruit_env.games.minatar_breakout.rules import BreakoutState
from fruit_env.games.minatar_game import MinAtarGame
from fruit_env.games.minatar_pictures import Palette
from fruit_env.kit import Step

COLOURS = ((200, 160, 60), (230, 60, 50), (120, 40, 40), (80, 140, 220))  # RGB of each plane
GLYPHS = "=o.#"  # paddle, ball, trail, brick
# Where planes share a cell (the ball starts inside the wall, over its trail), the first of
# these shows: ball, trail, paddle, brick.
_PRIORITY = (1, 2, 0, 3)
PALETTE = Palette(COLOURS, GLYPHS, _PRIORITY)


class MinAtarBreakout(MinAtarGame[BreakoutState]):
    """gymnax's `Breakout-MinAtar`: actions 0 no-op, 1 left, 2 right; +1 per brick; the game
    ends when the ball passes the paddle, and is truncated after `max_episode_steps` steps
    (gymnax's `max_steps_in_episode`, 1000 by default)."""

    num_actions = rules.NUM_ACTIONS
    obs_shape = rules.OBS_SHAPE

    def __init__(self, max_episode_steps: int = rules.MAX_STEPS_IN_EPISODE) -> None:
        super().__init__(max_episode_steps)

    def initial(self, bits: torch.Tensor) -> BreakoutState:
        return rules.initial_state(bits)

    def advance(self, state: BreakoutState, action: torch.Tensor, bits: torch.Tensor) -> Step:
        new, reward, terminal = rules.advance(state, action)
        # `terminal` is also a field of the new state: the kit hands out a tensor of its own.
        return Step(new, reward, terminal.clone(), rules.truncated(new, self.max_episode_steps))

    def restart(
        self, state: BreakoutState, mask: torch.Tensor, bits: torch.Tensor
    ) -> BreakoutState:
        """`TensorGame.restart` (`initial` where `mask` holds) in fewer kernels: a new game
        differs from another only in the ball's side, one bit, so most fields take a constant
        (a fill, not a new game and a select). New tensors, not writes into `state`: a state
        made under `torch.inference_mode()` cannot be written outside it."""
        right = (bits & 1).to(torch.int32)
        column = right * rules.BOTTOM
        return BreakoutState(
            ball_y=state.ball_y.masked_fill(mask, rules.START_ROW),
            ball_x=torch.where(mask, column, state.ball_x),
            ball_dir=torch.where(mask, right + 2, state.ball_dir),
            pos=state.pos.masked_fill(mask, rules.START_PADDLE),
            bricks=state.bricks.masked_fill(mask, rules.FULL_WALL),
            strike=state.strike.masked_fill(mask, False),
            last_y=state.last_y.masked_fill(mask, rules.START_ROW),
            last_x=torch.where(mask, column, state.last_x),
            time=state.time.masked_fill(mask, 0),
            terminal=state.terminal.masked_fill(mask, False),
            score=state.score.masked_fill(mask, 0),
        )

    def observe(self, state: BreakoutState) -> torch.Tensor:
        return rules.observe(state, torch.float32)

    def episode(self, state: BreakoutState) -> tuple[torch.Tensor, ...]:
        return rules.episode(state)

    def render(self, state: BreakoutState, mode: str) -> list[Any]:
        planes = rules.observe(state).cpu().numpy()  # (N, 10, 10, C) bool
        return PALETTE.render(planes, state.score.tolist(), state.time.tolist(), mode)
