"""The compiled step: a transition of `transitions.py` built once per machine, for every size,
and the choice between it and the eager step (`select_step`, the env's `compile=`).

`torch.export` traces the transition with a dynamic batch dimension (one graph for all
`num_envs`), AOTInductor turns it into a shared library (C++ on the CPU, CUDA kernels on a
GPU), and the package is kept on disk, so the compile cost (tens of seconds) is paid once
per machine, rules and autoreset mode, not once per process and size: a later process loads
the package in milliseconds. A call skips Dynamo's guards and Python wrapper: 11-16 us at
128 envs on our CPU. Measured in docs/performance.md.

The compiled step is not faster everywhere (on a 2-core CPU the eager step can win at large
batches), so a build also times both steps on its device at a few batch sizes and keeps the
measurement beside the package; `compile="auto"` runs the compiled step only where that
measurement says it is the faster one.

Cache folder: `$FRUIT_ENV_CACHE_DIR`, else `$XDG_CACHE_HOME/fruit_env`, else
`~/.cache/fruit_env`. A package's name is a digest of everything its code depends on: the
rules, the autoreset mode, the device type, the torch version, the source of the modules
that define the step, and the CPU's instruction set (inductor compiles for the build
machine's CPU) or the GPU's compute capability. Deleting the folder is always safe.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from fruit_env import core, params, rng, transitions
from fruit_env.packed import MODE_NAMES, EagerStep, StepOutput
from fruit_env.params import FruitParams
from fruit_env.transitions import Layout, Transition

log = logging.getLogger("fruit_env")

FORMAT = 1  # part of every package name: bump it to retire all cached packages
EXAMPLE_ENVS = 64  # the batch size the graph is traced with (any size runs it)
_SOURCES = (core, params, rng, transitions)  # their code is in the graph


def cache_dir() -> Path:
    """The folder that holds compiled packages."""
    if os.environ.get("FRUIT_ENV_CACHE_DIR"):
        return Path(os.environ["FRUIT_ENV_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fruit_env"


def supported(device: torch.device) -> bool:
    """Whether this torch can build and load packages for `device` (AOTInductor packages:
    torch 2.6 and later, CPU and CUDA)."""
    loader = hasattr(torch._C, "_aoti") and hasattr(torch._C._aoti, "AOTIModelPackageLoader")
    return loader and device.type in ("cpu", "cuda")


COMPILE_MODES = ("default", "max-autotune", "reduce-overhead")


def package_path(
    params: FruitParams, mode: AutoresetMode, device: torch.device, compile_mode: str = "default"
) -> Path:
    """Where the package for these rules, mode and device lives (whether or not it exists).
    `max-autotune` builds its own package; `reduce-overhead` replays the default one."""
    digest = hashlib.sha256()
    tuned = ("max-autotune",) if compile_mode == "max-autotune" else ()
    for part in (
        FORMAT,
        *tuned,
        torch.__version__,
        mode.name,
        dataclasses.astuple(params),
        device.type,
        _machine(device),
        *_sources(),
    ):
        digest.update(repr(part).encode() if not isinstance(part, bytes) else part)
        digest.update(b"\0")
    name = f"step-{mode.name.lower()}-{params.obs_mode}-{device.type}-{digest.hexdigest()[:24]}"
    return cache_dir() / f"{name}.pt2"


def is_cached(
    params: FruitParams, mode: AutoresetMode, device: torch.device, compile_mode: str = "default"
) -> bool:
    return supported(device) and package_path(params, mode, device, compile_mode).is_file()


class CompiledStep:
    """A loaded package: `step(packed, key, counter, action)` -> `Transition`, like the
    transition it was built from, except that the next state and counters are written into
    `packed` and `counter` (returned as the transition's): in place, the kernel has half the
    row pointers to keep, which is what makes one graph for every size as fast as one per
    size (docs/performance.md). `action` must be int64 and contiguous."""

    def __init__(self, path: Path, mode: AutoresetMode, device: torch.device) -> None:
        index = device.index if device.type == "cuda" and device.index is not None else -1
        self._loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, index)
        self._same_step = mode == AutoresetMode.SAME_STEP

    def __call__(
        self, packed: torch.Tensor, key: torch.Tensor, counter: torch.Tensor, action: torch.Tensor
    ) -> Transition:
        out = self._loader.boxed_run([packed, key, counter, action])
        final_obs = out[8] if self._same_step else None
        return Transition(packed, counter, *out[:3], tuple(out[3:7]), final_obs, out[7])


class GraphedStep:
    """A `CompiledStep` replayed from a CUDA graph (`compile_mode="reduce-overhead"`): one
    graph launch per env step instead of one launch per kernel, which is what bounds a small
    batch on a GPU. The graph reads and writes its own buffers, captured on the first call,
    so the state is copied in and out (the env replaces its state tensors on reset) and the
    outputs are cloned (a step returns fresh tensors)."""

    def __init__(self, step: CompiledStep) -> None:
        self._step = step
        self._graph: Any = None
        self._inputs: list[torch.Tensor] = []
        self._out: Transition | None = None

    def __call__(
        self, packed: torch.Tensor, key: torch.Tensor, counter: torch.Tensor, action: torch.Tensor
    ) -> Transition:
        inputs = (packed, key, counter, action)
        if self._graph is None or any(
            a.shape != b.shape for a, b in zip(self._inputs, inputs, strict=True)
        ):
            self._capture(inputs)
        for static, value in zip(self._inputs, inputs, strict=True):
            static.copy_(value)
        self._graph.replay()
        out = self._out
        assert out is not None
        packed.copy_(out.packed)
        counter.copy_(out.counter)
        final_obs = None if out.final_obs is None else out.final_obs.clone()
        episode = tuple(e.clone() for e in out.episode)
        return Transition(
            packed, counter, out.obs.clone(), out.reward.clone(), out.flags.clone(), episode,
            final_obs, out.invalid.clone(),
        )  # fmt: skip

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> None:
        self._inputs = [t.clone() for t in inputs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up outside the graph, on copies of the state
            for _ in range(2):
                self._step(*(t.clone() for t in self._inputs))
        torch.cuda.current_stream().wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._out = self._step(*self._inputs)


class CompiledEnvStep:
    """The compiled step as the env runs it, with `packed.EagerStep`'s calls: `step(packed,
    key, counter, actions)` -> (the next state, `StepOutput`), `clamped`, `flagged`, `reset`
    and `observe`. The graph clamps actions into [0, 2] and flags those it clamped, so the
    three step calls differ only in what they hand back."""

    def __init__(self, loaded: CompiledStep | GraphedStep, params: FruitParams) -> None:
        self.loaded, self.params = loaded, params  # the package it calls
        self._observe = transitions.COMPILED_OBSERVERS[params.obs_mode]

    def flagged(
        self, packed: torch.Tensor, key: torch.Tensor, counter: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, StepOutput, torch.Tensor]:
        """The step, and a () bool tensor: whether some action was outside [0, 2]."""
        t = self.loaded(packed, key, counter, action.to(torch.int64).contiguous())
        # One tensor each (not views of one): DLPack consumers such as JAX copy unaligned views.
        terminated, truncated, ended = (flag.to(torch.bool) for flag in t.flags)
        out = StepOutput(t.obs, t.reward, terminated, truncated, ended, t.episode, t.final_obs)
        return t.packed, out, t.invalid

    def __call__(
        self, packed: torch.Tensor, key: torch.Tensor, counter: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, StepOutput]:
        packed, out, _ = self.flagged(packed, key, counter, action)
        return packed, out

    clamped = __call__  # the graph clamps

    def reset(
        self, packed: torch.Tensor, key: torch.Tensor, counter: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """`core.restart` where `mask` is true, dropping those sub-envs' pending NEXT_STEP
        restart; advances `counter` in place and returns the new state."""
        game, pending = transitions.unpack(packed)
        game = core.restart(self.params, game, mask, core.draw(self.params, key, counter))
        counter.add_(mask)
        return transitions.pack(game, pending & ~mask)

    def observe(self, packed: torch.Tensor) -> torch.Tensor:
        return self._observe(self.params, transitions.unpack(packed)[0])


EnvStep: TypeAlias = EagerStep | CompiledEnvStep  # what the env steps with (`select_step`)


def load(
    params: FruitParams, mode: AutoresetMode, device: torch.device, compile_mode: str = "default"
) -> CompiledStep | GraphedStep:
    """The compiled step, built first if the cache does not hold it (logged at INFO, and
    measured against the eager step: `measure`); replayed from a CUDA graph for
    `compile_mode="reduce-overhead"` (CUDA only)."""
    if compile_mode == "reduce-overhead":
        return GraphedStep(load(params, mode, device))
    path = package_path(params, mode, device, compile_mode)
    if not path.is_file():
        started = time.perf_counter()
        log.info(
            "FruitCatcher: compiling the %s step (%s observations) for %s, once per machine "
            "and rules; cached in %s",
            mode.name,
            params.obs_mode,
            device.type,
            path.parent,
        )
        build(params, mode, device, path, max_autotune=compile_mode == "max-autotune")
        log.info("FruitCatcher: compiled in %.1f s", time.perf_counter() - started)
        step = CompiledStep(path, mode, device)
        save_measurement(path, measure(params, mode, device, step))
        return step
    return CompiledStep(path, mode, device)


def build(
    params: FruitParams,
    mode: AutoresetMode,
    device: torch.device,
    path: Path,
    *,
    static_envs: int | None = None,
    max_autotune: bool = False,
) -> None:
    """Export the transition with a dynamic batch dimension and compile it into `path`
    (written under a temporary name first, so that a reader never sees half a package).
    `static_envs`: a graph for that batch size only instead (to measure what the dynamic
    dimension costs: docs/performance.md). `max_autotune`: inductor tries kernel configurations
    and keeps the fastest (a longer build)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    inductor = importlib.import_module("torch._inductor")  # the compiler, only to build
    module = _Step(
        transitions.TRANSITIONS[mode], params, transitions.COMPILED_OBSERVERS[params.obs_mode]
    )
    n = static_envs or EXAMPLE_ENVS
    example = (
        torch.zeros((Layout(params.max_fruits).rows, n), dtype=torch.int32, device=device),
        torch.zeros(n, dtype=torch.int64, device=device),
        torch.zeros(n, dtype=torch.int64, device=device),
        torch.ones(n, dtype=torch.int64, device=device),
    )
    envs = torch.export.Dim("num_envs", min=1)
    dynamic = None if static_envs else ({1: envs}, {0: envs}, {0: envs}, {0: envs})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a serial kernel: see docs/performance.md
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's own deprecations
            warnings.simplefilter("ignore", DeprecationWarning)
            exported = torch.export.export(module, example, dynamic_shapes=dynamic, strict=False)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                partial = Path(tmp) / path.name
                inductor.aoti_compile_and_package(
                    exported,
                    package_path=str(partial),
                    inductor_configs={"max_autotune": True} if max_autotune else None,
                )
                os.replace(partial, path)
    finally:
        torch.set_num_threads(threads)


class _Step(torch.nn.Module):
    """A transition as a module for `torch.export`: the next state and counters written
    into the inputs, the other outputs as a flat tuple of tensors."""

    def __init__(
        self, transition: Callable[..., Transition], params: FruitParams, observe: Any
    ) -> None:
        super().__init__()
        self.transition, self.params, self.observe = transition, params, observe

    def forward(
        self, packed: torch.Tensor, key: torch.Tensor, counter: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        t = self.transition(self.params, self.observe, packed, key, counter, action)
        packed.copy_(t.packed)
        counter.copy_(t.counter)
        out = (t.obs, t.reward, t.flags, *t.episode, t.invalid)
        return out if t.final_obs is None else (*out, t.final_obs)


def _machine(device: torch.device) -> tuple[object, ...]:
    """What the generated code is specific to besides torch: the CPU's instruction set
    (inductor compiles with -march=native) or the GPU's compute capability."""
    if device.type == "cuda":
        return (torch.version.cuda, torch.cuda.get_device_capability(device))
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        pass
    return (
        platform.machine(),
        platform.processor(),
        torch.backends.cpu.get_cpu_capability(),
        flags,
    )


@functools.cache
def _sources() -> tuple[bytes, ...]:
    """The code that makes the graph: the modules it traces, and this one, which exports it."""
    return tuple(Path(str(m.__file__)).read_bytes() for m in (*_SOURCES, sys.modules[__name__]))


# -- which step is faster here: measured when a package is built, kept beside it ---------------

MEASURED_SIZES = (256, 2048, 16384, 131072)  # num_envs at which a build times both steps
MEASUREMENT_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Seconds per step of the eager and the compiled step, by `num_envs`, on the device and
    with the torch threads of the process that built the package. Both are timed as a
    trainer steps them (actions clamped, not checked): the env's shell around them is the
    same for both."""

    seconds: dict[int, tuple[float, float]]  # num_envs -> (eager, compiled)
    threads: int

    def nearest(self, num_envs: int) -> int:
        """The measured size nearest `num_envs` on a log scale (the smaller one on a tie)."""
        return min(self.seconds, key=lambda size: (abs(math.log(size / num_envs)), size))

    def speedup(self, num_envs: int) -> float:
        """The eager step's time over the compiled step's at the nearest measured size."""
        eager, compiled = self.seconds[self.nearest(num_envs)]
        return eager / compiled

    def to_json(self) -> str:
        sizes = {str(n): {"eager_s": e, "compiled_s": c} for n, (e, c) in self.seconds.items()}
        body = {"format": MEASUREMENT_FORMAT, "torch_threads": self.threads, "sizes": sizes}
        return json.dumps(body, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Measurement:
        body = json.loads(text)
        if body.get("format") != MEASUREMENT_FORMAT or not body.get("sizes"):
            raise ValueError(f"not a measurement of format {MEASUREMENT_FORMAT}")
        seconds = {
            int(n): (float(row["eager_s"]), float(row["compiled_s"]))
            for n, row in body["sizes"].items()
        }
        return cls(seconds, int(body["torch_threads"]))


def measurement_path(package: Path) -> Path:
    """Where the measurement of `package` is kept: beside it."""
    return package.with_name(package.stem + ".timing.json")


def save_measurement(package: Path, measurement: Measurement) -> None:
    """Write the measurement beside `package` (whole or not at all)."""
    path = measurement_path(package)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(measurement.to_json())
    os.replace(partial, path)


def stored_measurement(package: Path) -> Measurement | None:
    """The measurement kept beside `package`; None if there is none (or it is unreadable)."""
    try:
        return Measurement.from_json(measurement_path(package).read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def measure(
    params: FruitParams,
    mode: AutoresetMode,
    device: torch.device,
    loaded: CompiledStep | GraphedStep,
    sizes: tuple[int, ...] = MEASURED_SIZES,
    rounds: int = 5,
) -> Measurement:
    """Time the eager step and the `loaded` package's at each size: after a warm-up, `rounds`
    blocks of each in turns (the order alternating, so that a change in the machine's load
    hits both alike); the median block's seconds per step. A few seconds on a CPU."""
    seconds = {}
    for n in sizes:
        steps = {
            "eager": EagerStep(params, MODE_NAMES[mode], n, device),
            "compiled": CompiledEnvStep(loaded, params),
        }
        blocks = {name: _timed_block(s, params, n, device) for name, s in steps.items()}
        times: dict[str, list[float]] = {name: [] for name in blocks}
        for r in range(rounds):
            for name in list(blocks)[:: 1 if r % 2 == 0 else -1]:
                times[name].append(blocks[name]())
        seconds[n] = (statistics.median(times["eager"]), statistics.median(times["compiled"]))
    return Measurement(seconds, torch.get_num_threads())


def _timed_block(
    step: EnvStep, params: FruitParams, num_envs: int, device: torch.device
) -> Callable[[], float]:
    """A timer of `step` on its own games: each call plays a block of steps and returns the
    seconds per step. Three warm-up steps first."""
    n = num_envs
    state = core.empty_state(params, n, device)
    key = torch.from_numpy(rng.seed_keys(np.arange(n, dtype=np.uint64))).to(device)
    counter = torch.zeros(n, dtype=torch.int64, device=device)
    pending = torch.zeros(n, dtype=torch.bool, device=device)
    mask = torch.ones(n, dtype=torch.bool, device=device)
    board = [step.reset(transitions.pack(core.Game.of(state), pending), key, counter, mask)]
    generator = torch.Generator(device=device).manual_seed(0)
    actions = torch.randint(0, 3, (8, n), generator=generator, device=device)
    count = max(4, min(64, 2**19 // n))
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None

    def play(steps: int) -> float:
        sync()
        started = time.perf_counter()
        for i in range(steps):
            board[0], _ = step.clamped(board[0], key, counter, actions[i % 8])
        sync()
        return (time.perf_counter() - started) / steps

    play(3)
    return functools.partial(play, count)


# -- the env's choice ---------------------------------------------------------------------------

_LOGGED: set[str] = set()


def log_once(message: str, *args: object) -> None:
    """INFO on the `fruit_env` logger, once per process for each distinct message."""
    text = message % args
    if text not in _LOGGED:
        _LOGGED.add(text)
        log.info(text)


def check_choice(choice: object, compile_mode: object) -> None:
    """A `ValueError` unless `compile=choice` and `compile_mode` are ones the env takes."""
    if not (isinstance(choice, bool) or (isinstance(choice, str) and choice == "auto")):
        raise ValueError(f"compile must be True, False or 'auto', got {choice!r}")
    if compile_mode not in COMPILE_MODES:
        raise ValueError(f"compile_mode must be one of {COMPILE_MODES}, got {compile_mode!r}")


def runnable_compile_mode(requested: str, device: torch.device) -> str:
    """`requested`, except CUDA graphs off CUDA: the default mode there, with a log line."""
    if requested == "reduce-overhead" and device.type != "cuda":
        log_once(
            f"FruitCatcher: compile_mode='reduce-overhead' (CUDA graphs) needs CUDA; "
            f"the {device.type} step runs as compile_mode='default'"
        )
        return "default"
    return requested


def auto_choice(
    measurement: Measurement | None, num_envs: int, device: torch.device
) -> tuple[bool, str]:
    """What `compile="auto"` makes of a cached package: whether to run the compiled step,
    and why (for the log line). The stored measurement decides at the measured size nearest
    `num_envs`; without one, the compiled step on CUDA (a launch per kernel makes the eager
    step slow there), the eager step elsewhere."""
    if measurement is None:
        if device.type == "cuda":
            return True, "CUDA, not measured"
        return False, "no measurement beside the package"
    size, speedup = measurement.nearest(num_envs), measurement.speedup(num_envs)
    where = f"at {size} envs, the measured size nearest {num_envs}"
    if speedup > 1:
        return True, f"measured {speedup:.2f}x faster than the eager step {where}"
    return False, f"the compiled step measured {1 / speedup:.2f}x slower {where}"


def select_step(
    choice: bool | str,
    params: FruitParams,
    mode: AutoresetMode,
    device: torch.device,
    num_envs: int,
    compile_mode: str = "default",
) -> EnvStep:
    """The step that `compile=choice` asks for: False the eager step, True the compiled one
    (built first if the cache lacks it), "auto" the compiled one where it is known to be the
    faster (`auto_choice`) and never a build on the CPU. A step that cannot be built or
    loaded falls back to the eager step (the same games), with a warning."""
    names = f"for {mode.name}, {params.obs_mode} observations"

    def eager(why: str | None = None) -> EagerStep:
        if why is not None:  # the reason "auto" took it
            log_once(
                "FruitCatcher: eager step on %s (compile='auto': %s) %s", device.type, why, names
            )
        return EagerStep(params, MODE_NAMES[mode], num_envs, device)

    if choice is False:
        return eager()
    if not supported(device):
        if choice is True:
            log.warning(
                "FruitCatcher: compile=True, but this torch builds no compiled step for %s "
                "devices; running the eager step",
                device.type,
            )
        return eager(None if choice is True else "no compiled steps for this device")
    path = package_path(params, mode, device, compile_mode)
    if choice == "auto" and device.type != "cuda" and not path.is_file():
        return eager(
            f"no compiled step for these rules in {cache_dir()}; compile=True builds it, "
            "once per machine"
        )
    try:
        loaded = load(params, mode, device, compile_mode)
    except Exception as err:  # no C++ compiler, say: the eager step gives the same games
        log.warning("FruitCatcher: building the compiled step failed (%s); running eager", err)
        return eager()
    if choice is True:
        return CompiledEnvStep(loaded, params)
    measurement = _measurement(params, mode, device, path, loaded)
    faster, why = auto_choice(measurement, num_envs, device)
    if not faster:
        return eager(f"{why}; compile=True runs it")
    log_once("FruitCatcher: compiled step on %s (compile='auto': %s) %s", device.type, why, names)
    return CompiledEnvStep(loaded, params)


def _measurement(
    params: FruitParams,
    mode: AutoresetMode,
    device: torch.device,
    package: Path,
    loaded: CompiledStep | GraphedStep,
) -> Measurement | None:
    """The measurement beside `package`, made now (and kept) when it is missing; None if
    it cannot be made."""
    stored = stored_measurement(package)
    if stored is not None:
        return stored
    log_once("FruitCatcher: timing the eager and the compiled step once (no stored measurement)")
    try:
        made = measure(params, mode, device, loaded)
        save_measurement(package, made)
    except Exception as err:  # a read-only cache folder, say: decide without it
        log.warning("FruitCatcher: measuring the compiled step failed (%s)", err)
        return None
    return made
