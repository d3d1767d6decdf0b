"""examples/own_env.py, the "Write your own env" example of docs/env.md: a game of at most 80
lines on the kit that passes the trainer's conformance checker in every autoreset mode, run
as the docs say, and through `python -m grpo_trainer check`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "own_env.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'examples'}"}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def test_the_example_is_a_small_game() -> None:
    assert len(EXAMPLE.read_text().splitlines()) <= 80


def test_the_example_passes_the_checker_in_every_autoreset_mode() -> None:
    done = _run(str(EXAMPLE))
    assert done.returncode == 0, done.stdout + done.stderr
    reports = done.stdout.split("TreasureHunt-v0 (TensorVectorEnv): ")[1:]
    assert [r.splitlines()[0] for r in reports] == ["ok", "ok", "ok"]
    for mode, report in zip(("NEXT_STEP", "SAME_STEP", "DISABLED"), reports, strict=True):
        assert f"autoreset            pass    {mode}" in report
        assert "state_snapshots      pass" in report
        assert "num_envs_invariance  pass" in report


def test_the_trainers_check_command_passes_the_example() -> None:
    done = _run("-m", "grpo_trainer", "check", "own_env:TreasureHunt-v0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "TreasureHunt-v0 (TensorVectorEnv): ok" in done.stdout


def test_a_game_registered_as_a_function_gets_the_device_and_fast_options() -> None:
    """own_env.py registers its game with a function entry point: the trainer's env is made on
    the device asked for (meta here: an update runs on it up to its one host copy) with the
    kit's fast options set, and `check --strict-syncs` finds no per-step action-check sync."""
    script = (
        "import torch, pytest\n"
        "from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig\n"
        "from grpo_trainer.envs import make_envs\n"
        "run = RunConfig(env='own_env:TreasureHunt-v0', device='meta', compile=False)\n"
        "config = GRPOConfig(num_groups=2, group_size=2, hidden_sizes=(8,), run=run)\n"
        "envs = make_envs(config, config.num_envs, torch.device('meta'))\n"
        "assert envs.unwrapped.device == torch.device('meta'), envs.unwrapped.device\n"
        "assert envs.unwrapped.validate_actions is False\n"
        "trainer = GRPOTrainer(envs, config)\n"
        "assert trainer.device == torch.device('meta')\n"
        "with pytest.raises(NotImplementedError, match='Cannot copy out of meta'):\n"
        "    trainer.update()\n"
        "print('ok')\n"
    )
    done = _run("-c", script)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
    check = _run("-m", "grpo_trainer", "check", "own_env:TreasureHunt-v0", "--strict-syncs")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "host_syncs           pass    no host sync in" in check.stdout, check.stdout
