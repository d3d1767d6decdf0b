"""The loop around updates: budget, signals, checkpoints, logging, the summary and the plot.

`Harness.run` calls `GRPOTrainer.step` until the env-step budget is spent. SIGINT/SIGTERM
finish the current update, write a checkpoint and return; a second signal aborts at once.
In a distributed run every rank stops after the same update (the stop request rides the
update's metrics reduction). Only rank 0 writes files and prints.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_trainer import checkpoint
from grpo_trainer.config import RunConfig, describe
from grpo_trainer.metrics import MetricsWriter
from grpo_trainer.progress import ProgressDisplay

if TYPE_CHECKING:
    from grpo_trainer.trainer import GRPOTrainer

log = logging.getLogger(__name__)


class TrainingStopped(RuntimeError):
    """Training could not go on (e.g. too many non-finite updates in a row)."""


class Harness:
    """Runs one `GRPOTrainer` to its budget."""

    def __init__(self, trainer: GRPOTrainer) -> None:
        self.trainer = trainer
        run = trainer.config.run
        self.run_dir = Path(run.run_dir) if run.run_dir and trainer.collective.is_main else None
        self.stop_signal: str | None = None  # the signal every rank agreed to stop on
        self.signalled: str | None = None  # a signal this process received
        self.last_checkpoint: Path | None = None
        self._checkpoint_due = False  # a periodic checkpoint waits for a clean update

    def run(self) -> dict[str, float]:
        """Train until `total_env_steps`; returns the last update's metrics."""
        trainer, run = self.trainer, self.trainer.config.run
        is_main = trainer.collective.is_main
        if self.run_dir:
            self._prepare_run_dir()
        writer = MetricsWriter(self.run_dir, run.tensorboard and is_main)
        display = ProgressDisplay(
            trainer.config.total_env_steps,
            enabled=run.progress and is_main,
            ratios=trainer.env.episode_ratios,
        )
        metrics: dict[str, float] = {}
        warmup_s: float | None = None
        skips = 0
        try:
            with self._signals(), display:
                display.advance(trainer.env_steps, {})
                while trainer.env_steps < trainer.config.total_env_steps and not self.stop_signal:
                    result = trainer.step(should_stop=lambda: self.signalled is not None)
                    metrics = result.metrics
                    if result.stop:  # this rank or another was signalled
                        self.stop_signal = self.signalled or "a signal to another rank"
                    if warmup_s is None:
                        warmup_s = metrics["rollout_s"] + metrics["update_s"]
                    metrics["warmup_s"] = warmup_s
                    writer.write(metrics)
                    display.advance(trainer.env_steps, metrics)
                    clean = not metrics["skipped_steps"]
                    skips = 0 if clean else skips + 1
                    if not clean:
                        log.warning(
                            "update %d: %d optimiser step(s) skipped for a non-finite loss or "
                            "gradient (%d update(s) in a row; training stops at %d)",
                            trainer.update_index,
                            int(metrics["skipped_steps"]),
                            skips,
                            run.max_consecutive_skips,
                        )
                    if skips >= run.max_consecutive_skips:
                        raise TrainingStopped(
                            f"{skips} updates in a row had a non-finite loss or gradient; "
                            f"stopping. Last good checkpoint: {self.last_checkpoint}"
                        )
                    self._after_update(metrics, clean)
            if self.stop_signal is None or trainer.update_index > 0:
                self._checkpoint()
        finally:
            writer.close()
        if self.stop_signal and is_main:
            log.warning("stopped by %s after update %d; %s", *self._resume_hint())
        if is_main:
            display.summary(metrics)
            if self.run_dir:
                learning_curve(self.run_dir)
        return metrics

    def _after_update(self, metrics: dict[str, float], clean: bool) -> None:
        """best.pt follows the best mean return; periodic checkpoints are written only after a
        clean update (no skipped step), so the newest checkpoint is always a good one."""
        trainer = self.trainer
        score = metrics.get("return_mean")
        if score is not None and score > trainer.best_return:  # first: checkpoints record it
            trainer.best_return = score
            if self.run_dir:
                checkpoint.atomic_save(
                    trainer.state_dict(), self.run_dir / "checkpoints" / "best.pt"
                )
        every = trainer.config.run.checkpoint_every
        if every and trainer.update_index % every == 0:
            self._checkpoint_due = True
        if self._checkpoint_due and clean:
            self._checkpoint()

    def _checkpoint(self) -> None:
        self._checkpoint_due = False
        state = self.trainer.state_dict()  # every rank: its collectives must not diverge
        if self.run_dir:
            self.last_checkpoint = checkpoint.save_rotating(
                state,
                self.run_dir / "checkpoints",
                self.trainer.update_index,
                self.trainer.config.run.keep_checkpoints,
            )

    def _resume_hint(self) -> tuple[str, int, str]:
        """What stopped the run, where, and the command that continues it."""
        run_dir = self.trainer.config.run.run_dir
        if not run_dir:
            hint = "nothing was saved (no run_dir)"
        else:
            hint = (
                f"saved {self.last_checkpoint}; resume with: python -m grpo_trainer train "
                f"--config {Path(run_dir) / 'config.json'} --resume {run_dir}"
            )
        return str(self.stop_signal), self.trainer.update_index, hint

    def _prepare_run_dir(self) -> None:
        """Create the run directory and write `config.json`: the config, with `_help`
        describing every field (ignored when the file is read back with --config)."""
        assert self.run_dir is not None
        config = self.trainer.config
        payload: dict[str, Any] = {
            "_help": {
                **{f: describe(type(config), f) for f in config.to_dict() if f != "run"},
                **{f"run.{f}": describe(RunConfig, f) for f in config.run.__dataclass_fields__},
            },
            **config.to_dict(),
        }
        try:
            checkpoint.prepare_folder(self.run_dir / "checkpoints")
            path = self.run_dir / "config.json"
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(payload, indent=2))
            tmp.replace(path)
        except OSError as err:
            raise OSError(f"run directory {self.run_dir} is not writable: {err}") from err

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """Turn SIGINT/SIGTERM into a request to stop after the current update."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def request_stop(signum: int, _frame: Any) -> None:
            name = signal.Signals(signum).name
            if self.signalled:  # asked twice: the user means now
                raise KeyboardInterrupt(f"second {name}: aborted without a final checkpoint")
            log.warning(
                "%s: stopping after the current update with a checkpoint (again: abort now)", name
            )
            self.signalled = name  # every rank learns of it with the next update's metrics

        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def learning_curve(run_dir: Path) -> None:
    """`learning_curve.png` from metrics.jsonl, when matplotlib is installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line torn by a kill -9
            rows.append(json.loads(line))
    rows = [r for r in rows if "return_mean" in r]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["env_steps"] for r in rows], [r["return_mean"] for r in rows])
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean episode return")
    fig.tight_layout()
    fig.savefig(run_dir / "learning_curve.png", dpi=100)
    plt.close(fig)
