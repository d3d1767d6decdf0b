"""Checkpoints: SHA-256 integrity, no code execution on load, fallback past damaged files,
rotation, and refusal of checkpoints made for another env or network."""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.base import checkpoint
from grpo_trainer.base.checkpoint import CheckpointError

STEPS = 8


def payload(update: int = 0, n: int = 256) -> dict[str, Any]:
    """A small checkpoint-shaped payload; `update` makes each one distinct."""
    return {
        "format_version": checkpoint.FORMAT_VERSION,
        "config": {"hidden_sizes": [4], "activation": "tanh"},
        "spaces": {"observation_space": "Box(3)", "action_space": "Discrete(3)"},
        "weights": torch.arange(n, dtype=torch.float32) + update,
        "half": torch.ones(3, dtype=torch.bfloat16),
        "flags": torch.tensor([True, False]),
        "nested": {0: {"step": torch.tensor(5.0)}, "betas": (0.9, 0.999), "x": None},
        "update_index": update,
        "best_score": -math.inf,
    }


def flip_bit_in(path: Path, needle: bytes) -> None:
    """Flip one bit inside the first occurrence of `needle` (e.g. a tensor's raw bytes)."""
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0, "needle not in file"
    data[at + len(needle) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def weights_bytes(update: int) -> bytes:
    return payload(update)["weights"][100:110].numpy().tobytes()


def make_trainer(run_dir: Path | None = None, env_kwargs: dict | None = None, **cfg: Any):
    run = {"device": "cpu", "progress": False, "compile": False, **cfg.pop("run", {})}
    if run_dir is not None:
        run["run_dir"] = str(run_dir)
    config = GRPOConfig(
        num_groups=2,
        group_size=2,
        rollout_steps=STEPS,
        window=2,
        total_env_steps=10 * 4 * STEPS,
        epochs=1,
        minibatch_size=1 << 20,
        hidden_sizes=cfg.pop("hidden_sizes", (8,)),
        **cfg,
        run=RunConfig(**run),
    )
    envs = gym.make_vec(
        "FruitCatcher-v0", num_envs=4, max_episode_steps=STEPS, **(env_kwargs or {})
    )
    return GRPOTrainer(envs, config)


# -- integrity ---------------------------------------------------------------------------------


def test_round_trip_keeps_values_and_records_digest(tmp_path: Path) -> None:
    path = tmp_path / "a.pt"
    checkpoint.atomic_save(payload(3), path)
    loaded = checkpoint.load(path)
    assert torch.equal(loaded["weights"], payload(3)["weights"])
    assert loaded["half"].dtype == torch.bfloat16
    assert loaded["nested"]["betas"] == (0.9, 0.999)
    assert loaded["best_score"] == -math.inf
    assert loaded["sha256"] == checkpoint.payload_digest(payload(3))
    plain = torch.load(path, weights_only=True)  # still an ordinary torch file
    assert plain["update_index"] == 3
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left


def test_digest_covers_every_value() -> None:
    base = checkpoint.payload_digest(payload(0))
    changed = payload(0)
    changed["nested"][0]["step"] = torch.tensor(6.0)
    assert checkpoint.payload_digest(changed) != base
    changed = payload(0)
    changed["half"] = changed["half"].float()  # same values, other dtype
    assert checkpoint.payload_digest(changed) != base
    changed = payload(0)
    changed["weights"] = changed["weights"].reshape(16, 16)  # same bytes, other shape
    assert checkpoint.payload_digest(changed) != base
    assert checkpoint.payload_digest({**payload(0), "sha256": "ignored"}) == base


def test_bit_flip_in_tensor_data_is_detected(tmp_path: Path) -> None:
    """torch.load alone returns silently changed values; the SHA-256 catches the flip."""
    path = tmp_path / "a.pt"
    checkpoint.atomic_save(payload(0), path)
    flip_bit_in(path, weights_bytes(0))
    silently_wrong = torch.load(path, weights_only=True)["weights"]
    assert not torch.equal(silently_wrong, payload(0)["weights"])
    with pytest.raises(CheckpointError, match=r"a\.pt is corrupted: its contents hash"):
        checkpoint.load(path)


def test_edited_value_without_new_digest_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "a.pt"
    checkpoint.atomic_save(payload(0), path)
    tampered = torch.load(path, weights_only=True)
    tampered["update_index"] = 99
    torch.save(tampered, path)
    with pytest.raises(CheckpointError, match="corrupted"):
        checkpoint.load(path)


@pytest.mark.parametrize("keep_fraction", [0.0, 0.3, 0.9])
def test_truncated_file_is_detected(tmp_path: Path, keep_fraction: float) -> None:
    path = tmp_path / "a.pt"
    checkpoint.atomic_save(payload(0), path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep_fraction)])
    with pytest.raises(CheckpointError, match=r"a\.pt cannot be loaded safely \(truncated"):
        checkpoint.load(path)


def test_missing_digest_and_old_format_are_refused(tmp_path: Path) -> None:
    no_digest = tmp_path / "no-digest.pt"
    torch.save(payload(0), no_digest)
    with pytest.raises(CheckpointError, match="corrupted"):
        checkpoint.load(no_digest)
    old = tmp_path / "old.pt"
    torch.save({**payload(0), "format_version": 1}, old)
    with pytest.raises(
        CheckpointError, match="format version 1; this grpo_trainer reads version 3"
    ):
        checkpoint.load(old)
    other = tmp_path / "other.pt"
    torch.save({"state_dict": torch.zeros(2)}, other)
    with pytest.raises(CheckpointError, match="not a grpo_trainer checkpoint"):
        checkpoint.load(other)


# -- loading never runs code -------------------------------------------------------------------


class _Exploit:
    """Unpickling this calls `exec`, which writes the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("container", ["torch_zip", "raw_pickle", "nested_in_checkpoint"])
def test_crafted_pickle_is_refused_without_running_it(tmp_path: Path, container: str) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    if container == "torch_zip":
        torch.save(_Exploit(marker), path)
    elif container == "raw_pickle":
        path.write_bytes(pickle.dumps(_Exploit(marker)))
    else:  # a real-looking checkpoint whose config hides the object
        torch.save({**payload(0), "config": {"activation": _Exploit(marker)}}, path)

    with pytest.raises(CheckpointError, match="cannot be loaded safely"):
        checkpoint.load(path)
    with pytest.raises(CheckpointError):
        checkpoint.load_for_resume(path)
    assert not marker.exists()

    # The file really is an exploit: an unsafe load runs it (all it does is touch the marker).
    with contextlib.suppress(Exception):
        torch.load(path, weights_only=False)
    assert marker.exists()


# -- resume fallback and rotation --------------------------------------------------------------


def save_updates(folder: Path, updates: range, keep: int = 3) -> None:
    for u in updates:
        checkpoint.save_rotating(payload(u), folder, u, keep)


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_keeps_the_last_k_numbered_files_and_last_pt(tmp_path: Path) -> None:
    save_updates(tmp_path, range(1, 7), keep=2)
    assert names(tmp_path) == ["last.pt", "update-0000005.pt", "update-0000006.pt"]
    assert checkpoint.load(tmp_path / "last.pt")["update_index"] == 6


def test_resume_prefers_newest_and_falls_back_past_damage(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    folder = run_dir / "checkpoints"
    save_updates(folder, range(1, 5))  # keeps 2, 3, 4 and last.pt (= 4)

    found, where = checkpoint.load_for_resume(run_dir)
    assert (found["update_index"], where.name) == (4, "update-0000004.pt")

    flip_bit_in(folder / "update-0000004.pt", weights_bytes(4))
    with pytest.warns(RuntimeWarning, match=r"skipping unusable checkpoint.*update-0000004"):
        found, where = checkpoint.load_for_resume(run_dir)
    assert (found["update_index"], where.name) == (4, "last.pt")  # its intact twin

    (folder / "last.pt").write_bytes(b"\x00" * 100)
    with pytest.warns(RuntimeWarning) as caught:
        found, where = checkpoint.load_for_resume(folder)  # the folder itself works too
    assert (found["update_index"], where.name) == (3, "update-0000003.pt")
    assert len(caught) == 2


def test_kill_between_numbered_file_and_last_pt_resumes_from_the_newer(tmp_path: Path) -> None:
    save_updates(tmp_path, range(1, 3))
    checkpoint.atomic_save(payload(3), tmp_path / "update-0000003.pt")  # killed before last.pt
    found, where = checkpoint.load_for_resume(tmp_path)
    assert (found["update_index"], where.name) == (3, "update-0000003.pt")


def test_no_usable_checkpoint_lists_every_failure(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        checkpoint.load_for_resume(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.load_for_resume(tmp_path / "nope")
    save_updates(tmp_path, range(1, 3))
    for p in tmp_path.iterdir():
        p.write_bytes(p.read_bytes()[:50])
    with (
        warnings.catch_warnings(),
        pytest.raises(CheckpointError, match="no usable checkpoint") as info,
    ):
        warnings.simplefilter("ignore")
        checkpoint.load_for_resume(tmp_path)
    assert str(info.value).count("cannot be loaded safely") == 3


def test_numbered_files_from_an_abandoned_history_are_removed(tmp_path: Path) -> None:
    """Resuming from update 3 and saving makes 4 and 5 stale; "newest" must mean update 3."""
    save_updates(tmp_path, range(1, 6))
    checkpoint.save_rotating(payload(3), tmp_path, 3, keep=3)
    assert names(tmp_path) == ["last.pt", "update-0000003.pt"]
    assert checkpoint.load_for_resume(tmp_path)[0]["update_index"] == 3


def test_temp_files_of_dead_processes_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".update-0000001.pt.tmp-{dead.pid}"
    stale.write_bytes(b"partial")
    alive = tmp_path / f".last.pt.tmp-{os.getppid()}"  # a live writer's file
    alive.write_bytes(b"in progress")
    save_updates(tmp_path, range(1, 2))
    assert not stale.exists()
    assert alive.exists()


# -- compatibility -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("saved", "resumed", "match"),
    [
        ({}, {"env_kwargs": {"max_fruits": 2}}, r"observation_space: checkpoint 'Box"),
        ({"hidden_sizes": (8,)}, {"hidden_sizes": (8, 8)}, r"hidden_sizes: checkpoint \[8\]"),
        ({"hidden_sizes": (8,)}, {"hidden_sizes": (16,)}, r"this config \[16\]"),
        # Same tensor shapes: without the config check this would load silently.
        ({"activation": "tanh"}, {"activation": "relu"}, "activation: checkpoint 'tanh'"),
    ],
)
def test_incompatible_checkpoint_is_refused_naming_the_mismatch(
    tmp_path: Path, saved: dict, resumed: dict, match: str
) -> None:
    path = tmp_path / "a.pt"
    checkpoint.atomic_save(make_trainer(**saved).state_dict(), path)
    with pytest.raises(CheckpointError, match=r"a\.pt is incompatible with this run: .*" + match):
        make_trainer(**{**resumed, "run": {"resume": str(path)}})


@pytest.mark.parametrize(("saved_fused", "resumed_fused"), [(False, True), (True, False)])
def test_resume_across_optimizer_implementations(
    tmp_path: Path, saved_fused: bool, resumed_fused: bool
) -> None:
    """A foreach checkpoint resumed with fused AdamW (and back) keeps this run's choice."""
    first = make_trainer(run={"fused_optimizer": saved_fused})
    first.update()
    path = tmp_path / "a.pt"
    checkpoint.atomic_save(first.state_dict(), path)
    second = make_trainer(run={"fused_optimizer": resumed_fused, "resume": str(path)})
    assert second.optimizer_step.fused is resumed_fused
    assert bool(second.optimizer.param_groups[0]["fused"]) is resumed_fused
    metrics = second.update()  # the fused path passes found_inf: a foreach group would assert
    assert metrics["update"] == 2
    assert metrics["skipped_steps"] == 0


def test_resume_with_a_new_kl_reference_starts_it_from_the_checkpoint(tmp_path: Path) -> None:
    first = make_trainer()
    first.update()
    path = tmp_path / "a.pt"
    checkpoint.atomic_save(first.state_dict(), path)
    second = make_trainer(kl_coef=0.1, run={"resume": str(path)})
    assert second.reference is not None
    for ref, pol in zip(
        second.reference.state_dict().values(), first.policy.state_dict().values(), strict=True
    ):
        assert torch.equal(ref, pol)


def test_an_older_format_is_refused_by_eval_and_resume_alike(tmp_path: Path) -> None:
    """A version-2 checkpoint (whole-episode rollouts, `minibatches`) is neither resumed nor
    played: both name the versions, rather than translate its config."""
    trainer = make_trainer(tmp_path / "run")
    state = trainer.state_dict()
    state["format_version"] = 2
    state["config"] = {**state["config"], "minibatches": 8}
    del state["config"]["minibatch_size"]
    path = tmp_path / "v2.pt"
    checkpoint.atomic_save(state, path)
    with pytest.raises(checkpoint.CheckpointError, match=r"format version 2; .* reads version 3"):
        checkpoint.load_for_resume(path)
    from grpo_trainer.run.evaluation import load_policy

    with pytest.raises(checkpoint.CheckpointError, match=r"format version 2; .* reads version 3"):
        load_policy(path, torch.device("cpu"))
