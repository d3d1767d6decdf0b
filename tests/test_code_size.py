"""grpo_trainer stays readable in pieces: no class longer than 250 lines, no function longer
than 80 (docstrings and comments included; a nested function counts within its parent too)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "grpo_trainer"
MAX_LINES = {ast.ClassDef: 250, ast.FunctionDef: 80, ast.AsyncFunctionDef: 80}


def _too_long(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        limit = MAX_LINES.get(type(node))
        if limit is None:
            continue
        assert isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        if lines > limit:
            found.append(f"{where}:{node.lineno} {node.name}: {lines} lines (limit {limit})")
    return found


def test_no_class_over_250_lines_and_no_function_over_80() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += _too_long(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert not found


def test_the_size_check_sees_classes_and_functions() -> None:
    """A class of 251 lines and a method of 81 are both reported, with their lengths."""
    body = "".join(f"        x{i} = {i}\n" for i in range(79))
    method = f"    def long(self) -> None:\n{body}        return None\n"  # 81 lines
    filler = "".join(f"    y{i} = {i}\n" for i in range(250 - 1 - 81))
    source = f"class Big:\n{method}{filler}    z = 0\n"  # 251 lines
    assert _too_long(source, "x.py") == [
        "x.py:1 Big: 251 lines (limit 250)",
        "x.py:2 long: 81 lines (limit 80)",
    ]
