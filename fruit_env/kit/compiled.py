"""The compiled path: a game's vector step, built once per machine into a package on disk.

`torch.export` traces the autoreset mode's step (`autoreset.STEPS`) of the game's readable
rules with a dynamic batch dimension (one graph for every `num_envs`), AOTInductor turns it
into a shared library (C++ on the CPU, CUDA kernels on a GPU), and the package is kept on
disk, so the compile (tens of seconds) is paid once per machine, rules and autoreset mode,
not once per process and size: a later process loads the package in milliseconds and calls
it without Dynamo's guards. Measured in docs/performance.md.

The state crosses the graph as the game's packed rows plus the pending row (`layout.py`),
written in place with the counters: one int32 tensor in, none of them bool.

Cache folder: `$FRUIT_ENV_CACHE_DIR`, else `$XDG_CACHE_HOME/fruit_env`, else
`~/.cache/fruit_env`. A package's name is a digest of everything its code depends on: the
game's rules (`TensorGame.rules_key`), the autoreset mode, the device type, the torch version,
the source of the kit, of the packages (or lone modules) of the game's class and its bases
and of the user modules they import, and the CPU's instruction set (inductor compiles for the
build machine's CPU) or the GPU's compute capability. So a package built from other rules or
other code is never loaded. A package is loaded through torch's public loader
(`torch._inductor.aoti_load_package`), and only once a child process has played it against
the eager step (`proof.py`): native code that crashes must not take the caller down.
Deleting the folder is always safe.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import platform
import sys
import sysconfig
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from gymnasium.vector import AutoresetMode

from fruit_env.kit import captured, proof
from fruit_env.kit.autoreset import EagerStepper, Running, Transition
from fruit_env.kit.game import TensorGame
from fruit_env.kit.layout import Layout, Packed
from fruit_env.kit.step_graph import GraphStepper, StepGraph

log = logging.getLogger("fruit_env")

FORMAT = 4  # part of every package name: bump it to retire all cached packages
EXAMPLE_ENVS = 64  # the batch size the graph is traced with (any size runs it)
CHOICES = (True, False, "auto")


def cache_dir() -> Path:
    """The folder that holds compiled packages."""
    if os.environ.get("FRUIT_ENV_CACHE_DIR"):
        return Path(os.environ["FRUIT_ENV_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fruit_env"


def supported(device: torch.device) -> bool:
    """Whether this torch can build and load packages for `device` (AOTInductor packages,
    loaded through `torch._inductor.aoti_load_package`: CPU and CUDA)."""
    has_loader = importlib.util.find_spec("torch._inductor") is not None
    return device.type in ("cpu", "cuda") and has_loader


def package_path(game: TensorGame[Any], mode: AutoresetMode, device: torch.device) -> Path:
    """Where the package of these rules, mode and device lives (whether or not it exists)."""
    digest = hashlib.sha256()
    kind = type(game)
    for part in (
        FORMAT,
        torch.__version__,
        mode.name,
        f"{kind.__module__}.{kind.__qualname__}",
        game.rules_key(),
        device.type,
        _machine(device),
        *_sources(_source_roots(kind)),
    ):
        digest.update(part if isinstance(part, bytes) else repr(part).encode())
        digest.update(b"\0")
    name = f"{kind.__name__.lower()}-{mode.name.lower()}-{device.type}-{digest.hexdigest()[:24]}"
    return cache_dir() / f"{name}.pt2"


class CompiledStepper(GraphStepper):
    """The package of one game and mode, stepping a `Running` state like `EagerStepper`.

    It keeps the state in one int32 buffer of the game's packed rows and the pending row,
    which the package rewrites in place with the counters (with half the row pointers to
    keep, one graph for every size runs as fast as one per size: docs/performance.md). A
    state from elsewhere (a reset, a restore, a planted state) is packed into a new buffer.
    Resets and the observations they give run eagerly, on the readable rules.
    """

    def __init__(
        self,
        path: Path,
        game: TensorGame[Any],
        layout: Layout,
        mode: AutoresetMode,
        device: torch.device,
    ) -> None:
        index = device.index if device.type == "cuda" and device.index is not None else -1
        loaded = importlib.import_module("torch._inductor").aoti_load_package(
            str(path), device_index=index
        )
        self._loader = loaded.loader  # its boxed entry point: no pytree work per step
        super().__init__(game, layout, mode, EagerStepper(game, layout, mode))
        self.path = path
        self._rows: torch.Tensor | None = None
        self._state: Packed | None = None  # the state held in `_rows`

    def step(
        self, running: Running, key: torch.Tensor, counter: torch.Tensor, action: torch.Tensor
    ) -> Transition:
        """The mode's step; `action` of any integer dtype, clamped in the graph."""
        rows = self._own(running)
        out = self._loader.boxed_run([rows, key, counter, action.to(torch.int64).contiguous()])
        return self._transition(out, self._state, running, counter)

    def _own(self, running: Running) -> torch.Tensor:
        """The buffer that holds `running` (a new one unless the package wrote it)."""
        if running.game is not self._state or self._rows is None:
            pending = running.pending.to(torch.int32)[None]
            self._rows = torch.cat([self.layout.pack(running.game), pending])
            self._state = Packed(self._rows[:-1].T)
        return self._rows


def built(game: TensorGame[Any], layout: Layout, mode: AutoresetMode, device: torch.device) -> Path:
    """The package of these rules, mode and device, built first (logged at INFO) if the cache
    does not hold it."""
    path = package_path(game, mode, device)
    if not path.is_file():
        started = time.perf_counter()
        log.info(
            "%s: compiling the %s step for %s, once per machine and rules; cached in %s",
            type(game).__name__,
            mode.name,
            device.type,
            path.parent,
        )
        build(game, layout, mode, device, path)
        log.info("%s: compiled in %.1f s", type(game).__name__, time.perf_counter() - started)
        for stale in path.parent.glob(f"{path.stem}.*.verdict.json"):  # of a deleted package
            stale.unlink(missing_ok=True)
    return path


def build(
    game: TensorGame[Any],
    layout: Layout,
    mode: AutoresetMode,
    device: torch.device,
    path: Path,
) -> None:
    """Export the mode's step with a dynamic batch dimension and compile it into `path`
    (written under a temporary name first, so that a reader never sees half a package)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    inductor = importlib.import_module("torch._inductor")  # the compiler, only to build
    n = EXAMPLE_ENVS
    example = (
        torch.zeros((layout.rows + 1, n), dtype=torch.int32, device=device),
        torch.zeros(n, dtype=torch.int64, device=device),
        torch.zeros(n, dtype=torch.int64, device=device),
        torch.ones(n, dtype=torch.int64, device=device),
    )
    envs = torch.export.Dim("num_envs", min=1)
    dynamic = ({1: envs}, {0: envs}, {0: envs}, {0: envs})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a serial kernel: see docs/performance.md
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's own deprecations
            warnings.simplefilter("ignore", DeprecationWarning)
            graph = StepGraph(game, layout, mode)
            exported = torch.export.export(graph, example, dynamic_shapes=dynamic, strict=False)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                partial = Path(tmp) / path.name
                inductor.aoti_compile_and_package(exported, package_path=str(partial))
                os.replace(partial, path)
    finally:
        torch.set_num_threads(threads)


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


def _source_roots(kind: type) -> tuple[Path, ...]:
    """Where the code of the graph lives: the kit's folder; the top-level package folder (or
    lone module file) of the game's class and of each of its bases; and of the user modules
    those import, followed from module to module (a rules module the game's module imports,
    the helpers that one imports). Libraries are not followed (their code changes with their
    version, which a reinstall brings), nor is the standard library."""
    roots = {Path(__file__).resolve().parent}
    seen: set[str] = set()
    todo = [(c.__module__, True) for c in kind.__mro__]
    while todo:
        name, own = todo.pop()
        module = sys.modules.get(name)
        if name in seen or module is None:
            continue
        seen.add(name)
        root = _root(module)
        if (
            root is None
            or _under(root, _STDLIB)
            or (not own and root not in roots and _under(root, _LIBRARIES))
        ):
            continue
        roots.add(root)
        for value in vars(module).values():
            named = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", "")
            if isinstance(named, str):
                todo.append((named, False))
    return tuple(sorted(roots))


def _root(module: Any) -> Path | None:
    """A module's top-level package folder, or its own file if it is a lone module."""
    top = sys.modules.get(module.__name__.split(".")[0], module)
    origin = getattr(top, "__file__", None) or getattr(module, "__file__", None)
    if origin is None:
        return None
    path = Path(origin).resolve()
    return path.parent if path.name == "__init__.py" else path


def _under(path: Path, folders: tuple[Path, ...]) -> bool:
    return any(path.is_relative_to(folder) for folder in folders)


_PATHS = sysconfig.get_paths()
_STDLIB = tuple({Path(_PATHS[k]).resolve() for k in ("stdlib", "platstdlib")})
_LIBRARIES = tuple({Path(_PATHS[k]).resolve() for k in ("purelib", "platlib")})


@functools.cache
def _sources(roots: tuple[Path, ...]) -> tuple[bytes, ...]:
    """The name and bytes of every Python file under `roots`, in a fixed order."""
    files = sorted(
        {f for root in roots for f in ([root] if root.is_file() else root.rglob("*.py"))}
    )
    return tuple(f.name.encode() + b"\0" + f.read_bytes() for f in files)


# -- the env's choice ---------------------------------------------------------------------------


def check_choice(choice: object) -> None:
    """A `ValueError` unless `compile=choice` is one the env takes."""
    if not (isinstance(choice, bool) or (isinstance(choice, str) and choice == "auto")):
        raise ValueError(f"compile must be True, False or 'auto', got {choice!r}")


def stepper(
    choice: bool | str,
    game: TensorGame[Any],
    layout: Layout,
    mode: AutoresetMode,
    num_envs: int,
    device: torch.device,
) -> EagerStepper | CompiledStepper | captured.CapturedStepper:
    """The stepper that `compile=choice` asks for: True the compiled step (built first if the
    cache lacks it); "auto" on CUDA the step captured in a CUDA graph (`captured`: no
    compiler, 8.7x the eager step's Breakout steps/s on an H200), elsewhere the eager form;
    False the eager form. "auto" built a package on CUDA until the first GPU run
    (docs/performance.md, "On a GPU"): there torch 2.11's package loader died with SIGSEGV on
    4 of the 5 games' packages and one did not build, after up to 163 s on a first
    `make_vec`. A package is trusted only once a child process has played it against the
    eager step (`proof`), a graph once it has played the uncaptured step; one that cannot be
    built, loaded, captured or proven gives way to the eager form (the same games), with one
    warning that says why."""
    eager = EagerStepper(game.eager_form(num_envs, device), layout, mode)
    if choice == "auto" and captured.wanted(device):
        return captured.stepper(game, layout, mode, num_envs, device, eager)
    if choice is not True:
        return eager
    name = type(game).__name__
    if not supported(device):
        log.warning(
            "%s: compile=True, but this torch builds no compiled step for %s devices; "
            "running the eager step",
            name,
            device.type,
        )
        return eager
    try:
        path = built(game, layout, mode, device)
        why = proof.problem(path, game, layout, mode, device, StepGraph(game, layout, mode))
        if why is None:
            return CompiledStepper(path, game, layout, mode, device)
    except Exception as err:  # no C++ compiler, say: the eager step gives the same games
        why = f"{type(err).__name__}: {err}"
    log.warning("%s: the compiled step is not used (%s); running the eager step", name, why)
    return eager
