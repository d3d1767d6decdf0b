"""Zero-copy views of a torch vector env for numpy, JAX, CuPy and other DLPack frameworks.

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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import numpy as np
import torch
from gymnasium.vector import VectorEnv, VectorWrapper

__all__ = ["DLPackView", "NumpyView", "env_device", "to_torch"]

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
