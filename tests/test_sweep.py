"""`sweep`: a tiny two-trial sweep writes its results and a config `train --config` takes; a
second run continues the study; a pruned trial stops early; a bad space or flag is a usage
error naming what is wrong."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from grpo_trainer.tools.cli import main
from grpo_trainer.tools.search_space import Param, apply, parse_space

BASE = {
    "num_groups": 4,
    "group_size": 4,
    "rollout_steps": 32,
    "total_env_steps": 2048,
    "run": {
        "env": "CartPole-v1",
        "device": "cpu",
        "eval_every": 512,
        "eval_episodes": 4,
        "progress": False,
    },
}
SPACE = {"lr": {"low": 0.003, "high": 0.03, "log": True}, "epochs": {"choices": [2, 4]}}


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "space.json").write_text(json.dumps(SPACE))
    (tmp_path / "base.json").write_text(json.dumps(BASE))
    return tmp_path


def _sweep(folder: Path, *flags: str) -> int:
    space, base = str(folder / "space.json"), str(folder / "base.json")
    argv = ["sweep", "--space", space, "--config", base, "--sweep-dir", str(folder / "sweep")]
    return main([*argv, *flags])


def _results(folder: Path) -> list[dict[str, str]]:
    with (folder / "sweep" / "results.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_two_trials_write_results_and_a_best_config_train_accepts(files: Path) -> None:
    pytest.importorskip("optuna")
    assert _sweep(files, "--trials", "2") == 0
    rows = _results(files)
    assert [r["number"] for r in rows] == ["0", "1"]
    assert all(r["state"] == "COMPLETE" and r["env_steps"] == "2048" for r in rows)
    assert {"value", "wall_s", "lr", "epochs"} <= set(rows[0])
    assert all(0.003 <= float(r["lr"]) <= 0.03 and r["epochs"] in ("2", "4") for r in rows)
    best = max(rows, key=lambda r: float(r["value"]))
    config = json.loads((files / "sweep" / "best_config.json").read_text())
    assert config["lr"] == pytest.approx(float(best["lr"])) and config["run"]["run_dir"] is None
    for number in (0, 1):  # every trial is a normal run directory
        trial = files / "sweep" / f"trial_{number:04d}"
        assert (trial / "checkpoints" / "best.pt").exists()
        assert len((trial / "metrics.jsonl").read_text().splitlines()) == 4
    flags = ["--total-env-steps", "1024", "--no-progress", "--eval-every", "0"]
    best_config = str(files / "sweep" / "best_config.json")
    assert main(["train", "--config", best_config, *flags]) == 0


def test_running_again_continues_the_study(files: Path) -> None:
    pytest.importorskip("optuna")
    assert _sweep(files, "--trials", "1") == 0
    first = _results(files)
    assert len(first) == 1
    assert _sweep(files, "--trials", "2") == 0
    rows = _results(files)
    assert [r["number"] for r in rows] == ["0", "1"] and rows[0] == first[0]
    assert rows[1]["lr"] != rows[0]["lr"]  # the continued sampler draws anew
    assert _sweep(files, "--trials", "2") == 0  # nothing left to do
    assert len(_results(files)) == 2


def test_a_continued_sweep_must_be_the_same_sweep(
    files: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("optuna")
    assert _sweep(files, "--trials", "1") == 0
    (files / "space.json").write_text(json.dumps({"lr": {"low": 0.001, "high": 0.01}}))
    with pytest.raises(SystemExit) as exit_:
        _sweep(files, "--trials", "2")
    assert exit_.value.code == 2
    assert "another sweep (a different space)" in capsys.readouterr().err


def test_a_pruned_trial_stops_early(tmp_path: Path) -> None:
    optuna = pytest.importorskip("optuna")
    from grpo_trainer.tools.sweep import run_sweep

    class Always(optuna.pruners.BasePruner):
        def prune(self, study: Any, trial: Any) -> bool:
            return True

    study = run_sweep(SPACE, BASE, 1, tmp_path / "sweep", pruner=Always())
    (trial,) = study.trials
    assert trial.state.name == "PRUNED"
    # the first evaluation (512 steps) prunes; the stop takes effect after the next update
    assert trial.user_attrs["env_steps"] == 1024 < BASE["total_env_steps"]
    assert list(trial.intermediate_values) == [512]
    assert _results(tmp_path)[0]["state"] == "PRUNED"
    assert not (tmp_path / "sweep" / "best_config.json").exists()  # no complete trial yet


def test_time_to_target_scores_wall_seconds_or_inf(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    from grpo_trainer.tools.sweep import NOT_REACHED, run_sweep

    base = json.loads(json.dumps(BASE))
    base["run"]["target"] = "return=5"  # any policy reaches it at once
    study = run_sweep(SPACE, base, 1, tmp_path / "a", objective="time_to_target")
    (trial,) = study.trials
    assert 0 < trial.value < trial.user_attrs["wall_s"] + 1
    assert trial.user_attrs["env_steps"] == 512  # the run stops at the target
    base["run"]["target"] = "return=100000"  # never
    study = run_sweep(SPACE, base, 1, tmp_path / "b", objective="time_to_target", pruner="none")
    assert study.trials[0].value == NOT_REACHED


def test_with_no_trial_at_the_target_the_best_config_is_the_closest(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    from grpo_trainer.tools.sweep import NOT_REACHED, best_trial, run_sweep

    base = json.loads(json.dumps(BASE))
    base["run"]["target"] = "return=100000"  # never
    # long enough that the two draws' greedy policies leave CartPole's first plateau (9.5)
    base["total_env_steps"], base["run"]["eval_every"] = 8192, 2048
    study = run_sweep(SPACE, base, 2, tmp_path, objective="time_to_target", pruner="none")
    assert [t.value for t in study.trials] == [NOT_REACHED, NOT_REACHED]
    scores = [t.user_attrs["best_eval_score"] for t in study.trials]
    assert scores[0] != scores[1]  # the two draws play differently
    closest = study.trials[scores.index(max(scores))]
    assert best_trial(study).number == closest.number
    saved = json.loads((tmp_path / "best_config.json").read_text())
    assert saved["lr"] == closest.params["lr"] and saved["epochs"] == closest.params["epochs"]


def test_time_to_target_needs_a_target(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    from grpo_trainer.tools.sweep import run_sweep

    with pytest.raises(ValueError, match="time_to_target needs a target"):
        run_sweep(SPACE, BASE, 1, tmp_path / "sweep", objective="time_to_target")


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ({"learning_rate": {"low": 0.1, "high": 1.0}}, "learning_rate: no such config field"),
        ({"lr": {"low": 0.1, "high": 0.01}}, r"lr: low \(0.1\) is above high"),
        ({"epochs": {"choices": []}}, "epochs: choices must be a non-empty list"),
        ({"lr": {"low": 0.0, "high": 0.1, "log": True}}, "lr: log needs low > 0"),
        ({"epochs": {"low": 1.5, "high": 4}}, "epochs: low must be a finite int"),
        ({"activation": {"low": 1, "high": 2}}, "activation: a .* field takes choices"),
        ({"activation": {"choices": ["relu", "gelu"]}}, "activation: the choice 'gelu'"),
        ({"lr": {"low": 0.01}}, "lr: a range needs low and high"),
        ({"lr": {"low": 0.01, "high": 0.1, "lg": True}}, r"lr: unknown key\(s\) \['lg'\]"),
        ({"group_size": {"low": 4, "high": 16, "step": 5}}, "group_size: high - low"),
        ({"run.env_kwargs": {"choices": [{}]}}, "run.env_kwargs: a dict field"),
        ([], "must be a JSON object"),
    ],
)
def test_space_errors_name_the_field(space: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_space(space)


def test_space_types_follow_the_fields() -> None:
    params = parse_space(
        {
            "lr": {"low": 1, "high": 2},
            "group_size": {"low": 4, "high": 16, "step": 4},
            "eval_episodes": {"choices": [8, 16]},
            "run.seed": {"low": 0, "high": 3},
            "hidden_sizes": {"choices": [[64, 64], [32]]},
            "window": {"choices": [None, 32]},
        }
    )
    kinds = {p.name: p.kind for p in params}
    assert kinds == {
        "lr": "float",
        "group_size": "int",
        "run.eval_episodes": "choices",
        "run.seed": "int",
        "hidden_sizes": "choices",
        "window": "choices",
    }
    assert apply({"run": {}}, {"run.seed": 2, "hidden_sizes": (32,)}) == {
        "run": {"seed": 2},
        "hidden_sizes": [32],
    }


def test_bounds_that_make_a_bad_config_fail_before_any_trial(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    from grpo_trainer.tools.sweep import run_sweep

    with pytest.raises(ValueError, match="group_size: the value 1 is not valid"):
        run_sweep([Param("group_size", "int", 1, 4)], BASE, 1, tmp_path / "sweep")
    assert not (tmp_path / "sweep").exists()
    base = {**BASE, "run": {**BASE["run"], "eval_every": 0}}
    with pytest.raises(ValueError, match="eval_every must be between 1 and total_env_steps"):
        run_sweep(SPACE, base, 1, tmp_path / "sweep")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"space": {"lr": {"low": 1, "high": 0}}}, r"argument --space: .*lr: low \(1\)"),
        ({"space": "not json"}, "argument --space: .*space.json"),
        ({"flags": ["--trials", "0"]}, "argument --trials: must be at least 1"),
        ({"base": {"num_groups": 0}}, "num_groups must be at least 1"),
        ({"flags": ["--objective", "speed"]}, "invalid choice: 'speed'"),
    ],
)
def test_cli_bad_input_exits_2_with_the_message(
    files: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any], message: str
) -> None:
    pytest.importorskip("optuna")
    if "space" in change:
        space = change["space"]
        (files / "space.json").write_text(space if isinstance(space, str) else json.dumps(space))
    if "base" in change:
        (files / "base.json").write_text(json.dumps({**BASE, **change["base"]}))
    with pytest.raises(SystemExit) as exit_:
        _sweep(files, *change.get("flags", ["--trials", "1"]))
    assert exit_.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_cli_without_optuna_exits_2_naming_the_fix(
    files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(SystemExit) as exit_:
        _sweep(files, "--trials", "1")
    assert exit_.value.code == 2
    assert "pip install 'fruit-grpo[sweep]'" in capsys.readouterr().err


def test_a_second_process_cannot_run_the_same_sweep_dir(tmp_path: Path) -> None:
    pytest.importorskip("fcntl")
    from grpo_trainer.tools.sweep import locked_sweep_dir

    with (
        locked_sweep_dir(tmp_path),
        pytest.raises(ValueError, match="another process"),
        locked_sweep_dir(tmp_path),
    ):
        pass


def test_the_example_space_is_valid_for_the_default_config() -> None:
    from grpo_trainer.base.config import GRPOConfig
    from grpo_trainer.tools.search_space import check_against, load_space

    example = Path(__file__).resolve().parents[1] / "examples" / "sweep_space.json"
    params = load_space(example)
    assert {p.name for p in params} >= {"lr", "epochs", "group_size"}
    check_against(params, GRPOConfig().to_dict())


def test_a_trial_left_running_by_a_crash_is_failed_and_replaced(files: Path) -> None:
    optuna = pytest.importorskip("optuna")
    assert _sweep(files, "--trials", "1") == 0
    storage = f"sqlite:///{files / 'sweep' / 'study.db'}"
    optuna.load_study(study_name="sweep", storage=storage).ask()  # a killed process's trial
    assert _sweep(files, "--trials", "2") == 0
    assert [r["state"] for r in _results(files)] == ["COMPLETE", "FAIL", "COMPLETE"]
