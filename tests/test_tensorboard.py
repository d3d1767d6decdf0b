"""`--tensorboard`: event files when the package is there; a warning and a normal run when not."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.tools.cli import main

# 4 sub-envs x 16 steps = 64 env steps per update; 3 updates. The 16-step games end in
# every update, so every update has episode figures (`episode_caught`) to log.
TINY = ["--num-groups", "2", "--group-size", "2", "--rollout-steps", "16", "--window", "4"]
TINY += ["--env-kwargs", '{"max_episode_steps": 16}']
TINY += ["--total-env-steps", "192", "--hidden-sizes", "8", "--device", "cpu", "--no-progress"]


def metric_rows(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_tensorboard_flag_writes_the_metrics_as_event_files(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    assert main(["train", *TINY, "--run-dir", str(run_dir), "--tensorboard"]) == 0
    events = sorted((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    board = EventAccumulator(str(run_dir / "tensorboard"))
    board.Reload()
    rows = metric_rows(run_dir)
    assert len(rows) == 3
    tags = set(board.Tags()["scalars"])
    assert {"return_mean", "loss", "entropy", "episode_caught", "steps_per_s"} <= tags
    for tag in ("return_mean", "loss", "env_steps"):
        scalars = board.Scalars(tag)
        assert (
            [s.step for s in scalars] == [int(row["env_steps"]) for row in rows] == [64, 128, 192]
        )
        assert [s.value for s in scalars] == pytest.approx([row[tag] for row in rows])


def test_without_tensorboard_training_warns_and_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now fails
    with pytest.raises(ImportError):
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    run_dir = tmp_path / "run"
    run = RunConfig(device="cpu", progress=False, run_dir=str(run_dir), tensorboard=True)
    sizes = {"num_groups": 2, "group_size": 2, "rollout_steps": 16, "hidden_sizes": (8,)}
    config = GRPOConfig(total_env_steps=128, run=run, **sizes)
    envs = gym.make_vec("FruitCatcher-v0", num_envs=config.num_envs)
    with caplog.at_level(logging.WARNING, logger="grpo_trainer"):
        metrics = GRPOTrainer(envs, config).train()
    assert metrics["update"] == 2 and metrics["env_steps"] == 128
    warnings = [r for r in caplog.records if r.name == "grpo_trainer.base.metrics"]
    assert [(r.levelno, r.getMessage()) for r in warnings] == [
        (logging.WARNING, "--tensorboard needs the 'tensorboard' package; continuing without it")
    ]
    assert len(metric_rows(run_dir)) == 2  # the JSONL log is unaffected
    assert not (run_dir / "tensorboard").exists()


def test_evaluations_during_training_reach_tensorboard(tmp_path: Path) -> None:
    """`eval_*` figures ride the row of the update they followed, so they land in the event
    files at that update's env steps, like every other metric."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    flags = ["--eval-every", "64", "--eval-episodes", "4", "--tensorboard"]
    assert main(["train", *TINY, *flags, "--run-dir", str(run_dir)]) == 0
    board = EventAccumulator(str(run_dir / "tensorboard"))
    board.Reload()
    evaluated = [row for row in metric_rows(run_dir) if "eval_catch_rate" in row]
    assert [int(row["env_steps"]) for row in evaluated] == [64, 128, 192]  # every 64
    for tag in ("eval_return_mean", "eval_catch_rate", "eval_score"):
        scalars = board.Scalars(tag)
        assert [s.step for s in scalars] == [64, 128, 192]
        assert [s.value for s in scalars] == pytest.approx([row[tag] for row in evaluated])
