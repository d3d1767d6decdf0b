"""A full disk or an unwritable run directory: a clear error, and the previous checkpoint intact.

A full disk is simulated by making `torch.save` (or `os.fsync`) raise `OSError(ENOSPC)` after
part of the file was written, which is what a real full disk does.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.base import checkpoint
from grpo_trainer.tools.cli import main

STEPS = 8
REAL_SAVE = torch.save


def payload(update: int) -> dict[str, Any]:
    return {
        "format_version": checkpoint.FORMAT_VERSION,
        "weights": torch.full((64,), float(update)),
        "update_index": update,
    }


def disk_full_from(update: int):
    """A `torch.save` that writes half a file, then fails like a full disk, from `update` on."""

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if obj.get("update_index", 0) < update:
            return REAL_SAVE(obj, f, *args, **kwargs)
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    return save


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if ".tmp-" in p.name]


def test_enospc_keeps_the_previous_checkpoint_and_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint.save_rotating(payload(1), tmp_path, 1, keep=3)
    monkeypatch.setattr(checkpoint.torch, "save", disk_full_from(2))
    with pytest.raises(OSError, match=r"update-0000002\.pt \(disk full\).*unchanged") as info:
        checkpoint.save_rotating(payload(2), tmp_path, 2, keep=3)
    assert info.value.errno == errno.ENOSPC
    assert leftovers(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "update-0000001.pt"]
    assert checkpoint.load(tmp_path / "last.pt")["update_index"] == 1
    assert checkpoint.load_for_resume(tmp_path)[0]["update_index"] == 1


def test_enospc_on_last_pt_leaves_the_numbered_file_to_resume_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint.save_rotating(payload(1), tmp_path, 1, keep=3)
    calls = []

    def second_write_fails(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(obj["update_index"])
        if len(calls) == 2:  # update-0000002.pt went through, last.pt does not
            raise OSError(errno.ENOSPC, "No space left on device")
        REAL_SAVE(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", second_write_fails)
    with pytest.raises(OSError, match=r"last\.pt \(disk full\)"):
        checkpoint.save_rotating(payload(2), tmp_path, 2, keep=3)
    assert leftovers(tmp_path) == []
    assert checkpoint.load(tmp_path / "last.pt")["update_index"] == 1
    assert checkpoint.load_for_resume(tmp_path)[0]["update_index"] == 2


def test_fsync_failure_is_a_clear_error_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint.atomic_save(payload(1), tmp_path / "last.pt")

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    with pytest.raises(OSError, match=r"cannot write checkpoint .*Input/output error"):
        checkpoint.atomic_save(payload(2), tmp_path / "last.pt")
    monkeypatch.undo()
    assert leftovers(tmp_path) == []
    assert checkpoint.load(tmp_path / "last.pt")["update_index"] == 1


def make_trainer(run_dir: Path, updates: int = 5, every: int = 1) -> GRPOTrainer:
    config = GRPOConfig(
        num_groups=2,
        group_size=2,
        rollout_steps=STEPS,
        window=2,
        total_env_steps=updates * 4 * STEPS,  # no episode ends early: `updates` updates
        epochs=1,
        minibatch_size=1 << 20,
        hidden_sizes=(8,),
        run=RunConfig(
            device="cpu",
            progress=False,
            compile=False,
            run_dir=str(run_dir),
            checkpoint_every=every,
        ),
    )
    envs = gym.make_vec("FruitCatcher-v0", num_envs=4, max_episode_steps=STEPS)
    return GRPOTrainer(envs, config)


def test_disk_full_during_training_stops_with_the_last_checkpoint_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = make_trainer(tmp_path)
    monkeypatch.setattr(checkpoint.torch, "save", disk_full_from(3))
    with pytest.raises(OSError, match="disk full") as info:
        trainer.train()
    assert info.value.errno == errno.ENOSPC
    folder = tmp_path / "checkpoints"
    assert leftovers(folder) == []
    assert not (folder / "update-0000003.pt").exists()
    last = checkpoint.load(folder / "last.pt")
    assert last["update_index"] == 2
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2, 3]  # the writer was closed cleanly


def test_unwritable_run_dir_fails_before_the_first_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    trainer = make_trainer(blocker / "run")
    monkeypatch.setattr(trainer, "update", lambda: pytest.fail("trained despite the bad dir"))
    with pytest.raises(OSError, match=r"run directory .*a-file/run is not writable"):
        trainer.train()


def test_full_disk_at_start_fails_before_the_first_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = make_trainer(tmp_path / "run")
    monkeypatch.setattr(trainer, "update", lambda: pytest.fail("trained despite a full disk"))

    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    with pytest.raises(OSError, match=r"run is not writable: .*No space left"):
        trainer.train()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file permissions")
def test_read_only_run_dir_fails_before_the_first_update(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints").chmod(0o500)
    try:
        with pytest.raises(OSError, match="is not writable"):
            make_trainer(run_dir).train()
    finally:
        (run_dir / "checkpoints").chmod(0o700)


def test_cli_reports_an_unwritable_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    argv = ["train", "--num-groups", "2", "--group-size", "2", "--device", "cpu"]
    argv += ["--max-episode-steps", "8", "--no-progress", "--run-dir", str(blocker / "run")]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 1
    assert "a-file/run is not writable" in capsys.readouterr().err
