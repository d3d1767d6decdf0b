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


# A path a page may name without it being in the tree: what a script writes when it runs.
WRITTEN_WHEN_RUN = {"benchmarks/results/gpu_check.json"}  # scripts/gpu_check.py, on a GPU
PATH = re.compile(
    r"(?<![\w/.-])(?:fruit_env|grpo_trainer|benchmarks|examples|scripts|tests|docs)/[\w/.-]*"
)
LINK = re.compile(r"\]\(((?!https?:|mailto:|#)[^)#\s]+)(?:#[^)]*)?\)")


def _paths(line: str) -> list[str]:
    """The repository paths `line` names; a pattern (`train_ab_*`, `suite_<task>`) is none."""
    found = []
    for match in PATH.finditer(line):
        if line[match.end() : match.end() + 1] not in ("*", "<"):
            found.append(match.group().rstrip("./-"))
    return found


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_path_a_page_names_exists() -> None:
    """README and docs/ name no file or folder that is gone (a deleted script, a moved
    result, a module folded into another): a path of the tree, a `.py` module path without
    its suffix, or a relative link, resolved from the page's folder."""
    missing = []
    for page in _pages():
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for name in _paths(line):
                found = (ROOT / name).exists() or (ROOT / f"{name}.py").exists()
                if not found and name not in WRITTEN_WHEN_RUN:
                    missing.append(f"{page.relative_to(ROOT)}:{number}: {name}")
            for target in LINK.findall(line):
                if not (page.parent / target).exists():
                    missing.append(f"{page.relative_to(ROOT)}:{number}: link {target}")
    assert not missing, "\n".join(missing)


def test_the_path_check_sees_a_deleted_script_and_a_broken_link() -> None:
    line = "run `python benchmarks/time_to_target.py` ([results](../benchmarks/gone.json))"
    assert _paths(line) == ["benchmarks/time_to_target.py"]
    assert LINK.findall(line) == ["../benchmarks/gone.json"]
    assert not (ROOT / "benchmarks" / "time_to_target.py").exists()
    assert _paths("`benchmarks/results/train_ab_*.json`, `benchmarks/results/suite_<task>`") == []
