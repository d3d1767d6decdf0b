"""The game's rule outputs, checked once, on the env's first step.

A rule that returns the wrong kind of value (a Python float as the reward, an int64 reward,
fewer episode statistics than `episode_fields` names) would otherwise fail deep inside the
autoreset step with an error that names neither the rule nor the value, or pass silently and
hand a trainer the wrong dtype. So the first step plays the game's readable rules once on one
sub-env (its current state, action 0, zero random bits) and checks what each rule gave against
what `TensorGame` promises; every error names the rule (`MyGame.advance`) and what it
returned. After that the env steps with no check at all: `FirstStepCheck` replaces its own
`step` with the stepper's on first use, so later steps test no flag.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fruit_env.kit.autoreset import Running, Transition
from fruit_env.kit.game import TensorGame
from fruit_env.kit.layout import Layout


class FirstStepCheck:
    """A stepper (`EagerStepper` or `CompiledStepper`) whose first `step` checks the rules."""

    def __init__(self, stepper: Any, game: TensorGame[Any], layout: Layout) -> None:
        self.stepper, self.game, self.layout = stepper, game, layout
        self.reset, self.observe, self.unchecked = stepper.reset, stepper.observe, stepper.unchecked

    def step(
        self, running: Running, key: torch.Tensor, counter: torch.Tensor, action: torch.Tensor
    ) -> Transition:
        check_rules(self.game, self.layout, running.game)
        self.step = self.stepper.step  # type: ignore[method-assign]  # no check from now on
        return self.stepper.step(running, key, counter, action)


def check_rules(game: TensorGame[Any], layout: Layout, state: Any) -> None:
    """Play `advance`, `episode` and `observe` once on sub-env 0 of `state` (any form), and
    raise a `TypeError` naming the rule and its output where one breaks `TensorGame`'s
    promise. `state` is not changed: the rules play on a copy."""
    one = layout.unpack(layout.pack(state)[:, :1].clone())
    device = layout.pack(state).device
    action = torch.zeros(1, dtype=torch.int32, device=device)
    bits = torch.zeros(1, dtype=torch.int64, device=device)
    name = type(game).__qualname__
    step = game.advance(one, action, bits)
    if not isinstance(step, tuple) or len(step) != 4:
        raise TypeError(
            f"{name}.advance must return a Step(state, reward, terminated, truncated), "
            f"got {_shown(step)}"
        )
    _, reward, terminated, truncated = step
    _expect(f"{name}.advance", "reward", reward, torch.float32)
    _expect(f"{name}.advance", "terminated", terminated, torch.bool)
    _expect(f"{name}.advance", "truncated", truncated, torch.bool)
    _check_episode(game, name, game.episode(step[0]))
    _check_observation(game, name, game.observe(step[0]))


def _check_episode(game: TensorGame[Any], name: str, values: Any) -> None:
    fields = tuple(game.episode_fields)
    if not isinstance(values, (tuple, list)) or len(values) != len(fields):
        count = f"{len(values)} values" if isinstance(values, (tuple, list)) else _shown(values)
        raise TypeError(
            f"{name}.episode returned {count} for the {len(fields)} episode_fields {fields}: "
            "it must return one (num_envs,) tensor per name"
        )
    for field, value in zip(fields, values, strict=True):
        wanted = torch.float32 if field == "r" else None  # the return; the others any dtype
        _expect(f"{name}.episode", f"episode field {field!r}", value, wanted)


def _check_observation(game: TensorGame[Any], name: str, obs: Any) -> None:
    space = game.observation_space
    shape = (1, *(space.shape or ()))
    if not isinstance(obs, torch.Tensor) or tuple(obs.shape) != shape:
        raise TypeError(
            f"{name}.observe returned {_shown(obs)}; it must return a (num_envs, "
            f"*observation_space.shape) tensor: here {shape} for one sub-env"
        )
    if space.dtype is not None and obs.dtype != _torch_dtype(space.dtype):
        raise TypeError(
            f"{name}.observe returned {_shown(obs)} as the observation, but observation_space has "
            f"dtype {np.dtype(space.dtype)}: convert it in observe, or declare the space's dtype"
        )


def _expect(rule: str, what: str, value: Any, dtype: torch.dtype | None) -> None:
    """`value` must be a `(1,)` tensor (of `dtype`, if given)."""
    need = f"a (num_envs,) {_name(dtype) + ' ' if dtype else ''}tensor"
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != (1,):
        raise TypeError(f"{rule} returned {_shown(value)} as the {what}; it must be {need}")
    if dtype is not None and value.dtype != dtype:
        raise TypeError(
            f"{rule} returned {_shown(value)} as the {what}; it must be {need} (convert it "
            f"with .to(torch.{_name(dtype)}))"
        )


def _shown(value: Any) -> str:
    """A short description of a rule's output, for an error."""
    if isinstance(value, torch.Tensor):
        dtype = _name(value.dtype)
        return (
            f"{'an' if dtype[0] in 'aeiou' else 'a'} {dtype} tensor of shape {tuple(value.shape)}"
        )
    text = repr(value)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} (a {type(value).__name__})"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _torch_dtype(dtype: Any) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
