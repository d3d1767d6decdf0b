"""benchmarks/suite.py, the learning suite: its summary and markdown table from fabricated
results, and one tiny real run in a worker process, whose JSON has the documented shape."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from loading import load_module

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "suite.py"


@pytest.fixture(scope="module")
def suite() -> Any:
    return load_module(SCRIPT, "suite_benchmark")


def run(seed: int, trainer: str, curve: list[tuple[int, float, float]], **extra: Any) -> dict:
    points = [{"env_steps": s, "train_s": t, "eval": v} for s, t, v in curve]
    final = points[-1]["env_steps"], points[-1]["train_s"]
    return {
        "trainer": trainer,
        "seed": seed,
        "curve": points,
        "final_eval": points[-1]["eval"],
        "env_steps": final[0],
        "train_s": final[1],
        "env_steps_per_s": final[0] / final[1],
        **extra,
    }


def payload(suite: Any, name: str, runs: dict[str, list[dict]]) -> dict[str, Any]:
    """What Study.payload writes, from fabricated runs (the functions it uses, no processes)."""
    task = suite.TASKS[name]
    threshold, source = suite.resolve_threshold(task, runs)
    summary = {t: suite.summarise(rs, threshold) for t, rs in runs.items()}
    return {
        "timestamp": "2026-11-25T10:00:00+00:00",
        "task": name,
        "env": task.env,
        "metric": task.metric,
        "budget": task.budget,
        "threshold": threshold,
        "threshold_source": source,
        "complete": True,
        "summary": summary,
        "versus_peer": suite.versus_peer(summary, source),
        "runs": runs,
    }


def test_median_to_threshold_counts_a_miss_as_infinitely_late(suite: Any) -> None:
    assert suite.median_to_threshold([3.0, 1.0, None]) == 3.0
    assert suite.median_to_threshold([1.0, None, None]) is None
    assert suite.median_to_threshold([1.0, None]) is None
    assert suite.median_to_threshold([1.0, 3.0]) == 2.0
    assert suite.median_to_threshold([]) is None


def test_eval_marks_are_tenths_of_the_budget_ending_at_it(suite: Any) -> None:
    assert suite.eval_marks(1_000_000) == [100_000 * k for k in range(1, 11)]
    assert suite.eval_marks(4096)[-1] == 4096


def test_the_xla_flags_are_ppo_jax_s() -> None:
    text = (ROOT / "benchmarks" / "ppo_jax.py").read_text()
    flags = re.search(r'^THREAD_FLAGS = "(.*)"$', text, flags=re.MULTILINE)
    suite_text = SCRIPT.read_text()
    assert flags and f'XLA_ONE_THREAD = "{flags.group(1)}"' in suite_text


def test_peers_without_the_env_are_skipped_and_failures_counted(suite: Any, tmp_path: Path) -> None:
    args = suite.parse_args(["fruit", "--peers", "grpo,ppo_jax,sb3", "--results", str(tmp_path)])
    study = suite.Study(args, tmp_path, {"fruit": 1000})
    assert list(study.runs["fruit"]) == ["grpo"]
    study.add("fruit", {"trainer": "grpo", "seed": 1, "cpu": 0, "wall_s": 1.0, "error": "boom"})
    study.add("fruit", run(0, "grpo", [(500, 1.0, 0.2), (1000, 2.0, 0.71)]))
    result = json.loads((tmp_path / "suite_fruit.json").read_text())
    assert set(result["skipped"]) == {"ppo_jax", "sb3"} and not result["complete"]
    assert [r["seed"] for r in result["runs"]["grpo"]] == [0, 1]
    assert result["runs"]["grpo"][0]["reached"] == {"env_steps": 1000, "train_s": 2.0}
    summary = result["summary"]["grpo"]
    assert (summary["runs"], summary["failed"], summary["reached"]) == (2, 1, 1)
    assert summary["median_env_steps_to_threshold"] is None  # 1 of 2: no majority
    assert study.failed == 1
    row = suite.render_table(tmp_path).splitlines()[2]
    assert row.startswith(
        "| fruit (incomplete) (FruitCatcher-v0) | 1k | catch rate 0.7 | 1/2 (1 failed)"
    )
    assert row.endswith("| n/a |  |  | n/a |  |  |")


def test_table_from_fabricated_results(suite: Any, tmp_path: Path) -> None:
    cartpole = {
        "grpo": [
            run(0, "grpo", [(100_000, 2.0, 300.0), (200_000, 4.0, 480.0), (500_000, 10.0, 500.0)]),
            run(1, "grpo", [(100_000, 2.5, 476.0), (500_000, 11.0, 490.0)]),
            run(2, "grpo", [(100_000, 2.2, 100.0), (500_000, 9.0, 400.0)]),
        ],
        "ppo_jax": [run(s, "ppo_jax", [(500_000, 4.4, 500.0)], compile_s=8.0) for s in range(3)],
    }
    breakout = {
        "grpo": [
            run(s, "grpo", [(500_000, 30.0, 20.0), (1_000_000, 60.0, 30.0)]) for s in range(3)
        ],
        "ppo_jax": [
            run(s, "ppo_jax", [(1_000_000, 22.0, v)], compile_s=11.0)
            for s, v in enumerate([61.3, 22.2, 25.2])
        ],
    }
    for name, runs in (("cartpole", cartpole), ("breakout", breakout)):
        (tmp_path / f"suite_{name}.json").write_text(json.dumps(payload(suite, name, runs)))

    summary = json.loads((tmp_path / "suite_breakout.json").read_text())
    assert summary["threshold"] == 25.2 and summary["threshold_source"].startswith("ppo_jax")
    assert summary["versus_peer"]["grpo_median_train_s_to_peer_final"] == 60.0
    assert summary["versus_peer"]["grpo_final_at_least_peer"] is False  # 30 < 36.2

    table = suite.render_table(tmp_path).splitlines()
    assert table[0].startswith("| task | budget | threshold | GRPO: reached |")
    assert "PPO (JAX): final greedy" in table[0] and "SB3" not in table[0]
    # cartpole: seeds 0 and 1 reach 475 (at 200k / 4.0 s and 100k / 2.5 s), seed 2 does not
    assert table[2] == (
        "| cartpole (CartPole-v1) | 500k | 475 | 2/3 | 200k, 4.0 s | 463 (400 to 500) "
        "| 3/3 | 500k, 4.4 s | 500 (500 to 500) |"
    )
    assert table[3].startswith("| breakout (Breakout-MinAtar) | 1.00M | 25.2 (PPO (JAX) median")
    assert "| 3/3 | 1.00M, 60.0 s | 30.0 (30.0 to 30.0) |" in table[3]
    assert "| breakout | 25.2 | 22.0 s; + 11.0 s | 60.0 s | 30.0 | 36.2 |" in table
    assert table[-1].startswith("Files: `suite_cartpole.json` (2026-11-25)")

    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--table", "--results", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip().splitlines() == table


@pytest.mark.slow
def test_smoke_run_writes_the_documented_json(tmp_path: Path) -> None:
    command = [sys.executable, str(SCRIPT), "cartpole", "--budget", "4096", "--seeds", "0"]
    command += ["--peers", "grpo", "--jobs", "1", "--results", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "suite_cartpole.json").read_text())
    top = {"command", "timestamp", "task", "env", "budget", "threshold", "threshold_source"}
    top |= {"metric", "eval_marks", "eval_episodes", "seeds", "peers", "complete", "machine"}
    assert top | {"software", "summary", "versus_peer", "runs"} <= set(result)
    assert result["complete"] and result["budget"] == 4096 and result["threshold"] == 475.0
    assert result["software"]["torch"] and result["machine"]["threads_per_run"] == 1
    (record,) = result["runs"]["grpo"]
    assert record["seed"] == 0 and record["torch_threads"] == 1
    assert record["cpus_allowed"] == [record["cpu"]]
    assert record["env_steps"] >= 4096 and record["train_s"] > 0 and record["env_steps_per_s"] > 0
    assert record["config"]["total_env_steps"] == 4096
    assert record["config"]["run"]["env"] == "CartPole-v1"
    assert record["curve"][-1]["env_steps"] == record["env_steps"]
    assert record["final_eval"] == record["curve"][-1]["eval"] >= 8  # CartPole lasts 8+ steps
    assert "reached" in record
    summary = result["summary"]["grpo"]
    assert summary["runs"] == 1 and summary["failed"] == 0
    assert summary["final_eval"]["min"] == record["final_eval"]
