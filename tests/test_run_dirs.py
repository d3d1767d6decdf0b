"""A run directory keeps what it holds: a fresh run refuses a folder that holds a run, a lock
stops a second run on it, `--resume` refuses another env's episodes and keeps best.pt's rule;
and the trainer-side refusals of wrong values (an oversized minibatch, a meta-device train,
a full disk during `torch.save`). Each data-loss test reads the files on disk."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.base import checkpoint
from grpo_trainer.base.config import lr_for
from grpo_trainer.tools import cli

STEPS = 16  # steps per update, 4 sub-envs
TINY = [
    *("--num-groups", "2", "--group-size", "2", "--rollout-steps", str(STEPS)),
    *("--window", "8", "--hidden-sizes", "8", "--device", "cpu", "--eval-every", "0"),
    *("--checkpoint-every", "1", "--no-progress"),
]


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision(precision)


def train(capsys: pytest.CaptureFixture[str], *flags: str, updates: int = 4) -> tuple[int, str]:
    """`grpo train` in this process -> (exit code, stderr)."""
    argv = ["train", *TINY, "--total-env-steps", str(updates * 4 * STEPS), *flags]
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


def snapshot(run_dir: Path) -> dict[str, str]:
    """Every file under `run_dir` and a hash of its bytes."""
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def old_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    run_dir = tmp_path / "run"
    assert train(capsys, "--run-dir", str(run_dir), updates=5)[0] == 0
    return run_dir


def rows(run_dir: Path) -> int:
    return len((run_dir / "metrics.jsonl").read_text().splitlines())


# -- a fresh run into a folder that holds one ---------------------------------------------------


@pytest.mark.parametrize("how", ["--run-dir", "--config"])
def test_a_fresh_run_refuses_a_run_dir_that_holds_a_run(
    old_run: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(old_run)
    assert rows(old_run) == 5
    flags = (
        ["--run-dir", str(old_run)] if how == "--run-dir" else [how, str(old_run / "config.json")]
    )
    code, err = train(capsys, *flags, updates=2)
    assert code == 2, err
    assert "already holds a run" in err and f"--resume {old_run}" in err and "--overwrite" in err
    assert snapshot(old_run) == before  # not one byte changed


def test_overwrite_replaces_the_old_run_entirely(
    old_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    best = old_run / "checkpoints" / "best.pt"
    best.write_bytes((old_run / "checkpoints" / "last.pt").read_bytes())  # the old run's best
    code, err = train(capsys, "--run-dir", str(old_run), "--overwrite", updates=2)
    assert code == 0, err
    assert rows(old_run) == 2
    names = sorted(p.name for p in (old_run / "checkpoints").glob("update-*.pt"))
    assert names == ["update-0000001.pt", "update-0000002.pt"]  # none of the old run's
    assert not best.exists() or checkpoint.load(best)["update_index"] <= 2  # not the old one
    assert not (old_run / ".lock").exists()


def test_a_config_file_never_carries_overwrite(
    old_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads((old_run / "config.json").read_text())
    data["run"]["overwrite"] = True
    file = old_run.parent / "with_overwrite.json"
    file.write_text(json.dumps(data))
    before = snapshot(old_run)
    assert train(capsys, "--config", str(file), updates=2)[0] == 2
    assert snapshot(old_run) == before


# -- the lock ----------------------------------------------------------------------------------


def test_a_second_run_on_a_locked_run_dir_is_refused(
    old_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        (old_run / ".lock").write_text(str(other.pid))  # a run that is still going
        before = snapshot(old_run)
        code, err = train(capsys, "--run-dir", str(old_run), "--resume", str(old_run), updates=7)
        assert code == 2, err
        assert f"in use by another run (process {other.pid}" in err
        assert snapshot(old_run) == before
    finally:
        other.communicate(b"")


def test_a_lock_left_by_a_killed_run_is_taken_over(
    old_run: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    (old_run / ".lock").write_text(dead.stdout.strip())
    code, err = train(capsys, "--run-dir", str(old_run), "--resume", str(old_run), updates=7)
    assert code == 0, err
    assert f"left by process {dead.stdout.strip()}, which no longer runs" in caplog.text
    assert rows(old_run) == 7
    assert not (old_run / ".lock").exists()


# -- resuming ----------------------------------------------------------------------------------


def test_resume_refuses_another_envs_episodes(
    old_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(old_run)
    kwargs = json.dumps({"max_episode_steps": 7})
    code, err = train(
        capsys,
        "--run-dir",
        str(old_run),
        "--resume",
        str(old_run),
        "--env-kwargs",
        kwargs,
        updates=7,
    )
    assert code == 2, err
    assert "holds episodes of another env" in err and "'max_episode_steps'" in err
    assert snapshot(old_run) == before


def test_cli_resume_keeps_best_pts_rule(old_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """best.pt chosen by an evaluation score stays unless a better evaluation comes: a resume
    through the command line must not replace it by a training-return checkpoint."""
    last = old_run / "checkpoints" / "last.pt"
    payload = checkpoint.load(last)
    payload.update(best_score=0.287, best_by="eval_score")
    for path in (last, old_run / "checkpoints" / "best.pt", *old_run.glob("checkpoints/update-*")):
        checkpoint.atomic_save(payload, path)
    best_before = snapshot(old_run)["checkpoints/best.pt"]
    code, err = train(capsys, "--run-dir", str(old_run), "--resume", str(old_run), updates=8)
    assert code == 0, err
    assert snapshot(old_run)["checkpoints/best.pt"] == best_before
    resumed = checkpoint.load(old_run / "checkpoints" / "last.pt")
    assert (resumed["best_score"], resumed["best_by"]) == (0.287, "eval_score")


# -- wrong values ------------------------------------------------------------------------------


def test_the_learning_rate_follows_the_minibatch_an_update_can_hold() -> None:
    with pytest.warns(UserWarning, match="minibatch_size 100000000 is more than an update's 64"):
        config = GRPOConfig(num_groups=2, group_size=2, rollout_steps=16, minibatch_size=10**8)
    assert config.minibatch_size == 64
    assert config.lr == pytest.approx(lr_for(64))
    assert config.lr < 0.2  # not lr_for(10**8) = 1.56


def test_episodes_mode_clamps_to_the_episode_limit() -> None:
    with pytest.warns(UserWarning, match="more than an update's 200 samples"):
        config = GRPOConfig(num_groups=2, group_size=2, rollout="episodes", minibatch_size=10**4)
        resolved = config.resolve(50)
    assert (resolved.minibatch_size, resolved.lr) == (200, lr_for(200))


def test_train_on_meta_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = train(capsys, "--device", "meta", updates=1)
    assert code == 2
    assert "device 'meta' holds no data" in err and "Traceback" not in err


def test_no_progress_still_prints_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = train(capsys, "--run-dir", str(tmp_path / "r"), updates=2)
    assert code == 0
    assert "GRPO run summary" in err


class _FullDisk(io.FileIO):
    """A file on a disk that fills after `room` bytes (a real write error, not a mock of
    `torch.save`: torch's zip writer meets it and raises its own RuntimeError)."""

    room = 1000

    def write(self, data: Any) -> int:
        if self.tell() + len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def test_a_full_disk_during_torch_save_is_named_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload = {"format_version": checkpoint.FORMAT_VERSION, "weights": torch.zeros(4096)}
    checkpoint.atomic_save(payload, tmp_path / "last.pt")
    monkeypatch.setattr(checkpoint, "open", lambda path, mode: _FullDisk(path, "w"), raising=False)
    with pytest.raises(OSError, match=r"cannot write checkpoint .*last\.pt \(disk full\)") as info:
        checkpoint.atomic_save({**payload, "weights": torch.ones(4096)}, tmp_path / "last.pt")
    assert info.value.errno == errno.ENOSPC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no .tmp left
    assert checkpoint.load(tmp_path / "last.pt")["weights"].sum() == 0  # the old one


def test_trainer_meta_update_still_runs() -> None:
    """The meta device stays a test device for update(): only train() refuses it."""
    envs = gym.make_vec("FruitCatcher-v0", num_envs=4, device="meta", validate_actions=False)
    config = GRPOConfig(
        num_groups=2,
        group_size=2,
        rollout_steps=8,
        window=8,
        run=RunConfig(device="meta", compile=False, progress=False),
    )
    trainer = GRPOTrainer(envs, config)
    with pytest.raises(ValueError, match="device 'meta' holds no data"):
        trainer.train()
