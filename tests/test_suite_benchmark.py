"""benchmarks/suite.py, the study harness: variants as the train command's flags, the rows
and their order, the summary and markdown tables from fabricated results, a GRPO run through
the train command's path (in this process), and one tiny real study in worker processes,
against this repository's HEAD, whose JSON has the documented shape."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from loading import load_module

from grpo_trainer.tools.cli import build_parser, config_from_args

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "suite.py"


@pytest.fixture(scope="module")
def suite() -> Any:
    return load_module(SCRIPT, "suite_benchmark")


@pytest.fixture(scope="module")
def runs_module(suite: Any) -> Iterator[Any]:
    """benchmarks/suite_runs.py, run in this process; the matmul precision its GRPO runs set
    (as the train command does) is put back afterwards."""
    import torch

    precision = torch.get_float32_matmul_precision()
    yield load_module(ROOT / "benchmarks" / "suite_runs.py", "suite_runs_benchmark")
    torch.set_float32_matmul_precision(precision)


def run(seed: int, trainer: str, curve: list[tuple[float, ...]], **extra: Any) -> dict:
    """A fabricated run: (env steps, seconds, greedy value[, sampled value]) per evaluation."""
    points = [
        {"env_steps": p[0], "train_s": p[1], "elapsed_s": p[1], "eval": p[2], "eval_sampled": p[3]}
        for p in ((*c, None) if len(c) == 3 else c for c in curve)
    ]
    final = points[-1]["env_steps"], points[-1]["train_s"]
    return {
        "trainer": trainer,
        "seed": seed,
        "curve": points,
        "final_eval": points[-1]["eval"],
        "final_eval_sampled": points[-1]["eval_sampled"],
        "elapsed_s": final[1],
        "env_steps": final[0],
        "train_s": final[1],
        "env_steps_per_s": final[0] / final[1],
        **extra,
    }


def payload(suite: Any, name: str, runs: dict[str, list[dict]], **extra: Any) -> dict[str, Any]:
    """What Study.payload writes, from fabricated runs (the functions it uses, no processes)."""
    task = suite.TASKS[name]
    threshold, source = suite.resolve_threshold(task, runs)
    summary = {t: suite.summarise(rs, threshold) for t, rs in runs.items()}
    return {
        "timestamp": "2026-11-25T10:00:00+00:00",
        "task": name,
        "mode": "learning",
        "env": task.env,
        "metric": task.metric,
        "budget": task.budget,
        "threshold": threshold,
        "threshold_source": source,
        "complete": True,
        "peers": list(runs),
        "summary": summary,
        "versus_peer": suite.versus_peer(summary, source),
        "versus_against": suite.versus_against(summary, extra.get("rev")),
        "against": {"rev": extra["rev"]} if extra.get("rev") else None,
        "runs": runs,
    }


# ---------------------------------------------------------------- variants


def test_a_variant_becomes_the_train_commands_flags(suite: Any) -> None:
    fields = {
        "gamma": 0.999,
        "hidden_sizes": [32, 16],
        "amp": "bf16",
        "branch_ended": False,
        "run": {"env_kwargs": {"vectorization_mode": "sync"}, "compile": True},
    }
    flags = suite.variant_flags(fields)
    assert flags == [
        "--gamma",
        "0.999",
        "--hidden-sizes",
        "32,16",
        "--amp",
        "bf16",
        "--no-branch-ended",
        "--env-kwargs",
        '{"vectorization_mode": "sync"}',
        "--compile",
    ]
    config = config_from_args(build_parser().parse_args(["train", *flags]))
    assert config.gamma == 0.999 and config.hidden_sizes == (32, 16) and config.run.amp == "bf16"
    assert config.branch_ended is False
    assert config.run.env_kwargs == {"vectorization_mode": "sync"} and config.run.compile is True


def test_a_null_is_the_flag_none_where_the_field_allows_none(suite: Any) -> None:
    """`{"dual_clip": null}` turns the dual clip off: the flag reads "none" back as None."""
    assert suite.variant_flags({"dual_clip": None}) == ["--dual-clip", "none"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"no_such_field": 1}, "no_such_field is not a flag of the train command"),
        ({"seed": None}, "argument --seed: invalid int value: 'none'"),  # no None allowed
        ({"branch_ended": 1}, "branch_ended is true or false"),
        ({"epochs": True}, "epochs is not a true/false field"),
        ({"amp": "fp8"}, "argument --amp: invalid choice: 'fp8'"),
        ({"epochs": 2.5}, "argument --epochs: expected int or none, got '2.5'"),
        ({"seed": 1, "run": {"seed": 2}}, "seed given both at the top level and under run"),
    ],
)
def test_a_variant_the_command_line_cannot_express_is_refused(
    suite: Any, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        suite.variant_flags(fields)


def test_set_names_rows_and_refuses_bad_input(suite: Any, tmp_path: Path) -> None:
    args = suite.parse_args(
        ["cartpole", "--set", 'g999={"gamma": 0.999}', "--results", str(tmp_path)]
    )
    assert args.variants == [("g999", {"gamma": 0.999}, ["--gamma", "0.999"])]
    for bad in ('grpo={"gamma": 0.9}', "g=[1]", "g={oops", 'a@b={"gamma": 0.9}', "=1"):
        with pytest.raises(SystemExit):
            suite.parse_args(["cartpole", "--set", bad])
    with pytest.raises(SystemExit):
        suite.parse_args(["cartpole", "--set", 'g={"gamma": 0.9}', "--set", 'g={"epochs": 2}'])
    with pytest.raises(SystemExit):  # MinAtar's threshold is only known when the study ends
        suite.parse_args(["breakout", "--stop-at-threshold"])
    with pytest.raises(SystemExit):
        suite.parse_args(["cartpole", "--against", "no-such-revision-here"])
    with pytest.raises(SystemExit):  # the seconds it passes on come from --wallclock
        suite.parse_args(["cartpole", "--trainer-clock"])


def test_rows_alternate_with_their_against_twin_then_the_peers(suite: Any, tmp_path: Path) -> None:
    args = suite.parse_args(
        [
            "cartpole",
            "--peers",
            "grpo,ppo_jax",
            "--set",
            'w64={"window": 64}',
            "--against",
            "HEAD",
            "--results",
            str(tmp_path),
        ]
    )
    rows = suite.study_rows(args)
    assert [r.name for r in rows] == ["grpo", "grpo@HEAD", "w64", "w64@HEAD", "ppo_jax"]
    assert [r.against for r in rows] == [None, "HEAD", None, "HEAD", None]
    study = suite.Study(args, tmp_path, {"cartpole": 1000}, {"rev": "HEAD", "path": "/old/tree"})
    job = study.job("cartpole", rows[3], seed=2, repeat=0, cpu=0)
    assert job["flags"] == ["--window", "64"] and job["tree_path"] == "/old/tree"
    assert study.job("cartpole", rows[2], 2, 0, 0)["tree_path"] is None
    assert job["stop_at"] is None and job["kind"] == "grpo"


def test_grpo_argv_is_the_train_command_with_the_rows_flags_last(suite: Any) -> None:
    argv = sys.modules["suite_tasks"].grpo_argv(suite.TASKS["acrobot"], 300_000, 4, ["--seed", "9"])
    assert argv[:7] == [
        "train",
        "--env",
        "gymnax:Acrobot-v1",
        "--total-env-steps",
        "300000",
        "--seed",
        "4",
    ]
    assert argv[-2:] == ["--seed", "9"]  # a variant may override the task's settings
    config = config_from_args(build_parser().parse_args(argv))
    assert config.run.seed == 9 and config.total_env_steps == 300_000
    assert config.run.device == "cpu" and not config.run.progress and config.run.eval_every == 0
    on_gpu = sys.modules["suite_tasks"].grpo_argv(suite.TASKS["acrobot"], 300_000, 4, [], "cuda")
    assert config_from_args(build_parser().parse_args(on_gpu)).run.device == "cuda"


def test_a_study_on_cuda_puts_grpo_and_jax_there_and_keeps_one_cpu(
    suite: Any, runs_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--device cuda` reaches every job; a worker keeps its one CPU, and JAX goes where
    the study says (on a GPU machine it would take the GPU unasked, on the CPU study too)."""
    args = suite.parse_args(["breakout", "--device", "cuda", "--results", str(tmp_path)])
    row = suite.study_rows(args)[0]
    study = suite.Study(args, tmp_path, {"breakout": 1000}, None)
    assert study.job("breakout", row, seed=0, repeat=0, cpu=0)["device"] == "cuda"
    assert suite.parse_args(["breakout"]).device == "cpu"
    cpu = sorted(os.sched_getaffinity(0))[0]
    for name in ("JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_FLAGS"):
        monkeypatch.delenv(name, raising=False)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.setenv(var, os.environ.get(var, "1"))
    allowed = os.sched_getaffinity(0)
    try:
        runs_module.pin_worker(cpu, "cuda")
        assert os.environ["JAX_PLATFORMS"] == "cuda"
        assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        assert os.sched_getaffinity(0) == {cpu}
        runs_module.pin_worker(cpu)
        assert os.environ["JAX_PLATFORMS"] == "cpu"
    finally:
        os.sched_setaffinity(0, allowed)


# ---------------------------------------------------------------- summaries and tables


def test_median_to_threshold_counts_a_miss_as_infinitely_late(suite: Any) -> None:
    assert suite.median_to_threshold([3.0, 1.0, None]) == 3.0
    assert suite.median_to_threshold([1.0, None, None]) is None
    assert suite.median_to_threshold([1.0, None]) is None
    assert suite.median_to_threshold([1.0, 3.0]) == 2.0
    assert suite.median_to_threshold([]) is None


def test_eval_marks_are_tenths_of_the_budget_or_every_n_steps(suite: Any) -> None:
    assert suite.eval_marks(1_000_000) == [100_000 * k for k in range(1, 11)]
    assert suite.eval_marks(4096)[-1] == 4096
    assert suite.eval_marks(250_000, 100_000) == [100_000, 200_000, 250_000]


def test_the_xla_flags_are_ppo_jax_s() -> None:
    text = (ROOT / "benchmarks" / "ppo_jax.py").read_text()
    flags = re.search(r'^THREAD_FLAGS = "(.*)"$', text, flags=re.MULTILINE)
    runs_text = (ROOT / "benchmarks" / "suite_runs.py").read_text()
    assert flags and f'XLA_ONE_THREAD = "{flags.group(1)}"' in runs_text


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
    lines = suite.render_table(tmp_path).splitlines()
    assert lines[2] == (
        "| fruit (incomplete) (FruitCatcher-v0) | 1k | catch rate 0.7 | GRPO | 1/2 (1 failed) "
        "| - | 0.710 (0.710 to 0.710) | - |"
    )
    assert lines[3] == "|  |  |  | PPO (JAX) | n/a |  |  |  |"
    assert lines[4] == "|  |  |  | SB3 PPO | n/a |  |  |  |"


def test_a_minatar_game_without_peer_or_constant_has_no_threshold(suite: Any) -> None:
    runs = {"grpo": [run(0, "grpo", [(1_000_000, 60.0, 3.5)])]}
    threshold, source = suite.resolve_threshold(suite.TASKS["asterix"], runs)
    assert threshold is None and source.startswith("none")
    summary = suite.summarise(runs["grpo"], threshold)
    assert summary["reached"] is None and summary["final_eval"]["mean"] == 3.5


def test_a_run_moved_off_its_cpu_is_flagged_in_its_line(suite: Any) -> None:
    """A process outside the suite can change a worker's affinity mid-run; the run's line
    says so, so its seconds are not read as clean."""
    clean = run(0, "grpo", [(1000, 1.0, 3.5, 4.0)], cpu=1, cpus_allowed=[1])
    moved = {**clean, "cpus_allowed": [0]}
    assert "MOVED" not in suite._line("breakout", clean, Path("x.json"))
    line = suite._line("breakout", moved, Path("x.json"))
    assert "MOVED (it ended allowed on CPUs [0]: its seconds are not clean)" in line


def test_table_from_fabricated_results(suite: Any, tmp_path: Path) -> None:
    cartpole = {
        "grpo": [
            run(0, "grpo", [(100_000, 2.0, 300.0), (200_000, 4.0, 480.0), (500_000, 10, 500, 450)]),
            run(1, "grpo", [(100_000, 2.5, 476.0), (500_000, 11.0, 490.0, 300.0)]),
            run(2, "grpo", [(100_000, 2.2, 100.0), (500_000, 9.0, 400.0, 420.0)]),
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
    assert table[0] == (
        "| task | budget | threshold | trainer | reached | to threshold (median) "
        "| final greedy, mean (min to max) | final sampled, mean (min to max) |"
    )
    # cartpole: seeds 0 and 1 reach 475 (at 200k / 4.0 s and 100k / 2.5 s), seed 2 does not
    assert table[2] == (
        "| cartpole (CartPole-v1) | 500k | 475 | GRPO | 2/3 | 200k, 4.0 s | 463 (400 to 500) "
        "| 390 (300 to 450) |"
    )
    assert table[3] == "|  |  |  | PPO (JAX) | 3/3 | 500k, 4.4 s | 500 (500 to 500) | - |"
    assert table[4].startswith("| breakout (Breakout-MinAtar-v0) | 1.00M | 25.2 (PPO (JAX) median")
    assert table[4].endswith("| GRPO | 3/3 | 1.00M, 60.0 s | 30.0 (30.0 to 30.0) | - |")
    assert "| breakout | 25.2 | 22.0 s; + 11.0 s | 60.0 s | 30.0 | 36.2 |" in table
    assert table[-1].startswith("Files: `suite_cartpole.json` (2026-11-25)")

    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--table", "--results", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.stdout.strip().splitlines() == table


def test_against_table_gives_the_revisions_ratio(suite: Any, tmp_path: Path) -> None:
    runs = {
        "grpo": [run(s, "grpo", [(1_000_000, 20.0, 0.71)]) for s in range(2)],
        "grpo@abc123": [run(s, "grpo@abc123", [(2_000_000, 50.0, 0.70)]) for s in range(2)],
    }
    data = payload(suite, "fruit", runs, rev="abc123")
    versus = data["versus_against"]["grpo"]
    assert versus["against_over_this_train_s_to_threshold"] == 2.5
    assert versus["against_over_this_env_steps_to_threshold"] == 2.0
    (tmp_path / "study_fruit.json").write_text(json.dumps(data))
    table = suite.render_table(tmp_path, "study").splitlines()
    assert "| fruit | GRPO | 1.00M, 20.0 s | 2.00M, 50.0 s | 2.50x | 2.00x |" in table
    assert "|  |  |  | GRPO @abc123 | 2/2 | 2.00M, 50.0 s | 0.700 (0.700 to 0.700) | - |" in table


def test_throughput_summary_and_table(suite: Any, tmp_path: Path) -> None:
    def timed(seed: int, row: str, rate: float, groups: int) -> dict[str, Any]:
        config = {"num_groups": groups, "group_size": 8}
        return {
            "trainer": row,
            "seed": seed,
            "curve": [],
            "final_eval": None,
            "config": config,
            "median_update_env_steps_per_s": rate,
            "timed_updates": 3,
        }

    runs = {
        "grpo": [timed(0, "grpo", 70_000.0, 128), timed(1, "grpo", 74_000.0, 128)],
        "wide": [timed(0, "wide", 60_000.0, 512), timed(1, "wide", 62_000.0, 512)],
    }
    data = {**payload(suite, "fruit", runs), "mode": "throughput"}
    assert data["summary"]["wide"]["update_env_steps_per_s"]["median"] == 61_000.0
    (tmp_path / "suite_throughput_fruit.json").write_text(json.dumps(data))
    table = suite.render_table(tmp_path, "suite_throughput").splitlines()
    assert table[2] == "| fruit | GRPO | 1024 | 72,000 (70,000 to 74,000) | 2 |"
    assert table[3] == "| fruit | wide | 4096 | 61,000 (60,000 to 62,000) | 2 |"


def test_the_committed_results_still_render(suite: Any) -> None:
    table = suite.render_table(ROOT / "benchmarks" / "results")
    assert table.startswith("| task | budget | threshold | trainer |")
    assert "| fruit (FruitCatcher-v0) | 2.50M | catch rate 0.7 | GRPO |" in table


# ---------------------------------------------------------------- runs


def grpo_job(**extra: Any) -> dict[str, Any]:
    job = {"seed": 0, "budget": 8192, "flags": ["--num-groups", "4"], "eval_episodes": 3}
    return {**job, "eval_every": None, "stop_at": None, "throughput": None, **extra}


def test_a_grpo_run_trains_the_config_the_train_command_parses(runs_module: Any) -> None:
    task = runs_module.TASKS["cartpole"]
    record = runs_module.run_grpo(task, grpo_job())
    parsed = config_from_args(build_parser().parse_args(record["argv"])).to_dict()
    trained = record["config"]
    for name, value in parsed.items():  # the trainer only fills in what the parse left unset
        if name == "run":
            assert trained["run"] == value
        elif value is not None:
            assert trained[name] == value, name
    assert trained["num_groups"] == 4 and trained["total_env_steps"] == 8192
    assert record["env_steps"] >= 8192 and 1 <= len(record["curve"]) <= record["updates"]
    assert record["curve"][-1]["env_steps"] == record["env_steps"]
    assert record["final_eval"] == record["curve"][-1]["eval"] >= 8  # CartPole lasts 8+ steps
    assert record["train_s"] == record["curve"][-1]["train_s"] > 0 and record["eval_s"] > 0


def test_a_run_stops_at_its_threshold_and_throughput_times_its_updates(
    runs_module: Any,
) -> None:
    task = runs_module.TASKS["cartpole"]
    stopped = runs_module.run_grpo(task, grpo_job(budget=40_960, stop_at=-math.inf))
    # the first evaluation (at a tenth of the budget) reaches it; one more update finishes
    assert len(stopped["curve"]) == 1 and stopped["env_steps"] < 40_960
    timed = runs_module.run_grpo(task, grpo_job(budget=40_960, throughput=2))
    assert timed["curve"] == [] and timed["timed_updates"] == 2
    rates = timed["update_env_steps_per_s"]
    assert len(rates) == 2 and all(r > 0 for r in rates)
    assert timed["median_update_env_steps_per_s"] == pytest.approx(sum(rates) / 2, abs=0.1)
    # the pace of both together: their env steps over their seconds, between the two rates
    assert min(rates) - 0.1 <= timed["pace_env_steps_per_s"] <= max(rates) + 0.1


@pytest.mark.slow
def test_smoke_study_against_head_writes_the_documented_json(tmp_path: Path) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode:
        pytest.skip("not a git checkout: --against needs the repository's history")
    command = [sys.executable, str(SCRIPT), "cartpole", "--budget", "4096", "--seeds", "0"]
    # one variant row (no defaults, no peers: two runs keep the test short), and HEAD's twin
    command += ["--peers", "", "--set", 'narrow={"hidden_sizes": [16]}', "--against", "HEAD"]
    command += ["--eval-episodes", "10", "--results", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "suite_cartpole.json").read_text())
    top = {"command", "timestamp", "task", "env", "budget", "threshold", "threshold_source"}
    top |= {"metric", "eval_marks", "eval_episodes", "seeds", "peers", "complete", "machine"}
    top |= {"rows", "tree", "against", "software", "summary", "versus_peer", "versus_against"}
    assert top <= set(result)
    assert result["complete"] and result["budget"] == 4096 and result["threshold"] == 475.0
    assert result["peers"] == ["narrow", "narrow@HEAD"]
    assert result["against"] == {"rev": "HEAD", "commit": head.stdout.strip()}
    assert result["rows"]["narrow"]["flags"] == ["--hidden-sizes", "16"]
    assert result["software"]["torch"] and result["machine"]["threads_per_run"] == 1
    assert set(result["versus_against"]) == {"narrow"}
    for name, records in result["runs"].items():
        (record,) = records
        assert record["seed"] == 0 and record["torch_threads"] == 1
        assert record["cpus_allowed"] == [record["cpu"]]
        assert record["config"]["run"]["env"] == "gymnax:CartPole-v1"
        assert record["config"]["total_env_steps"] == 4096
        assert record["curve"][-1]["env_steps"] == record["env_steps"] >= 4096
        assert record["final_eval"] == record["curve"][-1]["eval"] >= 8
        assert "reached" in record
        trained_by = Path(record["grpo_trainer"])
        assert (trained_by == ROOT / "grpo_trainer") == ("@" not in name), trained_by
    assert result["runs"]["narrow@HEAD"][0]["config"]["hidden_sizes"] == [16]
    summary = result["summary"]["narrow"]
    assert summary["runs"] == 1 and summary["failed"] == 0
    assert summary["final_eval"]["min"] == result["runs"]["narrow"][0]["final_eval"]


# ---------------------------------------------------------------- per-peer envs


def test_classic_tasks_train_grpo_and_the_jax_peer_on_gymnaxs_env(suite: Any) -> None:
    """Where gymnax has the task, GRPO plays the JAX peer's env on equal seconds; SB3 keeps
    Gymnasium's."""
    for name in ("cartpole", "acrobot", "pendulum", "mountaincar"):
        task = suite.TASKS[name]
        assert task.env_for("grpo") == f"gymnax:{task.env_for('ppo_jax')}"
        assert task.sb3 is not None and task.env_for("sb3") == task.env_for("ppo_jax")


def test_minatar_tasks_train_grpo_on_the_kits_game_and_ppo_on_gymnaxs(suite: Any) -> None:
    tasks = sys.modules["suite_tasks"]
    breakout = suite.TASKS["breakout"]
    assert breakout.env_for("grpo") == "fruit_env:Breakout-MinAtar-v0"
    assert breakout.env_for("ppo_jax") == "Breakout-MinAtar"
    assert breakout.env_for("sb3") == "MinAtar/Breakout-v1"
    for game, name in (("Freeway", "freeway"), ("SpaceInvaders", "space_invaders")):
        assert suite.TASKS[name].env_for("grpo") == f"fruit_env:{game}-MinAtar-v0"
        assert suite.TASKS[name].env_for("ppo_jax") == f"{game}-MinAtar"
    assert tasks.missing_env(breakout.env) is None
    assert tasks.missing_env("gymnax:Breakout-MinAtar") is None  # the train command checks it
    message = tasks.missing_env("fruit_env:NoSuchGame-MinAtar-v0")
    assert message is not None and "NoSuchGame-MinAtar-v0" in message
    assert "no_such_module" in (tasks.missing_env("no_such_module:Game-v0") or "")


def test_a_study_whose_grpo_game_is_not_registered_stops_naming_it(
    suite: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    task = dataclasses.replace(suite.TASKS["breakout"], env="fruit_env:NoSuchGame-MinAtar-v0")
    monkeypatch.setitem(suite.TASKS, "nosuch", task)
    with pytest.raises(SystemExit):
        suite.parse_args(["nosuch", "--results", str(tmp_path)])
    assert "fruit_env:NoSuchGame-MinAtar-v0" in capsys.readouterr().err
    # a PPO-only study does not need GRPO's game
    assert suite.parse_args(["nosuch", "--peers", "ppo_jax", "--results", str(tmp_path)])


# ---------------------------------------------------------------- equal wall-clock


def test_wallclock_needs_the_ppo_peer_on_every_task(suite: Any, tmp_path: Path) -> None:
    for bad in (
        ["breakout", "--wallclock", "--peers", "grpo"],
        ["fruit", "--wallclock"],  # gymnax has no Fruit Catcher: no PPO time to take
        ["cartpole", "--wallclock", "--throughput", "3"],
        ["cartpole", "--wallclock", "--calibrate", "0"],
    ):
        with pytest.raises(SystemExit):
            suite.parse_args([*bad, "--results", str(tmp_path)])
    args = suite.parse_args(["cartpole", "--wallclock", "--set", 'w={"window": 64}'])
    assert [r.name for r in suite.study_rows(args)] == ["ppo_jax", "grpo", "w"]


def test_the_env_steps_a_time_budget_buys(suite: Any) -> None:
    wallclock = sys.modules["suite_wallclock"]
    calibration = {
        "first_update_s": 2.0,
        "pace_env_steps_per_s": 10_000.0,
        "updates": 4,
        "env_steps": 4 * 1024,
    }
    # the first update (2 s), then 8 s at 10k/s with 10% headroom = 88k steps: 85 whole
    # updates of 1024 more
    assert wallclock.HEADROOM == 1.1
    assert wallclock.estimate_env_steps(calibration, 10.0) == 1024 * 86
    assert wallclock.estimate_env_steps(calibration, 1.0) == 1024  # at least one update
    with pytest.raises(ValueError, match="timed no update"):
        wallclock.estimate_env_steps({"error": "boom"}, 10.0)


def test_a_calibrations_pace_counts_the_updates_that_do_more(runs_module: Any) -> None:
    # four timed updates of 1024 env steps after the warm-up; every fourth does three times
    # the work (as a config that plays extra steps every few updates does)
    timed = runs_module._throughput([5.0, 1.0, 1.0, 1.0, 3.0], [1024 * i for i in range(1, 6)])
    assert timed["median_update_env_steps_per_s"] == 1024.0  # blind to the slow update
    assert timed["pace_env_steps_per_s"] == round(4 * 1024 / 6.0, 1)


def _calibration(job: dict[str, Any]) -> dict[str, Any]:
    """A fake calibration run: 1024 env steps per update, 100k/s after a 1 s first one."""
    updates = job["throughput"] + 2
    return {
        "first_update_s": 1.0,
        "pace_env_steps_per_s": 100_000.0,
        "updates": updates,
        "env_steps": 1024 * updates,
    }


def test_a_wallclock_run_calibrates_then_trains_to_the_peers_time(suite: Any) -> None:
    wallclock = sys.modules["suite_wallclock"]
    jobs: list[dict[str, Any]] = []

    def fake_run(job: dict[str, Any]) -> dict[str, Any]:
        jobs.append(job)
        if job.get("throughput"):
            return _calibration(job)
        return {"trainer": job["row"], "env_steps": job["budget"]}

    job = {"row": "grpo", "seed": 0, "repeat": 0, "cpu": 0, "budget": 1_000_000}
    record = wallclock.run_wallclock(job, 9.0, 5, fake_run)
    # the task's budget and the estimate (1024 + 8 s x 100k/s x 1.1) size updates alike
    assert [j["budget"] for j in jobs] == [1_000_000, 1024 * 860]
    assert jobs[0]["throughput"] == 5 and jobs[0]["row"] != "grpo"  # its own file
    assert jobs[1]["time_budget_s"] == 9.0 and record["estimated_env_steps"] == 1024 * 860
    assert len(record["calibrations"]) == 1 and record["trainer"] == "grpo"
    jobs.clear()
    record = wallclock.run_wallclock(job, 0.5, 5, fake_run)  # one update: smaller updates
    assert [j["budget"] for j in jobs] == [1_000_000, 1024, 1024]
    assert len(record["calibrations"]) == 2
    failed = wallclock.run_wallclock(job, None, 5, fake_run)
    assert "ppo_jax run of this seed failed" in failed["error"]


def test_wallclock_side_by_side_and_its_table(suite: Any, tmp_path: Path) -> None:
    ppo = [
        run(s, "ppo_jax", [(500_000, 10.0, 10.0, 12.0), (1_000_000, 20.0, v, 30.0)])
        for s, v in ((0, 20.0), (1, 25.0))
    ]
    for r in ppo:
        for point in r["curve"]:
            point["elapsed_s"] = point["train_s"] + 15.0  # its compile
        r["elapsed_s"] = 35.0
    grpo = [
        run(0, "grpo", [(300_000, 17.0, 21.0, 22.0), (600_000, 35.1, 30.0, 31.0)]),
        run(1, "grpo", [(300_000, 17.0, 5.0, 6.0), (500_000, 34.0, 8.0, 20.0)]),
    ]
    reasons = ["the time budget (35.00 s of training) is spent", None]
    for r, reason in zip(grpo, reasons, strict=True):
        r |= {"time_budget_s": 35.0, "stop_reason": reason, "estimated_env_steps": 640_000}
    runs = {"ppo_jax": ppo, "grpo": grpo}
    data = {**payload(suite, "breakout", runs), "versus_peer_wallclock": None}
    data["versus_peer_wallclock"] = sys.modules["suite_wallclock"].side_by_side(runs, "ppo_jax")
    row = data["versus_peer_wallclock"]["grpo"]
    first = row["seeds"][0]
    assert first["peer"]["to_ppo_final_s"] == 35.0 and first["grpo"]["to_ppo_final_s"] == 17.0
    assert first["grpo"]["final_sampled"] == 31.0 and first["greedy_at_least_peer"] is True
    assert row["seeds"][1]["grpo"]["to_ppo_final_s"] is None
    assert (row["greedy_at_least_peer"], row["of"]) == (1, 2)
    assert row["grpo_median_to_peer_final_s"] is None  # 1 of 2 got there: no majority
    (tmp_path / "suite_breakout.json").write_text(json.dumps(data))
    table = suite.render_table(tmp_path).splitlines()
    assert (
        "| breakout | 0 | PPO (JAX) | 35.0 s | 1.00M | 20.0 | 30.0 | 35.0 s (1.00M) | - |" in table
    )
    assert (
        "| breakout | 0 | GRPO | 35.1 s | 600k | 30.0 | 31.0 | 17.0 s (300k) | the clock |" in table
    )
    assert "| breakout | 1 | GRPO | 34.0 s | 500k | 8.00 | 20.0 | - | its env steps |" in table
    assert any("greedy at least PPO (JAX)'s on 1 of 2 seeds" in line for line in table)


def test_a_grpo_run_stops_at_its_time_budget_with_both_evaluations(
    runs_module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breakout on the kit: a budget of next to no time stops the run after its second
    update (the first one asks), with a reason that names the budget, and its last
    evaluation is that of its last update; the trainer's evaluation plays greedy and
    sampled. With `--trainer-clock` the train command gets the budget as `--time-budget-s`
    and ends the run itself, after its first update, evaluated as its last."""
    import grpo_trainer.run.evaluation as evaluation

    played: list[bool] = []
    evaluate = evaluation.evaluate

    def recording(*args: Any, greedy: bool = True, **kwargs: Any) -> dict[str, float]:
        played.append(greedy)
        return evaluate(*args, greedy=greedy, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate", recording)
    task = runs_module.TASKS["breakout"]
    job = grpo_job(budget=10_000_000, flags=["--num-groups", "2"], time_budget_s=1e-9)
    record = runs_module.run_grpo(task, job)
    assert record["config"]["run"]["env"] == "fruit_env:Breakout-MinAtar-v0"
    assert record["stop_reason"].startswith(runs_module.TIME_BUDGET)
    assert record["config"]["time_budget_s"] is None
    assert record["updates"] == 2 and record["env_steps"] < 10_000_000
    assert record["curve"][-1]["env_steps"] == record["env_steps"]
    assert played == [True, False] * len(record["curve"])
    last = record["curve"][-1]
    assert (
        record["final_eval"] == last["eval"]
        and record["final_eval_sampled"] == last["eval_sampled"]
    )
    assert last["eval_sampled"] is not None and record["time_budget_s"] == 1e-9
    clocked = runs_module.run_grpo(task, {**job, "trainer_clock": True})
    assert clocked["argv"][-2:] == ["--time-budget-s", "1e-09"]
    assert clocked["config"]["time_budget_s"] == 1e-9 and clocked["updates"] == 1
    assert clocked["stop_reason"] == "the time budget (1e-09 s of training) is spent"
    assert clocked["curve"][-1]["env_steps"] == clocked["env_steps"]
    unlimited = runs_module.run_grpo(task, grpo_job(budget=2048, flags=["--num-groups", "2"]))
    assert unlimited["stop_reason"] is None and unlimited["env_steps"] >= 2048


@pytest.mark.slow
def test_smoke_wallclock_study_gives_grpo_the_peers_seconds_on_its_core(tmp_path: Path) -> None:
    pytest.importorskip("gymnax")
    command = [sys.executable, str(SCRIPT), "cartpole", "--wallclock", "--budget", "4096"]
    command += ["--seeds", "0", "--calibrate", "2", "--eval-episodes", "5"]
    command += ["--results", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "suite_cartpole.json").read_text())
    assert result["wallclock"] and result["peers"] == ["ppo_jax", "grpo"]
    assert result["envs"] == {"ppo_jax": "CartPole-v1", "grpo": "gymnax:CartPole-v1"}
    (ppo,), (grpo,) = result["runs"]["ppo_jax"], result["runs"]["grpo"]
    assert ppo["elapsed_s"] >= ppo["compile_s"] + ppo["train_s"]
    assert grpo["time_budget_s"] == ppo["elapsed_s"] and grpo["cpu"] == ppo["cpu"]
    assert grpo["cpus_allowed"] == ppo["cpus_allowed"] == [ppo["cpu"]]
    assert grpo["config"]["total_env_steps"] == grpo["estimated_env_steps"]
    assert grpo["calibrations"][0]["budget"] == 4096
    # the clock or the estimated env steps ended it, and the record says which
    by_clock = grpo["stop_reason"] is not None
    assert by_clock or grpo["env_steps"] >= grpo["estimated_env_steps"]
    assert not by_clock or grpo["stop_reason"].startswith("the time budget")
    for record in (ppo, grpo):
        assert record["final_eval"] is not None and record["final_eval_sampled"] is not None
    (seed,) = result["versus_peer_wallclock"]["grpo"]["seeds"]
    assert (
        seed["budget_s"] == ppo["elapsed_s"] and seed["peer"]["final_greedy"] == ppo["final_eval"]
    )
    assert seed["grpo"]["final_sampled"] == grpo["final_eval_sampled"]


def test_an_sb3_run_reports_its_greedy_and_sampled_returns(runs_module: Any) -> None:
    pytest.importorskip("stable_baselines3")
    task = runs_module.TASKS["cartpole"]
    record = runs_module.run_sb3(task, {"seed": 0, "budget": 512, "eval_episodes": 3})
    assert record["env_steps"] >= 512 and record["curve"]
    for point in record["curve"]:
        assert point["eval"] >= 8 and point["eval_sampled"] >= 8  # CartPole lasts 8+ steps
    assert record["final_eval_sampled"] == record["curve"][-1]["eval_sampled"]


def _paced_runs(
    jobs: list[dict[str, Any]], pace: float
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A fake `run`: calibrated at 100k env-steps/s (`_calibration`), a whole run goes at
    `pace` after a 1 s first update; the clock stops it at the budget, else its env steps
    do. Every job it is given is appended to `jobs`."""

    def fake_run(job: dict[str, Any]) -> dict[str, Any]:
        jobs.append(job)
        if job.get("throughput"):
            return _calibration(job)
        seconds = 1.0 + (job["budget"] - 1024) / pace
        clock = seconds >= job["time_budget_s"]
        steps = job["budget"] if not clock else 1024 + int(pace * (job["time_budget_s"] - 1))
        steps -= steps % 1024
        return {
            "env_steps": steps,
            "updates": steps // 1024,
            "first_update_s": 1.0,
            "train_s": min(seconds, job["time_budget_s"]),
            "elapsed_s": min(seconds, job["time_budget_s"]),
            "stop_reason": "the time budget (9.00 s of training) is spent" if clock else None,
        }

    return fake_run


def test_a_wallclock_run_the_clock_cut_far_short_runs_again_at_its_own_pace(
    suite: Any,
) -> None:
    """Calibrated at 100k env-steps/s, a whole run goes at 50k/s: the clock stops it at about
    half its estimate, so it runs again at the pace it made, and then ends near its new
    estimate, cut by the clock as the headroom intends."""
    wallclock = sys.modules["suite_wallclock"]
    jobs: list[dict[str, Any]] = []
    fake_run = _paced_runs(jobs, 50_000)

    job = {"row": "grpo", "seed": 0, "repeat": 0, "cpu": 0, "budget": 1_000_000}
    record = wallclock.run_wallclock(job, 9.0, 5, fake_run)
    (aside,) = record["set_aside"]
    assert aside["estimated_env_steps"] == jobs[1]["budget"]  # 880k at the calibrated pace
    assert aside["env_steps"] < wallclock.SHORT * aside["estimated_env_steps"]
    assert aside["stop_reason"].startswith("the time budget")
    assert len(jobs) == 3 and jobs[-1]["budget"] == record["estimated_env_steps"]
    assert record["env_steps"] >= wallclock.SHORT * record["estimated_env_steps"]
    assert record["stop_reason"].startswith("the time budget")


def test_a_run_cut_by_the_clock_near_its_estimate_is_kept(suite: Any) -> None:
    wallclock = sys.modules["suite_wallclock"]
    cut = {"env_steps": 850, "stop_reason": "the time budget (9.00 s of training) is spent"}
    assert wallclock._cut_short(cut, 1000) is False  # 85%: its learning rate at 15%
    assert wallclock._cut_short({**cut, "env_steps": 790}, 1000) is True
    assert wallclock._cut_short({"env_steps": 500, "stop_reason": None}, 1000) is False


def test_a_wallclock_run_that_left_seconds_unused_runs_again_at_its_own_pace(
    suite: Any,
) -> None:
    wallclock = sys.modules["suite_wallclock"]
    jobs: list[dict[str, Any]] = []
    fake_run = _paced_runs(jobs, 200_000)  # calibrated at 100k env-steps/s, runs at 200k

    job = {"row": "grpo", "seed": 0, "repeat": 0, "cpu": 0, "budget": 1_000_000}
    record = wallclock.run_wallclock(job, 9.0, 5, fake_run)
    (aside,) = record["set_aside"]  # 880k env steps took 5.4 s of 9: run again
    assert aside["env_steps"] == 1024 * 860 and aside["stop_reason"] is None
    assert aside["elapsed_s"] < 0.95 * 9.0
    # at its own pace (200k/s) with 10% headroom, the second run is cut by the clock
    assert jobs[-1]["budget"] == record["estimated_env_steps"] > aside["env_steps"]
    assert record["stop_reason"].startswith("the time budget")
    assert len(jobs) == 3  # one calibration, two runs
