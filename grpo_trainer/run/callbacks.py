"""Hooks into a training run, as Stable-Baselines3's callbacks (docs/trainer.md). Every hook
gets the `RunState`, never the loop, and runs on every rank once the metrics reached the host
(no device sync of its own). Also the run's `Target`, the evaluation score it aims for.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_trainer.base.config import GRPOConfig, parse_target

if TYPE_CHECKING:
    from grpo_trainer.algorithm.policy import Policy


@dataclasses.dataclass(frozen=True)
class Target:
    """An evaluation score to reach: `return` or one of the env's declared ratios."""

    name: str
    value: float
    stops: bool  # --target ends the run; an env's declared goal is only recorded

    @property
    def metric(self) -> str:
        return "eval_return_mean" if self.name == "return" else f"eval_{self.name}"

    def __str__(self) -> str:
        return f"{self.name}={self.value:g}"


def resolve_target(
    text: str | None, ratios: dict[str, Any], goals: dict[str, float]
) -> Target | None:
    """`--target`, else the env's first declared goal, checked against what the env reports."""
    if text is not None:
        name, value = parse_target(text)
        if name != "return" and name not in ratios:
            known = ", ".join(["return", *ratios])
            raise ValueError(f"target {text!r}: the env reports no {name!r}; choose from {known}")
        return Target(name, value, stops=True)
    known = {k: v for k, v in goals.items() if k == "return" or k in ratios}
    if not known:
        return None
    name, value = next(iter(known.items()))
    return Target(name, float(value), stops=False)


@dataclasses.dataclass
class Best:
    """best.pt's score and its metric: the training return until the first evaluation."""

    score: float = -math.inf
    by: str = "return_mean"


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """How a run ended: the last update's metrics, and why it ended before its budget."""

    metrics: dict[str, float]
    stop_signal: str | None = None  # the signal every rank agreed to stop on
    stop_reason: str | None = None  # a reached target or a callback's request

    @property
    def ended(self) -> bool:
        """Whether the run ends after this update, before its budget."""
        return bool(self.stop_signal or self.stop_reason)


@dataclasses.dataclass
class RunState:
    """What a callback sees of a run: its counters, its best score, and the way to stop it."""

    config: GRPOConfig
    policy: Policy
    run_dir: Path | None  # where this rank writes files (rank 0's run directory, else None)
    target: Target | None = None  # the evaluation score the run aims for, if any
    update: int = 0  # updates done
    env_steps: int = 0  # sub-env steps simulated so far, all ranks
    best: Best = dataclasses.field(default_factory=Best)
    stop_requested: str | None = None  # request_stop's reason, until every rank agrees
    outcome: RunOutcome = dataclasses.field(default_factory=lambda: RunOutcome({}))

    def request_stop(self, reason: str = "a callback") -> None:
        """End the run after the next update, cleanly, with a final checkpoint."""
        self.stop_requested = self.stop_requested or reason

    def end(self, **outcome: Any) -> None:
        """Record how the run ends (`RunOutcome`'s fields), for decisions every rank reaches
        alike; a callback deciding on its own rank asks with `request_stop` instead."""
        self.outcome = dataclasses.replace(self.outcome, **outcome)


class Callback:
    """Does nothing; override any hook."""

    def on_train_start(self, state: RunState) -> None:
        """Before the first update (after a resume, from where it resumed)."""

    def on_update(self, state: RunState, metrics: dict[str, float]) -> None:
        """After every update, with its metrics (the row written to metrics.jsonl)."""

    def on_eval(self, state: RunState, metrics: dict[str, float]) -> None:
        """After every evaluation during training, with its `eval_*` metrics."""

    def on_checkpoint(self, state: RunState, path: Path) -> None:
        """After a checkpoint file was written (numbered, last.pt or best.pt)."""

    def on_train_end(self, state: RunState, metrics: dict[str, float]) -> None:
        """After the final checkpoint, with each metric's latest value."""

    def on_train_error(self, state: RunState, error: BaseException) -> None:
        """Training raised `error` (raised again afterwards; one raised here is only logged)."""
