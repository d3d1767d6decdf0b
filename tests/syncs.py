"""A counter of the aten operations that make a GPU wait for the host (or the host for it).

On the CPU nothing waits, but the same operations run: `.item()`, `int()` and `float()` of a
tensor (`_local_scalar_dense`), `bool()` (`is_nonzero`), and the data-dependent shapes of
`nonzero` and `masked_select`. Counting them on the CPU measures what a CUDA run would sync.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = ("_local_scalar_dense", "is_nonzero", "nonzero", "masked_select")


class SyncCounter(TorchDispatchMode):
    """`with SyncCounter() as syncs: ...`, then `syncs.total` and `syncs.by_op`."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name in SYNC_OPS:
            self.by_op[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_op.values())
