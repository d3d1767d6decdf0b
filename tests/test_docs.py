"""docs/trainer.md stays true: its generated tables match the code, its snippets run, and
no project file points at a design document outside the repository."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "trainer.md"

sys.path.insert(0, str(ROOT / "scripts"))
import docs_tables  # noqa: E402


def test_config_and_metrics_tables_are_generated_from_the_code() -> None:
    """The tables equal what the dataclasses and the metrics registry say (regenerate them
    with `python scripts/docs_tables.py`)."""
    text = PAGE.read_text()
    assert docs_tables.render(text) == text
    for name in docs_tables.TABLES:
        assert f"<!-- generated: {name} -->" in text


def _snippets() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), flags=re.MULTILINE | re.DOTALL)


NEEDS = {"run_sweep": "optuna", "wandb=True": "wandb"}  # snippets that need an extra


@pytest.mark.parametrize("index", range(len(_snippets())))
def test_docs_trainer_snippet_runs(index: int) -> None:
    for needle, module in NEEDS.items():
        if needle in _snippets()[index]:
            pytest.importorskip(module)
    exec(
        compile(_snippets()[index], f"docs/trainer.md snippet {index}", "exec"),
        {"__name__": "__doc__"},
    )


def test_no_file_cites_a_design_document_outside_the_repository() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in tracked:
        if name.endswith((".py", ".md", ".toml", ".txt")) and name != "tests/test_docs.py":
            text = (ROOT / name).read_text()
            assert "DESIGN.md" not in text and "../shared" not in text, name


def test_the_readme_layout_names_every_module() -> None:
    text = (ROOT / "README.md").read_text()
    layout = text[text.index("## Layout") :]
    for package in ("fruit_env", "grpo_trainer"):
        for module in sorted((ROOT / package).glob("*.py")):
            if not module.stem.startswith("__"):
                assert re.search(rf"\b{module.stem}\b", layout), f"{package}/{module.name}"


def test_every_module_says_what_it_owns() -> None:
    """Every public module of both packages opens with a docstring."""
    import ast

    for package in ("fruit_env", "grpo_trainer"):
        for module in sorted((ROOT / package).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(module.read_text()))
            assert doc and len(doc) > 20, module


def test_gpu_check_refuses_without_cuda_in_one_line() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: make gpu-check runs for real")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py")], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stdout.strip().count("\n") == 0 and "needs a CUDA GPU" in done.stdout
