"""`--wandb`: a tiny run logged offline holds the config, every metric row and the
evaluations; without wandb the run refuses before it starts, naming the fix."""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.envs import make_envs
from grpo_trainer.tools.cli import main

BLOCK = 32_768  # the .wandb file is a log of records in 32 KiB blocks


def _records(path: Path) -> Iterator[Any]:
    """The protobuf records of an offline run's `.wandb` file (a LevelDB-style log: a 7-byte
    file header, then chunks with a 7-byte header each: checksum, length, type).

    `run.finish()` returns once W&B's service has the run's records, not once it has written
    them all (under load the file was seen without its run or history records), so the
    service is shut down first: that flushes and closes every file it holds."""
    import wandb
    from wandb.proto import wandb_internal_pb2

    wandb.teardown()
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # the block's zero padding
            pos += left
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _history(path: Path) -> list[dict[str, Any]]:
    """The history rows of an offline run's `.wandb` file, keyed by metric name."""
    return [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
        for record in _records(path)
        if record.WhichOneof("record_type") == "history"
    ]


def _offline_run(folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """(config, history rows, file names) of the one offline run under `folder`."""
    (path,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    config: dict[str, Any] = {}
    files: list[str] = []
    for record in _records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "files":
            files += [f.path for f in record.files.files]
    return config, _history(path), files


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return tmp_path


def _config(tmp_path: Path, **run: Any) -> GRPOConfig:
    settings: dict[str, Any] = {
        "env": "CartPole-v1",
        "device": "cpu",
        "progress": False,
        "eval_every": 512,
        "eval_episodes": 4,
        "run_dir": str(tmp_path / "run"),
        "wandb": True,
        "wandb_mode": "offline",
        "wandb_project": "grpo-test",
    }
    run_config = RunConfig(**{**settings, **run})
    return GRPOConfig(
        num_groups=4, group_size=4, rollout_steps=32, total_env_steps=1024, run=run_config
    )


def test_offline_run_holds_config_every_metric_row_and_the_evaluations(offline: Path) -> None:
    config = _config(offline)
    trainer = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
    trainer.train()
    logged, rows, _files = _offline_run(offline / "run")
    logged = {
        k: v["value"] if isinstance(v, dict) and set(v) == {"value"} else v
        for k, v in logged.items()
    }
    assert logged["num_groups"] == 4 and logged["run"]["wandb"] is True
    assert logged["run"]["env"] == "CartPole-v1"
    metric_rows = [r for r in rows if "loss" in r]
    written = [json.loads(line) for line in (offline / "run" / "metrics.jsonl").open()]
    assert len(metric_rows) == len(written) == trainer.update_index == 2
    assert [r["_step"] for r in metric_rows] == [512, 1024]  # step = env steps
    for row, line in zip(metric_rows, written, strict=True):
        assert row["env_steps"] == line["env_steps"]
        assert row["loss"] == pytest.approx(line["loss"])
        assert "return_mean" not in line or row["return_mean"] == pytest.approx(line["return_mean"])
    evaluated = [r for r in rows if "eval_score" in r]
    assert [r["_step"] for r in evaluated] == [512, 1024]
    assert {"eval_return_mean", "eval_s"} <= set(evaluated[0])
    media = {key.split("/")[0] for key in rows[-1] if "/" in key}  # logged at the end
    run_dir = offline / "run"
    # the curve needs matplotlib (plot extra), the GIF Pillow (video extra): make test has both
    expected = {
        name
        for name, module in (("learning_curve", "matplotlib"), ("agent", "PIL"))
        if importlib.util.find_spec(module) is not None
    }
    assert media == expected
    assert (run_dir / "agent.gif").exists() == ("agent" in expected)


def test_the_run_name_defaults_to_the_run_directory(offline: Path) -> None:
    config = _config(offline)
    trainer = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
    trainer.train()
    (path,) = (offline / "run").glob("wandb/offline-run-*/run-*.wandb")
    runs = [r.run for r in _records(path) if r.WhichOneof("record_type") == "run"]
    assert runs[0].display_name == "run" and runs[0].project == "grpo-test"


def test_a_run_that_raises_finishes_its_wandb_run_with_exit_code_1(offline: Path) -> None:
    from grpo_trainer.run.callbacks import Callback

    class Boom(Callback):
        def on_update(self, state: Any, metrics: dict[str, float]) -> None:
            raise RuntimeError("boom")

    config = _config(offline, eval_every=0)
    trainer = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train(callbacks=[Boom()])
    (path,) = (offline / "run").glob("wandb/offline-run-*/run-*.wandb")
    exits = [r.exit for r in _records(path) if r.WhichOneof("record_type") == "exit"]
    assert [e.exit_code for e in exits] == [1]


def test_only_rank_0_logs(offline: Path) -> None:
    config = _config(offline, eval_every=0)
    trainer = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
    trainer.collective.rank = 1  # what another rank of a distributed run sees
    trainer.train()
    assert not list(offline.rglob("*.wandb"))


def test_without_wandb_training_refuses_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails
    config = _config(tmp_path)
    trainer = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
    with pytest.raises(ImportError, match=r"pip install .*\[wandb\].*--no-wandb"):
        trainer.train()
    assert trainer.env_steps == 0 and not (tmp_path / "run").exists()


def test_cli_without_wandb_exits_2_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    flags = ["--env", "CartPole-v1", "--device", "cpu", "--num-groups", "2", "--group-size", "2"]
    with pytest.raises(SystemExit) as exit_:
        main(["train", *flags, "--total-env-steps", "64", "--no-progress", "--wandb"])
    assert exit_.value.code == 2
    assert "--no-wandb" in capsys.readouterr().err


def test_wandb_flags_reach_the_config() -> None:
    from grpo_trainer.tools.cli import build_parser, config_from_args

    args = build_parser().parse_args(
        [
            *("train", "--wandb", "--wandb-project", "P", "--wandb-entity", "E"),
            *("--wandb-name", "N", "--wandb-mode", "offline"),
        ]
    )
    del args.command, args.verbose
    run = config_from_args(args).run
    assert (run.wandb, run.wandb_project, run.wandb_entity) == (True, "P", "E")
    assert (run.wandb_name, run.wandb_mode) == ("N", "offline")
    with pytest.raises(ValueError, match="wandb_mode"):
        RunConfig(wandb_mode="sometimes")  # type: ignore[arg-type]


def test_a_resumed_run_continues_its_wandb_run(offline: Path) -> None:
    config = _config(offline, eval_every=0)
    trainer = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
    trainer.train()
    run_dir = offline / "run"
    first_id = (run_dir / "wandb_run_id").read_text().strip()
    data = config.to_dict()
    data["total_env_steps"], data["run"]["resume"] = 2048, str(run_dir)
    more = GRPOConfig.from_dict(data)
    GRPOTrainer(make_envs(more, more.num_envs, torch.device("cpu")), more).train()
    logs = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(logs) == 2  # one log per process, the same W&B run
    ids = [
        [r.run.run_id for r in _records(p) if r.WhichOneof("record_type") == "run"] for p in logs
    ]
    assert {i for found in ids for i in found} == {first_id}
    kinds = [sorted({r.WhichOneof("record_type") for r in _records(p)}) for p in logs]
    # each process's metric rows, in whatever order W&B named the folders
    steps = sorted([row["_step"] for row in _history(path) if "loss" in row] for path in logs)
    assert steps == [[512, 1024], [1536, 2048]], kinds  # the curves go on where they stopped


def test_a_new_run_in_a_used_run_directory_starts_a_new_wandb_run(offline: Path) -> None:
    """The second run replaces the first (`overwrite`: a fresh run refuses a folder that
    holds a run otherwise) and logs as a new W&B run beside the first's log."""
    for overwrite in (False, True):
        config = _config(offline, eval_every=0, overwrite=overwrite)
        GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config).train()
    logs = sorted((offline / "run").glob("wandb/offline-run-*/run-*.wandb"))
    ids = {r.run.run_id for p in logs for r in _records(p) if r.WhichOneof("record_type") == "run"}
    assert len(logs) == 2 and len(ids) == 2
