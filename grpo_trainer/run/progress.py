"""Console output: a progress bar with live metrics, and a summary table at the end.

Which metrics show, and how, is declared once in `metrics.METRICS` (`live`, `summary`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from grpo_trainer.base.metrics import declared, live_line
from grpo_trainer.run.callbacks import Callback, RunState, Target

REACHED = ("target_reached_s", "target_reached_env_steps")  # set by the first evaluation there


class ConsoleProgress(Callback):
    """A progress bar with the live line while training, then the summary and the target."""

    def __init__(
        self, total_steps: int, enabled: bool, ratios: Mapping[str, Any], report: bool = True
    ) -> None:
        """`enabled`: the live bar; `report`: the summary at the end (even without the bar)."""
        self.enabled, self.report, self.ratios = enabled, report, dict(ratios)
        self.latest: dict[str, float] = {}  # each metric's latest value: the live line
        self.console = Console(stderr=True)
        self._progress = Progress(
            TextColumn("[bold]GRPO"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[live]}"),
            console=self.console,
            disable=not enabled,
        )
        self._task = self._progress.add_task("train", total=total_steps, live="")

    def on_train_start(self, state: RunState) -> None:
        self._progress.__enter__()
        self._advance(state.env_steps)

    def on_update(self, state: RunState, metrics: dict[str, float]) -> None:
        self.latest.update(metrics)
        self._advance(state.env_steps)

    def on_train_end(self, state: RunState, metrics: dict[str, float]) -> None:
        self._progress.__exit__(None, None, None)
        self.summary(metrics)
        self.target_line(state.target, metrics)

    def on_train_error(self, state: RunState, error: BaseException) -> None:
        self._progress.__exit__(type(error), error, error.__traceback__)

    def _advance(self, env_steps: int) -> None:
        live = live_line(self.latest, self.ratios)
        self._progress.update(self._task, completed=env_steps, live=live)

    def summary(self, metrics: Mapping[str, float]) -> None:
        if not self.report or not metrics:
            return
        table = Table(title="GRPO run summary")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for name, value, metric in declared(metrics, self.ratios):
            if metric.summary:
                table.add_row(name, metric.fmt.format(value))
        self.console.print(table)

    def target_line(self, target: Target | None, latest: Mapping[str, float]) -> None:
        """When the evaluation first reached the target, or that it did not."""
        if not self.report or target is None:
            return
        if all(k in latest for k in REACHED):
            seconds, steps = (latest[k] for k in REACHED)
            self.console.print(
                f"eval {target.name} reached {target.value:g} after {seconds:.1f} s and "
                f"{steps:,.0f} env steps"
            )
        elif target.metric in latest:
            self.console.print(
                f"eval {target.name} did not reach {target.value:g} "
                f"(latest evaluation: {latest[target.metric]:.4g})"
            )
        else:
            self.console.print(f"eval {target.name} {target.value:g}: no evaluation ran")
