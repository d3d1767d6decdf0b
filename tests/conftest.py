"""Shared test set-up."""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """One intra-op thread: the tests' tensors are small, and on a shared 2-core machine extra
    threads oversubscribe the cores (seen here: 10x slowdowns)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
