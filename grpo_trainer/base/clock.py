"""Marks in time that cost no device sync."""

from __future__ import annotations

import time
from typing import Any

import torch


class Clock:
    """A mark in time; on CUDA an event, read after the update's host copy, so that timing
    adds no sync of its own. Subtract two marks for the seconds between them."""

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
