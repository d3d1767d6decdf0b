"""benchmarks/ratio_moves.py: it measures how far an update moved the trained steps'
log-probs, from their behaviour log-probs to the policy after the update."""

from __future__ import annotations

import json
import math
from pathlib import Path

from loading import load_module

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, name: str, lr: str) -> list[dict]:
    ratio_moves = load_module(ROOT / "benchmarks" / "ratio_moves.py", "ratio_moves_benchmark")
    argv = ["--game", "breakout", "--budget", "20000", "--updates", "5", "--name", name]
    assert ratio_moves.main([*argv, "--results", str(tmp_path), "--flags", "--lr", lr]) == 0
    payload = json.loads((tmp_path / f"{name}.json").read_text())
    assert payload["flags"] == ["--seed", "0", "--lr", lr]
    return [r for r in payload["updates"] if "down_max" in r]


def test_an_update_that_barely_changes_the_policy_moves_no_log_prob(tmp_path: Path) -> None:
    """At lr 1e-9 the policy after each update scores the trained steps as their behaviour
    log-probs do; at lr 1e-2 some steps move. So the moves are the update's, and the
    behaviour log-probs are the ratios' anchors."""
    still = _run(tmp_path, "still", "1e-9")
    moved = _run(tmp_path, "moved", "1e-2")
    assert still and moved  # updates that trained rows
    for record in still:
        assert abs(record["down_max"]) < 1e-4 and abs(record["up_max"]) < 1e-4
        assert record["down_5"] == record["up_5"] == 0
    assert max(r["down_max"] for r in moved) > 1e-2
    assert all(math.isfinite(r["approx_kl_old"]) for r in moved)
    assert all(r["weighted_steps"] > 0 for r in moved)
