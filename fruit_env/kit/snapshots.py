"""What a sub-env state snapshot holds, and the checks a restore makes before it writes.

A snapshot carries the rules it was taken under (`rules`: the game's class and
`TensorGame.rules_key()`, as UTF-8 bytes in a uint8 tensor), because two envs of one game
with other parameters (Fruit Catcher of width 20 and of width 10) can have the same packed
rows: restoring one into the other would be accepted and give observations outside the
declared space. The tag is a tensor so that it travels wherever the snapshot's tensors do (a
checkpoint stores tensors only). A restore from the env's own `snapshot_state` is recognised
by identity and reads nothing; any other tag is read from its device once (a checkpoint's).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import torch

from fruit_env.kit.game import TensorGame


class SubEnvSnapshot(NamedTuple):
    """The state of some sub-envs, one column (`packed`) or entry per sub-env."""

    packed: torch.Tensor  # (rows + 1, n) int32: the game's packed rows (`layout.py`), pending
    key: torch.Tensor  # (n,) int64
    counter: torch.Tensor  # (n,) int64
    rules: torch.Tensor  # (k,) uint8: the rules it was taken under (`rules_tag`)


_DTYPES = {"packed": torch.int32, "key": torch.int64, "counter": torch.int64}


def describe(game: TensorGame[Any]) -> str:
    """The rules of `game` as one line: its class and `rules_key()`."""
    return f"{type(game).__qualname__} {game.rules_key()}"


def rules_tag(game: TensorGame[Any], device: torch.device) -> torch.Tensor:
    """`describe(game)` as a uint8 tensor on `device`."""
    data = bytearray(describe(game).encode())
    return torch.frombuffer(data, dtype=torch.uint8).to(device)


def checked(
    snapshot: Any, rows: int, entries: int, own_tag: torch.Tensor, game: TensorGame[Any]
) -> SubEnvSnapshot:
    """`snapshot` as a `SubEnvSnapshot`, or a `ValueError` that names what does not fit an
    env of `game` whose packed state has `rows` rows, restored into `entries` sub-envs.

    A snapshot of three tensors (written before snapshots carried their rules, e.g. in an
    older checkpoint) is taken without the rules check."""
    if not isinstance(snapshot, (tuple, list)) or len(snapshot) not in (3, 4):
        raise ValueError(
            "snapshot must be what snapshot_state() returned (or its tensors as a tuple), "
            f"got {type(snapshot).__name__}"
            + (f" of {len(snapshot)} items" if isinstance(snapshot, (tuple, list)) else "")
        )
    *tensors, tag = snapshot if len(snapshot) == 4 else (*snapshot, own_tag)
    for name, value in zip(_DTYPES, tensors, strict=True):
        if not isinstance(value, torch.Tensor) or value.dtype != _DTYPES[name]:
            got = f"a {value.dtype} tensor" if isinstance(value, torch.Tensor) else repr(value)
            raise ValueError(
                f"snapshot.{name} must be a {_DTYPES[name]} tensor, as snapshot_state() "
                f"gives it; got {got[:80]}"
            )
    if tag is not own_tag:
        _check_rules(tag, own_tag, game)
    packed, key, _ = tensors
    if tuple(packed.shape) != (rows + 1, entries) or tuple(key.shape) != (entries,):
        raise ValueError(
            f"snapshot has {key.shape[0] if key.dim() else 0} rows of shape "
            f"{tuple(packed.shape[:1])}, index has {entries} entries of ({rows + 1},): it is "
            "from another env or another index"
        )
    return SubEnvSnapshot(*tensors, own_tag)


def _check_rules(tag: Any, own_tag: torch.Tensor, game: TensorGame[Any]) -> None:
    """A `ValueError` naming both rules unless `tag` holds this env's rules."""
    if not isinstance(tag, torch.Tensor) or tag.dtype != torch.uint8 or tag.dim() != 1:
        raise ValueError(f"snapshot.rules must be a 1-D uint8 tensor, got {tag!r:.80}")
    if tag.device.type == "meta" or own_tag.device.type == "meta":  # no data to compare
        same = tag.shape == own_tag.shape
        theirs = f"rules of {tag.shape[0]} bytes"
    else:
        theirs = bytes(tag.cpu().numpy()).decode(errors="replace")
        same = theirs == describe(game)
    if not same:
        ours = describe(game)
        raise ValueError(
            f"snapshot is from another env's rules: {_difference(theirs, ours)}; a snapshot "
            "restores only into an env of the same game with the same parameters"
        )


def _difference(theirs: str, ours: str) -> str:
    """What differs between two rules descriptions: the parameters (`name=value` and the
    like) each has that the other lacks, or both whole where they share no form."""
    split = re.compile(r"[\s,()\[\]]+")
    mine, other = split.split(ours), split.split(theirs)
    only_theirs = [t for t in other if t and t not in mine]
    only_ours = [t for t in mine if t and t not in other]
    game = ours.split(" ", 1)[0]
    if not only_theirs or not only_ours or theirs.split(" ", 1)[0] != game:
        return f"it was taken under {theirs}, and this env plays {ours}"
    return (
        f"it was taken under {game} with {', '.join(only_theirs)}, and this env plays "
        f"{game} with {', '.join(only_ours)}"
    )
