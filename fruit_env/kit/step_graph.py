"""The kit's step as one function of tensors, written in place: what a compiled package is
exported from, what its proof plays against, and what a CUDA graph captures.

Its inputs are the game's packed rows with the pending row (`layout.py`), the keys, the
counters and the actions: one int32 tensor for the state, none of them bool, the rows and
counters rewritten in place. So a caller can hold the state in buffers of fixed address,
which a package's boxed call and a CUDA graph's replay both need.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from gymnasium.vector import AutoresetMode

from fruit_env.kit import actions, rng
from fruit_env.kit.autoreset import STEPS, EagerStepper, Running, Transition
from fruit_env.kit.game import TensorGame
from fruit_env.kit.layout import Layout


class StepGraph(torch.nn.Module):
    """The mode's step as a module for `torch.export`: the next rows and counters written
    into the inputs, the other outputs as a flat tuple of tensors (flags as int32 rows)."""

    def __init__(self, game: TensorGame[Any], layout: Layout, mode: AutoresetMode) -> None:
        super().__init__()
        self.game, self.layout, self.step = game, layout, STEPS[mode]

    def forward(
        self, rows: torch.Tensor, key: torch.Tensor, counter: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        running = Running(self.layout.unpack(rows[:-1]), rows[-1] != 0)
        action = action.clamp(0, self.game.num_actions - 1).to(torch.int32)
        t = self.step(self.game, rng.draw, running, key, counter, action)  # counter in place
        pending = t.running.pending.to(torch.int32)[None]
        rows.copy_(torch.cat([*self.layout.blocks(t.running.game), pending]))
        flags = torch.stack([flag.to(torch.int32) for flag in (t.terminated, t.truncated, t.ended)])
        out = (t.obs, t.reward, flags, *t.episode)
        return out if t.final_obs is None else (*out, t.final_obs)


class GraphStepper:
    """What a stepper that runs the step graph (a package's, or one captured in a CUDA
    graph) shares: resets, and the observations they give, run eagerly (`eager`); the
    graph's flat outputs become a `Transition` one way (`_transition`); the graph clamps
    actions, so `validate_actions=False` checks none."""

    def __init__(
        self, game: TensorGame[Any], layout: Layout, mode: AutoresetMode, eager: EagerStepper
    ) -> None:
        self.game, self.layout, self._eager = game, layout, eager
        self._same_step = mode == AutoresetMode.SAME_STEP
        self._next_step = mode == AutoresetMode.NEXT_STEP

    def _transition(
        self, out: Sequence[torch.Tensor], state: Any, running: Running, counter: torch.Tensor
    ) -> Transition:
        """`StepGraph`'s outputs as the step's `Transition`, the next game state `state`."""
        # One tensor per flag (not views of one): DLPack consumers such as JAX copy those.
        terminated, truncated, ended = (flag.to(torch.bool) for flag in out[2])
        episode = tuple(out[3 : 3 + len(self.game.episode_fields)])
        final_obs = out[-1] if self._same_step else None
        # Pending restarts: NEXT_STEP's are the episodes that just ended (a copy: `ended` is
        # handed out); the other modes have none.
        pending = ended.clone() if self._next_step else running.pending
        return Transition(
            Running(state, pending),
            counter,
            out[0],
            out[1],
            terminated,
            truncated,
            ended,
            episode,
            final_obs,
        )

    def reset(
        self, running: Running, key: torch.Tensor, counter: torch.Tensor, mask: torch.Tensor
    ) -> tuple[Running, torch.Tensor]:
        return self._eager.reset(running, key, counter, mask)

    def unchecked(self, num_actions: int) -> actions.ActionCheck:
        """The action check of `validate_actions=False`: none (the graph clamps)."""
        return actions.NoCheck()

    def observe(self, running: Running) -> torch.Tensor:
        return self._eager.observe(running)
