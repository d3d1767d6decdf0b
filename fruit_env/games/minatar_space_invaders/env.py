"""`SpaceInvadersVectorEnv`: MinAtar Space Invaders on the kit, what
`make_vec("SpaceInvaders-MinAtar-v0")` gives.

A class rather than a function, so that a caller that reads a vector entry point's
`metadata` (a trainer's `fast_kwargs`) and its signature (`device`) finds the kit's.
"""

from __future__ import annotations

import torch
from gymnasium.vector import AutoresetMode

from fruit_env.games.minatar_space_invaders.game import MinAtarSpaceInvaders
from fruit_env.games.minatar_space_invaders.rules import MAX_STEPS_IN_EPISODE
from fruit_env.kit import TensorVectorEnv


class SpaceInvadersVectorEnv(TensorVectorEnv):
    """`num_envs` MinAtar Space Invaders games (gymnax's rules) stepped together as torch
    tensors on one device. `max_episode_steps`: the time limit (gymnax's 1000 by default);
    the other arguments are the kit's (`TensorVectorEnv`)."""

    def __init__(
        self,
        num_envs: int,
        *,
        device: str | torch.device = "cpu",
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        render_mode: str | None = None,
        validate_actions: bool | str = True,
        compile: bool | str = "auto",
        max_episode_steps: int = MAX_STEPS_IN_EPISODE,
    ) -> None:
        super().__init__(
            MinAtarSpaceInvaders(max_episode_steps),
            num_envs,
            device=device,
            autoreset_mode=autoreset_mode,
            render_mode=render_mode,
            validate_actions=validate_actions,
            compile=compile,
        )
