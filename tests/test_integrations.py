"""docs/integrations.md runs as written, and scripts/make_readme_gif.py records a checkpoint."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from loading import load_module

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("stable_baselines3", "jax", "torchrl", "tensordict", "moviepy", "tensorboard")


def doc_snippets() -> list[str]:
    text = (ROOT / "docs" / "integrations.md").read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_every_library_has_a_snippet() -> None:
    code = "\n".join(doc_snippets())
    for needle in ("SB3VecEnv", 'autoreset_mode="SAME_STEP"', "DLPackView", "GymWrapper"):
        assert needle in code
    assert "RecordVideo" in code and "tensorboard=True" in code
    assert "check_vector_env" in code


@pytest.mark.parametrize("index", range(len(doc_snippets())))
def test_docs_integrations_snippet_runs(
    index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = doc_snippets()[index]
    imported = re.findall(r"^(?:from|import) (\w+)", code, flags=re.MULTILINE)
    for module in imported:
        if module in OPTIONAL:
            pytest.importorskip(module)
    if "tensorboard=True" in code:
        pytest.importorskip("tensorboard")
    monkeypatch.chdir(tmp_path)  # snippets that write (runs/...) write here
    exec(compile(code, f"docs/integrations.md snippet {index}", "exec"), {"__name__": "__doc__"})


# -- scripts/make_readme_gif.py ----------------------------------------------------------------


def load_script() -> Any:
    return load_module(ROOT / "scripts" / "make_readme_gif.py", "make_readme_gif")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GRPO run's final checkpoint (untrained in all but name: enough to record)."""
    run_dir = tmp_path_factory.mktemp("gif-run")
    run = RunConfig(device="cpu", progress=False, run_dir=str(run_dir))
    config = GRPOConfig(
        num_groups=2, group_size=2, total_env_steps=64, max_episode_steps=16, run=run
    )
    GRPOTrainer(gym.make_vec("FruitCatcher-v0", num_envs=config.num_envs), config).train()
    return run_dir / "checkpoints" / "last.pt"


def test_readme_gif_from_a_checkpoint(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("PIL")
    from PIL import Image

    script = load_script()
    out = tmp_path / "agent.gif"
    argv = ["--checkpoint", str(checkpoint), "--out", str(out), "--steps", "12"]
    result = script.main([*argv, "--scale", "0.5", "--eval-episodes", "4", "--fps", "5"])
    with Image.open(out) as gif:
        assert gif.size == (160, 120) and gif.n_frames == result["frames"]
        assert gif.info["duration"] == 200  # ms per frame at 5 fps
    assert result["frames"] <= 13  # the first frame and one per step, until the episode ends
    assert result["kb"] == pytest.approx(out.stat().st_size / 1024)
    assert 0.0 <= result["greedy_catch_rate"] <= 1.0
    out_text = capsys.readouterr().out
    assert f"wrote {out}:" in out_text and "greedy catch rate over 4 episodes" in out_text


def test_readme_gif_shrinks_or_refuses_when_over_the_size_limit(
    checkpoint: Path, tmp_path: Path
) -> None:
    pytest.importorskip("PIL")
    script = load_script()
    out = tmp_path / "agent.gif"
    common = ["--checkpoint", str(checkpoint), "--out", str(out), "--eval-episodes", "2"]
    common += ["--steps", "40"]
    full = script.main(common)
    assert full["scale"] == 1.0
    limit = int(full["kb"])  # just under the full-size file
    shrunk = script.main([*common, "--max-kb", str(limit)])
    assert shrunk["scale"] < 1.0 and shrunk["kb"] <= limit
    assert out.stat().st_size <= limit * 1024
    with pytest.raises(SystemExit, match=r"exceeds --max-kb 1$"):
        script.main([*common, "--max-kb", "1"])
    assert not out.exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--scale", "0"], "--scale must be in (0, 1], got 0.0"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--checkpoint", "no/such/file.pt"], "--checkpoint no/such/file.pt is not a file"),
    ],
)
def test_readme_gif_bad_flags(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_script()
    with pytest.raises(SystemExit) as exit_info:
        script.main(flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
