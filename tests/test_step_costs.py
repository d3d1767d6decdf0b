"""benchmarks/step_costs.py: it times the train command's own run of a game, and a played
step costs less than a played and trained one (the update's epochs come on top)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from loading import load_module

ROOT = Path(__file__).resolve().parents[1]


def test_step_costs_times_the_train_commands_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    step_costs = load_module(ROOT / "benchmarks" / "step_costs.py", "step_costs_benchmark")
    scratch = tmp_path / "tmp"  # where the measured runs' directories go, and must not stay
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    argv = ["--games", "freeway", "--budget", "20000", "--updates", "2"]
    assert step_costs.main([*argv, "--name", "costs", "--results", str(tmp_path)]) == 0
    assert not list(scratch.glob("step-costs-*"))
    (row,) = json.loads((tmp_path / "costs.json").read_text())["rows"]
    # 20k env steps: the smallest derived update, 1024 samples (32 sub-envs x 32 steps)
    assert (row["game"], row["samples_per_update"], row["epochs"]) == ("freeway", 1024, 4)
    assert len(row["collect_s"]) == len(row["learn_s"]) == 2  # the warm-up update is not kept
    assert 0 < row["collect_us_per_step"] < row["update_us_per_step"]
    assert row["extra_steps_per_update"] == 0  # the defaults play no inference-only steps
    assert row["drop_flat_rows"] is True  # the CPU's default: rows of weight 0 are not trained
    assert len(row["frac_zero_std_groups"]) == 2


def test_every_row_trains_rows_of_weight_zero_too(tmp_path: Path) -> None:
    """`--every-row` times the update as a GPU runs it, every row through the passes."""
    step_costs = load_module(ROOT / "benchmarks" / "step_costs.py", "step_costs_benchmark")
    argv = ["--games", "freeway", "--budget", "20000", "--updates", "1", "--every-row"]
    assert step_costs.main([*argv, "--name", "every", "--results", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "every.json").read_text())["rows"]
    assert row["drop_flat_rows"] is False
