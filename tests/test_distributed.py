"""Data-parallel GRPO on CPU: two gloo ranks started by `torchrun --standalone`.

One torchrun launch runs `_worker` (this file as a script) through several scenarios and
saves what each rank saw; the tests below check those files against each other and against a
single process given the concatenated batch. A second launch runs the real CLI end to end.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import grpo_trainer.trainer as trainer_module
from grpo_trainer import checkpoint, distributed
from grpo_trainer.config import GRPOConfig, RunConfig
from grpo_trainer.evaluation import make_envs
from grpo_trainer.rollout import RolloutStats
from grpo_trainer.trainer import GRPOTrainer

ROOT = Path(__file__).resolve().parents[1]
SUBPROCESS_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    "OMP_NUM_THREADS": "1",
}
GROUPS = 4  # per rank
TIMING_KEYS = ("rollout_s", "update_s", "steps_per_s", "warmup_s")


def _config(**overrides: Any) -> GRPOConfig:
    # Short games (first to +-3) that end at different steps, so masks and episode stats matter.
    run = RunConfig(
        env="fruit_env:FruitCatcher-v0",
        env_kwargs={"win_score": 3, "lose_score": -3, "max_episode_steps": 30},
        device="cpu",
        seed=3,
        progress=False,
        **overrides.pop("run", {}),
    )
    fields = {"num_groups": GROUPS, "group_size": 4, "max_episode_steps": 30, "lr": 1e-3}
    return GRPOConfig(**{**fields, **overrides}, run=run)


def _trainer(config: GRPOConfig) -> GRPOTrainer:
    return GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)


def _flat_params(trainer: GRPOTrainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in trainer.policy.parameters()])


def _torchrun(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return subprocess.run(
        [*command, "--nproc-per-node=2", *args],
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


# -- the worker (run by torchrun, not by pytest) ---------------------------------------------


def _worker(out: Path) -> None:
    """Each rank records, per scenario, what the parent test needs to compare."""
    torch.set_num_threads(1)
    device = distributed.init_from_env(torch.device("cpu"))
    rank = distributed.rank_and_world()[0]
    record: dict[str, Any] = {}

    # A. One update with one minibatch and one epoch: well defined against one process.
    # batch_std: the advantage scale, too, must be that of the concatenated batch.
    trainer = _trainer(_config(epochs=1, minibatches=1, scale="batch_std"))
    assert trainer.world_size == 2 and trainer.device == device
    stats: list[RolloutStats] = []
    collect = trainer_module.collect

    def recording_collect(*args: Any) -> RolloutStats:
        stats.append(collect(*args))
        return stats[-1]

    trainer_module.collect = recording_collect
    before = _flat_params(trainer)
    metrics = trainer.update()
    trainer_module.collect = collect
    h = int(metrics["horizon"])
    buffer = trainer.buffer
    record["equivalence"] = {
        "before": before,
        "after": _flat_params(trainer),
        "grads": torch.cat([p.grad.flatten() for p in trainer.policy.parameters()]),
        "metrics": metrics,
        "rollout": {
            "obs": buffer.obs[:h].clone(),
            "actions": buffer.actions[:h].clone(),
            "logp": buffer.logp[:h].clone(),
            "rewards": buffer.rewards[:h].clone(),
            "lengths": buffer.lengths.clone(),
            "finished": stats[0].finished,
            "info_sums": dict(stats[0].info_sums),
            "info_counts": dict(stats[0].info_counts),
        },
    }

    # B. Several shuffled minibatches, micro-batches and a KL reference: replicas stay equal.
    config = _config(
        scale="group_std",
        epochs=2,
        minibatches=2,
        micro_batches=2,
        kl_coef=0.05,
        ref_update_every=2,
        run={"run_dir": str(out / "run")},
    )
    trainer = _trainer(config)
    record["updates"] = []
    for i in range(3):
        metrics = trainer.update()
        if i == 1:
            trainer._checkpoint(metrics)  # rank 0 writes update-0000002.pt
        record["updates"].append({"params": _flat_params(trainer), "metrics": metrics})
    distributed.barrier()

    # C. Resume the checkpoint after update 2 on the same world size: update 3 again.
    saved = out / "run" / "checkpoints" / "update-0000002.pt"
    run = dataclasses.replace(config.run, run_dir=None, resume=str(saved))
    resumed = _trainer(dataclasses.replace(config, run=run))
    record["resumed"] = {"params": _flat_params(resumed), "metrics": resumed.update()}
    record["resumed"]["params_after"] = _flat_params(resumed)

    # D. A signal reaching only rank 1 stops both ranks after the same update.
    if rank == 1:
        resumed._pending_signal = "SIGTERM"
    resumed.update()
    record["stop_signal"] = resumed._stop_signal

    # E. Metric names that differ between ranks (no episode ended on rank 1) still reduce.
    local = {"length_mean": torch.tensor(1.0 + 2 * rank)}
    if rank == 0:
        local["episode_r"] = torch.tensor(4.0)
    counts = {"episode_r": torch.tensor(2.0)} if rank == 0 else {}
    reduced = distributed.reduce_metrics(local, counts, stop=False)
    record["mismatched"] = {k: float(v) for k, v in reduced.items()}

    record["checkpoint"] = str(saved)
    torch.save(record, out / f"rank{rank}.pt")
    distributed.shutdown()


# -- the tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], ...]:
    out = tmp_path_factory.mktemp("ddp")
    done = _torchrun(__file__, str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return tuple(torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2))


def test_parameters_are_identical_on_both_ranks_after_every_update(ranks: Any) -> None:
    first, second = ranks
    previous = first["updates"][0]["params"]
    for i, (a, b) in enumerate(zip(first["updates"], second["updates"], strict=True)):
        assert torch.equal(a["params"], b["params"]), f"replicas diverged at update {i + 1}"
        if i:
            assert not torch.equal(a["params"], previous), "the update changed nothing"
        previous = a["params"]


def test_ranks_agree_on_metrics_counters_and_horizon(ranks: Any) -> None:
    first, second = ranks
    env_steps = 0
    for a, b in zip(first["updates"], second["updates"], strict=True):
        a, b = a["metrics"], b["metrics"]
        shared = {k for k in a if not k.startswith("mem_") and k not in TIMING_KEYS}
        assert shared == {k for k in b if not k.startswith("mem_") and k not in TIMING_KEYS}
        assert {k: a[k] for k in shared} == {k: b[k] for k in shared}
        env_steps += a["valid_steps"]
        assert a["env_steps"] == env_steps  # the counter advances by the steps of both ranks
        assert a["simulated_steps"] == a["horizon"] * 2 * GROUPS * 4
        assert distributed.STOP not in a
        assert not [k for k in a if k.startswith("_")]  # internal columns are consumed
        assert "episode_caught" in a  # 30-step games inside the horizon: every one ended


def test_ranks_play_different_groups(ranks: Any) -> None:
    first, second = (r["equivalence"]["rollout"] for r in ranks)
    assert not torch.equal(first["obs"][0], second["obs"][0])


def test_ddp_update_equals_one_process_update_on_the_concatenated_batch(
    ranks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ranks with G groups each take the step one process takes on all 2G groups."""
    first, second = (r["equivalence"] for r in ranks)
    rollouts = (first["rollout"], second["rollout"])
    # Ranks with unequal valid counts: a per-rank normaliser would give another step.
    assert rollouts[0]["lengths"].sum() != rollouts[1]["lengths"].sum()
    single = _trainer(_config(num_groups=2 * GROUPS, epochs=1, minibatches=1, scale="batch_std"))
    torch.nn.utils.vector_to_parameters(first["before"].clone(), single.policy.parameters())

    def concatenated(*args: Any) -> RolloutStats:
        """`collect` replaced: the buffer gets rank 0's groups, then rank 1's."""
        buffer, horizon = args[4], args[5]
        for name in ("obs", "actions", "logp", "rewards"):
            getattr(buffer, name)[:horizon] = torch.cat([r[name] for r in rollouts], dim=1)
        buffer.lengths.copy_(torch.cat([r["lengths"] for r in rollouts]))
        summed = {
            kind: {k: sum(r[kind][k] for r in rollouts) for k in rollouts[0][kind]}
            for kind in ("info_sums", "info_counts")
        }
        finished = torch.cat([r["finished"] for r in rollouts])
        return RolloutStats(finished, summed["info_sums"], summed["info_counts"])

    monkeypatch.setattr(trainer_module, "collect", concatenated)
    expected = single.update()
    grads = torch.cat([p.grad.flatten() for p in single.policy.parameters()])

    assert torch.equal(first["after"], second["after"])
    assert (first["after"] - first["before"]).abs().max() > 1e-4  # a real step was taken
    torch.testing.assert_close(first["grads"], grads, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(first["after"], _flat_params(single), rtol=0, atol=1e-6)
    got = first["metrics"]
    for key in ("valid_steps", "return_min", "return_max", "length_max", "horizon"):
        assert got[key] == expected[key], key  # sums, min and max are exact
    for key, value in expected.items():
        if key.startswith("mem_") or key in TIMING_KEYS:
            continue
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_a_resume_on_the_same_world_size_is_exact(ranks: Any) -> None:
    for rank in ranks:
        assert torch.equal(rank["resumed"]["params"], rank["updates"][1]["params"])
        assert torch.equal(rank["resumed"]["params_after"], rank["updates"][2]["params"])
        replayed, original = rank["resumed"]["metrics"], rank["updates"][2]["metrics"]
        for key in ("env_steps", "update", "return_mean", "loss", "grad_norm", "horizon"):
            assert replayed[key] == original[key], key


def test_metrics_that_only_one_rank_reports_are_reduced_over_that_rank(ranks: Any) -> None:
    expected = {"length_mean": 2.0, "episode_r": 4.0, distributed.STOP: 0.0}
    assert ranks[0]["mismatched"] == ranks[1]["mismatched"] == expected


def test_a_signal_on_one_rank_stops_every_rank_after_the_same_update(ranks: Any) -> None:
    assert ranks[0]["stop_signal"] == "a signal to another rank"
    assert ranks[1]["stop_signal"] == "SIGTERM"


def test_a_checkpoint_from_two_ranks_resumes_in_one_process(ranks: Any) -> None:
    """Weights and optimiser state are replicated, so they load on any world size."""
    saved = ranks[0]["updates"][1]
    config = _config(scale="group_std", kl_coef=0.05, run={"resume": ranks[0]["checkpoint"]})
    trainer = _trainer(config)
    assert (trainer.update_index, trainer.world_size) == (2, 1)
    assert trainer.env_steps == saved["metrics"]["env_steps"]
    assert torch.equal(_flat_params(trainer), saved["params"])
    metrics = trainer.update()
    assert metrics["update"] == 3 and math.isfinite(metrics["loss"])
    assert metrics["env_steps"] == saved["metrics"]["env_steps"] + metrics["valid_steps"]


# -- without a process group ------------------------------------------------------------------


def test_without_torchrun_no_process_group_is_created(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.init_from_env(torch.device("cpu")) == torch.device("cpu")
    assert not torch.distributed.is_initialized()
    assert distributed.rank_and_world() == (0, 1) and distributed.is_main()
    trainer = _trainer(_config())
    assert (trainer.rank, trainer.world_size) == (0, 1)
    assert trainer._log_prob_entropy == trainer.policy.log_prob_entropy  # no DDP wrapper


def test_a_cuda_index_other_than_local_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="LOCAL_RANK=0"):
        distributed._local_device(torch.device("cuda", 1), 0)


def test_rank_seeds_are_deterministic_and_distinct() -> None:
    seeds = {distributed.rank_seed(3, u, r) for u in range(50) for r in range(8)}
    assert len(seeds) == 400 and all(0 <= s < 2**63 for s in seeds)
    assert distributed.rank_seed(3, 7, 1) == distributed.rank_seed(3, 7, 1)


def test_combine_reduces_each_kind_over_the_concatenated_batch() -> None:
    """Per-rank summaries combine into the figures of the concatenated batch."""
    returns = [torch.tensor([1.0, -2.0, 4.0, 0.5]), torch.tensor([3.0, 3.5, -1.0, 2.0])]
    episode = [(torch.tensor(6.0), torch.tensor(3.0)), (torch.tensor(2.0), torch.tensor(1.0))]
    names = ["valid_steps", "return_mean", "return_std", "return_min", "return_max", "episode_r"]
    values = torch.tensor(
        [
            [7.0, r.mean(), r.std(correction=0), r.min(), r.max(), total / count]
            for r, (total, count) in zip(returns, episode, strict=True)
        ],
        dtype=torch.float64,
    )
    weights = torch.ones_like(values)
    weights[:, -1] = torch.tensor([3.0, 1.0])
    got = distributed.combine(values, weights, names)
    every = torch.cat(returns).double()
    expected = [14.0, every.mean(), every.std(correction=0), -2.0, 4.0, 8.0 / 4.0]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))


def test_combine_ignores_a_metric_missing_on_one_rank() -> None:
    values = torch.tensor([[5.0, 0.0, 2.0], [0.0, 0.0, 3.0]], dtype=torch.float64)
    weights = torch.tensor([[2.0, 0.0, 1.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    got = distributed.combine(values, weights, ["episode_r", "episode_l", "length_max"])
    assert got.tolist() == [5.0, 0.0, 3.0]


# -- the command line ---------------------------------------------------------------------------


def test_torchrun_cli_trains_and_only_rank_zero_writes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    flags = ["--env", "fruit_env:FruitCatcher-v0", "--device", "cpu", "--no-progress"]
    flags += ["--num-groups", "2", "--group-size", "4", "--max-episode-steps", "20"]
    flags += ["--epochs", "1", "--minibatches", "2"]
    flags += ["--total-env-steps", "500", "--run-dir", str(run_dir), "--checkpoint-every", "1"]
    done = _torchrun("-m", "grpo_trainer", "train", *flags)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == list(range(1, len(rows) + 1))  # one row per update
    assert rows[-1]["env_steps"] >= 500 > rows[-2]["env_steps"]
    assert rows[-1]["env_steps"] == sum(r["valid_steps"] for r in rows)
    assert rows[0]["valid_steps"] > 2 * 4 * 20 / 2  # both ranks' steps are counted
    last = checkpoint.load(run_dir / "checkpoints" / "last.pt")
    assert last["update_index"] == len(rows) and last["env_steps"] == rows[-1]["env_steps"]
    assert done.stderr.count("training fruit_env:FruitCatcher-v0") == 1  # rank 0 logs


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
