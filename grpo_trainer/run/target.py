"""A run's target: an evaluation score to reach, from `--target NAME=VALUE` (the run stops
when an evaluation reaches it) or, without one, from the env's declared goals (recorded)."""

from __future__ import annotations

import dataclasses
from typing import Any

from grpo_trainer.base.config import parse_target


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
