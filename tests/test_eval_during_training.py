"""Evaluation during training, best.pt by evaluation score, --target, and callbacks."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.base import checkpoint
from grpo_trainer.base import config as config_module
from grpo_trainer.run.callbacks import Best, Callback, RunState
from grpo_trainer.run.evaluation import evaluate, load_policy
from grpo_trainer.run.periodic_eval import EVAL_SEED

STEPS_PER_UPDATE = 16 * 16  # 4 groups x 4 members x 16 rollout steps
CPU = torch.device("cpu")


def _config(run_dir: Path | None = None, **run: Any) -> GRPOConfig:
    settings: dict[str, Any] = {
        "progress": False,
        "device": "cpu",
        "seed": 3,
        "run_dir": str(run_dir) if run_dir else None,
        "eval_every": 2 * STEPS_PER_UPDATE,
        "eval_episodes": 12,
        **run,
    }
    return GRPOConfig(
        num_groups=4,
        group_size=4,
        rollout_steps=16,
        window=8,
        minibatch_size=128,
        hidden_sizes=(16,),
        total_env_steps=7 * STEPS_PER_UPDATE,
        run=RunConfig(**settings),
    )


def _trainer(config: GRPOConfig) -> GRPOTrainer:
    return GRPOTrainer(gym.make_vec("FruitCatcher-v0", num_envs=config.num_envs), config)


def _rows(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class Recorder(Callback):
    """Records every hook call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def on_train_start(self, state: RunState) -> None:
        self.calls.append(("start", state.update))

    def on_update(self, state: RunState, metrics: dict[str, float]) -> None:
        self.calls.append(("update", dict(metrics)))

    def on_eval(self, state: RunState, metrics: dict[str, float]) -> None:
        self.calls.append(("eval", dict(metrics)))

    def on_checkpoint(self, state: RunState, path: Path) -> None:
        self.calls.append(("checkpoint", path))

    def on_train_end(self, state: RunState, metrics: dict[str, float]) -> None:
        self.calls.append(("end", dict(metrics)))
        self.best = state.best


def test_evaluations_land_every_eval_every_env_steps_and_pick_best_pt(tmp_path: Path) -> None:
    """Rows after updates 2, 4 and 6 carry eval_* metrics; best.pt is the best of those
    evaluations, and replaying eval on it gives its recorded score exactly."""
    run_dir = tmp_path / "run"
    _trainer(_config(run_dir)).train()
    rows = _rows(run_dir)
    evaluated = [r for r in rows if "eval_score" in r]
    assert [r["update"] for r in evaluated] == [2, 4, 6]
    for row in evaluated:
        assert row["eval_score"] == row["eval_catch_rate"]  # the env's declared ratio
        assert row["eval_episodes"] == 12
        assert row["eval_s"] > 0
    assert not any(k.startswith("eval_") for r in rows if r["update"] % 2 for k in r)
    assert evaluated[-1]["eval_total_s"] == pytest.approx(sum(r["eval_s"] for r in evaluated))

    best_row = max(evaluated, key=lambda r: r["eval_score"])
    best = checkpoint.load(run_dir / "checkpoints" / "best.pt")
    assert (best["update_index"], best["best_by"]) == (best_row["update"], "eval_score")
    assert best["best_score"] == best_row["eval_score"]
    envs = gym.make_vec("FruitCatcher-v0", num_envs=12)
    policy, _, _ = load_policy(run_dir / "checkpoints" / "best.pt", CPU, envs)
    again = evaluate(policy, envs, 12, seed=EVAL_SEED)
    assert again["catch_rate"] == pytest.approx(best_row["eval_score"], abs=1e-6)


@pytest.mark.parametrize(("default_every", "updates"), [(300, [4]), (1500, [6])])
def test_the_default_cadence_is_at_least_four_updates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default_every: int, updates: list[int]
) -> None:
    """With eval_every unset, evaluations land every EVAL_EVERY env steps (here scaled down
    to this run's 256-step updates), but never closer than 4 updates: a GPU's update plays
    more env steps than EVAL_EVERY, and an evaluation there costs more than an update."""
    monkeypatch.setattr(config_module, "EVAL_EVERY", default_every)
    run_dir = tmp_path / "run"
    _trainer(_config(run_dir, eval_every=None)).train()
    assert [r["update"] for r in _rows(run_dir) if "eval_score" in r] == updates


def test_evaluation_time_stays_out_of_training_time_and_steps_per_second(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    _trainer(_config(run_dir)).train()
    rows = _rows(run_dir)
    for before, row in itertools.pairwise(rows):
        spent = row["rollout_s"] + row["update_s"]
        assert row["train_s"] - before["train_s"] == pytest.approx(spent, abs=1e-6)
        assert row["steps_per_s"] == pytest.approx(STEPS_PER_UPDATE / spent, rel=1e-6)


def test_a_target_stops_the_run_and_records_time_and_steps_to_it(tmp_path: Path) -> None:
    """catch_rate=0 is met by the first evaluation (after update 2): the run stops there, with
    a final checkpoint, and records when it got there."""
    run_dir = tmp_path / "run"
    trainer = _trainer(_config(run_dir, target="catch_rate=0"))
    trainer.train()
    rows = _rows(run_dir)
    assert rows[-1]["update"] == 2 and trainer.env_steps == 2 * STEPS_PER_UPDATE
    assert rows[-1]["target_reached_env_steps"] == 2 * STEPS_PER_UPDATE
    assert rows[-1]["target_reached_s"] >= rows[-1]["train_s"]  # wall time: more than training
    assert trainer.stop_reason == "the evaluation reached the target catch_rate=0"
    assert trainer.stop_signal is None  # not a signal: `grpo train` exits 0
    assert checkpoint.load(run_dir / "checkpoints" / "last.pt")["update_index"] == 2


def test_the_env_goal_is_recorded_without_stopping(tmp_path: Path) -> None:
    """Without --target the env's declared goal is tracked; reaching it does not stop."""
    run_dir = tmp_path / "run"
    trainer = _trainer(_config(run_dir))
    assert trainer.env.episode_goals == {"catch_rate": 0.70}
    trainer.env.episode_goals = {"catch_rate": 0.0}  # met at once
    trainer.train()
    rows = _rows(run_dir)
    assert rows[-1]["update"] == 7  # the whole budget
    reached = [r for r in rows if "target_reached_env_steps" in r]
    assert [r["update"] for r in reached] == [2]  # recorded once, when first met


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("caught_rate=0.5", "the env reports no 'caught_rate'; choose from return, catch_rate"),
        ("catch_rate", "target must be NAME=VALUE"),
        ("return=high", "target must be NAME=VALUE"),
    ],
)
def test_a_bad_target_is_refused_by_name(target: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _trainer(_config(target=target)).train()


def test_eval_envs_must_fit_the_policy() -> None:
    """A trainer given an env its config's id does not make cannot evaluate on that id."""
    config = _config(eval_every=STEPS_PER_UPDATE)
    cartpole = gym.make_vec("CartPole-v1", num_envs=16, vectorization_mode="sync")
    with pytest.raises(ValueError, match="pass eval_envs= to train"):
        GRPOTrainer(cartpole, config).train()
    trainer = GRPOTrainer(
        gym.make_vec("CartPole-v1", num_envs=16, vectorization_mode="sync"), config
    )
    recorder = Recorder()
    trainer.train(
        callbacks=[recorder],
        eval_envs=gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync"),
    )
    assert recorder.best.by == "eval_score"


def test_callbacks_see_every_update_evaluation_and_checkpoint_in_order(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    recorder = Recorder()
    _trainer(_config(run_dir)).train(callbacks=[recorder])
    kinds = [kind for kind, _ in recorder.calls]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert kinds.count("update") == 7 and kinds.count("eval") == 3
    rows = _rows(run_dir)
    updates = [m for kind, m in recorder.calls if kind == "update"]
    assert [m["update"] for m in updates] == [r["update"] for r in rows]
    evals = [m for kind, m in recorder.calls if kind == "eval"]
    assert [m["eval_score"] for m in evals] == [r["eval_score"] for r in rows if "eval_score" in r]
    # each evaluation is reported first; best.pt follows when it is the best so far, then the
    # update's on_update with the evaluation in its metrics
    best = -float("inf")
    for i, (kind, metrics) in enumerate(recorder.calls):
        if kind != "eval":
            continue
        improved = metrics["eval_score"] > best
        best = max(best, metrics["eval_score"])
        following = recorder.calls[i + 1 : i + 2 + improved]
        if improved:
            assert following[0][0] == "checkpoint" and following[0][1].name == "best.pt"
        assert following[-1][0] == "update"
        assert following[-1][1]["eval_score"] == metrics["eval_score"]
    paths = [p for kind, p in recorder.calls if kind == "checkpoint"]
    assert all(p.exists() for p in paths)
    assert {p.name for p in paths} >= {"best.pt", "update-0000007.pt"}


def test_request_stop_ends_the_run_after_the_next_update_with_a_checkpoint(
    tmp_path: Path,
) -> None:
    class StopAtThree(Callback):
        def on_update(self, state: RunState, metrics: dict[str, float]) -> None:
            if metrics["update"] == 3:
                state.request_stop("enough")

    run_dir = tmp_path / "run"
    trainer = _trainer(_config(run_dir, eval_every=0))
    trainer.train(callbacks=[StopAtThree()])
    assert trainer.update_index == 4  # the request rides update 4's metrics reduction
    assert trainer.stop_reason == "enough"
    assert checkpoint.load(run_dir / "checkpoints" / "last.pt")["update_index"] == 4


def test_callbacks_see_the_run_state_and_not_the_loop(tmp_path: Path) -> None:
    """Hooks get a RunState (counters, best, request_stop), not the loop: a callback that
    reaches for the loop (`harness.trainer...`) fails with an AttributeError naming it."""
    seen: list[tuple[int, int, Best]] = []

    class Watch(Callback):
        def on_update(self, state: RunState, metrics: dict[str, float]) -> None:
            seen.append((state.update, state.env_steps, dataclasses.replace(state.best)))

    _trainer(_config(tmp_path / "run", eval_every=0)).train(callbacks=[Watch()])
    assert [(u, s) for u, s, _ in seen] == [(u, u * STEPS_PER_UPDATE) for u in range(1, 8)]
    assert all(b.by == "return_mean" for _, _, b in seen)

    class Old(Callback):
        def on_update(self, harness: Any, metrics: dict[str, float]) -> None:
            harness.trainer.env_steps  # noqa: B018

    with pytest.raises(AttributeError, match="'RunState' object has no attribute 'trainer'"):
        _trainer(_config(eval_every=0)).train(callbacks=[Old()])


def test_the_console_shows_the_live_eval_figures_and_ends_with_the_target_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a default `make train` shows, on a tiny run: the progress line carries the latest
    evaluation (`eval return`, `eval_catch_rate`) and the summary ends with the env's goal."""
    monkeypatch.setenv("COLUMNS", "400")  # the whole progress line, not cut at 80 columns
    config = _config(progress=True, eval_every=STEPS_PER_UPDATE)  # the last update evaluates
    _trainer(config).train()
    err = capsys.readouterr().err
    live = err[: err.index("GRPO run summary")]
    assert re.search(r"eval return -?\d+\.\d\d", live), live
    assert re.search(r"eval_catch_rate \d\.\d{3}", live), live
    assert re.search(
        r"eval catch_rate (reached 0\.7 after [\d.]+ s and [\d,]+ env steps"
        r"|did not reach 0\.7 \(latest evaluation: [\d.]+\))",
        err[err.index("GRPO run summary") :],
    ), err
