"""The step of a vector env for each autoreset mode, written once for every game.

Each mode is a function of the game, the running state, the random keys and counters and the
actions, with one signature (`STEPS`, the one table of modes), so that the env calls it with
no mode flag and it compiles as a single graph (`compiled.py`). The game only says what one
step does (`TensorGame.advance`) and what a new game is (`restart`); when a game starts again
is decided here, as Gymnasium defines the modes (docs/env.md, "Autoreset modes").

Randomness: a step draws once per sub-env from its counter, which then advances by one. A
NEXT_STEP restart uses the step's own draw; a SAME_STEP restart draws from the next counter
value; a reset draws from the current one. So a sub-env's game depends only on its key, its
counter and its actions.

A state is used only before the call that replaces it, so a game's faster form may restart
in place. The counters advance in place, and the reward a game's step returns is masked in
place (a game returns fresh tensors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from gymnasium.vector import AutoresetMode

from fruit_env.kit import actions, rng
from fruit_env.kit.game import TensorGame
from fruit_env.kit.layout import Layout, Packed

Draw = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (key, counter) -> random bits


class Running(NamedTuple):
    """The state of the games in play, and the sub-envs whose episode ended on the last step
    (NEXT_STEP restarts them on the next one; always false in the other modes)."""

    game: Any  # the game's state
    pending: torch.Tensor  # (N,) bool


class Transition(NamedTuple):
    """Everything one vector step produces."""

    running: Running  # the next state
    counter: torch.Tensor  # (N,) int64, the next random-draw counters (the same tensor)
    obs: torch.Tensor
    reward: torch.Tensor  # (N,) float32
    terminated: torch.Tensor  # (N,) bool
    truncated: torch.Tensor  # (N,) bool
    ended: torch.Tensor  # (N,) bool: the `_episode` mask
    episode: tuple[torch.Tensor, ...]  # the statistics of the episode as it stands (or ended)
    final_obs: torch.Tensor | None  # SAME_STEP only: the last observation of ended episodes


def next_step(
    game: TensorGame[Any],
    draw: Draw,
    running: Running,
    key: torch.Tensor,
    counter: torch.Tensor,
    action: torch.Tensor,
) -> Transition:
    """NEXT_STEP: sub-envs whose episode ended last step restart now and ignore their action
    (reward 0, both flags false)."""
    bits = draw(key, counter)
    step = game.advance(running.game, action, bits)
    episode = game.episode(step.state)
    pending = running.pending
    new = game.restart(step.state, pending, bits)
    # A flag counts where the sub-env was playing (True > False: the flag, and not pending).
    terminated, truncated = step.terminated > pending, step.truncated > pending
    ended = terminated | truncated
    reward = step.reward.masked_fill_(pending, 0.0)
    running = Running(new, ended.clone())  # `ended` is handed out: the env keeps a copy
    return Transition(
        running, counter.add_(1), game.observe(new), reward, terminated, truncated, ended,
        episode, None,
    )  # fmt: skip


def same_step(
    game: TensorGame[Any],
    draw: Draw,
    running: Running,
    key: torch.Tensor,
    counter: torch.Tensor,
    action: torch.Tensor,
) -> Transition:
    """SAME_STEP: an episode that ends restarts at once, from the next counter value; its last
    observation goes to `final_obs`."""
    step = game.advance(running.game, action, draw(key, counter))
    episode = game.episode(step.state)
    ended = step.terminated | step.truncated
    final_obs = game.observe(step.state)
    new = game.restart(step.state, ended, draw(key, counter + 1))
    return Transition(
        Running(new, running.pending), counter.add_(1).add_(ended), game.observe(new),
        step.reward, step.terminated, step.truncated, ended, episode, final_obs,
    )  # fmt: skip


def disabled(
    game: TensorGame[Any],
    draw: Draw,
    running: Running,
    key: torch.Tensor,
    counter: torch.Tensor,
    action: torch.Tensor,
) -> Transition:
    """DISABLED: no restarts; the caller resets ended sub-envs with a `reset_mask`."""
    step = game.advance(running.game, action, draw(key, counter))
    episode = game.episode(step.state)
    ended = step.terminated | step.truncated
    return Transition(
        Running(step.state, running.pending), counter.add_(1), game.observe(step.state),
        step.reward, step.terminated, step.truncated, ended, episode, None,
    )  # fmt: skip


STEPS = {
    AutoresetMode.NEXT_STEP: next_step,
    AutoresetMode.SAME_STEP: same_step,
    AutoresetMode.DISABLED: disabled,
}


def reset(
    game: TensorGame[Any],
    draw: Draw,
    running: Running,
    key: torch.Tensor,
    counter: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[Running, torch.Tensor]:
    """A new game where `mask` is true, drawn from the current counter (which advances
    there, in place); a pending NEXT_STEP restart of those sub-envs is dropped."""
    new = game.restart(running.game, mask, draw(key, counter))
    return Running(new, running.pending & ~mask), counter.add_(mask)


class EagerStepper:
    """The mode's step and the reset, run eagerly on one form of a game: the game itself, or
    its faster eager form (`TensorGame.eager_form`), whose states are `Packed`. A state of
    the other form (planted, restored) is converted through the layout first."""

    def __init__(self, form: TensorGame[Any], layout: Layout, mode: AutoresetMode) -> None:
        self.form, self.layout, self._step = form, layout, STEPS[mode]
        self._draw = rng.EagerDraw()

    def step(
        self, running: Running, key: torch.Tensor, counter: torch.Tensor, action: torch.Tensor
    ) -> Transition:
        """The mode's step; `action` in range, of any integer dtype (the game gets int32)."""
        action = action.to(torch.int32)
        return self._step(self.form, self._draw, self._adopt(running), key, counter, action)

    def unchecked(self, num_actions: int) -> actions.ActionCheck:
        """The action check of `validate_actions=False`: a clamp."""
        return actions.Clamp(num_actions)

    def reset(
        self, running: Running, key: torch.Tensor, counter: torch.Tensor, mask: torch.Tensor
    ) -> tuple[Running, torch.Tensor]:
        return reset(self.form, self._draw, self._adopt(running), key, counter, mask)

    def observe(self, running: Running) -> torch.Tensor:
        return self.form.observe(self._adopt(running).game)

    def _adopt(self, running: Running) -> Running:
        is_packed = isinstance(running.game, Packed)
        if is_packed == self.form.packed_state:
            return running
        state = running.game
        game = self.layout.state(state) if is_packed else Packed(self.layout.pack(state).T)
        return running._replace(game=game)
