"""The run: a loop around `GRPO.agreed_update`, with its services as callbacks.

`Harness.run` updates until the env-step budget is spent. Around each update: evaluation
every `eval_every` env steps (`periodic_eval`), the run's files and checkpoints
(`run_files.RunFiles`: metrics.jsonl, periodic checkpoints, best.pt), the progress line,
W&B (`--wandb`, rank 0) and the user's callbacks, which all see one `RunState`, never the
loop. SIGINT/SIGTERM and `RunState.request_stop` finish the current update, write a
checkpoint and return; a second signal aborts at once. In a distributed run every rank stops
after the same update (a stop request rides the next update's metrics reduction; a reached
target is seen alike by every rank). Only rank 0 writes files and prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from grpo_trainer.run.callbacks import Callback, RunState
from grpo_trainer.run.files import RunFiles, learning_curve, resumed_best
from grpo_trainer.run.periodic_eval import PeriodicEvaluator
from grpo_trainer.run.progress import ProgressDisplay

if TYPE_CHECKING:
    import gymnasium as gym

    from grpo_trainer.algorithm.grpo import GRPO

log = logging.getLogger(__name__)


class TrainingStopped(RuntimeError):
    """Training could not go on (e.g. too many non-finite updates in a row)."""


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """How a run ended: the last update's metrics, and why it ended before its budget."""

    metrics: dict[str, float]
    stop_signal: str | None = None  # the signal every rank agreed to stop on
    stop_reason: str | None = None  # a reached target or a callback's request


class Harness:
    """Runs one `GRPO` to its budget."""

    def __init__(
        self,
        trainer: GRPO,
        callbacks: Sequence[Callback] = (),
        eval_envs: gym.vector.VectorEnv | None = None,
    ) -> None:
        self.trainer = trainer
        run = trainer.config.run
        self.files = RunFiles(trainer, self._call, run.tensorboard)
        self.callbacks: list[Callback] = [self.files, *callbacks]
        if run.wandb:  # every rank refuses alike, before anything runs, when wandb is missing
            from grpo_trainer.run.wandb_log import WandbCallback, import_wandb

            import_wandb()
            if trainer.collective.is_main:
                self.callbacks.append(WandbCallback())
        self.evaluator = PeriodicEvaluator(trainer, eval_envs)
        self.state = RunState(
            trainer.config,
            trainer.policy,
            self.files.run_dir,
            self.evaluator.target,
            trainer.update_index,
            trainer.env_steps,
            resumed_best(trainer),
        )
        self.signal_received: str | None = None  # SIGINT/SIGTERM here, until ranks agree
        self.outcome = RunOutcome({})
        self._start = time.perf_counter()

    def run(self) -> RunOutcome:
        """Train until `total_env_steps`. If training raises, every callback's
        `on_train_error` runs before the error goes on."""
        try:
            self._run()
        except BaseException as error:
            for callback in self.callbacks:
                try:
                    callback.on_train_error(self.state, error)
                except Exception:
                    log.exception("%s.on_train_error failed", type(callback).__name__)
            raise
        return self.outcome

    def _run(self) -> None:
        trainer, is_main = self.trainer, self.trainer.collective.is_main
        display = ProgressDisplay(
            trainer.config.total_env_steps,
            enabled=trainer.config.run.progress and is_main,
            ratios=trainer.env.episode_ratios,
        )
        latest: dict[str, float] = {}  # each metric's latest value: the live line, the summary
        self._start = time.perf_counter()
        try:
            with self._signals(), display:
                display.advance(trainer.env_steps, {})
                self._call("on_train_start")
                skips, warmup_s = 0, None
                while trainer.env_steps < trainer.config.total_env_steps and not self._ended:
                    metrics = self._update()
                    if warmup_s is None:
                        warmup_s = metrics["rollout_s"] + metrics["update_s"]
                    metrics["warmup_s"] = warmup_s
                    if self.evaluator.due():
                        metrics.update(self._evaluate())
                    self.files.write(metrics)
                    latest.update(metrics)
                    display.advance(trainer.env_steps, latest)
                    skips = 0 if not metrics["skipped_steps"] else skips + 1
                    self._check_skips(skips, metrics)
                    self._call("on_update", metrics)
            if self.outcome.stop_signal is None or trainer.update_index > 0:
                self.files.save(self.state)
        finally:
            self.files.close()
            self.evaluator.close()
        self._report_end(display, latest)
        self._call("on_train_end", latest)

    @property
    def _ended(self) -> bool:
        return bool(self.outcome.stop_signal or self.outcome.stop_reason)

    def _update(self) -> dict[str, float]:
        """One update; every rank learns from its reduction whether some rank asked to stop."""
        state = self.state
        result = self.trainer.agreed_update(
            should_stop=lambda: bool(self.signal_received or state.stop_requested)
        )
        state.update, state.env_steps = self.trainer.update_index, self.trainer.env_steps
        if result.stop and state.stop_requested and not self.signal_received:
            self._end(stop_reason=state.stop_requested)
        elif result.stop:
            self._end(stop_signal=self.signal_received or "a stop request to another rank")
        self._end(metrics=result.metrics)
        return result.metrics

    def _end(self, **outcome: Any) -> None:
        self.outcome = dataclasses.replace(self.outcome, **outcome)

    def _evaluate(self) -> dict[str, float]:
        """Evaluate the policy now; stop at a `--target`."""
        evaluator = self.evaluator
        out = evaluator.run(elapsed_s=time.perf_counter() - self._start)
        self._call("on_eval", out)
        target = evaluator.target
        if target and target.stops and evaluator.reached(out):
            # every rank evaluated the same summed episodes: all stop after this update
            self._end(stop_reason=f"the evaluation reached the target {target}")
        return out

    def _check_skips(self, skips: int, metrics: dict[str, float]) -> None:
        """Warn of a non-finite update; stop after `max_consecutive_skips` in a row."""
        if not skips:
            return
        limit = self.trainer.config.run.max_consecutive_skips
        log.warning(
            "update %d: %d optimiser step(s) skipped for a non-finite loss or gradient (%d "
            "update(s) in a row; training stops at %d)",
            self.state.update,
            int(metrics["skipped_steps"]),
            skips,
            limit,
        )
        if skips >= limit:
            raise TrainingStopped(
                f"{skips} updates in a row had a non-finite loss or gradient; stopping. Last "
                f"good checkpoint: {self.files.last_checkpoint}"
            )

    def _report_end(self, display: ProgressDisplay, latest: dict[str, float]) -> None:
        if not self.trainer.collective.is_main:
            return
        update, outcome = self.state.update, self.outcome
        if outcome.stop_signal:
            hint = self.files.resume_hint()
            log.warning("stopped by %s after update %d; %s", outcome.stop_signal, update, hint)
        if outcome.stop_reason:
            log.info("stopped after update %d: %s", update, outcome.stop_reason)
        display.summary(latest)
        display.target_line(self.evaluator.target, self.evaluator.reached_at, latest)
        if self.files.run_dir:
            learning_curve(self.files.run_dir)

    def _call(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(self.state, *args)

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """Turn SIGINT/SIGTERM into a request to stop after the current update."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def request_stop(signum: int, _frame: Any) -> None:
            name = signal.Signals(signum).name
            if self.signal_received:  # asked twice: the user means now
                raise KeyboardInterrupt(f"second {name}: aborted without a final checkpoint")
            log.warning(
                "%s: stopping after the current update with a checkpoint (again: abort now)", name
            )
            self.signal_received = name  # every rank learns of it with the next update's metrics

        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
