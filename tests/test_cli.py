"""`python -m grpo_trainer train | eval | play`: flags, errors, outputs; and the import rule.

Most runs call `cli.main(argv)` in-process (fast); one spawns `python -m grpo_trainer` to
check the module entry point itself.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_trainer import GRPOConfig, RunConfig
from grpo_trainer.base import checkpoint
from grpo_trainer.tools import cli

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "grpo_trainer"
SUBPROCESS_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    "OMP_NUM_THREADS": "1",
}
TRAIN_STEPS = 3000
# 2 groups x 2 members take 100 steps per update in games of 40 steps: every update sees
# games end (and restart, within restart_every = 8 steps).
STEPS_PER_UPDATE = 4 * 100
GAME_STEPS = 40


@contextlib.contextmanager
def _single_thread() -> Iterator[None]:
    """Shared 2-core machine: one intra-op thread avoids oversubscription (10x slowdowns)."""
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(precision)  # `grpo train` sets it process-wide


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with _single_thread():
        yield


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """cli.main(argv) -> (exit code, stdout, stderr); argparse exits become codes."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny `grpo train` run shared by the tests that read its outputs."""
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    argv = [
        "train",
        "--total-env-steps",
        str(TRAIN_STEPS),
        "--num-groups",
        "2",
        "--group-size",
        "2",
        "--run-dir",
        str(run_dir),
        "--device",
        "cpu",
        "--hidden-sizes",
        "16",
        "--rollout-steps",
        "100",
        "--window",
        "8",
        "--env-kwargs",
        json.dumps({"max_episode_steps": GAME_STEPS}),
        "--no-progress",
    ]
    with _single_thread():
        assert cli.main(argv) == 0
    return run_dir


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "flag"),
    [
        (["--num-groups", "0"], "--num-groups"),  # parsed fine, refused by GRPOConfig
        (["--amp", "bogus"], "--amp"),  # not a choice
        (["--lr", "abc"], "--lr"),  # not a float
        (["--lr", "-1"], "--lr"),  # a float out of range
        (["--hidden-sizes", "x"], "--hidden-sizes"),  # not comma-separated ints
        (["--group-size", "1"], "--group-size"),
        (["--env-kwargs", "[1, 2]"], "--env-kwargs"),  # JSON, but not an object
        (["--advantage", "mean"], "--advantage"),
        (["--seed", "-3"], "--seed"),
        (["--dual-clip", "off"], "--dual-clip"),  # a number or "none"
        (["--dual-clip", "1"], "--dual-clip"),  # a bound at 1 x A is inside the clip
    ],
)
def test_bad_train_flags_exit_nonzero_naming_the_flag(
    flags: list[str], flag: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Each invalid value stops `grpo train` before any work, with exit code 2 and a message
    naming the flag the user typed."""
    code, _, err = run_main(["train", "--run-dir", str(tmp_path / "r"), *flags], capsys)
    assert code == 2
    assert f"argument {flag}" in err, err
    assert not (tmp_path / "r").exists()  # nothing was written


def test_fp16_on_cpu_is_refused_naming_the_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--amp fp16 with --device cpu fails cleanly (fp16 autocast needs CUDA)."""
    argv = ["train", "--amp", "fp16", "--device", "cpu", "--num-groups", "1", "--group-size", "2"]
    code, _, err = run_main([*argv, "--total-env-steps", "10", "--no-progress"], capsys)
    assert code == 2
    assert "--amp" in err and "fp16" in err


def test_eval_with_bad_arguments(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """eval refuses --episodes 0 and a missing checkpoint, non-zero, saying what is wrong."""
    missing = tmp_path / "nope.pt"
    code, _, err = run_main(["eval", "--checkpoint", str(missing), "--episodes", "0"], capsys)
    assert code == 2 and "--episodes" in err
    code, _, err = run_main(["eval", "--checkpoint", str(missing)], capsys)
    assert code != 0 and "does not exist" in err


# -- flags and configs -------------------------------------------------------------------------


def test_flags_are_typed_from_the_dataclasses(tmp_path: Path) -> None:
    """Tuples, dicts, bools, optionals and literals parse into the config's own types."""
    args = cli.build_parser().parse_args(
        [
            "train",
            "--hidden-sizes",
            "32,16",
            "--env-kwargs",
            '{"width": 10}',
            "--no-fused-optimizer",
            "--compile",
            "--max-episode-steps",
            "50",
            "--scale",
            "none",
            "--gamma",
            "0.5",
        ]
    )
    cfg = cli.config_from_args(args)
    assert cfg.hidden_sizes == (32, 16)
    assert cfg.run.env_kwargs == {"width": 10}
    assert cfg.run.fused_optimizer is False and cfg.run.compile is True
    assert cfg.max_episode_steps == 50 and cfg.scale == "none" and cfg.gamma == 0.5
    # A field that allows None takes a number or "none".
    on = cli.config_from_args(cli.build_parser().parse_args(["train", "--dual-clip", "3"]))
    off = cli.config_from_args(cli.build_parser().parse_args(["train", "--dual-clip", "none"]))
    assert on.dual_clip == 3.0 and off.dual_clip is None
    # Unset flags keep the dataclass defaults.
    assert cfg.num_groups == GRPOConfig().num_groups
    assert cfg.run.seed == RunConfig().seed


def test_config_file_then_flags(tmp_path: Path) -> None:
    """--config loads a saved config.json; flags given on the command line override it."""
    saved = GRPOConfig(num_groups=3, lr=0.02, run=RunConfig(seed=9, keep_checkpoints=7))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(saved.to_dict()))
    args = cli.build_parser().parse_args(
        ["train", "--config", str(path), "--lr", "0.5", "--seed", "4"]
    )
    cfg = cli.config_from_args(args)
    assert cfg.num_groups == 3 and cfg.run.keep_checkpoints == 7  # from the file
    assert cfg.lr == 0.5 and cfg.run.seed == 4  # from the flags


# -- a real run --------------------------------------------------------------------------------


def test_train_writes_config_metrics_and_checkpoints(trained_run: Path) -> None:
    """`grpo train ... --run-dir` writes config.json, metrics.jsonl (one documented row per
    update) and checkpoints/last.pt and best.pt."""
    config = GRPOConfig.from_dict(json.loads((trained_run / "config.json").read_text()))
    assert (config.num_groups, config.group_size, config.total_env_steps) == (2, 2, TRAIN_STEPS)
    assert config.run.run_dir == str(trained_run)

    rows = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()]
    # ceil(3000 / 400) = 8 updates; training stops at the first row past 3000 steps.
    assert [r["update"] for r in rows] == list(range(1, 9))
    assert rows[-2]["env_steps"] < TRAIN_STEPS <= rows[-1]["env_steps"]
    for row in rows:  # env_steps counts every sub-env step simulated, cumulatively
        assert row["env_steps"] == row["update"] * STEPS_PER_UPDATE
        assert 0 < row["valid_steps"] <= STEPS_PER_UPDATE
    documented = {
        "env_steps",
        "steps_per_s",
        "return_mean",
        "return_std",
        "catch_rate",
        "frac_zero_std_groups",
        "loss",
        "policy_loss",
        "kl",
        "entropy",
        "clip_fraction",
        "episode_caught",
        "episode_missed",
    }
    for row in rows:
        assert documented <= set(row), documented - set(row)
        assert any(k.startswith("mem_") for k in row)  # memory figures
        assert row["steps_per_s"] > 0
        # A FruitCatcher score is caught minus missed.
        assert row["episode_caught"] - row["episode_missed"] == pytest.approx(row["return_mean"])

    folder = trained_run / "checkpoints"
    last = checkpoint.load(folder / "last.pt")
    assert last["update_index"] == len(rows)
    assert last["env_steps"] == rows[-1]["env_steps"]
    best = checkpoint.load(folder / "best.pt")
    assert best["best_score"] == max(r["return_mean"] for r in rows)


def test_eval_prints_json(trained_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`grpo eval --checkpoint ... --episodes 8 --json` prints one JSON object of results."""
    ckpt = trained_run / "checkpoints" / "last.pt"
    argv = ["eval", "--checkpoint", str(ckpt), "--episodes", "8", "--json", "--device", "cpu"]
    code, out, _ = run_main(argv, capsys)
    assert code == 0
    result = json.loads(out.strip().splitlines()[-1])
    assert result["episodes"] == 8.0 and result["greedy"] == 1.0
    assert {"return_mean", "return_std", "length_mean"} <= set(result)
    assert {"episode_caught", "episode_missed"} <= set(result)
    assert result["length_mean"] == GAME_STEPS  # games run to their limit
    assert result["episode_caught"] - result["episode_missed"] == pytest.approx(
        result["return_mean"]
    )
    # Greedy evaluation with a fixed seed is reproducible.
    code, again, _ = run_main(argv, capsys)
    assert json.loads(again.strip().splitlines()[-1]) == result


def test_play_writes_a_gif(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`grpo play --out x.gif` writes an animated GIF of sub-env 0 (needs Pillow)."""
    image = pytest.importorskip("PIL.Image")
    out_path = tmp_path / "agent.gif"
    ckpt = trained_run / "checkpoints" / "best.pt"
    code, out, _ = run_main(
        ["play", "--checkpoint", str(ckpt), "--out", str(out_path), "--steps", "10"], capsys
    )
    assert code == 0
    # The reset frame plus one per step: the 200-step game does not end within 10 steps.
    assert "wrote 11 frames" in out
    with image.open(out_path) as gif:
        assert gif.format == "GIF"
        assert gif.n_frames > 1


def test_play_ansi_prints_boards(trained_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`grpo play --ansi` prints one text board per step instead of writing a file."""
    ckpt = trained_run / "checkpoints" / "last.pt"
    code, out, _ = run_main(["play", "--checkpoint", str(ckpt), "--ansi", "--steps", "5"], capsys)
    assert code == 0
    steps = [int(s) for s in re.findall(r"score [+-]?\d+\s+step (\d+)", out)]
    assert steps == [0, 1, 2, 3, 4, 5]
    assert out.count("+" + "-" * 20 + "+") == 2 * 6  # top and bottom border of each board


# -- the import rule ---------------------------------------------------------------------------


def _imported_modules(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.add(str(node.args[0].value))
    return names


def test_grpo_trainer_never_imports_fruit_env() -> None:
    """No module of grpo_trainer imports fruit_env (statically, or dynamically by name)."""
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) >= 10
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in mods if m.split(".")[0] == "fruit_env")
        for path in sources
        if (mods := _imported_modules(path.read_text()))
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    # The detector itself works:
    assert _imported_modules("from fruit_env.core import step\nimport fruit_env as f") == {
        "fruit_env.core",
        "fruit_env",
    }


def test_fresh_interpreter_never_loads_fruit_env_and_entry_point_works() -> None:
    """In a fresh interpreter, importing every grpo_trainer module does not load fruit_env;
    then `python -m grpo_trainer train --lr abc` (run as __main__) exits 2 naming the flag."""
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__main__")
    code = (
        "import importlib, runpy, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module('grpo_trainer' if m == '__init__' else 'grpo_trainer.' + m)\n"
        "assert 'fruit_env' not in sys.modules, 'fruit_env was imported'\n"
        "sys.argv = ['grpo', 'train', '--lr', 'abc']\n"
        "runpy.run_module('grpo_trainer', run_name='__main__', alter_sys=True)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "fruit_env was imported" not in proc.stderr
    assert proc.returncode == 2, proc.stderr
    assert "argument --lr: expected float or none, got 'abc'" in proc.stderr


@pytest.mark.parametrize("command", ["eval", "play"])
@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"run": {"env_kwargs": {"obs_mode": "pixels"}}}, "observation_space"),  # another env
        ({"hidden_sizes": [8, 8]}, "hidden_sizes"),  # another network than the weights
    ],
    ids=["other env", "other network"],
)
def test_eval_and_play_refuse_a_checkpoint_that_does_not_fit(
    trained_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    change: dict[str, Any],
    named: str,
) -> None:
    """A checkpoint whose config names an env with other spaces, or a network its weights
    do not fit, is refused by eval and play with the mismatch named, as --resume refuses it
    (regression: both used to load it unchecked)."""
    payload = checkpoint.load(trained_run / "checkpoints" / "last.pt")
    run = change.get("run", {})
    payload["config"] = {**payload["config"], **change, "run": {**payload["config"]["run"], **run}}
    moved = tmp_path / "moved.pt"
    checkpoint.atomic_save(payload, moved)
    flags = ["--episodes", "2"] if command == "eval" else ["--out", str(tmp_path / "a.gif")]
    argv = [command, "--checkpoint", str(moved), *flags, "--device", "cpu"]
    code, _, err = run_main(argv, capsys)
    assert code == 2 and named in err and "--checkpoint" in err, err
    assert not (tmp_path / "a.gif").exists()


def test_the_env_kwargs_episode_limit_is_the_horizon() -> None:
    """Regression: env_kwargs={'max_episode_steps': 50} gives the env a 50-step limit, and
    episodes mode takes it as its horizon (make_vec leaves the spec at the registered 200)."""
    import torch

    from grpo_trainer import GRPOTrainer
    from grpo_trainer.envs import make_envs

    config = GRPOConfig(
        num_groups=2,
        group_size=2,
        rollout="episodes",
        hidden_sizes=(8,),
        run=RunConfig(env_kwargs={"max_episode_steps": 50}, progress=False, device="cpu"),
    )
    trainer = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
    assert trainer.rollout.horizon == 50
    assert trainer.update()["length_mean"] == 50


def test_train_help_describes_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """`train --help` lists one flag per config field, each with its one-line description
    (the same text as config.json's `_help` and the tables in docs/trainer.md)."""
    from grpo_trainer.base.config import GRPOConfig, RunConfig, describe

    with pytest.raises(SystemExit) as done:
        cli.main(["train", "--help"])
    assert done.value.code == 0
    text = "".join(capsys.readouterr().out.split())  # argparse wraps lines, even at hyphens
    for cls in (GRPOConfig, RunConfig):
        for field in dataclasses.fields(cls):
            if field.name == "run":
                continue
            flag = "--" + field.name.replace("_", "-")
            assert flag in text, flag
            description = "".join(describe(cls, field.name).split())
            assert description, field.name
            assert flag in text and description in text, (flag, description)


def test_the_summary_keeps_the_catch_rate_of_the_last_episodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Games of 60 steps in 32-step updates: the 2nd update sees them end, the 3rd does not.
    Its metrics have no return or catch rate, and the summary still shows the last ones."""
    argv = ["train", "--run-dir", str(tmp_path / "r"), "--device", "cpu", "--progress"]
    argv += ["--num-groups", "2", "--group-size", "2", "--hidden-sizes", "8"]
    argv += ["--rollout-steps", "32", "--window", "8", "--total-env-steps", str(3 * 4 * 32)]
    argv += ["--env-kwargs", json.dumps({"max_episode_steps": 60})]
    code, _, err = run_main(argv, capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").open()]
    assert [("catch_rate" in row) for row in rows] == [False, True, False]
    summary = err[err.index("GRPO run summary") :]
    shown = re.search(r"catch_rate\s*│\s*([0-9.]+)", summary)
    assert shown is not None, summary
    assert float(shown.group(1)) == pytest.approx(rows[1]["catch_rate"], abs=5e-4)


def test_a_time_budget_ends_train_with_exit_code_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """`train --time-budget-s` that its first update spends: a finished run (exit 0), one
    update far short of its env steps, the reason logged, the checkpoint written."""
    argv = ["train", "--total-env-steps", "1000000", "--time-budget-s", "1e-9"]
    argv += ["--num-groups", "2", "--group-size", "2", "--rollout-steps", "16", "--window", "8"]
    argv += ["--hidden-sizes", "16", "--device", "cpu", "--no-progress"]
    with caplog.at_level(logging.INFO), _single_thread():
        code, _, _ = run_main([*argv, "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 0
    assert "stopped after update 1: the time budget (1e-09 s of training) is spent" in caplog.text
    last = checkpoint.load(tmp_path / "run" / "checkpoints" / "last.pt")
    assert last["update_index"] == 1 and last["env_steps"] == 4 * 16
