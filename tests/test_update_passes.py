"""benchmarks/update_passes.py: it times the passes before an update both ways on the same
rollouts of the train command's run, and both ways give the same numbers."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from loading import load_module

ROOT = Path(__file__).resolve().parents[1]


def test_update_passes_times_both_ways_on_the_train_commands_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    passes = load_module(ROOT / "benchmarks" / "update_passes.py", "update_passes_benchmark")
    scratch = tmp_path / "tmp"  # where the measured runs' directories go, and must not stay
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    argv = ["--games", "breakout", "--budget", "20000", "--updates", "2"]
    assert passes.main([*argv, "--name", "passes", "--results", str(tmp_path)]) == 0
    assert not list(scratch.glob("update-passes-*"))
    (row,) = json.loads((tmp_path / "passes.json").read_text())["rows"]
    assert row["game"] == "breakout" and row["bit_identical"] is True
    assert len(row["apart_s"]) == len(row["once_s"]) == len(row["update_s"]) == 2
    # a grid gets a shared critic, and with the window's look-ahead 31 of 32 rows wait
    assert row["rescored_rows"] == 31 * 32
    assert row["median_once_ms"] > 0 and row["median_apart_ms"] > 0
