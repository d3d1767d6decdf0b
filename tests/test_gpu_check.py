"""`make gpu-check`'s bookkeeping, on the CPU: a step's result is the JSON it writes to its
result file, whatever it prints; the report is rewritten after every step, so a failing or
timed-out step loses nothing measured before it; steps past the time budget are skipped and
say so. (Without CUDA the script itself refuses in one line: tests/test_docs.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from loading import load_module

ROOT = Path(__file__).resolve().parents[1]
gpu_check = load_module(ROOT / "scripts" / "gpu_check.py", "gpu_check")


def _step(tmp_path: Path, name: str, code: str) -> tuple[list[str], Path]:
    result = tmp_path / f"{name}.json"
    return [sys.executable, "-c", code, str(result)], result


NOISY = (
    "import json, sys\n"
    "print('progress ' * 2000)\n"
    "sys.stderr.write('a warning\\n' * 2000)\n"
    "open(sys.argv[1], 'w').write(json.dumps({'steps_per_s': 123.0}))\n"
    "print('more output after the result')\n"
)
FAILS = (
    "import json, sys\n"
    "open(sys.argv[1], 'w').write(json.dumps({'rows': [1]}))\n"  # a partial result, then
    "raise SystemExit(3)\n"
)


def test_a_result_survives_output_on_both_streams_and_a_later_failure(tmp_path: Path) -> None:
    commands = {
        "train": _step(tmp_path, "train", NOISY),
        "memory": _step(tmp_path, "memory", FAILS),
    }
    report = gpu_check.run_steps(commands, {"device": "test"}, tmp_path / "out")
    assert report["train"]["returncode"] == 0
    assert report["train"]["result"] == {"steps_per_s": 123.0}
    assert report["memory"]["returncode"] == 3
    assert report["memory"]["result"] == {"rows": [1]}  # what it measured before failing
    written = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert written["train"]["result"] == {"steps_per_s": 123.0}
    table = (tmp_path / "out" / "gpu_check.md").read_text().splitlines()
    assert table[-2].startswith("| train | 0 |") and '"steps_per_s": 123.0' in table[-2]
    assert table[-1].startswith("| memory | 3 |")


def test_the_report_is_written_before_the_next_step_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    check = f"import json; json.load(open({str(out / 'gpu_check.json')!r}))['first']['result']"
    commands = {
        "first": _step(tmp_path, "first", NOISY),
        "second": ([sys.executable, "-c", check], None),  # fails unless the report is there
    }
    report = gpu_check.run_steps(commands, {}, out)
    assert report["second"]["returncode"] == 0, report["second"]["tail"]


def test_steps_past_the_budget_are_skipped_and_say_so(tmp_path: Path) -> None:
    commands = {"tests": _step(tmp_path, "tests", NOISY), "env": _step(tmp_path, "env", NOISY)}
    report = gpu_check.run_steps(commands, {}, tmp_path / "out", total_limit_s=0)
    assert set(report) == {"tests", "env"}
    assert all("skipped" in report[s] for s in commands)
    assert not (tmp_path / "tests.json").exists()  # nothing ran
    table = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "| tests | - | - | skipped:" in table and "| env | - | - | skipped:" in table


def test_children_keep_the_callers_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """Packages the caller installed on its PYTHONPATH (gymnasium, say) stay visible."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/site", "/tmp/more"]))
    paths = gpu_check.child_env()["PYTHONPATH"].split(os.pathsep)
    assert paths == [str(ROOT), "/opt/site", "/tmp/more"]
    monkeypatch.delenv("PYTHONPATH")
    assert gpu_check.child_env()["PYTHONPATH"] == str(ROOT)


def test_the_default_budget_fits_one_short_sitting() -> None:
    assert gpu_check.TOTAL_LIMIT_S <= 8 * 60
    assert gpu_check.STEPS[0] == "games"  # what every GPU user meets first comes first
    # every step but the package builds has a limit, and all of them fit the budget together
    assert set(gpu_check.STEP_LIMITS_S) == set(gpu_check.STEPS) - {"package_tests"}
    assert sum(gpu_check.STEP_LIMITS_S.values()) <= gpu_check.TOTAL_LIMIT_S
    assert gpu_check.STEPS[-1] == "package_tests"


SPINS = (
    "import json, sys\n"
    "open(sys.argv[1], 'w').write(json.dumps({'rows': [1]}))\n"  # a partial result, then
    "while True: pass\n"
)


def test_a_step_past_its_own_limit_is_stopped_and_the_next_still_runs(tmp_path: Path) -> None:
    commands = {"slow": _step(tmp_path, "slow", SPINS), "next": _step(tmp_path, "next", NOISY)}
    report = gpu_check.run_steps(commands, {}, tmp_path / "out", 600, {"slow": 2})
    assert report["slow"]["returncode"] == -1 and "timed out after 2 s" in report["slow"]["tail"]
    assert report["slow"]["result"] == {"rows": [1]}  # what it saved before it was stopped
    assert report["next"]["returncode"] == 0 and report["next"]["result"] == {"steps_per_s": 123.0}


def test_the_train_summary_reads_a_real_run(tmp_path: Path) -> None:
    """The train step's summary parses what `train` writes (a short CPU run here): a change
    to the run's files that the check would misread fails this test, not the GPU sitting."""
    run_dir = tmp_path / "run"
    command = gpu_check.train_command(run_dir)
    command += ["--total-env-steps", "40000", "--eval-every", "20000", "--eval-episodes", "20"]
    command += ["--device", "cpu", "--no-progress"]
    subprocess.run(command, cwd=ROOT, env=gpu_check.child_env(), check=True, capture_output=True)
    summary = gpu_check.summarise_train(run_dir)
    assert summary["first_update_s"] > 0 and summary["train_s"] > 0
    assert summary["steps_per_s_median"] > 0 and 0 <= summary["final_eval_score"] <= 1
    assert summary["config"]["num_groups"] >= 1 and summary["config"]["total_env_steps"] == 40000


def test_the_games_step_finds_every_kit_game() -> None:
    """The MinAtar games register a function, not a string, as their vector entry point."""
    from fruit_env.registration import ENV_ID, MINATAR_GAMES

    assert gpu_check.kit_games() == sorted([ENV_ID, *MINATAR_GAMES])


def test_a_game_worker_plays_bit_for_bit_on_a_stand_in_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker with the CPU standing in for CUDA: registration, the
    plays and the comparison run; only the device differs on a GPU."""
    monkeypatch.setattr(gpu_check, "DEVICE", "cpu")
    out = tmp_path / "game.json"
    gpu_check.game_worker("Breakout-MinAtar-v0", out, num_envs=8, steps=20)
    result = json.loads(out.read_text())
    assert result["env"] == "Breakout-MinAtar-v0"
    assert result["default_equals_cpu"] is True and result["compiled"] is False
    assert result["captured"] is False  # the CPU stand-in: "auto" captures on CUDA only


def test_an_env_rate_row_on_a_stand_in_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_check, "DEVICE", "cpu")
    row = gpu_check._env_rate("FruitCatcher-v0", 16, compile=False)
    assert row["steps_per_s"] > 0 and row["bytes_per_step"] > 0
    assert row["compiled"] is False and row["captured"] is False


def test_the_profile_worker_reports_what_ran_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One default update profiled on a stand-in device: the syncs the hot loops must not
    have, and whether sampling and the loss ran compiled (on the CPU the default minibatch
    is below the size that compiles)."""
    monkeypatch.setattr(gpu_check, "DEVICE", "cpu")
    out = tmp_path / "profile.json"
    gpu_check.profile_worker(out)
    result = json.loads(out.read_text())
    assert result["sync_ops_collect"] == 0
    # on the CPU stand-in the update counts its rows of weight 0 once per optimiser step (a
    # GPU keeps every row, and makes no sync)
    assert result["drop_flat_rows"] is True and result["optimizer_steps_per_update"] > 0
    assert result["sync_ops_learn"] == result["optimizer_steps_per_update"]
    assert result["sample_compiled"] is False and result["loss_compiled"] is False
    assert result["compiled_regions_per_update"] == 0
    assert result["eager_backward_nodes_per_update"] > 0  # the eager loss's backward


def test_the_train_modes_step_trains_and_summarises_each_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each mode is `make train`'s command plus its flags, summarised like the train step."""
    monkeypatch.setattr(gpu_check, "TRAIN_MODES", {"no_compile": ["--no-compile"]})
    out = tmp_path / "modes.json"
    short = ("--total-env-steps", "40000", "--eval-every", "20000", "--eval-episodes", "20")
    gpu_check.train_modes_worker(out, (*short, "--device", "cpu", "--no-progress"))
    result = json.loads(out.read_text())
    assert list(result) == ["no_compile"]
    row = result["no_compile"]
    assert row["returncode"] == 0 and row["flags"] == ["--no-compile"]
    assert row["command"].endswith(
        " ".join(["--no-compile", *gpu_check.TRAIN_MODES_STOP, *short])
        + " --device cpu --no-progress"
    )
    assert row["config"]["total_env_steps"] == 40000 and row["train_s"] > 0


def test_the_step_modes_step_checks_each_mode_against_the_eager_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a stand-in device: the step graph eager and under torch.compile (no CUDA graphs
    without CUDA), each played against the eager graph from one start, then timed."""
    monkeypatch.setattr(gpu_check, "DEVICE", "cpu")
    out = tmp_path / "modes.json"
    gpu_check.step_modes_worker(out, {"Breakout-MinAtar-v0": (16,)})
    rows = json.loads(out.read_text())["rows"]
    assert [r["step"] for r in rows] == ["eager", "torch.compile"]
    for row in rows:
        assert "error" not in row, row
        assert row["equals_eager"] is True and row["steps_per_s"] > 0
    assert rows[1]["compile_s"] > 0
