"""The run: a loop around `GRPO.update_and_agree_on_stop`, with every service a callback
(in order: evaluation, the run's files, progress, W&B on rank 0, the user's).

SIGINT/SIGTERM and `RunState.request_stop` finish the current update, write a checkpoint and
return (a second signal aborts); the request rides the next update's metrics reduction, so
every rank stops after the same update.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from grpo_trainer.run.callbacks import Best, Callback, RunOutcome, RunState
from grpo_trainer.run.files import RunFiles
from grpo_trainer.run.periodic_eval import Evaluation
from grpo_trainer.run.progress import ConsoleProgress

if TYPE_CHECKING:
    import gymnasium as gym

    from grpo_trainer.algorithm.grpo import GRPO

log = logging.getLogger(__name__)


class TrainingStopped(RuntimeError):
    """Training could not go on (e.g. too many non-finite updates in a row)."""


class Harness:
    """Runs one `GRPO` to its budget."""

    def __init__(
        self,
        trainer: GRPO,
        callbacks: Sequence[Callback] = (),
        eval_envs: gym.vector.VectorEnv | None = None,
        best: Best | None = None,
    ) -> None:
        """`best`: the best score so far (a resumed checkpoint's), else none yet."""
        self.trainer = trainer
        run, is_main = trainer.config.run, trainer.collective.is_main
        self._start = time.perf_counter()
        self.evaluation = Evaluation(trainer, eval_envs, self._call, self._elapsed_s)
        self.files = RunFiles(trainer, self._call, run.tensorboard)
        ratios = trainer.env.episode_ratios
        total = trainer.config.total_env_steps
        progress = ConsoleProgress(total, run.progress and is_main, ratios, report=is_main)
        self.callbacks: list[Callback] = [self.evaluation, self.files, progress]
        if run.wandb:  # every rank refuses alike, before anything runs, when wandb is missing
            from grpo_trainer.run.wandb_log import WandbCallback, import_wandb

            import_wandb()
            if is_main:
                self.callbacks.append(WandbCallback())
        self.callbacks += callbacks
        self.state = RunState(
            trainer.config,
            trainer.policy,
            self.files.run_dir,
            self.evaluation.target,
            trainer.update_index,
            trainer.env_steps,
            best or Best(),
        )
        self.signal_received: str | None = None  # SIGINT/SIGTERM here, until ranks agree

    def run(self) -> RunOutcome:
        """Train until `total_env_steps`, or the time budget where it ends first; on an
        error, callbacks' `on_train_error` run first."""
        try:
            self._run()
        except BaseException as error:
            for callback in self.callbacks:
                try:
                    callback.on_train_error(self.state, error)
                except Exception:
                    log.exception("%s.on_train_error failed", type(callback).__name__)
            raise
        return self.state.outcome

    def _run(self) -> None:
        trainer, state = self.trainer, self.state
        latest: dict[str, float] = {}  # each metric's latest value, for on_train_end
        self._start = time.perf_counter()
        self._call("on_train_start")
        with self._signals():
            skips, warmup_s = 0, None
            self._check_time_budget()  # a resumed run may have spent it already
            while trainer.env_steps < trainer.config.total_env_steps and not state.outcome.ended:
                metrics = self._update()
                if warmup_s is None:
                    warmup_s = metrics["rollout_s"] + metrics["update_s"]
                metrics["warmup_s"] = warmup_s
                self._call("on_update", metrics)
                latest.update(metrics)
                skips = 0 if not metrics["skipped_steps"] else skips + 1
                self._check_skips(skips, metrics)
        if state.outcome.stop_reason and trainer.collective.is_main:
            log.info("stopped after update %d: %s", state.update, state.outcome.stop_reason)
        self._call("on_train_end", latest)

    def _update(self) -> dict[str, float]:
        """One update; every rank learns from its reduction whether some rank asked to stop."""
        state = self.state
        result = self.trainer.update_and_agree_on_stop(
            stop_requested=lambda: bool(self.signal_received or state.stop_requested)
        )
        state.update, state.env_steps = self.trainer.update_index, self.trainer.env_steps
        if result.stop and state.stop_requested and not self.signal_received:
            state.end(stop_reason=state.stop_requested)
        elif result.stop:
            state.end(stop_signal=self.signal_received or "a stop request to another rank")
        state.end(metrics=result.metrics)
        self._check_time_budget()
        return result.metrics

    def _check_time_budget(self) -> None:
        """End the run after the update that spent its time budget (with env steps left:
        else it ends as planned). Every rank reads the slowest one's seconds, so all end
        after the same update."""
        trainer, state = self.trainer, self.state
        budget_s = trainer.config.time_budget_s
        going = trainer.env_steps < trainer.config.total_env_steps and not state.outcome.ended
        if going and budget_s is not None and trainer.train_s >= budget_s:
            state.end(stop_reason=f"the time budget ({budget_s:g} s of training) is spent")

    def _elapsed_s(self) -> float:
        return time.perf_counter() - self._start

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
