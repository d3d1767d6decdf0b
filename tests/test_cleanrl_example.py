"""examples/cleanrl_ppo.py: importable, runnable with flags, learns, and stays in torch."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from loading import load_module

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cleanrl_ppo.py"


def load_example() -> Any:
    return load_module(EXAMPLE, "cleanrl_ppo_example")


@pytest.fixture
def no_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any tensor-to-numpy conversion inside the training loop fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the CleanRL example converted a tensor to numpy")

    monkeypatch.setattr(torch.Tensor, "numpy", refuse)
    monkeypatch.setattr(torch.Tensor, "__array__", refuse)


@pytest.mark.slow
def test_ppo_learns_to_catch_without_touching_numpy(no_numpy: None) -> None:
    example = load_example()
    args = example.Args(total_steps=98_304, num_envs=128, seed=0, log_every=6, verbose=False)
    result = example.train(args)
    curve = result["curve"]
    assert [row["env_steps"] for row in curve] == [24_576, 49_152, 73_728, 98_304]
    assert all(row["episodes"] > 0 for row in curve[1:])
    first, last = curve[0]["catch_rate"], curve[-1]["catch_rate"]
    assert last > first + 0.1 and last > 0.25  # sampled actions, still exploring
    greedy = example.evaluate(result["agent"], num_envs=64, steps=400, seed=12345)
    assert greedy["episodes"] >= 64
    assert greedy["catch_rate"] > 0.3  # a random basket catches 0.15


def test_main_parses_flags_and_prints_the_catch_rate(
    no_numpy: None, capsys: pytest.CaptureFixture[str]
) -> None:
    example = load_example()
    argv = ["--total-steps", "6400", "--num-envs", "32", "--device", "cpu", "--seed", "1"]
    cheap = ["--update-epochs", "1", "--num-minibatches", "2"]
    result = example.main([*argv, *cheap, "--num-steps", "25", "--log-every", "4"])
    curve = result["curve"]
    assert [row["env_steps"] for row in curve] == [3200, 6400]  # 8 updates of 32 x 25 steps
    assert curve[-1]["episodes"] == 32  # every game ended once at 200 steps
    assert 0.0 <= curve[-1]["catch_rate"] <= 1.0
    assert result["greedy"]["episodes"] >= 64
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[0].startswith("update    4  steps     3200")
    assert "catch rate" in out[1] and out[2].startswith("done: 6400 env steps")


def test_a_run_is_reproducible_from_its_seed() -> None:
    example = load_example()
    args = {
        "total_steps": 4096,
        "num_envs": 16,
        "num_steps": 64,
        "update_epochs": 2,
        "num_minibatches": 2,
        "log_every": 2,
        "verbose": False,
    }
    a = example.train(example.Args(seed=5, **args))
    b = example.train(example.Args(seed=5, **args))
    for row_a, row_b in zip(a["curve"], b["curve"], strict=True):
        assert row_a["catch_rate"] == row_b["catch_rate"] or math.isnan(row_a["catch_rate"])
    for p, q in zip(a["agent"].parameters(), b["agent"].parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--num-envs", "0"], "num_envs must be a positive int, got 0"),
        (["--num-envs", "10", "--num-steps", "3"], "must divide into num_minibatches = 16"),
    ],
)
def test_bad_flags_exit_with_a_clear_error(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    example = load_example()
    with pytest.raises(SystemExit) as exit_info:
        example.main(flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_training_runs_on_cuda() -> None:
    example = load_example()
    args = example.Args(total_steps=8192, num_envs=64, device="cuda", log_every=2, verbose=False)
    result = example.train(args)
    assert next(result["agent"].parameters()).device.type == "cuda"
    assert len(result["curve"]) == 2
