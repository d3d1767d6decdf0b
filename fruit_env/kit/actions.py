"""What a step does with actions outside `0 .. num_actions - 1`: one check per
`validate_actions` setting, chosen when it is set, so that the env's `step` tests no flag.

Reading a value back from a GPU costs a sync, so the check comes in three kinds
(docs/env.md, "Action validation"). Each hands the stepper the actions in range:

* `ImmediateCheck`: reads the actions' range on the host and raises before the step;
* `DeferredCheck`: the actions are clamped; the first offending sub-env and its value stay
  on the device until `raise_pending()`, at the caller's next sync;
* `Clamp` (`validate_actions=False`): the actions are clamped; `NoCheck` instead where the
  stepper clamps them itself (the compiled step, inside its graph: no kernel of its own).
"""

from __future__ import annotations

from typing import Protocol

import torch

SETTINGS = (True, False, "immediate", "deferred")


class ActionCheck(Protocol):
    def __call__(self, actions: torch.Tensor) -> torch.Tensor:
        """`actions` in `[0, num_actions)` (or an error)."""
        ...


class Clamp:
    """`validate_actions=False`: out-of-range actions are clamped, and nothing is said."""

    def __init__(self, num_actions: int) -> None:
        self.high = num_actions - 1

    def __call__(self, actions: torch.Tensor) -> torch.Tensor:
        return actions.clamp(0, self.high)


class NoCheck:
    """`validate_actions=False` where the stepper clamps the actions itself."""

    def __call__(self, actions: torch.Tensor) -> torch.Tensor:
        return actions


class ImmediateCheck:
    """`"immediate"`: the step raises before changing anything (a host read per step)."""

    def __init__(self, num_actions: int) -> None:
        self.num_actions = num_actions

    def __call__(self, actions: torch.Tensor) -> torch.Tensor:
        low, high = torch.aminmax(actions)
        if int(low) < 0 or int(high) >= self.num_actions:  # host reads: free on the CPU
            raise invalid_action_error(actions, self.num_actions)
        return actions


class DeferredCheck:
    """`"deferred"`: the actions are clamped; the actions of the first step with an invalid
    one stay on the device until `raise_pending`."""

    def __init__(self, num_actions: int, num_envs: int, device: torch.device) -> None:
        self.num_actions = num_actions
        self.flag = torch.zeros((), dtype=torch.bool, device=device)
        self.first = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.unchecked_steps = 0

    def __call__(self, actions: torch.Tensor) -> torch.Tensor:
        clamped = actions.clamp(0, self.num_actions - 1)
        torch.where(self.flag, self.first, actions, out=self.first)
        self.flag.logical_or_((clamped != actions).any())
        self.unchecked_steps += 1
        return clamped

    def raise_pending(self) -> None:
        """Raise the `ValueError` of the first invalid action since the last call, once (a
        host read of one flag, after any step)."""
        if not self.unchecked_steps:
            return
        self.unchecked_steps = 0
        if bool(self.flag):  # the host sync
            self.flag.zero_()
            raise invalid_action_error(
                self.first,
                self.num_actions,
                f" (in a step since the last check, which ran with it clamped to "
                f"[0, {self.num_actions - 1}])",
            )


def resolve(setting: bool | str, device: torch.device) -> str | None:
    """The check that `validate_actions=setting` asks for on `device`: "immediate",
    "deferred" or None; a `ValueError` for anything else."""
    if not (isinstance(setting, bool) or (isinstance(setting, str) and setting in SETTINGS)):
        raise ValueError(
            f"validate_actions must be True, False, 'immediate' or 'deferred', got {setting!r}"
        )
    if setting is True:
        return "immediate" if device.type == "cpu" else "deferred"
    return setting or None


def allowed(num_actions: int) -> str:
    """The valid actions in words: "0, 1 or 2"."""
    if num_actions > 6:
        return f"integers in [0, {num_actions - 1}]"
    *others, last = [str(a) for a in range(num_actions)]
    return f"{', '.join(others)} or {last}" if others else last


def invalid_action_error(actions: torch.Tensor, num_actions: int, suffix: str = "") -> ValueError:
    """The error for the first action out of range (reads `actions` on the host)."""
    index = int(((actions < 0) | (actions >= num_actions)).nonzero()[0, 0])
    return ValueError(
        f"actions must be {allowed(num_actions)}; sub-env {index} got {int(actions[index])}{suffix}"
    )
