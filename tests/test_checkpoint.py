"""Checkpoints: full round-trip, bit-exact resume, atomic writes, rotation, safe loading."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.base import checkpoint
from grpo_trainer.base.checkpoint import CheckpointError
from grpo_trainer.base.config import describe

# 4 groups x 4 members x 24-step games: 384 valid steps per update.
STEPS_PER_UPDATE = 16 * 24


def _trainer(*, run_dir: Path | None = None, resume: Path | None = None, **kw: Any) -> GRPOTrainer:
    run = RunConfig(
        progress=False,
        device="cpu",
        seed=kw.pop("seed", 5),
        run_dir=str(run_dir) if run_dir else None,
        resume=str(resume) if resume else None,
        checkpoint_every=kw.pop("checkpoint_every", 0),
        keep_checkpoints=kw.pop("keep_checkpoints", 3),
    )
    fields: dict[str, Any] = {
        "num_groups": 4,
        "group_size": 4,
        "rollout_steps": 24,
        "window": 6,
        "minibatch_size": 128,
        "hidden_sizes": (16,),
        "lr": 1e-2,
        "kl_coef": 0.1,  # so the reference policy is saved and restored too
        "total_env_steps": 10**6,
    }
    cfg = GRPOConfig(**{**fields, **kw}, run=run)
    envs = gym.make_vec("FruitCatcher-v0", num_envs=cfg.num_envs, max_episode_steps=24)  # games end
    return GRPOTrainer(envs, cfg)


def _assert_same_state(a: GRPOTrainer, b: GRPOTrainer) -> None:
    """Parameters, reference, optimizer state, generator and counters are identical."""
    for (name, x), (_, y) in zip(
        a.policy.state_dict().items(), b.policy.state_dict().items(), strict=True
    ):
        assert torch.equal(x, y), name
    assert a.reference is not None and b.reference is not None
    for x, y in zip(a.reference.parameters(), b.reference.parameters(), strict=True):
        assert torch.equal(x, y)
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys() and sa["state"]
    for key in sa["state"]:
        for field, value in sa["state"][key].items():
            assert torch.equal(value, sb["state"][key][field]), (key, field)
    assert torch.equal(a.generator.get_state(), b.generator.get_state())
    assert (a.update_index, a.env_steps) == (b.update_index, b.env_steps)
    assert a.rollout.horizon == b.rollout.horizon


def test_state_dict_round_trip(tmp_path: Path) -> None:
    """state_dict -> atomic_save -> load into a fresh trainer restores everything; what the
    run saved beside the trainer's state (best.pt's score) comes back as checkpoint_extras."""
    trained = _trainer()
    for _ in range(2):
        trained.update()
    path = tmp_path / "ckpt.pt"
    run_state = {"best_score": 1.5, "best_by": "eval_score"}
    checkpoint.atomic_save({**trained.state_dict(), **run_state}, path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary left behind

    fresh = _trainer(seed=99)  # different initial weights and generator
    assert fresh.load(path) == path
    _assert_same_state(trained, fresh)
    assert fresh.update_index == 2 and fresh.env_steps == 2 * STEPS_PER_UPDATE
    assert fresh.checkpoint_extras == run_state


def test_checkpoint_holds_only_plain_data(tmp_path: Path) -> None:
    """A checkpoint loads with weights_only=True and carries the config as JSON data."""
    trainer = _trainer()
    trainer.update()
    path = tmp_path / "c.pt"
    checkpoint.atomic_save(trainer.state_dict(), path)
    payload = torch.load(path, weights_only=True)
    assert payload["format_version"] == checkpoint.FORMAT_VERSION
    assert GRPOConfig.from_dict(payload["config"]) == trainer.config
    assert payload["spaces"]["action_space"] == "Discrete(3)"


def test_exact_resume_is_bit_identical(tmp_path: Path) -> None:
    """Train K updates, checkpoint, continue M; a fresh trainer loaded from the checkpoint and
    run for M updates ends with bit-identical weights (CPU, fixed seeds)."""
    k, m = 2, 3
    original = _trainer()
    for _ in range(k):
        original.update()
    path = tmp_path / "k.pt"
    checkpoint.atomic_save(original.state_dict(), path)
    expected = [original.update() for _ in range(m)]

    resumed = _trainer()  # same config (its seed also seeds the groups' games)
    resumed.load(path)
    got = [resumed.update() for _ in range(m)]
    _assert_same_state(original, resumed)
    for a, b in zip(expected, got, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if not key.startswith("mem_") and not key.endswith("_s") and key != "steps_per_s":
                assert a[key] == b[key], key


def test_resume_via_run_config(tmp_path: Path) -> None:
    """RunConfig(resume=run_dir) continues from the newest checkpoint to the same result as an
    uninterrupted run (constant lr, so the schedule does not depend on the budget)."""
    budget = 4 * STEPS_PER_UPDATE
    straight = _trainer(total_env_steps=budget, lr_schedule="constant")
    straight.train()

    first = tmp_path / "first"
    part = _trainer(run_dir=first, total_env_steps=2 * STEPS_PER_UPDATE, lr_schedule="constant")
    part.train()
    assert part.update_index == 2
    assert (first / "checkpoints" / "last.pt").is_file()

    resumed = _trainer(
        run_dir=tmp_path / "second", resume=first, total_env_steps=budget, lr_schedule="constant"
    )
    assert resumed.update_index == 2  # loaded in the constructor
    resumed.train()
    assert resumed.update_index == straight.update_index == 4
    for x, y in zip(straight.policy.parameters(), resumed.policy.parameters(), strict=True):
        assert torch.equal(x, y)


def test_resume_from_a_numbered_checkpoint_file(tmp_path: Path) -> None:
    """A periodic checkpoint file resumes at its own update, whatever came after it."""
    budget = 3 * STEPS_PER_UPDATE
    run_dir = tmp_path / "run"
    full = _trainer(run_dir=run_dir, total_env_steps=budget, checkpoint_every=1)
    full.train()
    middle = run_dir / "checkpoints" / "update-0000001.pt"
    resumed = _trainer(resume=middle, total_env_steps=budget)
    assert resumed.update_index == 1
    resumed.train()
    _assert_same_state(full, resumed)


def test_periodic_checkpoint_records_the_best_score_so_far(tmp_path: Path) -> None:
    """update-N.pt's best_score (without evaluation, the best training return of updates
    1..N), so that a run resumed from it does not overwrite best.pt with a worse policy."""
    run_dir = tmp_path / "run"
    _trainer(run_dir=run_dir, total_env_steps=2 * STEPS_PER_UPDATE, checkpoint_every=1).train()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = checkpoint.load(run_dir / "checkpoints" / "update-0000001.pt")
    assert first["best_score"] == rows[0]["return_mean"]


def test_run_dir_layout_rotation_and_best(tmp_path: Path) -> None:
    """train() writes config.json, one metrics line per update, the newest `keep` numbered
    checkpoints, last.pt (the final state) and best.pt (the best mean return)."""
    run_dir = tmp_path / "run"
    trainer = _trainer(
        run_dir=run_dir,
        total_env_steps=5 * STEPS_PER_UPDATE,
        checkpoint_every=1,
        keep_checkpoints=2,
    )
    trainer.train()
    saved = json.loads((run_dir / "config.json").read_text())
    assert GRPOConfig.from_dict(saved).resolve(None) == trainer.config  # derived again
    # every field's one-line description rides along (ignored when the file is read back)
    expected = {
        **{f.name: describe(GRPOConfig, f.name) for f in dataclasses.fields(GRPOConfig)},
        **{f"run.{f.name}": describe(RunConfig, f.name) for f in dataclasses.fields(RunConfig)},
    }
    del expected["run"]
    assert saved["_help"] == expected
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2, 3, 4, 5]
    folder = run_dir / "checkpoints"
    assert sorted(p.name for p in folder.glob("update-*.pt")) == [
        "update-0000004.pt",
        "update-0000005.pt",
    ]
    assert not list(folder.glob(".*tmp*"))
    last = checkpoint.load(folder / "last.pt")
    assert last["update_index"] == 5
    best = checkpoint.load(folder / "best.pt")
    best_row = max(rows, key=lambda r: r["return_mean"])
    assert best["best_score"] == best_row["return_mean"]
    assert best["update_index"] == best_row["update"]


def test_atomic_save_keeps_the_old_file_when_writing_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure mid-write leaves the previous checkpoint intact and no temporary file."""
    path = tmp_path / "last.pt"
    checkpoint.atomic_save({"format_version": checkpoint.FORMAT_VERSION, "x": 1}, path)

    def failing_save(obj: Any, f: Any) -> None:
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.atomic_save({"format_version": checkpoint.FORMAT_VERSION, "x": 2}, path)
    monkeypatch.undo()
    assert checkpoint.load(path)["x"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_corrupted_last_falls_back_to_an_older_checkpoint(tmp_path: Path) -> None:
    """Resuming from a run directory skips a truncated last.pt, with a warning."""
    folder = tmp_path / "checkpoints"
    for update in (1, 2):
        checkpoint.save_rotating(
            {"format_version": checkpoint.FORMAT_VERSION, "update_index": update}, folder, update, 3
        )
    for name in ("last.pt", "update-0000002.pt"):  # the newest state, in both its copies
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: len(data) // 2])
    with pytest.warns(RuntimeWarning, match="skipping unusable checkpoint"):
        payload, found = checkpoint.load_for_resume(tmp_path)
    assert found == folder / "update-0000001.pt" and payload["update_index"] == 1


def test_no_usable_checkpoint_raises(tmp_path: Path) -> None:
    """A missing file, an empty run directory, or only corrupted files: CheckpointError."""
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.load(tmp_path / "nope.pt")
    with pytest.raises(CheckpointError, match=r"no (usable )?checkpoint in"):
        checkpoint.load_for_resume(tmp_path)
    (tmp_path / "last.pt").write_bytes(b"not a checkpoint")
    with (
        pytest.warns(RuntimeWarning, match="skipping"),
        pytest.raises(CheckpointError, match="no usable checkpoint"),
    ):
        checkpoint.load_for_resume(tmp_path)


class _Payload:
    """Not plain data: unpickling it would run code, so weights_only loading must refuse it."""


def test_loading_refuses_arbitrary_objects(tmp_path: Path) -> None:
    """Files holding pickled objects, or dicts that are not ours, are rejected."""
    path = tmp_path / "evil.pt"
    torch.save({"format_version": checkpoint.FORMAT_VERSION, "x": _Payload()}, path)
    with pytest.raises(CheckpointError, match="cannot be loaded safely"):
        checkpoint.load(path)
    torch.save({"weights": torch.zeros(1)}, path)
    with pytest.raises(CheckpointError, match="not a grpo_trainer checkpoint"):
        checkpoint.load(path)


def test_incompatible_checkpoints_are_refused(tmp_path: Path) -> None:
    """A checkpoint from other spaces or another network shape raises CheckpointError."""
    trainer = _trainer()
    path = tmp_path / "c.pt"
    checkpoint.atomic_save(trainer.state_dict(), path)

    pixels = gym.make_vec("FruitCatcher-v0", num_envs=16, obs_mode="pixels")
    run = RunConfig(progress=False, device="cpu")
    other_space = GRPOTrainer(
        pixels, GRPOConfig(num_groups=4, group_size=4, rollout_steps=8, run=run)
    )
    with pytest.raises(CheckpointError, match="observation_space"):
        other_space.load(path)

    wider = _trainer(hidden_sizes=(32,))
    with pytest.raises(CheckpointError, match="hidden_sizes"):
        wider.load(path)


def test_a_rollout_state_with_an_entry_missing_is_refused_by_name(tmp_path: Path) -> None:
    """A checkpoint whose episodes in play lack an entry this version writes (here `own`,
    which marks episodes played from their start) cannot be continued: the resume says
    which, instead of guessing the entry."""
    trainer = _trainer()
    trainer.update()
    state = trainer.state_dict()
    del state["rollouts"][0]["own"]
    path = tmp_path / "no-own.pt"
    checkpoint.atomic_save(state, path)
    with pytest.raises(CheckpointError, match=r"no-own\.pt: its rollout state lacks own \("):
        _trainer().load(path)


def test_sigint_stops_after_the_update_and_checkpoints(tmp_path: Path) -> None:
    """SIGINT during an update finishes it, writes last.pt and returns."""
    trainer = _trainer(run_dir=tmp_path / "run", total_env_steps=10**6)
    collect = trainer.collect

    def collect_then_interrupt() -> Any:
        rollout = collect()
        os.kill(os.getpid(), signal.SIGINT)  # mid-update: handled as a stop request
        return rollout

    trainer.collect = collect_then_interrupt  # type: ignore[method-assign]
    handler = signal.getsignal(signal.SIGINT)
    metrics = trainer.train()
    assert trainer.update_index == 1 and metrics["update"] == 1
    assert checkpoint.load(tmp_path / "run" / "checkpoints" / "last.pt")["update_index"] == 1
    assert signal.getsignal(signal.SIGINT) is handler  # the previous handler is restored


def test_exact_resume_keeps_the_correlated_exploration_noise(tmp_path: Path) -> None:
    """With noise_correlation, a sub-env's next noise depends on its last: the checkpoint
    carries it, so a resumed run samples the same actions as an uninterrupted one."""

    pytest.importorskip("gymnax")  # its state is arrays: a checkpoint holds the env's too
    from grpo_trainer.envs import make_envs

    def pendulum() -> GRPOTrainer:
        run = RunConfig(env="gymnax:Pendulum-v1", progress=False, device="cpu", seed=3)
        config = GRPOConfig(
            num_groups=2, group_size=4, noise_correlation=0.9, hidden_sizes=(8,), run=run
        )
        return GRPOTrainer(make_envs(config, 8, torch.device("cpu")), config)

    original = pendulum()
    original.update()
    path = tmp_path / "p.pt"
    checkpoint.atomic_save(original.state_dict(), path)
    original.update()
    resumed = pendulum()
    resumed.load(path)
    resumed.update()
    assert torch.equal(original.rollout.noise.last, resumed.rollout.noise.last)
    for x, y in zip(original.policy.parameters(), resumed.policy.parameters(), strict=True):
        assert torch.equal(x, y)
