"""What callers hand the vector env, checked and turned into tensors on its device.

Every function raises a `ValueError` that names the argument and what was wrong with it, and
none reads device data: shapes, dtypes and devices are host metadata. The values of actions
are the action check's (`actions.py`), not these functions'.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from fruit_env.kit import rng

_WIDE_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)  # torch has few kernels for these


def as_num_envs(num_envs: Any) -> int:
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)):
        raise ValueError(f"num_envs must be an int, got {num_envs!r}")
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    return int(num_envs)


def as_actions(actions: Any, num_envs: int, device: torch.device) -> torch.Tensor:
    """`num_envs` integers (a tensor, numpy array or list) as a tensor on `device`."""
    if not isinstance(actions, torch.Tensor):
        actions = torch.from_numpy(_integer_array(actions, "actions"))
    elif actions.layout != torch.strided:
        raise ValueError(f"actions must be a dense tensor, got {actions.layout}")
    if actions.shape != (num_envs,):
        raise ValueError(f"actions must have shape ({num_envs},), got {tuple(actions.shape)}")
    if actions.dtype.is_floating_point or actions.dtype.is_complex or actions.dtype == torch.bool:
        raise ValueError(f"actions must have an integer dtype, got {actions.dtype}")
    if actions.dtype in _WIDE_UNSIGNED:
        actions = actions.to(torch.int64)
    if actions.device == device:
        return actions
    return _to_device(actions, device, "actions", non_blocking=True)


def as_reset_mask(mask: Any, num_envs: int, device: torch.device) -> torch.Tensor:
    """`options["reset_mask"]` as a bool tensor on `device`; all true when not given."""
    if mask is None:
        return torch.ones(num_envs, dtype=torch.bool, device=device)
    if not isinstance(mask, torch.Tensor):
        try:
            array = np.asarray(mask)
        except ValueError as err:
            raise ValueError(f"options['reset_mask'] is not an array: {err}") from None
        if array.dtype != np.bool_:
            raise ValueError(f"options['reset_mask'] must be a bool array, got dtype {array.dtype}")
        mask = torch.from_numpy(array)
    elif mask.layout != torch.strided:
        raise ValueError("options['reset_mask'] must be a dense tensor")
    if mask.shape != (num_envs,) or mask.dtype != torch.bool:
        raise ValueError(
            f"options['reset_mask'] must be a bool array of shape ({num_envs},), "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
    return _to_device(mask, device, "options['reset_mask']")


def seeded_keys(
    seed: int | Sequence[int | None] | None, mask: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Which sub-envs (among `mask`) get a new random key from `seed`, and the keys; None
    when no seed is given. An int seeds sub-env i with `seed + i` (modulo 2**64); a list gives
    one seed per sub-env, `None` entries none. Every seed must be an int in [0, 2**64)."""
    if seed is None:
        return None
    n = mask.shape[0]
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
        return mask, rng.range_keys(rng.normalize_seed(seed), n, device)  # seed + i, mod 2**64
    if isinstance(seed, Sequence) and not isinstance(seed, str):
        if len(seed) != n:
            raise ValueError(f"seed list must have num_envs={n} entries, got {len(seed)}")
        given = np.array([s is not None for s in seed], dtype=bool)
        seeds = np.array(
            [0 if s is None else rng.normalize_seed(s, "each seed") for s in seed],
            dtype=np.uint64,
        )
        keys = torch.from_numpy(rng.seed_keys(seeds)).to(device)
        return torch.from_numpy(given).to(device) & mask, keys
    raise ValueError(f"seed must be an int, a list of num_envs ints, or None; got {seed!r}")


def as_index(index: Any, device: torch.device, num_envs: int | None = None) -> torch.Tensor:
    """Sub-env indices (a 1-D integer tensor or array) as int64 on `device`, each in
    `[0, num_envs)` when `num_envs` is given. The range is checked where the values are in
    host memory and the env's are not (an array, or a CPU tensor for a GPU env: no sync);
    an index on the env's own CPU is checked by the gather that uses it (`index_errors`)."""
    if not isinstance(index, torch.Tensor):
        index = torch.from_numpy(_integer_array(index, "index"))
    if index.dim() != 1 or index.dtype.is_floating_point or index.dtype == torch.bool:
        raise ValueError(
            f"index must be a 1-D integer tensor, got {index.dtype} {tuple(index.shape)}"
        )
    host = index.device.type == "cpu" and device.type != "cpu"
    if num_envs is not None and host and len(index):
        low, high = int(index.min()), int(index.max())
        if low < 0 or high >= num_envs:
            raise ValueError(_out_of_range(low if low < 0 else high, num_envs))
    return index.to(device, torch.int64)


@contextlib.contextmanager
def index_errors(index: torch.Tensor, num_envs: int) -> Iterator[None]:
    """Turn torch's error for a sub-env `index` out of range (a gather on the CPU) into a
    `ValueError` that names `index` (on a GPU it is a device-side assert: check there first)."""
    try:
        yield
    except IndexError:
        bad = index[(index < 0) | (index >= num_envs)].tolist()  # an error path: read freely
        raise ValueError(_out_of_range(bad[0] if bad else None, num_envs)) from None


def _out_of_range(value: int | None, num_envs: int) -> str:
    got = "" if value is None else f", got {value}"
    return f"index entries must be sub-envs in [0, {num_envs}) (num_envs={num_envs}){got}"


def resolve_device(device: str | torch.device) -> torch.device:
    """A `torch.device` that exists on this machine, or a `ValueError` naming the problem."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a valid torch device: {err}") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        index = resolved.index if resolved.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) exist"
            )
        resolved = torch.device("cuda", index)
    elif resolved.type in ("mps", "xpu"):
        backend = torch.backends.mps if resolved.type == "mps" else getattr(torch, "xpu", None)
        if backend is None or not backend.is_available():
            raise ValueError(f"device {device!r} requested but {resolved.type} is not available")
    elif resolved.type not in ("cpu", "meta"):  # meta: shapes only, for tests
        raise ValueError(f"device {device!r}: unsupported device type {resolved.type!r}")
    return resolved


def parse_autoreset_mode(mode: AutoresetMode | str) -> AutoresetMode:
    """Accept the enum, its value ("NextStep") or its name ("next_step", any case)."""
    if isinstance(mode, AutoresetMode):
        return mode
    if isinstance(mode, str):
        for member in AutoresetMode:
            if mode in (member.value, member.name) or mode.upper() == member.name:
                return member
    choices = [m.name for m in AutoresetMode]
    raise ValueError(f"autoreset_mode must be an AutoresetMode or one of {choices}, got {mode!r}")


def check_size(
    game: object, state_bytes: int, obs_bytes: int, num_envs: int, device: torch.device
) -> None:
    """Refuse a batch whose state and observations would not fit in the device's memory,
    with a `ValueError` naming `num_envs` and the game with its rules (`*_bytes`: per
    sub-env)."""
    memory = _device_memory(device)
    need = num_envs * (state_bytes + obs_bytes)
    if memory is not None and need > memory:
        raise ValueError(
            f"num_envs={num_envs} games of {game!r} need {need / 2**30:,.1f} GiB for one state "
            f"and one observation, more than the {memory / 2**30:,.1f} GiB of {device}: lower "
            "num_envs or the size of a game"
        )


def _device_memory(device: torch.device) -> int | None:
    """Bytes of memory of `device` (the CPU's: physical RAM), None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "cpu" and hasattr(os, "sysconf"):
        try:
            return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError):
            return None
    return None


def _to_device(
    tensor: torch.Tensor, device: torch.device, name: str, non_blocking: bool = False
) -> torch.Tensor:
    try:
        return tensor.to(device, non_blocking=non_blocking)
    except NotImplementedError:  # a meta tensor has no data to copy
        raise ValueError(
            f"{name} must be a tensor with data for an env on {device}, got one on {tensor.device}"
        ) from None


def _integer_array(values: Any, name: str) -> np.ndarray:
    """numpy integers from array-likes, or a `ValueError` naming `name`."""
    try:
        array = np.asarray(values)
    except ValueError as err:  # ragged nesting
        raise ValueError(f"{name} must be an array of integers: {err}") from None
    if array.dtype.kind not in "iu":  # bool, float, strings, objects
        raise ValueError(f"{name} must have an integer dtype, got {array.dtype}")
    if array.dtype.kind == "u" and array.dtype.itemsize > 1:  # few torch kernels for these
        array = array.astype(np.int64)
    if not array.flags.writeable:  # torch cannot alias read-only memory
        array = array.copy()
    return array
