"""Checkpoints: atomic writes, the last K kept, safe loading, fallback past corrupted files.

A checkpoint is a plain dict of tensors, numbers, strings and lists, so it loads with
`torch.load(weights_only=True)`: loading never runs code from the file.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch

FORMAT_VERSION = 1
_NUMBERED = re.compile(r"update-(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, corrupted or incompatible."""


def atomic_save(payload: dict[str, Any], path: Path) -> None:
    """Write to a temporary file in the same folder, flush to disk, then rename over `path`.

    A crash at any moment leaves either the old file or the new one, never a partial one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_rotating(payload: dict[str, Any], folder: Path, update: int, keep: int) -> Path:
    """Save `update-NNNNNNN.pt` and `last.pt`; delete numbered files beyond the newest `keep`."""
    path = folder / f"update-{update:07d}.pt"
    atomic_save(payload, path)
    atomic_save(payload, folder / "last.pt")
    for old in numbered_checkpoints(folder)[keep:]:
        old.unlink(missing_ok=True)
    return path


def numbered_checkpoints(folder: Path) -> list[Path]:
    """Numbered checkpoints in `folder`, newest first."""
    found = [
        (int(m.group(1)), p) for p in folder.glob("update-*.pt") if (m := _NUMBERED.search(p.name))
    ]
    return [p for _, p in sorted(found, reverse=True)]


def load(path: Path | str) -> dict[str, Any]:
    """Load one checkpoint safely, or raise `CheckpointError` saying what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(
            f"checkpoint {path} cannot be loaded safely (corrupted, truncated, or it holds "
            f"objects other than tensors and plain data): {err}"
        ) from None
    if not isinstance(payload, dict) or payload.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} is not a grpo_trainer checkpoint")
    return payload


def load_for_resume(path: Path | str) -> tuple[dict[str, Any], Path]:
    """A file loads as it is; a run directory falls back from `last.pt` to older files.

    Corrupted candidates are skipped with a warning; if none loads, `CheckpointError`.
    """
    path = Path(path)
    if path.is_file():
        return load(path), path
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    candidates = [folder / "last.pt", *numbered_checkpoints(folder)]
    errors = []
    for candidate in candidates:
        if not candidate.is_file():
            continue
        try:
            return load(candidate), candidate
        except CheckpointError as err:
            warnings.warn(f"skipping unusable checkpoint: {err}", RuntimeWarning, stacklevel=2)
            errors.append(str(err))
    raise CheckpointError(f"no usable checkpoint in {folder}" + "".join(f"\n  {e}" for e in errors))
