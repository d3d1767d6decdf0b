"""MinAtar Freeway as a `TensorGame`: the rules module's pure functions, handed to the kit.

The rules (`rules.py`) are gymnax's and are tested against gymnax; this module only says what
the kit needs besides them: the spaces, the time limit, the episode statistics and the
pictures. The observation is gymnax's float32 `(10, 10, 7)` Box, so that a trainer builds
for it the network it builds for `gymnax:Freeway-MinAtar` (a bool Box of planes would be
an image to a trainer that encodes images with a CNN).
"""

from __future__ import annotations

from typing import Any

import torch

from fruit_env.games.minatar_freeway import rules
from fruit_env.games.minatar_freeway.rules import FreewayState
from fruit_env.games.minatar_game import MinAtarGame
from fruit_env.games.minatar_pictures import Palette
from fruit_env.kit import Step

CHICKEN, CAR = (240, 220, 60), (230, 60, 50)  # RGB of planes 0 and 1
TRAILS = tuple((60 + 30 * s, 90 + 25 * s, 160 + 15 * s) for s in range(1, 6))  # speeds 1..5
COLOURS = (CHICKEN, CAR, *TRAILS)  # RGB of each plane
GLYPHS = "@#12345"  # chicken, car, then a trail shows its car's speed
# Where planes share a cell, the first of these shows: the chicken, a car, a trail.
_PRIORITY = tuple(range(rules.OBS_SHAPE[2]))
PALETTE = Palette(COLOURS, GLYPHS, _PRIORITY)


class MinAtarFreeway(MinAtarGame[FreewayState]):
    """gymnax's `Freeway-MinAtar`: actions 0 no-op, 1 up, 2 down; +1 per crossing; the game
    never ends by itself and is truncated after `max_episode_steps` steps (gymnax's
    `max_steps_in_episode`, 2500 by default)."""

    num_actions = rules.NUM_ACTIONS
    obs_shape = rules.OBS_SHAPE

    def __init__(self, max_episode_steps: int = rules.MAX_STEPS_IN_EPISODE) -> None:
        super().__init__(max_episode_steps)

    def initial(self, bits: torch.Tensor) -> FreewayState:
        return rules.initial_state(bits)

    def advance(self, state: FreewayState, action: torch.Tensor, bits: torch.Tensor) -> Step:
        new, reward, terminated = rules.advance(state, action, bits)
        return Step(new, reward, terminated, rules.truncated(new, self.max_episode_steps))

    def observe(self, state: FreewayState) -> torch.Tensor:
        return rules.observe(state, torch.float32)

    def episode(self, state: FreewayState) -> tuple[torch.Tensor, ...]:
        return rules.episode(state)

    def render(self, state: FreewayState, mode: str) -> list[Any]:
        planes = rules.observe(state).cpu().numpy()  # (N, 10, 10, C) bool
        return PALETTE.render(planes, state.score.tolist(), state.time.tolist(), mode)
