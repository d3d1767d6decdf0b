"""What a run keeps on disk, as a service of the loop: config.json, metrics.jsonl, the
checkpoints (periodic, final and best.pt) and the learning curve.

Only rank 0 writes, but every rank builds the checkpoint's contents (`state_dict` gathers
the ranks' rollouts: its collectives must not diverge). A checkpoint holds the trainer's
state plus the run's own (the best score), so `--resume` continues both.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_trainer.base import checkpoint
from grpo_trainer.base.config import RunConfig, describe
from grpo_trainer.base.metrics import MetricsWriter, keep_rows_up_to
from grpo_trainer.run.callbacks import Best, Callback, RunState

if TYPE_CHECKING:
    from grpo_trainer.algorithm.grpo import GRPO

log = logging.getLogger(__name__)


def resumed_best(extras: Mapping[str, Any]) -> Best:
    """The best score a resumed checkpoint recorded beside the trainer's state (`extras`)."""
    score = extras.get("best_score", -math.inf)
    return Best(float(score), str(extras.get("best_by", "return_mean")))


class RunFiles(Callback):
    """Writes the run directory (rank 0) and decides when a checkpoint is due (every rank).

    Periodic checkpoints are written only after a clean update (no skipped step), so the
    newest checkpoint is always a good one; best.pt follows the best training return until
    the first evaluation, then the best evaluation score.
    """

    def __init__(
        self, trainer: GRPO, announce: Callable[[str, Path], None], tensorboard: bool
    ) -> None:
        self.trainer, self.announce, self.tensorboard = trainer, announce, tensorboard
        run = trainer.config.run
        self.run_dir = Path(run.run_dir) if run.run_dir and trainer.collective.is_main else None
        self.last_checkpoint: Path | None = None
        self.writer: MetricsWriter | None = None
        self._checkpoint_due = False  # a periodic checkpoint waits for a clean update
        self.lock: RunDirLock | None = None  # held from on_train_start to close()

    def on_train_start(self, state: RunState) -> None:
        if self.run_dir:
            self._prepare_run_dir()
            keep_rows_up_to(self.run_dir / "metrics.jsonl", state.update)
        self.writer = MetricsWriter(self.run_dir, self.tensorboard and self.run_dir is not None)

    def on_update(self, state: RunState, metrics: dict[str, float]) -> None:
        assert self.writer is not None
        self.writer.write(metrics)  # before any checkpoint of this update
        clean = not metrics["skipped_steps"]
        best = state.best
        if "eval_score" in metrics:
            if best.by != "eval_score":  # the first evaluation: from now on it decides
                best.score, best.by = -math.inf, "eval_score"
            self._keep_best(state, metrics["eval_score"] if clean else None)
        elif best.by == "return_mean":
            self._keep_best(state, metrics.get("return_mean"))
        every = self.trainer.config.run.checkpoint_every
        if every and state.update % every == 0:
            self._checkpoint_due = True
        if self._checkpoint_due and clean:
            self.save(state)

    def _keep_best(self, state: RunState, score: float | None) -> None:
        if score is None or not score > state.best.score:
            return
        state.best.score = score  # first: the checkpoint records it
        if not self.trainer.config.run.run_dir:  # the same on every rank
            return
        payload = self._payload(state)  # every rank: its collectives must not diverge
        if self.run_dir:
            path = self.run_dir / "checkpoints" / "best.pt"
            checkpoint.atomic_save(payload, path)
            self.announce("on_checkpoint", path)

    def save(self, state: RunState) -> None:
        """A numbered checkpoint and last.pt, after the rows up to this update are on disk."""
        self._checkpoint_due = False
        payload = self._payload(state)
        if self.run_dir:
            if self.writer is not None:
                self.writer.flush()
            self.last_checkpoint = checkpoint.save_rotating(
                payload,
                self.run_dir / "checkpoints",
                state.update,
                self.trainer.config.run.keep_checkpoints,
            )
            self.announce("on_checkpoint", self.last_checkpoint)

    def _payload(self, state: RunState) -> dict[str, Any]:
        return {
            **self.trainer.state_dict(),
            "best_score": state.best.score,
            "best_by": state.best.by,
        }

    def on_train_end(self, state: RunState, metrics: dict[str, float]) -> None:
        """The final checkpoint (unless a signal stopped the run before its first update),
        then the learning curve; after a signal, the command that resumes."""
        if state.outcome.stop_signal is None or state.update > 0:
            self.save(state)
        self.close()
        if self.trainer.collective.is_main and state.outcome.stop_signal:
            log.warning(
                "stopped by %s after update %d; %s",
                state.outcome.stop_signal,
                state.update,
                self.resume_hint(),
            )
        if self.run_dir:
            learning_curve(self.run_dir)

    def on_train_error(self, state: RunState, error: BaseException) -> None:
        self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def resume_hint(self) -> str:
        """Where the run was saved, and the command that continues it."""
        run_dir = self.trainer.config.run.run_dir
        if not run_dir:
            return "nothing was saved (no run_dir)"
        return (
            f"saved {self.last_checkpoint}; resume with: python -m grpo_trainer train "
            f"--config {Path(run_dir) / 'config.json'} --resume {run_dir}"
        )

    def _prepare_run_dir(self) -> None:
        """Lock the run directory (a fresh run refuses one that holds a run), create it and
        write `config.json`: the config, with `_help`
        describing every field and `_derived` naming the fields derived from the others
        (read back with --config, those are derived again: a new budget gets its own)."""
        assert self.run_dir is not None
        config = self.trainer.config
        payload: dict[str, Any] = {
            "_help": {
                **{f: describe(type(config), f) for f in config.to_dict() if f != "run"},
                **{f"run.{f}": describe(RunConfig, f) for f in config.run.__dataclass_fields__},
            },
            **config.to_file_dict(),
        }
        try:
            self.lock = RunDirLock(self.run_dir)
            claim_run_dir(self.run_dir, config.run)
            checkpoint.prepare_folder(self.run_dir / "checkpoints")
            checkpoint.atomic_write_text(
                json.dumps(payload, indent=2), self.run_dir / "config.json"
            )
        except OSError as err:
            raise OSError(f"run directory {self.run_dir} is not writable: {err}") from err


RUN_FILES = ("config.json", "metrics.jsonl", "learning_curve.png", "checkpoints", "tensorboard")


def claim_run_dir(run_dir: Path, run: RunConfig) -> None:
    """Refuse a fresh run into a folder that holds a run (its checkpoints, metrics or config
    would be overwritten and mixed with this run's); with `overwrite`, remove the old run's
    files first. A resumed run continues what the folder holds."""
    held = [name for name in RUN_FILES[:3] if (run_dir / name).exists()]
    held += [f"checkpoints/{p.name}" for p in sorted((run_dir / "checkpoints").glob("*.pt"))]
    if run.resume or not held:
        return
    if not run.overwrite:
        raise ValueError(
            f"run_dir {run_dir} already holds a run ({', '.join(held[:4])}); continue it with "
            f"--resume {run_dir}, choose another --run-dir, or pass --overwrite to replace it"
        )
    log.warning("--overwrite: removing the run in %s (%s)", run_dir, ", ".join(held[:4]))
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


class RunDirLock:
    """`run_dir/.lock`, made with O_EXCL and holding this process's id: a second run on the
    same folder is refused (two runs would mix their checkpoints and metrics); a lock whose
    process no longer runs (a killed run) is taken over, with a warning."""

    def __init__(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / ".lock"
        for _ in range(2):  # a stale lock is removed once, then taken like a free one
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            return
        raise ValueError(f"run_dir {run_dir}: another run took its lock {self.path} just now")

    def _take_over_if_stale(self) -> None:
        try:
            pid = int(self.path.read_text().strip() or "0")
        except (OSError, ValueError):
            pid = 0  # unreadable or half-written: its writer died before the pid was in
        if pid and pid != os.getpid() and checkpoint.pid_alive(pid):
            raise ValueError(
                f"run_dir {self.path.parent} is in use by another run (process {pid}, lock "
                f"{self.path}); wait for it to finish or choose another --run-dir"
            )
        log.warning(
            "run_dir %s: taking over the lock %s left by process %d, which no longer runs",
            self.path.parent,
            self.path,
            pid,
        )
        self.path.unlink(missing_ok=True)

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


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
