"""Console output: a rich progress bar with live metrics, and a summary table at the end."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# Metrics shown live, with their format; the summary shows these and a few more.
LIVE = {
    "return_mean": "return {:.2f}",
    "steps_per_s": "{:,.0f} steps/s",
    "entropy": "entropy {:.3f}",
    "frac_zero_std_groups": "zero-std {:.2f}",
}
SUMMARY = (
    "update",
    "env_steps",
    "return_mean",
    "return_std",
    "length_mean",
    "entropy",
    "kl",
    "clip_fraction",
    "frac_zero_std_groups",
    "steps_per_s",
    "warmup_s",
)


class ProgressDisplay:
    """A progress bar over env steps; silent when disabled."""

    def __init__(self, total_steps: int, enabled: bool = True) -> None:
        self.enabled = enabled
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

    def __enter__(self) -> ProgressDisplay:
        self._progress.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.__exit__(exc_type, exc, tb)

    def advance(self, env_steps: int, metrics: dict[str, Any]) -> None:
        live = "  ".join(fmt.format(metrics[k]) for k, fmt in LIVE.items() if k in metrics)
        for name, value in metrics.items():
            if name.startswith("episode_") and name not in ("episode_r", "episode_l"):
                live += f"  {name[8:]} {value:.2f}"
        self._progress.update(self._task, completed=env_steps, live=live)

    def summary(self, metrics: dict[str, Any]) -> None:
        if not self.enabled or not metrics:
            return
        table = Table(title="GRPO run summary")
        table.add_column("metric")
        table.add_column("value", justify="right")
        names = [*SUMMARY, *sorted(k for k in metrics if k.startswith("episode_"))]
        for name in names:
            if name in metrics:
                value = metrics[name]
                text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
                table.add_row(name, text)
        self.console.print(table)
