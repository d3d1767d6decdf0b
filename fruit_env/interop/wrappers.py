"""Wrappers for torch vector envs: zero-copy views for numpy, JAX, CuPy and other DLPack
frameworks, and episode statistics kept on the device.

`FruitCatcherVectorEnv` returns fresh torch tensors on every `reset` and `step`. These wrappers
hand the same memory to another framework instead of copying it:

* `NumpyView`: numpy arrays that share memory with the env's CPU tensors (`Tensor.numpy()`).
* `DLPackView`: arrays of any Array-API module with `from_dlpack` (numpy, jax.numpy, cupy).

Because the env allocates new tensors each step, a returned array stays valid after later
steps: it aliases that step's tensor, not a buffer the env overwrites. Copies happen only
where the memory cannot be shared (another device) and only when asked for with
`allow_copy=True`.

Actions go the other way without a copy where possible (`torch.from_numpy`,
`torch.from_dlpack`) and are then moved to the env's device.

`TorchEpisodeStatistics` is Gymnasium's vector `RecordEpisodeStatistics` for any torch vector
env, with its returns, lengths and buffers kept on the env's device: no host sync per step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper

__all__ = ["DLPackView", "NumpyView", "TorchEpisodeStatistics", "env_device", "to_torch"]

Converter = Callable[[torch.Tensor], Any]


def env_device(env: VectorEnv) -> torch.device:
    """The torch device of a (possibly wrapped) torch vector env, or a TypeError."""
    for candidate in (env, env.unwrapped):
        device = getattr(candidate, "device", None)
        if isinstance(device, (str, torch.device)):
            return torch.device(device)
    raise TypeError(
        f"{type(env).__name__} has no `device` attribute; these views wrap a torch vector env "
        "such as FruitCatcherVectorEnv"
    )


def to_torch(value: Any, device: torch.device) -> torch.Tensor:
    """Actions or a reset mask from numpy / DLPack / Python values to a tensor on `device`.

    numpy arrays go through `torch.from_numpy` and DLPack producers through `torch.from_dlpack`,
    so the only copy is the move to `device` (none on the same device). Read-only numpy arrays
    are copied first, because torch cannot alias memory it must not write.
    """
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
        return torch.from_dlpack(value).to(device, non_blocking=True)
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":  # strings, objects, ...: no numeric tensor to make
        raise TypeError(f"cannot convert {type(value).__name__} {value!r} to a tensor")
    if not array.flags.writeable or not array.dtype.isnative:
        array = np.array(array, dtype=array.dtype.newbyteorder("="))
    tensor = torch.from_numpy(array)
    return tensor.to(device, non_blocking=True)


def _map_tensors(tree: Any, convert: Converter) -> Any:
    """Apply `convert` to every tensor in nested dicts / tuples / lists; keep the rest."""
    if isinstance(tree, torch.Tensor):
        return convert(tree)
    if isinstance(tree, Mapping):
        return {key: _map_tensors(value, convert) for key, value in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_map_tensors(value, convert) for value in tree)
    return tree


def _to_host(tree: Any, device: torch.device) -> Any:
    """Copy every tensor in `tree` to the CPU with a single wait for the device.

    On CUDA the copies are queued with `non_blocking=True` (into pinned memory) and one
    stream synchronisation follows, instead of one blocking copy per tensor.
    """
    if device.type != "cuda":
        return _map_tensors(tree, lambda t: t.detach().to("cpu"))
    host = _map_tensors(tree, lambda t: t.detach().to("cpu", non_blocking=True))
    torch.cuda.current_stream(device).synchronize()
    return host


class _TensorView(VectorWrapper):
    """Shared plumbing: convert every tensor that `reset`/`step` return, convert actions back."""

    def __init__(self, env: VectorEnv, *, allow_copy: bool) -> None:
        super().__init__(env)
        self._device = env_device(env)
        self.allow_copy = bool(allow_copy)

    @property
    def device(self) -> torch.device:
        """The wrapped env's device (where its tensors live and actions are sent)."""
        return self._device

    def _convert(self, tree: Any) -> Any:
        raise NotImplementedError

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if options and "reset_mask" in options:
            options = {**options, "reset_mask": to_torch(options["reset_mask"], self._device)}
        obs, info = self.env.reset(seed=seed, options=options)
        return self._convert((obs, info))

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        out = self.env.step(to_torch(actions, self._device))
        return self._convert(out)


class NumpyView(_TensorView):
    """numpy outputs that share memory with the env's CPU tensors; nothing is copied.

    On another device there is no memory numpy could share, so the view refuses with a
    ValueError unless `allow_copy=True`, in which case every step copies its outputs to the
    host (one device synchronisation per step).

    The arrays alias the env's output tensors: writing into them writes into those tensors.
    """

    def __init__(self, env: VectorEnv, *, allow_copy: bool = False) -> None:
        super().__init__(env, allow_copy=allow_copy)
        if self.device.type != "cpu" and not self.allow_copy:
            raise ValueError(
                f"NumpyView shares memory with CPU tensors, but the env runs on {self.device}; "
                "pass allow_copy=True to copy every step's outputs to the host"
            )

    def _convert(self, tree: Any) -> Any:
        if self.device.type != "cpu":
            tree = _to_host(tree, self.device)
        return _map_tensors(tree, lambda t: t.detach().numpy())


class DLPackView(_TensorView):
    """Outputs as arrays of `xp` (numpy, jax.numpy, cupy, ...) through `xp.from_dlpack`.

    The arrays share memory with the env's tensors when `xp` can read memory on the env's
    device (numpy and JAX-on-CPU from a CPU env; CuPy and JAX-on-GPU from a CUDA env). When it
    cannot, the view raises a ValueError naming the device, unless `allow_copy=True`: then
    outputs are copied to the host and handed to `xp.asarray`, which places them where `xp`
    keeps arrays.

    The check runs once, on the first output; a failure later (say a dtype `xp` lacks) is
    raised as it comes.
    """

    def __init__(self, env: VectorEnv, xp: ModuleType, *, allow_copy: bool = False) -> None:
        if not callable(getattr(xp, "from_dlpack", None)):
            raise TypeError(
                f"xp must be an array module with from_dlpack (numpy, jax.numpy, cupy), got {xp!r}"
            )
        super().__init__(env, allow_copy=allow_copy)
        self.xp = xp
        self._shares: bool | None = None  # decided on the first output

    def _convert(self, tree: Any) -> Any:
        if self._shares is None:
            self._shares = self._probe(tree)
        if self._shares:
            return _map_tensors(tree, lambda t: self.xp.from_dlpack(t.detach()))
        host = _to_host(tree, self.device)
        return _map_tensors(host, lambda t: self.xp.asarray(t.numpy()))

    def _probe(self, tree: Any) -> bool:
        """Can `xp` import this env's tensors? Tried on the first output tensor."""
        first: list[torch.Tensor] = []
        _map_tensors(tree, lambda t: first.append(t) if not first else None)
        try:
            self.xp.from_dlpack(first[0].detach())
        except Exception as err:  # each framework raises its own type (BufferError, ...)
            if self.allow_copy:
                return False
            name = getattr(self.xp, "__name__", repr(self.xp))
            raise ValueError(
                f"{name}.from_dlpack cannot import tensors on {self.device} ({err}); "
                "pass allow_copy=True to copy outputs through host memory"
            ) from err
        return True


class TorchEpisodeStatistics(VectorWrapper):
    """Gymnasium's `wrappers.vector.RecordEpisodeStatistics` for a torch vector env, on the device.

    Every step adds `info[stats_key] = {"r": returns, "l": lengths, "t": seconds}` (zero where
    no episode ended) and `info["_" + stats_key]`, the bool mask of sub-envs whose episode
    ended on this step: Gymnasium's layout, with tensors on the env's device. Unlike
    Gymnasium's wrapper, the entry is there on every step (deciding whether any episode ended
    would read the device), so test the mask, not the key.

    Returns are summed in float64 (float32 on MPS), lengths count in int64, and the autoreset
    mode in `metadata["autoreset_mode"]` is honoured as Gymnasium does: NEXT_STEP (and
    DISABLED) start the next episode on the step after an end, which counts for neither
    episode; SAME_STEP starts it on the same step; `reset(options={"reset_mask": mask})`
    restarts the masked sub-envs' statistics. `return_queue`, `length_queue` and `time_queue`
    are the last `buffer_length` finished episodes' values (oldest first), in ring buffers on
    the device; reading them copies the episode count to the host.

    The env's own info must not use `stats_key` (FruitCatcher reports `info["episode"]`
    itself: pass another `stats_key`, e.g. "stats"); the wrapper raises a ValueError if it does.
    """

    def __init__(
        self, env: VectorEnv, stats_key: str = "episode", buffer_length: int = 100
    ) -> None:
        super().__init__(env)
        if not isinstance(stats_key, str) or not stats_key:
            raise ValueError(f"stats_key must be a non-empty string, got {stats_key!r}")
        if (
            isinstance(buffer_length, bool)
            or not isinstance(buffer_length, int)
            or (buffer_length < 1)
        ):
            raise ValueError(f"buffer_length must be a positive int, got {buffer_length!r}")
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self.autoreset_mode = AutoresetMode(mode) if not isinstance(mode, AutoresetMode) else mode
        self.stats_key = stats_key
        self.buffer_length = buffer_length
        self._t0 = time.perf_counter()
        self._device: torch.device | None = None
        with contextlib.suppress(TypeError):  # no `device`: allocated on the first reset
            self._allocate(env_device(env))

    def _allocate(self, device: torch.device) -> None:
        n, size = self.num_envs, self.buffer_length + 1  # the last slot takes discarded writes
        real = torch.float32 if device.type == "mps" else torch.float64
        self._device = device
        self._returns = torch.zeros(n, dtype=real, device=device)
        self._lengths = torch.zeros(n, dtype=torch.int64, device=device)
        self._starts = torch.zeros(n, dtype=real, device=device)
        self._prev_dones = torch.zeros(n, dtype=torch.bool, device=device)
        self._return_buf = torch.zeros(size, dtype=real, device=device)
        self._length_buf = torch.zeros(size, dtype=torch.int64, device=device)
        self._time_buf = torch.zeros(size, dtype=real, device=device)
        self._count = torch.zeros((), dtype=torch.int64, device=device)

    @property
    def device(self) -> torch.device | None:
        """Where the statistics live: the env's device (None before the first reset of an env
        without a `device` attribute)."""
        return self._device

    def _now(self) -> float:
        return time.perf_counter() - self._t0

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        if self._device is None:
            first: list[torch.Tensor] = []
            _map_tensors(obs, lambda t: first.append(t) if not first else None)
            if not first:
                raise TypeError("TorchEpisodeStatistics needs an env whose outputs are tensors")
            self._allocate(first[0].device)
        now = self._now()
        if options and options.get("reset_mask") is not None:
            mask = to_torch(options["reset_mask"], self._device).to(torch.bool)
            self._returns = torch.where(mask, 0.0, self._returns)
            self._lengths = torch.where(mask, 0, self._lengths)
            self._starts = torch.where(mask, now, self._starts)
            self._prev_dones = self._prev_dones & ~mask
        else:
            self._returns = torch.zeros_like(self._returns)
            self._lengths = torch.zeros_like(self._lengths)
            self._starts = torch.full_like(self._starts, now)
            self._prev_dones = torch.zeros_like(self._prev_dones)
        return obs, info

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        key = self.stats_key
        if key in info or f"_{key}" in info:
            raise ValueError(
                f"TorchEpisodeStatistics: the env's info already has {key!r} (keys "
                f"{sorted(info)}); pass another stats_key"
            )
        if self._device is None:
            raise RuntimeError("call reset() before step()")
        reward_orig, reward = reward, reward.to(self._returns.dtype)
        now = self._now()
        if self.autoreset_mode == AutoresetMode.SAME_STEP:
            returns, lengths, starts = self._returns + reward, self._lengths + 1, self._starts
        else:  # the step after an end restarts the sub-env and counts for no episode
            prev = self._prev_dones
            returns = torch.where(prev, 0.0, self._returns + reward)
            lengths = torch.where(prev, 0, self._lengths + 1)
            starts = torch.where(prev, now, self._starts)
        dones = (terminated | truncated).to(torch.bool)
        elapsed = torch.round(now - starts, decimals=6)
        stats = {
            "r": torch.where(dones, returns, 0.0),
            "l": torch.where(dones, lengths, 0),
            "t": torch.where(dones, elapsed, 0.0),
        }
        self._record(dones, returns, lengths, elapsed)
        if self.autoreset_mode == AutoresetMode.SAME_STEP:
            returns = torch.where(dones, 0.0, returns)
            lengths = torch.where(dones, 0, lengths)
            starts = torch.where(dones, now, starts)
        self._returns, self._lengths, self._starts, self._prev_dones = (
            returns,
            lengths,
            starts,
            dones,
        )
        return (
            obs,
            reward_orig,
            terminated,
            truncated,
            {
                **info,
                key: stats,
                f"_{key}": dones,
            },
        )

    def _record(
        self, dones: torch.Tensor, returns: torch.Tensor, lengths: torch.Tensor, elapsed: Any
    ) -> None:
        """Append the ended episodes to the ring buffers, in sub-env order, without a sync."""
        size = self.buffer_length
        rank = dones.cumsum(0) - 1
        total = dones.sum()
        keep = dones & (rank >= total - size)  # more ends than slots: the last `size` stay
        slot = torch.where(keep, (self._count + rank) % size, size)
        self._return_buf.scatter_(0, slot, returns)
        self._length_buf.scatter_(0, slot, lengths)
        self._time_buf.scatter_(0, slot, elapsed)
        self._count = self._count + total

    def _queue(self, buffer: torch.Tensor) -> torch.Tensor:
        count = int(self._count)  # one host read, when asked
        kept = min(count, self.buffer_length)
        index = (count - kept + torch.arange(kept, device=buffer.device)) % self.buffer_length
        return buffer[index]

    @property
    def episode_count(self) -> int:
        """Episodes ended since the wrapper was made (a host read)."""
        return int(self._count)

    @property
    def return_queue(self) -> torch.Tensor:
        """The returns of the last `buffer_length` finished episodes, oldest first."""
        return self._queue(self._return_buf)

    @property
    def length_queue(self) -> torch.Tensor:
        """The lengths of the last `buffer_length` finished episodes, oldest first."""
        return self._queue(self._length_buf)

    @property
    def time_queue(self) -> torch.Tensor:
        """The wall-clock seconds of the last `buffer_length` finished episodes, oldest first."""
        return self._queue(self._time_buf)
