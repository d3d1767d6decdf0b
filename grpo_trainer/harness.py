"""The loop around updates: budget, evaluation, signals, checkpoints, callbacks, logging, the
summary and the plot.

`Harness.run` calls `GRPOTrainer.step` until the env-step budget is spent, evaluates every
`eval_every` env steps (`periodic_eval`), and keeps `best.pt` at the best evaluation score
(without evaluation: the best training return). SIGINT/SIGTERM and `request_stop` finish the
current update, write a checkpoint and return; a second signal aborts at once. In a
distributed run every rank stops after the same update (a stop request rides the next
update's metrics reduction; a reached target is seen alike by every rank). Only rank 0
writes files and prints.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_trainer import checkpoint
from grpo_trainer.callbacks import Callback
from grpo_trainer.config import RunConfig, describe
from grpo_trainer.metrics import MetricsWriter, keep_rows_up_to
from grpo_trainer.periodic_eval import PeriodicEvaluator
from grpo_trainer.progress import ProgressDisplay

if TYPE_CHECKING:
    import gymnasium as gym

    from grpo_trainer.trainer import GRPOTrainer

log = logging.getLogger(__name__)


class TrainingStopped(RuntimeError):
    """Training could not go on (e.g. too many non-finite updates in a row)."""


class Harness:
    """Runs one `GRPOTrainer` to its budget."""

    def __init__(
        self,
        trainer: GRPOTrainer,
        callbacks: Sequence[Callback] = (),
        eval_envs: gym.vector.VectorEnv | None = None,
    ) -> None:
        self.trainer = trainer
        run = trainer.config.run
        self.run_dir = Path(run.run_dir) if run.run_dir and trainer.collective.is_main else None
        self.callbacks = list(callbacks)
        self.evaluator = PeriodicEvaluator(trainer, eval_envs)
        self.stop_signal: str | None = None  # the signal every rank agreed to stop on
        self.signalled: str | None = None  # a signal this process received
        self.stop_reason: str | None = None  # why the run ended early without a signal
        self.requested: str | None = None  # request_stop's reason, until every rank agrees
        self.last_checkpoint: Path | None = None
        self.writer: MetricsWriter | None = None
        self._checkpoint_due = False  # a periodic checkpoint waits for a clean update
        self._start = time.perf_counter()

    def request_stop(self, reason: str = "a callback") -> None:
        """End the run after the next update, cleanly, with a final checkpoint."""
        self.requested = self.requested or reason

    @property
    def stopped(self) -> bool:
        return bool(self.stop_signal or self.stop_reason)

    def run(self) -> dict[str, float]:
        """Train until `total_env_steps`; returns the last update's metrics. If training
        raises, every callback's `on_train_error` runs before the error goes on."""
        try:
            return self._run()
        except BaseException as error:
            for callback in self.callbacks:
                try:
                    callback.on_train_error(self, error)
                except Exception:
                    log.exception("%s.on_train_error failed", type(callback).__name__)
            raise

    def _run(self) -> dict[str, float]:
        trainer, run = self.trainer, self.trainer.config.run
        is_main = trainer.collective.is_main
        if self.run_dir:
            self._prepare_run_dir()
            keep_rows_up_to(self.run_dir / "metrics.jsonl", trainer.update_index)
        self.writer = writer = MetricsWriter(self.run_dir, run.tensorboard and is_main)
        display = ProgressDisplay(
            trainer.config.total_env_steps,
            enabled=run.progress and is_main,
            ratios=trainer.env.episode_ratios,
        )
        metrics: dict[str, float] = {}
        # What the live line and the summary show: each metric's latest value. An update in
        # which no episode ended reports no return or catch rate; the last ones still stand.
        latest: dict[str, float] = {}
        warmup_s: float | None = None
        skips = 0
        self._start = time.perf_counter()
        try:
            with self._signals(), display:
                display.advance(trainer.env_steps, {})
                self._call("on_train_start")
                while trainer.env_steps < trainer.config.total_env_steps and not self.stopped:
                    result = trainer.step(
                        should_stop=lambda: bool(self.signalled or self.requested)
                    )
                    metrics = result.metrics
                    if result.stop:  # this rank or another was signalled, or asked to stop
                        if self.requested and not self.signalled:
                            self.stop_reason = self.requested
                        else:
                            self.stop_signal = self.signalled or "a stop request to another rank"
                    if warmup_s is None:
                        warmup_s = metrics["rollout_s"] + metrics["update_s"]
                    metrics["warmup_s"] = warmup_s
                    clean = not metrics["skipped_steps"]
                    if self.evaluator.due():
                        metrics.update(self._evaluate(clean))
                    writer.write(metrics)
                    latest.update(metrics)
                    display.advance(trainer.env_steps, latest)
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
                    self._call("on_update", metrics)
            if self.stop_signal is None or trainer.update_index > 0:
                self._checkpoint()
        finally:
            writer.close()
            self.evaluator.close()
        if self.stop_signal and is_main:
            log.warning("stopped by %s after update %d; %s", *self._resume_hint())
        if self.stop_reason and is_main:
            log.info("stopped after update %d: %s", trainer.update_index, self.stop_reason)
        if is_main:
            display.summary(latest)
            display.target_line(self.evaluator.target, self.evaluator.reached_at, latest)
            if self.run_dir:
                learning_curve(self.run_dir)
        self._call("on_train_end", latest)
        return metrics

    def _evaluate(self, clean: bool) -> dict[str, float]:
        """Evaluate the policy now; keep best.pt at the best score; stop at a `--target`."""
        trainer, evaluator = self.trainer, self.evaluator
        out = evaluator.run(elapsed_s=time.perf_counter() - self._start)
        self._call("on_eval", out)
        if trainer.best_by != "eval_score":  # the first evaluation: from now on it decides
            trainer.best_score, trainer.best_by = -math.inf, "eval_score"
        if clean and out["eval_score"] > trainer.best_score:  # first: checkpoints record it
            trainer.best_score = out["eval_score"]
            self._save_best()
        target = evaluator.target
        if target and target.stops and evaluator.reached(out):
            # every rank evaluated the same summed episodes: all stop after this update
            self.stop_reason = f"the evaluation reached the target {target}"
        return out

    def _after_update(self, metrics: dict[str, float], clean: bool) -> None:
        """Until the first evaluation best.pt follows the best training return. Periodic
        checkpoints are written only after a clean update (no skipped step), so the newest
        checkpoint is always a good one."""
        trainer = self.trainer
        score = metrics.get("return_mean")
        by_return = trainer.best_by == "return_mean"
        if by_return and score is not None and score > trainer.best_score:
            trainer.best_score = score
            self._save_best()
        every = trainer.config.run.checkpoint_every
        if every and trainer.update_index % every == 0:
            self._checkpoint_due = True
        if self._checkpoint_due and clean:
            self._checkpoint()

    def _save_best(self) -> None:
        if not self.trainer.config.run.run_dir:  # the same on every rank
            return
        state = self.trainer.state_dict()  # every rank: its collectives must not diverge
        if self.run_dir:
            path = self.run_dir / "checkpoints" / "best.pt"
            checkpoint.atomic_save(state, path)
            self._call("on_checkpoint", path)

    def _checkpoint(self) -> None:
        self._checkpoint_due = False
        state = self.trainer.state_dict()  # every rank: its collectives must not diverge
        if self.run_dir:
            if self.writer is not None:  # the rows up to this update are on disk before it
                self.writer.flush()
            self.last_checkpoint = checkpoint.save_rotating(
                state,
                self.run_dir / "checkpoints",
                self.trainer.update_index,
                self.trainer.config.run.keep_checkpoints,
            )
            self._call("on_checkpoint", self.last_checkpoint)

    def _call(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(self, *args)

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
            checkpoint.atomic_write_text(
                json.dumps(payload, indent=2), self.run_dir / "config.json"
            )
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
