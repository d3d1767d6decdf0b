"""Interrupts: SIGINT/SIGTERM finish the update, checkpoint and exit 128+signal with a resume
hint; a second signal aborts at once; `kill -9` loses at most one checkpoint period.

The subprocess tests run the real CLI and wait for files to appear (polling with a timeout),
never for a fixed time.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.base import checkpoint

ROOT = Path(__file__).resolve().parents[1]
STEPS = 8
STEPS_PER_UPDATE = 4 * STEPS  # 4 sub-envs, and no FruitCatcher episode ends within 8 steps
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
}


def make_trainer(run_dir: Path, **run: Any) -> GRPOTrainer:
    config = GRPOConfig(
        num_groups=2,
        group_size=2,
        rollout_steps=STEPS,
        window=2,
        total_env_steps=100 * STEPS_PER_UPDATE,
        epochs=1,
        minibatch_size=1 << 20,
        hidden_sizes=(8,),
        run=RunConfig(device="cpu", progress=False, compile=False, run_dir=str(run_dir), **run),
    )
    envs = gym.make_vec("FruitCatcher-v0", num_envs=4, max_episode_steps=STEPS)
    return GRPOTrainer(envs, config)


def signal_during_rollout(trainer: GRPOTrainer, update: int, *signals: signal.Signals) -> None:
    """Send `signals` to this process from inside the rollout of `update` (1-based)."""
    step = trainer.env.step
    calls = {"n": 0}

    def stepped(action: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == (update - 1) * STEPS + 3:  # the third env step of that rollout
            for s in signals:
                os.kill(os.getpid(), s)
        return step(action)

    trainer.env.step = stepped  # type: ignore[method-assign]


def metric_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            break
    return rows


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_finishes_the_update_and_checkpoints(
    tmp_path: Path, sig: signal.Signals, caplog: pytest.LogCaptureFixture
) -> None:
    before = signal.getsignal(sig)
    trainer = make_trainer(tmp_path)  # checkpoint_every=0: only the final checkpoint
    signal_during_rollout(trainer, 2, sig)
    with caplog.at_level(logging.WARNING, "grpo_trainer"):
        metrics = trainer.train()

    assert trainer.stop_signal == sig.name
    assert metrics["update"] == 2  # the interrupted update was completed, no third one
    assert [r["update"] for r in metric_rows(tmp_path)] == [1, 2]
    last, where = checkpoint.load_for_resume(tmp_path)
    assert (last["update_index"], where.name) == (2, "update-0000002.pt")
    hint = (
        f"resume with: python -m grpo_trainer train --config {tmp_path / 'config.json'} "
        f"--resume {tmp_path}"
    )
    assert any(hint in r.message for r in caplog.records)
    assert signal.getsignal(sig) is before  # handlers restored


def test_second_signal_aborts_without_a_checkpoint(tmp_path: Path) -> None:
    # What SIGINT did before: Python's default, or SIG_IGN when started in the background.
    before = signal.getsignal(signal.SIGINT)
    trainer = make_trainer(tmp_path, checkpoint_every=1)
    signal_during_rollout(trainer, 2, signal.SIGINT, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt, match="second SIGINT: aborted"):
        trainer.train()
    assert checkpoint.load_for_resume(tmp_path)[0]["update_index"] == 1
    assert signal.getsignal(signal.SIGINT) is before  # restored even on the abort path


# -- the real CLI in a subprocess --------------------------------------------------------------


def start_cli(run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "grpo_trainer", "train", "--device", "cpu", "--no-progress"]
    argv += ["--num-groups", "2", "--group-size", "2", "--rollout-steps", str(STEPS)]
    argv += ["--window", "2", "--epochs", "1", "--minibatch-size", "1048576", "--hidden-sizes", "8"]
    argv += ["--env-kwargs", json.dumps({"max_episode_steps": STEPS}), "--run-dir", str(run_dir)]
    return subprocess.Popen(
        [*argv, *extra],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str], timeout: float) -> None:
    """Poll until `condition()` holds; fail early if the process died, or after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"trainer exited with {proc.returncode}: {proc.communicate()[1][-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(0.1)


def resume_cli(run_dir: Path, total_env_steps: int) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "grpo_trainer", "train", "--config", str(run_dir / "config.json")]
    argv += ["--resume", str(run_dir), "--total-env-steps", str(total_env_steps)]
    return subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_cli_stops_cleanly_on_a_signal_and_resumes(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    proc = start_cli(tmp_path, "--total-env-steps", str(10**9))
    wait_for(lambda: len(metric_rows(tmp_path)) >= 2, proc, timeout=300)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)

    assert proc.returncode == code, err
    assert f"stopped by {sig.name} after update" in err
    assert f"--config {tmp_path / 'config.json'} --resume {tmp_path}" in err
    assert "Traceback" not in err
    updates = [r["update"] for r in metric_rows(tmp_path)]
    last = checkpoint.load(tmp_path / "checkpoints" / "last.pt")
    assert last["update_index"] == updates[-1]  # the final checkpoint holds the last update

    resumed = resume_cli(tmp_path, last["env_steps"] + STEPS_PER_UPDATE)  # one more update
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {tmp_path / 'checkpoints'}" in resumed.stderr
    assert [r["update"] for r in metric_rows(tmp_path)] == [*updates, updates[-1] + 1]


@pytest.mark.slow
def test_cli_kill_9_loses_at_most_one_checkpoint_period(tmp_path: Path) -> None:
    every = 2
    proc = start_cli(tmp_path, "--total-env-steps", str(10**9), "--checkpoint-every", str(every))
    wait_for(lambda: len(metric_rows(tmp_path)) >= 2 * every + 1, proc, timeout=300)
    proc.kill()  # SIGKILL: no handler, no final checkpoint
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    logged = len(metric_rows(tmp_path))
    found, where = checkpoint.load_for_resume(tmp_path)
    saved = found["update_index"]
    assert saved % every == 0
    assert logged - every <= saved <= logged  # lost at most one period of updates
    assert where.name == f"update-{saved:07d}.pt"

    resumed = resume_cli(tmp_path, found["env_steps"] + STEPS_PER_UPDATE)  # one more update
    assert resumed.returncode == 0, resumed.stderr
    assert f"at update {saved} " in resumed.stderr
    assert metric_rows(tmp_path)[-1]["update"] == saved + 1
    assert checkpoint.load(tmp_path / "checkpoints" / "last.pt")["update_index"] == saved + 1


def _deterministic(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row without its wall times and memory figures, which no two runs share."""
    timed = ("warmup_s", "train_s", "rollout_s", "update_s", "steps_per_s")
    return {k: v for k, v in row.items() if k not in timed and not k.startswith("mem_")}


@pytest.mark.slow
def test_metrics_after_kill_9_and_resume_are_those_of_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    """`kill -9` between checkpoints, then `--resume`: metrics.jsonl holds every update once,
    with the values an uninterrupted run of the same seed writes (training is bit-reproducible
    per seed on the CPU), not the killed run's rows after its checkpoint followed by the
    resumed run's rows for the same updates."""
    every, constant = 10, ("--lr-schedule", "constant")  # the lr does not depend on the budget
    killed = tmp_path / "killed"
    proc = start_cli(
        killed, "--total-env-steps", str(10**9), "--checkpoint-every", str(every), *constant
    )
    while True:  # freeze the trainer at a moment with rows after its newest checkpoint
        wait_for(lambda: len(metric_rows(killed)) > every, proc, timeout=300)
        proc.send_signal(signal.SIGSTOP)
        if len(metric_rows(killed)) % every:
            break
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.01)
    proc.kill()
    proc.communicate(timeout=60)
    assert len(metric_rows(killed)) % every  # the rows a resume would have repeated
    saved = checkpoint.load_for_resume(killed)[0]["update_index"]
    total = (saved + 3) * STEPS_PER_UPDATE
    resumed = resume_cli(killed, total)
    assert resumed.returncode == 0, resumed.stderr

    straight = tmp_path / "straight"
    uninterrupted = start_cli(straight, "--total-env-steps", str(total), *constant)
    _, err = uninterrupted.communicate(timeout=300)
    assert uninterrupted.returncode == 0, err

    rows = metric_rows(killed)
    assert [r["update"] for r in rows] == list(range(1, saved + 4))
    assert [_deterministic(r) for r in rows] == [_deterministic(r) for r in metric_rows(straight)]
