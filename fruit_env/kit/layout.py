"""A batch of game states as one int32 tensor: one row per scalar field, one column per sub-env.

The kit keeps a state in the game's own NamedTuple form while it steps it eagerly, and packs it
where one tensor serves better than many:

* snapshots: the rows of some sub-envs are one gather, and a snapshot is three tensors (the
  rows, keys, counters) whatever the game;
* the compiled step: one int32 tensor crosses the graph's boundary instead of a tensor per
  field (inductor's CPU code loads and stores bool tensors element by element: measured in
  docs/performance.md);
* a game's faster eager form (`TensorGame.eager_form`), which works on the rows in place.

The rows follow the fields in order, nested NamedTuples and tuples depth first; a field of
shape `(N, a, b)` takes `a * b` rows in row-major order. bool and integer fields are stored as
int32 values, float32 fields bit for bit.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

_STORED = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.float32)


class Packed(NamedTuple):
    """A state kept as packed rows: `board` is the `(N, rows)` transpose of a `(rows, N)`
    int32 tensor, so that it indexes by sub-env like any other state's fields."""

    board: torch.Tensor


class Field(NamedTuple):
    name: str
    shape: tuple[int, ...]  # per sub-env
    dtype: torch.dtype
    start: int  # its first row

    @property
    def stop(self) -> int:
        return self.start + math.prod(self.shape)


class Layout:
    """Where each field of a game's state sits in the packed rows, read from one example
    state (`Layout(game.initial(bits))`)."""

    def __init__(self, example: Any) -> None:
        self.fields: list[Field] = []
        self._tree = self._read(example, "")
        self.rows = self.fields[-1].stop if self.fields else 0

    def _read(self, node: Any, path: str) -> Any:
        """The state's shape as nested field types, recording its tensors as fields."""
        if isinstance(node, torch.Tensor):
            name = path or "state"
            if node.dim() < 1 or node.dtype not in _STORED:
                raise ValueError(
                    f"state field {name!r} must be a (num_envs, ...) tensor of bool, an integer "
                    f"type of at most 32 bits or float32, got {node.dtype} {tuple(node.shape)}"
                )
            start = self.fields[-1].stop if self.fields else 0
            self.fields.append(Field(name, tuple(node.shape[1:]), node.dtype, start))
            return None
        if not isinstance(node, tuple) or (not path and not hasattr(node, "_fields")):
            raise ValueError(
                f"a game state is a NamedTuple of tensors (or of tuples of them); "
                f"{path or 'the state'} is a {type(node).__name__}"
            )
        names = node._fields if hasattr(node, "_fields") else [str(i) for i in range(len(node))]
        paths = [f"{path}.{name}" if path else name for name in names]
        children = [self._read(v, p) for p, v in zip(paths, node, strict=True)]
        return (type(node), children)

    def pack(self, state: Any) -> torch.Tensor:
        """The `(rows, N)` int32 tensor of `state` (a state of this layout, or `Packed`)."""
        if isinstance(state, Packed):
            return state.board.T
        return torch.cat(self.blocks(state), 0)

    def blocks(self, state: Any) -> list[torch.Tensor]:
        """The rows of each field of `state`, as `(k, N)` int32 tensors in layout order."""
        leaves = _leaves(state)
        n = leaves[0].shape[0]
        return [_as_int32(leaf).reshape(n, -1).T for leaf in leaves]

    def unpack(self, rows: torch.Tensor) -> Any:
        """The state whose packed rows are `rows` (views of them where the dtype allows)."""
        n = rows.shape[1]
        leaves = iter(
            _from_int32(rows[f.start : f.stop].T.reshape(n, *f.shape), f.dtype) for f in self.fields
        )
        return _build(self._tree, leaves)

    def state(self, state: Any) -> Any:
        """`state` in the game's own form (a `Packed` state unpacked)."""
        return self.unpack(state.board.T) if isinstance(state, Packed) else state

    def zeros(self, num_envs: int, device: torch.device) -> Any:
        """A state of zeros (a placeholder until the first reset)."""
        return self.unpack(torch.zeros((self.rows, num_envs), dtype=torch.int32, device=device))


def packed(rows: torch.Tensor) -> Packed:
    """`rows` (rows, N) as a `Packed` state."""
    return Packed(rows.T)


def _leaves(node: Any) -> list[torch.Tensor]:
    if isinstance(node, torch.Tensor):
        return [node]
    return [leaf for child in node for leaf in _leaves(child)]


def _build(tree: Any, leaves: Any) -> Any:
    if tree is None:
        return next(leaves)
    kind, children = tree
    built = (_build(child, leaves) for child in children)
    return kind(*built) if hasattr(kind, "_fields") else kind(built)


def _as_int32(leaf: torch.Tensor) -> torch.Tensor:
    if leaf.dtype == torch.float32:
        return leaf.view(torch.int32)  # bit for bit
    return leaf.to(torch.int32)


def _from_int32(block: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.int32:
        return block
    if dtype == torch.bool:
        return block != 0
    if dtype == torch.float32:
        return block.view(torch.float32)
    return block.to(dtype)
