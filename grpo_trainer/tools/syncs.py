"""Counting host syncs: a `TorchDispatchMode` that records the aten calls which copy device
data to the host, so that a test on the CPU can assert that code would not sync on a GPU.

    with SyncCounter() as syncs:
        env.step(actions)
    assert syncs.count == 0, syncs.calls

`.item()`, `int(t)`, `bool(t)` reach `_local_scalar_dense` or `is_nonzero`; `nonzero` and
`masked_select` read data to size their output; bool-mask indexing calls `nonzero` inside
`index` / `index_put`, out of this mode's sight, so those calls count too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["INDEX_OPS", "SYNC_OPS", "SyncCounter"]

aten = torch.ops.aten
SYNC_OPS = frozenset({aten._local_scalar_dense, aten.is_nonzero, aten.nonzero, aten.masked_select})
INDEX_OPS = frozenset({aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_})


class SyncCounter(TorchDispatchMode):
    """Counts calls of `SYNC_OPS` while active; `calls` lists them in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    @property
    def count(self) -> int:
        return len(self.calls)

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        packet = func.overloadpacket
        if packet in SYNC_OPS or (packet in INDEX_OPS and _bool_index(args)):
            self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def _bool_index(args: tuple[Any, ...]) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
    )
