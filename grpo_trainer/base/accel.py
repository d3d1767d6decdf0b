"""Speed features with capability checks: device choice, compile, AMP, fused optimizer. Each
picks the fastest option the device supports and logs a fallback, so a run never fails over one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def resolve_device(name: str) -> torch.device:
    """ "auto" -> cuda when available, else cpu; anything else must exist on this machine.
    "meta" is a test device (shapes, no data): a hot path on it fails on a stray CPU tensor or
    a host read. The reference is `fruit_env.kit.inputs.resolve_device` (not imported here);
    tests/test_shared_concepts.py keeps the two in agreement."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {name!r} is not a torch device: {err}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} GPU(s) here")
    elif device.type not in ("cpu", "meta"):
        raise ValueError(f"device {name!r}: only 'auto', 'cpu' and 'cuda[:N]' are supported")
    return device


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    """A seeded generator for `device` (a CPU one for meta, where a draw makes no data)."""
    generator = torch.Generator(device="cpu" if device.type == "meta" else device)
    generator.manual_seed(seed)
    return generator


# On the CPU, compiling the loss pays once a minibatch has this many samples (measured in
# docs/performance.md: below it, the compile time is not won back within a run).
CPU_COMPILE_MIN_SAMPLES = 65_536


class Compiled:
    """`torch.compile(fn)` that falls back to eager, with a warning, if compilation fails."""

    def __init__(self, fn: Callable[..., Any], enabled: bool, name: str, mode: str = "default"):
        self.eager, self.name = fn, name
        self.fn = torch.compile(fn, mode=None if mode == "default" else mode) if enabled else fn
        self.compiled = enabled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.compiled:
            return self.eager(*args, **kwargs)
        try:
            return self.fn(*args, **kwargs)
        except Exception as err:  # compilers fail in many ways; the eager path must not
            log.warning("torch.compile of %s failed (%s); running it eagerly", self.name, err)
            self.fn, self.compiled = self.eager, False
            return self.eager(*args, **kwargs)


def should_compile(requested: bool | None, device: torch.device, minibatch_size: int) -> bool:
    """None means auto: on the CPU from `CPU_COMPILE_MIN_SAMPLES` samples per minibatch;
    never on a GPU, where its compile was not won back within `make train`'s run. On an
    H200 (docs/performance.md, "On a GPU") the compiled default reached 0.70 after 19.8 s
    of training, a first update of 12.3 s included, and the eager one after 8.4 s: the
    compiled update was 1.16x as fast (956k against 823k env steps/s), which wins back its
    11 s only after about 60M env steps, three times the default budget."""
    if requested is not None:
        return requested
    return device.type == "cpu" and minibatch_size >= CPU_COMPILE_MIN_SAMPLES


def compile_mode(mode: str, device: torch.device) -> str:
    """The torch.compile mode to use: CUDA graphs ('reduce-overhead') need CUDA."""
    if mode == "reduce-overhead" and device.type != "cuda":
        log.info("compile_mode 'reduce-overhead' (CUDA graphs) needs CUDA; using 'default'")
        return "default"
    return mode


def resolve_amp(amp: str, device: torch.device) -> str:
    """The AMP mode to use, refusing what the device cannot run. No mode is on by default:
    bf16 did not pay on the CPU (its faster steps were spent on as many more steps to learn,
    docs/trainer.md; with AMX its conversions made the update slower, docs/performance.md),
    and on a GPU it has not been measured yet."""
    if amp == "fp16" and device.type != "cuda":
        raise ValueError("amp='fp16' needs a CUDA device (use 'bf16' or 'off' on CPU)")
    if amp == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("amp='bf16' is not supported by this GPU (use 'fp16' or 'off')")
    return amp


@contextlib.contextmanager
def autocast(amp: str, device: torch.device) -> Iterator[None]:
    """bf16 / fp16 autocast, or nothing for "off"."""
    if amp == "off":
        yield
        return
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def make_optimizer(
    params: Iterable[torch.nn.Parameter], lr: float, fused: bool
) -> tuple[torch.optim.AdamW, bool]:
    """AdamW, fused where supported (one kernel per step, and device-side step skipping),
    without weight decay: it did not help (docs/trainer.md, "Flags decided by measurement"),
    and AdamW's own default is 0.01."""
    params = list(params)
    if fused and params[0].device.type not in ("cpu", "cuda"):
        log.info("fused AdamW runs on the CPU and CUDA, not %s; using foreach", params[0].device)
        fused = False
    if fused:
        try:
            return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=True), True
        except (RuntimeError, ValueError) as err:
            log.info("fused AdamW unavailable (%s); using foreach", err)
    # capturable: the step count lives on the GPU, so that a skipped step can be undone there
    cuda = params[0].device.type == "cuda"
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, foreach=True, capturable=cuda), False
