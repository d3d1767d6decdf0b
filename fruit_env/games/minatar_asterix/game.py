"""MinAtar Asterix as a `TensorGame`: the rules module's pure functions, handed to the kit.

The rules (`rules.py`) are gymnax's and are tested against gymnax; this module only says what
the kit needs besides them: the spaces, the time limit, the episode statistics and the
pictures. The observation is gymnax's float32 `(10, 10, 4)` Box, so that a trainer builds
for it the network it builds for `gymnax:Asterix-MinAtar` (a bool Box of planes would be
an image to a trainer that encodes images with a CNN).
"""

from __future__ import annotations

from typing import Any

import torch

from fruit_env.games.minatar_asterix import rules
from fruit_env.games.minatar_asterix.rules import AsterixState
from fruit_env.games.minatar_game import MinAtarGame
from fruit_env.games.minatar_pictures import Palette
from fruit_env.kit import Step

COLOURS = ((240, 200, 60), (230, 60, 50), (90, 60, 110), (250, 230, 120))  # RGB of each plane
GLYPHS = "AX.$"  # player, enemy, trail, gold
# Where planes share a cell (an enemy on the player ends the game), the first of these
# shows: enemy, player, gold, trail.
_PRIORITY = (1, 0, 3, 2)
PALETTE = Palette(COLOURS, GLYPHS, _PRIORITY)


class MinAtarAsterix(MinAtarGame[AsterixState]):
    """gymnax's `Asterix-MinAtar`: actions 0 no-op, 1 left, 2 up, 3 right, 4 down; +1 per
    gold; the game ends when the player meets an enemy, and is truncated after
    `max_episode_steps` steps (gymnax's `max_steps_in_episode`, 1000 by default)."""

    num_actions = rules.NUM_ACTIONS
    obs_shape = rules.OBS_SHAPE

    def __init__(self, max_episode_steps: int = rules.MAX_STEPS_IN_EPISODE) -> None:
        super().__init__(max_episode_steps)

    def initial(self, bits: torch.Tensor) -> AsterixState:
        return rules.initial_state(bits)

    def advance(self, state: AsterixState, action: torch.Tensor, bits: torch.Tensor) -> Step:
        new, reward, terminal = rules.advance(state, action, bits)
        # `terminal` is also a field of the new state: the kit hands out a tensor of its own.
        return Step(new, reward, terminal.clone(), rules.truncated(new, self.max_episode_steps))

    def restart(self, state: AsterixState, mask: torch.Tensor, bits: torch.Tensor) -> AsterixState:
        """`TensorGame.restart` (`initial` where `mask` holds) in fewer kernels: every new
        game is the same, so each field takes a constant (a fill, not a new game and a
        select). New tensors, not writes into `state`: a state made under
        `torch.inference_mode()` cannot be written outside it."""
        rows = mask[:, None]
        return AsterixState(
            player_x=state.player_x.masked_fill(mask, rules.START),
            player_y=state.player_y.masked_fill(mask, rules.START),
            spawn_speed=state.spawn_speed.masked_fill(mask, rules.INIT_SPAWN_SPEED),
            spawn_timer=state.spawn_timer.masked_fill(mask, rules.INIT_SPAWN_SPEED),
            move_speed=state.move_speed.masked_fill(mask, rules.INIT_MOVE_INTERVAL),
            move_timer=state.move_timer.masked_fill(mask, rules.INIT_MOVE_INTERVAL),
            ramp_timer=state.ramp_timer.masked_fill(mask, rules.RAMP_INTERVAL),
            ramp_index=state.ramp_index.masked_fill(mask, 0),
            entity_x=state.entity_x.masked_fill(rows, 0),
            entity_right=state.entity_right.masked_fill(rows, False),
            entity_gold=state.entity_gold.masked_fill(rows, False),
            entity_on=state.entity_on.masked_fill(rows, False),
            time=state.time.masked_fill(mask, 0),
            terminal=state.terminal.masked_fill(mask, False),
            score=state.score.masked_fill(mask, 0),
        )

    def observe(self, state: AsterixState) -> torch.Tensor:
        return rules.observe(state, torch.float32)

    def episode(self, state: AsterixState) -> tuple[torch.Tensor, ...]:
        return rules.episode(state)

    def render(self, state: AsterixState, mode: str) -> list[Any]:
        planes = rules.observe(state).cpu().numpy()  # (N, 10, 10, C) bool
        return PALETTE.render(planes, state.score.tolist(), state.time.tolist(), mode)
