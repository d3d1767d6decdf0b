"""Every metric the trainer reports, declared once; timings, memory; a background writer.

`METRICS` says how each metric combines across ranks (an all-reduce, `derived` from reduced
sums, or rank 0's `host` figure), how it is shown and what it means, for every reader (the
reduction, console, metrics.jsonl, TensorBoard, docs/trainer.md): undeclared, it is not reported.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import queue
import resource
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from grpo_trainer.base.checkpoint import atomic_write_text

log = logging.getLogger(__name__)

Reduce = Literal["sum", "mean", "min", "max", "derived", "host"]


@dataclasses.dataclass(frozen=True)
class Metric:
    reduce: Reduce
    help: str
    fmt: str = "{:.4g}"
    live: str | None = None  # its label in the live progress line, if shown there
    summary: bool = False  # in the summary table at the end of a run


METRICS: dict[str, Metric] = {
    # -- progress (host) --
    "update": Metric("host", "updates done", "{:.0f}", summary=True),
    "env_steps": Metric(
        "host", "sub-env steps simulated so far, all ranks", "{:,.0f}", summary=True
    ),
    "valid_steps": Metric(
        "sum", "steps of this update's trained rows that belong to counted episodes", "{:,.0f}"
    ),
    "horizon": Metric("host", "episodes mode: this update's rollout horizon", "{:.0f}"),
    "lr": Metric("host", "learning rate of this update", "{:.3g}"),
    "rollout_s": Metric("host", "seconds spent collecting the rollout", "{:.3f}"),
    "update_s": Metric("host", "seconds spent on advantages and optimisation", "{:.3f}"),
    "steps_per_s": Metric(
        "host",
        "env steps per second of this update (rollout and optimisation)",
        "{:,.0f}",
        live="steps/s",
        summary=True,
    ),
    "warmup_s": Metric(
        "host", "seconds of the first update, compilation included", "{:.2f}", summary=True
    ),
    "train_s": Metric(
        "host",
        "seconds of training so far (rollouts and updates; the slowest rank's)",
        "{:.1f}",
        summary=True,
    ),
    # -- episodes that ended during the update (derived from reduced sums) --
    "episodes": Metric("sum", "episodes that ended during this update", "{:.0f}"),
    "return_mean": Metric(
        "derived", "mean return of those episodes", "{:.2f}", live="return", summary=True
    ),
    "return_std": Metric("derived", "their return's standard deviation", "{:.2f}", summary=True),
    "return_min": Metric("min", "their lowest return", "{:.2f}"),
    "return_max": Metric("max", "their highest return", "{:.2f}"),
    "length_mean": Metric("derived", "their mean length in steps", "{:.1f}", summary=True),
    "length_max": Metric("max", "the longest episode still being played (steps so far)", "{:.0f}"),
    "episode_<field>": Metric(
        "derived",
        "mean of a numeric info['episode'] field over those episodes (e.g. episode_caught)",
        "{:.2f}",
        summary=True,
    ),
    "<ratio>": Metric(
        "derived",
        "a success ratio the env declares, hits / (hits + misses) (e.g. catch_rate)",
        "{:.3f}",
        live="",
        summary=True,
    ),
    # -- advantages --
    "frac_zero_std_groups": Metric(
        "derived",
        "fraction of compared group steps whose returns had no spread (no signal, weight 0); "
        "absent when nothing was compared",
        "{:.2f}",
        live="zero-std",
        summary=True,
    ),
    # -- optimisation: means over the update's gradient steps --
    "loss": Metric("mean", "total loss", "{:.4f}"),
    "policy_loss": Metric("mean", "clipped surrogate term", "{:.4f}"),
    "kl": Metric(
        "mean", "k3 KL to the reference policy (0 without kl_coef)", "{:.4f}", summary=True
    ),
    "entropy": Metric("mean", "policy entropy", "{:.3f}", live="entropy", summary=True),
    "clip_fraction": Metric(
        "mean", "fraction of samples whose ratio was clipped", "{:.3f}", summary=True
    ),
    "approx_kl_old": Metric("mean", "k3 KL to the rollout policy: the step size", "{:.4f}"),
    "mean_bound": Metric(
        "mean",
        "penalty on a Gaussian past the action bounds (its mean past them, its std past half "
        "their range), per valid sample (before mean_bound_coef; 0 for discrete actions)",
        "{:.4f}",
    ),
    "value_loss": Metric(
        "mean",
        "the critic's squared error per valid sample over its targets' variance (before "
        "value_coef; 1: no better than their mean; 0 without a critic)",
        "{:.4f}",
    ),
    "grad_norm": Metric("max", "global gradient norm before clipping", "{:.3f}"),
    "skipped_steps": Metric(
        "max", "optimiser steps skipped for a non-finite loss or gradient", "{:.0f}"
    ),
    # -- evaluation during training (eval_every; every rank has the same, summed figures) --
    "eval_return_mean": Metric(
        "host",
        "mean return of the latest evaluation's episodes (greedy actions, separate envs)",
        "{:.2f}",
        live="eval return",
        summary=True,
    ),
    "eval_<ratio>": Metric(
        "host",
        "a declared ratio over those episodes (e.g. eval_catch_rate)",
        "{:.3f}",
        live="",
        summary=True,
    ),
    "eval_<metric>": Metric(
        "host",
        "another figure of those episodes: eval_return_std, eval_length_mean, eval_episodes, "
        "eval_episode_<field>",
        "{:.4g}",
    ),
    "eval_score": Metric(
        "host",
        "what picks best.pt and meets the target: the env's first declared ratio "
        "(eval_catch_rate), else eval_return_mean",
        "{:.4g}",
        summary=True,
    ),
    "eval_s": Metric(
        "host", "seconds the latest evaluation took (outside steps_per_s and train_s)", "{:.2f}"
    ),
    "eval_total_s": Metric("host", "seconds spent evaluating so far", "{:.1f}", summary=True),
    "target_reached_s": Metric(
        "host",
        "wall seconds from the run's start to the first evaluation at the target (--target, "
        "else the env's declared goal), compilation and evaluations included",
        "{:.1f}",
        summary=True,
    ),
    "target_reached_env_steps": Metric(
        "host", "env steps done at that evaluation", "{:,.0f}", summary=True
    ),
    # -- memory (host) --
    "mem_rss_mib": Metric("host", "CPU: resident memory, MiB", "{:.0f}"),
    "mem_peak_rss_mib": Metric("host", "CPU: peak resident memory, MiB", "{:.0f}"),
    "mem_allocated_mib": Metric("host", "CUDA: memory allocated by tensors, MiB", "{:.0f}"),
    "mem_reserved_mib": Metric("host", "CUDA: memory reserved by the allocator, MiB", "{:.0f}"),
    "mem_peak_mib": Metric("host", "CUDA: peak memory allocated, MiB", "{:.0f}"),
}


def cross_rank(name: str) -> Reduce:
    """How an update's raw per-rank value `name` combines across ranks: a declared metric's
    own all-reduce; anything else (the sums behind `derived` metrics, the stop flag) adds up."""
    metric = METRICS.get(name)
    return metric.reduce if metric and metric.reduce in ("sum", "mean", "min", "max") else "sum"


def spec(name: str, ratios: Mapping[str, Any] | None = None) -> Metric:
    """The declaration of `name` (`episode_*` and the env's ratios by their pattern)."""
    if name in METRICS:
        return METRICS[name]
    if name.startswith("eval_"):
        own = name.removeprefix("eval_")
        return METRICS["eval_<ratio>" if ratios and own in ratios else "eval_<metric>"]
    if name.startswith("episode_"):
        return METRICS["episode_<field>"]
    if ratios and name in ratios:
        return METRICS["<ratio>"]
    raise KeyError(f"metric {name!r} is not declared in grpo_trainer.base.metrics.METRICS")


def markdown_table() -> str:
    """The metrics table of docs/trainer.md."""
    lines = ["| metric | across ranks | meaning |", "|---|---|---|"]
    lines += [f"| `{name}` | {m.reduce} | {m.help} |" for name, m in METRICS.items()]
    return "\n".join(lines)


def declared(
    metrics: Mapping[str, float], ratios: Mapping[str, Any] | None = None
) -> Iterator[tuple[str, float, Metric]]:
    """Each of `metrics` that `METRICS` declares, with its declaration."""
    for name, value in metrics.items():
        try:
            metric = spec(name, ratios)
        except KeyError:
            continue
        yield name, value, metric


def live_line(metrics: Mapping[str, float], ratios: Mapping[str, Any] | None = None) -> str:
    """The metrics shown while training, e.g. `return 12.31  catch_rate 0.702  ...`."""
    return "  ".join(
        f"{m.live or name} {m.fmt.format(value)}"
        for name, value, m in declared(metrics, ratios)
        if m.live is not None
    )


def to_host(metrics: Mapping[str, torch.Tensor | float | int]) -> dict[str, float]:
    """One device-to-host copy for all tensor metrics (the only sync of an update)."""
    names = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, torch.Tensor)}
    if names:
        stacked = torch.stack([metrics[k].detach().double().reshape(()) for k in names])  # type: ignore[union-attr]
        out.update(zip(names, stacked.cpu().tolist(), strict=True))
    return out


class Clock:
    """A mark in time (on CUDA an event, read after the update's host copy: no sync of its own);
    subtract two marks for the seconds between them."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.mark: Any = torch.cuda.Event(enable_timing=True)
            self.mark.record()
        else:
            self.mark = time.perf_counter()

    def __sub__(self, earlier: Clock) -> float:
        if self.cuda:
            return earlier.mark.elapsed_time(self.mark) / 1000.0
        return self.mark - earlier.mark


def memory_stats(device: torch.device) -> dict[str, float]:
    """Memory in MiB: allocated/reserved/peak on CUDA; resident and peak resident on CPU."""
    mib = 1024**2
    if device.type == "cuda":
        return {
            "mem_allocated_mib": torch.cuda.memory_allocated(device) / mib,
            "mem_reserved_mib": torch.cuda.memory_reserved(device) / mib,
            "mem_peak_mib": torch.cuda.max_memory_allocated(device) / mib,
        }
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if sys.platform == "darwin":
        peak_kib //= 1024  # bytes there
    return {"mem_rss_mib": _current_rss() / mib, "mem_peak_rss_mib": peak_kib / 1024}


def _current_rss() -> float:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return float("nan")


class MetricsWriter:
    """Writes metric rows to `metrics.jsonl` (and TensorBoard) from a background thread."""

    def __init__(self, run_dir: Path | None, tensorboard: bool = False) -> None:
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._file = open(run_dir / "metrics.jsonl", "a") if run_dir else None  # noqa: SIM115
        self._tb = _tensorboard_writer(run_dir) if tensorboard and run_dir else None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="metrics-writer", daemon=True)
        self._thread.start()

    def write(self, row: dict[str, Any]) -> None:
        if self.error is not None:
            raise RuntimeError(f"metrics writer failed: {self.error}") from self.error
        self._queue.put(row)

    def flush(self) -> None:
        """Wait until every row given so far is on disk (before a checkpoint that counts them)."""
        self._queue.join()
        if self.error is not None:
            raise RuntimeError(f"metrics writer failed: {self.error}") from self.error

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self._file:
            self._file.close()
        if self._tb:
            self._tb.close()

    def _run(self) -> None:
        while (row := self._queue.get()) is not None:
            try:
                if self._file:
                    self._file.write(json.dumps(row) + "\n")
                    self._file.flush()
                if self._tb:
                    step = int(row.get("env_steps", 0))
                    for key, value in row.items():
                        if isinstance(value, (int, float)):
                            self._tb.add_scalar(key, value, step)
            except Exception as err:  # surfaced to the trainer on its next write
                self.error = err
            finally:
                self._queue.task_done()


def keep_rows_up_to(path: Path, update: int) -> None:
    """Cut `metrics.jsonl` back to the rows of updates `<= update`, where a resume continues:
    rows a `kill -9` left after that checkpoint (and a torn line) would otherwise repeat."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line torn by the kill
            continue
        if isinstance(row, dict) and row.get("update", math.inf) <= update:
            kept.append(line + "\n")
    atomic_write_text("".join(kept), path)


def _tensorboard_writer(run_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        log.warning("--tensorboard needs the 'tensorboard' package; continuing without it")
        return None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))
