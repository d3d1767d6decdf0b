"""grpo_trainer's layers (docs/architecture.md): imports point one way, tools -> run ->
algorithm -> envs -> base, and no module imports one that imports it back. Every import
counts: at module level, inside functions, and under `TYPE_CHECKING`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "grpo_trainer"
LAYERS = ("base", "envs", "algorithm", "run", "tools")  # bottom to top


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The grpo_trainer modules `path` imports, wherever the import stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("grpo_trainer")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grpo_trainer"):
            assert node.level == 0, f"{path}: relative import"
            for alias in node.names:  # `from package import module` imports the module
                name = f"{node.module}.{alias.name}"
                found.add(name if name in modules else node.module)
    return found


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_every_module_lives_in_a_layer() -> None:
    loose = [m for m in _modules() if _layer(m) == len(LAYERS)]
    assert sorted(loose) == ["grpo_trainer", "grpo_trainer.__main__"]  # the public face


def test_imports_point_down_the_layers() -> None:
    upward = [
        f"{module} ({LAYERS[_layer(module)]}) imports {target}"
        for module, targets in _graph().items()
        if _layer(module) < len(LAYERS)
        for target in targets
        if _layer(target) > _layer(module)
    ]
    assert not upward


def test_no_import_circle() -> None:
    graph = _graph()
    state: dict[str, str] = {}  # "open" while on the path, "done" after

    def visit(module: str, path: list[str]) -> None:
        if state.get(module) == "done":
            return
        assert state.get(module) != "open", "import circle: " + " -> ".join([*path, module])
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            visit(target, [*path, module])
        state[module] = "done"

    for module in sorted(graph):
        visit(module, [])


def test_the_algorithm_is_the_top_of_its_layer() -> None:
    """`GRPO` composes the algorithm's pieces; no piece reaches back to it."""
    graph = _graph()
    back = [m for m, targets in graph.items() if "grpo_trainer.algorithm.grpo" in targets]
    assert all(_layer(m) > LAYERS.index("algorithm") for m in back), back


# What of base/checkpoint.py the algorithm may name: the data format of its state, and the
# error a state that does not fit raises; reading and writing files is the run's.
CHECKPOINT_DATA = {"FORMAT_VERSION", "DIGEST_KEY", "space_signature", "CheckpointError"}
FILE_MODULES = {"pathlib", "os", "io", "shutil", "tempfile"}


def test_the_algorithm_reads_and_writes_no_files() -> None:
    """docs/architecture.md: `GRPO`'s state goes out and comes back as a dict; resuming from
    a file is `GRPOTrainer.load` (run/). No algorithm module opens a file, imports a file
    module, or calls base/checkpoint.py's file functions."""
    found = []
    for path in sorted((PACKAGE / "algorithm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [
                    f"{path.name}: import {a.name}" for a in node.names if a.name in FILE_MODULES
                ]
            elif isinstance(node, ast.ImportFrom) and node.module in FILE_MODULES:
                found.append(f"{path.name}: from {node.module}")
            elif isinstance(node, ast.ImportFrom) and node.module == "grpo_trainer.base.checkpoint":
                found += [
                    f"{path.name}: {a.name}" for a in node.names if a.name not in CHECKPOINT_DATA
                ]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "checkpoint" and node.attr not in CHECKPOINT_DATA:
                    found.append(f"{path.name}: checkpoint.{node.attr}")
            elif isinstance(node, ast.Name) and node.id == "open":
                found.append(f"{path.name}: open")
    assert not found
