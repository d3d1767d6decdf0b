"""benchmarks/weight_average.py: its averages follow the live policy by their decay, and a
run records the live policy and every average at each mark, on the same games."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from loading import load_module

ROOT = Path(__file__).resolve().parents[1]
probe = load_module(ROOT / "benchmarks" / "weight_average.py", "weight_average_benchmark")


def test_each_average_moves_one_minus_its_decay_toward_the_live_weights() -> None:
    torch.manual_seed(0)
    live = torch.nn.Linear(3, 2)
    averages = {d: copy.deepcopy(live) for d in (0.5, 0.9)}
    before = [p.detach().clone() for p in live.parameters()]
    with torch.no_grad():
        for p in live.parameters():
            p.add_(1.0)
    probe.update_averages(averages, live)
    for decay, average in averages.items():
        for old, new, got in zip(before, live.parameters(), average.parameters(), strict=True):
            torch.testing.assert_close(got, decay * old + (1 - decay) * new.detach())


def test_a_run_scores_the_live_policy_and_every_average_at_each_mark(tmp_path: Path) -> None:
    job = {
        "env": "Breakout-MinAtar-v0",
        "steps": 16384,
        "seed": 3,
        "cpu": 0,
        "episodes": 2,
        "every": 4096,
        "first_mark": 8192,
        "out": str(tmp_path / "record.json"),
    }
    record = probe.run_one(job)
    json.dumps(record)  # what the worker writes
    names = {"live", *(f"ema{d:g}" for d in probe.DECAYS)}
    steps = [point["env_steps"] for point in record["curve"]]
    assert steps == sorted(steps) and steps[0] >= 8192 and len(steps) >= 2
    for point in record["curve"]:
        assert set(point["greedy"]) == set(point["greedy_length"]) == names
        assert all(1 <= length <= 1000 for length in point["greedy_length"].values())
    final = record["final"]
    assert final["env_steps"] >= 16384
    assert set(final["greedy"]) == set(final["sampled"]) == set(final["sampled_length"]) == names
    assert record["config"]["total_env_steps"] == 16384 and record["config"]["run"]["seed"] == 3
