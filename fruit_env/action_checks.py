"""What a step does with actions outside {0, 1, 2}: one strategy per `validate_actions`
setting, chosen when it is set, so that `FruitCatcherVectorEnv.step` tests no flag.

Reading a value back from a GPU costs a sync, so the check comes in three kinds
(docs/env.md, "Action validation"):

* `ImmediateCheck`: reads the actions' range on the host and raises before the step;
* `DeferredCheck`: the step runs with the actions clamped; the first offending sub-env and
  its value are kept on the device until `raise_pending()`, at the caller's next sync;
* `NoCheck`: the step runs with the actions clamped.

Each calls the step in the form it needs: `step(...)` for actions known to be valid,
`step.clamped(...)`, or `step.flagged(...)`, which also says, on the device, whether some
action needed the clamp (`packed.EagerStep`, `compiled.CompiledEnvStep`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from fruit_env.packed import StepOutput

if TYPE_CHECKING:
    from fruit_env.compiled import EnvStep

SETTINGS = (True, False, "immediate", "deferred")


class ActionCheck(Protocol):
    def step(
        self,
        step: EnvStep,
        packed: torch.Tensor,
        key: torch.Tensor,
        counter: torch.Tensor,
        actions: torch.Tensor,
    ) -> tuple[torch.Tensor, StepOutput]: ...


class NoCheck:
    """`validate_actions=False`: out-of-range actions are clamped, and nothing is said."""

    def step(
        self,
        step: EnvStep,
        packed: torch.Tensor,
        key: torch.Tensor,
        counter: torch.Tensor,
        actions: torch.Tensor,
    ) -> tuple[torch.Tensor, StepOutput]:
        return step.clamped(packed, key, counter, actions)


class ImmediateCheck:
    """`"immediate"`: the step raises before changing anything (a host read per step)."""

    def step(
        self,
        step: EnvStep,
        packed: torch.Tensor,
        key: torch.Tensor,
        counter: torch.Tensor,
        actions: torch.Tensor,
    ) -> tuple[torch.Tensor, StepOutput]:
        low, high = torch.aminmax(actions)
        if int(low) < 0 or int(high) > 2:  # host reads: free on the CPU
            raise invalid_action_error(actions)
        return step(packed, key, counter, actions)


class DeferredCheck:
    """`"deferred"`: the step runs with the actions clamped; the actions of the first step
    with an invalid one stay on the device until `raise_pending`."""

    def __init__(self, num_envs: int, device: torch.device) -> None:
        self.flag = torch.zeros((), dtype=torch.bool, device=device)
        self.first = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.unchecked_steps = 0

    def step(
        self,
        step: EnvStep,
        packed: torch.Tensor,
        key: torch.Tensor,
        counter: torch.Tensor,
        actions: torch.Tensor,
    ) -> tuple[torch.Tensor, StepOutput]:
        packed, out, invalid = step.flagged(packed, key, counter, actions)
        torch.where(self.flag, self.first, actions, out=self.first)
        self.flag.logical_or_(invalid)
        self.unchecked_steps += 1
        return packed, out

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
                " (in a step since the last check, which ran with it clamped to [0, 2])",
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


def invalid_action_error(actions: torch.Tensor, suffix: str = "") -> ValueError:
    """The error for the first action outside {0, 1, 2} (reads `actions` on the host)."""
    index = int(((actions < 0) | (actions > 2)).nonzero()[0, 0])
    return ValueError(
        f"actions must be 0, 1 or 2; sub-env {index} got {int(actions[index])}{suffix}"
    )
