"""Checkpoints: atomic writes, a SHA-256 of the contents, the last K kept, safe loading.

A checkpoint is a plain dict of tensors and plain data, loaded with `weights_only=True` (no
code runs), and carries a SHA-256 of its own contents, since `torch.load` does not notice a
flipped bit in tensor data (docs/reliability.md, "Integrity").
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import struct
import warnings
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

FORMAT_VERSION = 3  # 2: adds the "sha256" digest; 3: windowed rollouts' state, train_s
DIGEST_KEY = "sha256"
_NUMBERED = re.compile(r"update-(\d+)\.pt$")
_TEMP = re.compile(r"^\..+\.tmp-(\d+)$")
# Config fields that decide the network's shape or function: a checkpoint trained with other
# values cannot drive this network, even where the tensor shapes happen to agree.
ARCHITECTURE_FIELDS = ("hidden_sizes", "activation", "cnn_channels")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, corrupted or incompatible."""


# -- digest ------------------------------------------------------------------------------------


def payload_digest(payload: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of everything in `payload` but its `"sha256"` entry: of values, not
    pickle bytes, so it is the same before saving (tensors on CUDA) and after loading."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in payload.items() if k != DIGEST_KEY})
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    """Feed one value, type-tagged and length-prefixed so that no two values collide."""

    def chunk(tag: bytes, data: bytes | memoryview) -> None:
        h.update(tag + struct.pack("<Q", len(data)))
        h.update(data)

    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous().reshape(-1)
        chunk(b"T", f"{t.dtype}{tuple(value.shape)}".encode())
        chunk(b"D", memoryview(t.view(torch.uint8).numpy()))
    elif isinstance(value, Mapping):
        chunk(b"M", str(len(value)).encode())
        for key, item in value.items():
            _feed(h, key)
            _feed(h, item)
    elif isinstance(value, (list, tuple)):  # one tag: a round trip must not change the digest
        chunk(b"L", str(len(value)).encode())
        for item in value:
            _feed(h, item)
    elif isinstance(value, str):
        chunk(b"S", value.encode())
    elif isinstance(value, bytes):
        chunk(b"B", value)
    elif value is None or isinstance(value, (bool, int, float)):
        chunk(b"N", f"{type(value).__name__}:{value!r}".encode())
    else:  # torch.dtype, torch.device, ...: their repr is stable
        chunk(b"R", f"{type(value).__name__}:{value!r}".encode())


def _to_cpu(value: Any) -> Any:
    """The payload with every tensor on the CPU: one device copy, shared by hash and save."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


# -- saving ------------------------------------------------------------------------------------


def atomic_save(payload: dict[str, Any], path: Path) -> None:
    """Add the digest, write beside `path`, fsync, rename over it: never a partial file."""
    _write(_with_digest(payload), path)


def atomic_write_text(text: str, path: Path) -> None:
    """Write `text` beside `path`, then rename it over: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _with_digest(payload: dict[str, Any]) -> dict[str, Any]:
    """A CPU copy of `payload` that records its own SHA-256."""
    payload = _to_cpu(payload)
    payload[DIGEST_KEY] = payload_digest(payload)
    return payload


def _write(payload: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        err = _os_error(err)
        if isinstance(err, OSError):
            hint = " (disk full)" if err.errno in (errno.ENOSPC, errno.EDQUOT) else ""
            raise OSError(
                err.errno,
                f"cannot write checkpoint {path}{hint}: {err.strerror or err}; "
                "the checkpoints already on disk are unchanged",
            ) from err
        raise
    _fsync_dir(path.parent)


def _os_error(err: BaseException) -> BaseException:
    """The `OSError` behind `err` (`torch.save` wraps a failed write in a `RuntimeError`)."""
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    return cause or err


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); silently skipped where directories can't sync."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_rotating(payload: dict[str, Any], folder: Path, update: int, keep: int) -> Path:
    """Save `update-NNNNNNN.pt`, then `last.pt`; keep the newest `keep` numbered files. Files
    newer than `update` are of a history a resume abandoned: removed, so newest means latest."""
    remove_stale_temp_files(folder)
    path = folder / f"update-{update:07d}.pt"
    payload = _with_digest(payload)  # one device copy and one hash for both files
    _write(payload, path)
    _write(payload, folder / "last.pt")
    numbered = numbered_checkpoints(folder)
    for old in numbered:
        if _number(old) > update:
            log.warning("removing %s: newer than the resumed run's update %d", old, update)
            old.unlink(missing_ok=True)
    for old in [p for p in numbered if _number(p) <= update][keep:]:
        old.unlink(missing_ok=True)
    return path


def prepare_folder(folder: Path) -> None:
    """Create `folder` and prove it writable now, not at the first checkpoint an hour later."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(b"ok")
            f.flush()
            os.fsync(f.fileno())
    finally:
        probe.unlink(missing_ok=True)
    remove_stale_temp_files(folder)


def remove_stale_temp_files(folder: Path) -> None:
    """Delete temporary files left by a process killed mid-save (its pid no longer runs)."""
    for tmp in folder.glob(".*.tmp-*"):
        m = _TEMP.match(tmp.name)
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            tmp.unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs (on this machine)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists but belongs to someone else
        return True
    return True


def _number(path: Path) -> int:
    m = _NUMBERED.search(path.name)
    return int(m.group(1)) if m else -1


def numbered_checkpoints(folder: Path) -> list[Path]:
    """Numbered checkpoints in `folder`, newest first."""
    found = [(_number(p), p) for p in folder.glob("update-*.pt") if _NUMBERED.search(p.name)]
    return [p for _, p in sorted(found, reverse=True)]


# -- loading -----------------------------------------------------------------------------------


def load(path: Path | str) -> dict[str, Any]:
    """Load one checkpoint safely and verify it, or raise `CheckpointError` saying why."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(
            f"checkpoint {path} cannot be loaded safely (truncated, corrupted, or it holds "
            f"objects other than tensors and plain data): {err}"
        ) from None
    if not isinstance(payload, dict) or "format_version" not in payload:
        raise CheckpointError(f"checkpoint {path} is not a grpo_trainer checkpoint")
    if payload["format_version"] != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {payload['format_version']!r}; "
            f"this grpo_trainer reads version {FORMAT_VERSION}"
        )
    recorded = payload.get(DIGEST_KEY)
    actual = payload_digest(payload)
    if recorded != actual:
        raise CheckpointError(
            f"checkpoint {path} is corrupted: its contents hash to sha256 {actual[:16]}…, "
            f"but the file records {str(recorded)[:16]}…"
        )
    return payload


def load_for_resume(path: Path | str) -> tuple[dict[str, Any], Path]:
    """A file loads as it is; a run directory tries its newest numbered file, `last.pt` (its
    twin), then older ones, skipping unusable ones with a warning (if none loads, the error
    lists why each failed)."""
    path = Path(path)
    if path.is_file():
        return load(path), path
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist")
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    numbered = numbered_checkpoints(folder)
    candidates = [*numbered[:1], folder / "last.pt", *numbered[1:]]
    errors = []
    for candidate in (c for c in candidates if c.is_file()):
        try:
            return load(candidate), candidate
        except CheckpointError as err:
            warnings.warn(f"skipping unusable checkpoint: {err}", RuntimeWarning, stacklevel=2)
            errors.append(str(err))
    if not errors:
        raise CheckpointError(f"no checkpoint in {folder} (expected last.pt or update-*.pt)")
    raise CheckpointError(f"no usable checkpoint in {folder}" + "".join(f"\n  {e}" for e in errors))


def space_signature(observation_space: Any, action_space: Any) -> dict[str, str]:
    """How a checkpoint records the spaces its policy was made for."""
    return {"observation_space": str(observation_space), "action_space": str(action_space)}


def check_compatible(
    payload: Mapping[str, Any], where: Path, spaces: Mapping[str, str], config: Mapping[str, Any]
) -> None:
    """Refuse a checkpoint made for other spaces or another network, naming each difference."""
    saved_spaces = payload.get("spaces") or {}
    problems = [
        f"{name}: checkpoint {saved_spaces.get(name)!r}, this env {spaces[name]!r}"
        for name in spaces
        if saved_spaces.get(name) != spaces[name]
    ]
    saved = payload.get("config") or {}
    for name in ARCHITECTURE_FIELDS:
        ours, theirs = config[name], saved.get(name, config[name])  # older: the default
        if isinstance(ours, (list, tuple)) and isinstance(theirs, (list, tuple)):
            ours, theirs = list(ours), list(theirs)
        if ours != theirs:
            problems.append(f"{name}: checkpoint {theirs!r}, this config {ours!r}")
    if problems:
        raise CheckpointError(
            f"checkpoint {where} is incompatible with this run: " + "; ".join(problems)
        )


def check_same_env(
    payload: Mapping[str, Any], where: Path, run: Mapping[str, Any], free: Collection[str]
) -> None:
    """Refuse to continue a checkpoint's episodes in another env: another env id, or another
    value of an env kwarg that may shape the state (all but those in `free`: device, fast
    options), since its episodes would be restored into rules they do not fit."""
    saved = (payload.get("config") or {}).get("run") or {}
    problems = []
    if saved.get("env", run["env"]) != run["env"]:
        problems.append(f"env: checkpoint {saved['env']!r}, this run {run['env']!r}")
    ours, theirs = run["env_kwargs"], saved.get("env_kwargs", run["env_kwargs"])
    for name in sorted(set(ours) | set(theirs)):
        if name not in free and ours.get(name) != theirs.get(name):
            problems.append(
                f"env_kwargs[{name!r}]: checkpoint {theirs.get(name, '(unset)')!r}, "
                f"this run {ours.get(name, '(unset)')!r}"
            )
    if problems:
        raise CheckpointError(
            f"checkpoint {where} holds episodes of another env: "
            + "; ".join(problems)
            + "; resume with the env and --env-kwargs it was trained with"
        )
