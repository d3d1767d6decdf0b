"""Observability: device-side metric reduction, memory figures, and a background writer.

The trainer gathers each update's metrics as 0-d device tensors and copies them to the host
in one transfer (`to_host`). Writing (JSONL, TensorBoard) happens on a background thread so
the training loop never waits on the disk.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import resource
import sys
import threading
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


def to_host(metrics: dict[str, torch.Tensor | float | int]) -> dict[str, float]:
    """One device-to-host copy for all tensor metrics (the only sync of an update)."""
    names = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, torch.Tensor)}
    if names:
        stacked = torch.stack([metrics[k].detach().double().reshape(()) for k in names])  # type: ignore[union-attr]
        out.update(zip(names, stacked.cpu().tolist(), strict=True))
    return out


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
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
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


def _tensorboard_writer(run_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        log.warning("--tensorboard needs the 'tensorboard' package; continuing without it")
        return None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))
