"""docs/coming-from.md runs as written: one snippet per concept mapped."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = {"stable_baselines3", "wandb", "optuna"}
NEEDS = {"SB3VecEnv": "stable_baselines3", "wandb=True": "wandb", '"sweep"': "optuna"}


def doc_snippets() -> list[str]:
    text = (ROOT / "docs" / "coming-from.md").read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_every_mapping_has_a_snippet() -> None:
    code = "\n".join(doc_snippets())
    for needle in ("make_vec", "SB3VecEnv", "eval_every=", "target=", "Callback", "load_policy"):
        assert needle in code
    for needle in ("wandb=True", '"sweep"', "--config", "check_vector_env", "policy.act"):
        assert needle in code


@pytest.mark.parametrize("index", range(len(doc_snippets())))
def test_coming_from_snippet_runs(
    index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = doc_snippets()[index]
    for needle, module in NEEDS.items():
        if needle in code:
            pytest.importorskip(module)
    monkeypatch.chdir(tmp_path)  # snippets write runs/... here
    monkeypatch.setenv("WANDB_MODE", "offline")  # never the network
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    exec(compile(code, f"docs/coming-from.md snippet {index}", "exec"), {"__name__": "__doc__"})
