"""MinAtar Space Invaders as a `TensorGame`: the rules module's pure functions, handed to the kit.

The rules (`rules.py`) are gymnax's and are tested against gymnax; this module only says what
the kit needs besides them: the spaces, the time limit, the episode statistics and the
pictures. The observation is gymnax's float32 `(10, 10, 6)` Box, so that a trainer builds
for it the network it builds for `gymnax:SpaceInvaders-MinAtar` (a bool Box of planes would
be an image to a trainer that encodes images with a CNN).
"""

from __future__ import annotations

from typing import Any

import torch

from fruit_env.games.minatar_game import MinAtarGame
from fruit_env.games.minatar_pictures import Palette
from fruit_env.games.minatar_space_invaders import rules
from fruit_env.games.minatar_space_invaders.rules import SpaceInvadersState
from fruit_env.kit import Step

# RGB and text of each observation plane: cannon, alien (drawn through the next two), alien
# marching left, alien marching right, the cannon's bullet, an alien's bullet.
COLOURS = (
    (200, 160, 60),
    (120, 200, 90),
    (120, 200, 90),
    (90, 200, 170),
    (240, 240, 240),
    (230, 60, 50),
)
GLYPHS = "^M<>|!"
# Where planes share a cell, the first of these shows: the alien (by its march's direction),
# the cannon, an alien's bullet, the cannon's bullet.
_PRIORITY = (2, 3, 0, 5, 4)
PALETTE = Palette(COLOURS, GLYPHS, _PRIORITY)


class MinAtarSpaceInvaders(MinAtarGame[SpaceInvadersState]):
    """gymnax's `SpaceInvaders-MinAtar`: actions 0 no-op, 1 left, 2 right, 3 fire; +1 per
    alien shot; the game ends when an alien or an alien's bullet reaches the cannon, and is
    truncated after `max_episode_steps` steps (gymnax's `max_steps_in_episode`, 1000 by
    default). Every game starts the same way: the kit's random bits decide nothing."""

    num_actions = rules.NUM_ACTIONS
    obs_shape = rules.OBS_SHAPE

    def __init__(self, max_episode_steps: int = rules.MAX_STEPS_IN_EPISODE) -> None:
        super().__init__(max_episode_steps)

    def initial(self, bits: torch.Tensor) -> SpaceInvadersState:
        return rules.initial_state(bits)

    def advance(self, state: SpaceInvadersState, action: torch.Tensor, bits: torch.Tensor) -> Step:
        new, reward, terminal = rules.advance(state, action)
        return Step(new, reward, terminal, rules.truncated(new, self.max_episode_steps))

    def restart(
        self, state: SpaceInvadersState, mask: torch.Tensor, bits: torch.Tensor
    ) -> SpaceInvadersState:
        """`TensorGame.restart` (`initial` where `mask` holds) in fewer kernels: every new
        game is the same, so each field takes a constant (a fill, not a new game and a
        select). New tensors, not writes into `state`: a state made under
        `torch.inference_mode()` cannot be written outside it."""
        rows = mask[:, None]
        block = rules.start_block(mask.device)
        return SpaceInvadersState(
            pos=state.pos.masked_fill(mask, rules.START_POS),
            f_bullets=state.f_bullets.masked_fill(rows, 0),
            e_bullets=state.e_bullets.masked_fill(rows, 0),
            aliens=torch.where(rows, block, state.aliens),
            alien_dir=state.alien_dir.masked_fill(mask, rules.START_DIR),
            enemy_move_interval=state.enemy_move_interval.masked_fill(
                mask, rules.ENEMY_MOVE_INTERVAL
            ),
            alien_move_timer=state.alien_move_timer.masked_fill(mask, rules.ENEMY_MOVE_INTERVAL),
            alien_shot_timer=state.alien_shot_timer.masked_fill(mask, rules.ENEMY_SHOT_INTERVAL),
            ramp_index=state.ramp_index.masked_fill(mask, 0),
            shot_timer=state.shot_timer.masked_fill(mask, 0),
            ramping=state.ramping.masked_fill(mask, True),
            time=state.time.masked_fill(mask, 0),
            terminal=state.terminal.masked_fill(mask, False),
            score=state.score.masked_fill(mask, 0),
        )

    def observe(self, state: SpaceInvadersState) -> torch.Tensor:
        return rules.observe(state, torch.float32)

    def episode(self, state: SpaceInvadersState) -> tuple[torch.Tensor, ...]:
        return rules.episode(state)

    def render(self, state: SpaceInvadersState, mode: str) -> list[Any]:
        planes = rules.observe(state).cpu().numpy()  # (N, 10, 10, C) bool
        return PALETTE.render(planes, state.score.tolist(), state.time.tolist(), mode)
