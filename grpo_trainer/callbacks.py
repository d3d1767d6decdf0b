"""Hooks into a training run, for Python users: the habit Stable-Baselines3's callbacks set.

Subclass `Callback`, override the hooks you need, and pass instances to
`GRPOTrainer.train(callbacks=[...])`. Every hook gets the `Harness` that runs the loop:
`harness.trainer` is the trainer (policy, config, counters), and `harness.request_stop(why)`
ends the run cleanly, with a final checkpoint, after the next update (in a distributed run
every rank stops after that same update).

Hooks run on every rank, after the update's metrics reached the host: they cost no device
sync of their own unless they read the device themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo_trainer.harness import Harness


class Callback:
    """Does nothing; override any hook."""

    def on_train_start(self, harness: Harness) -> None:
        """Before the first update (after a resume, from where it resumed)."""

    def on_update(self, harness: Harness, metrics: dict[str, float]) -> None:
        """After every update, with its metrics (the row written to metrics.jsonl)."""

    def on_eval(self, harness: Harness, metrics: dict[str, float]) -> None:
        """After every evaluation during training, with its `eval_*` metrics."""

    def on_checkpoint(self, harness: Harness, path: Path) -> None:
        """After a checkpoint file was written (numbered, last.pt or best.pt)."""

    def on_train_end(self, harness: Harness, metrics: dict[str, float]) -> None:
        """After the final checkpoint, with each metric's latest value."""

    def on_train_error(self, harness: Harness, error: BaseException) -> None:
        """Training raised `error` (a second Ctrl-C included); it is raised again after the
        callbacks ran. An error a callback raises here is logged, not raised."""
