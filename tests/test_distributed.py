"""Data-parallel GRPO on CPU: two gloo ranks started by `torchrun --standalone`.

One torchrun launch runs `_worker` (this file as a script) through several scenarios and
saves what each rank saw; the tests below check those files against each other and against a
single process given the concatenated batch. A second launch runs the real CLI end to end.
"""

from __future__ import annotations

import copy
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

from grpo_trainer.algorithm.rollout import Rollout
from grpo_trainer.base import checkpoint, collective, distributed
from grpo_trainer.base.config import GRPOConfig, RunConfig
from grpo_trainer.envs import make_envs
from grpo_trainer.run.trainer import GRPOTrainer

ROOT = Path(__file__).resolve().parents[1]
SUBPROCESS_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    "OMP_NUM_THREADS": "1",
}
GROUPS = 4  # per rank
TIMING_KEYS = ("rollout_s", "update_s", "steps_per_s", "warmup_s", "train_s")


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
    fields = {"num_groups": GROUPS, "group_size": 4, "rollout_steps": 24, "window": 6, "lr": 1e-3}
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


def _cpu(rollout: Rollout) -> dict[str, Any]:
    return {
        name: {k: v.clone() for k, v in value.items()}
        if isinstance(value, dict)
        else value.clone()
        if isinstance(value, torch.Tensor)
        else value
        for name, value in rollout._asdict().items()
    }


def _worker(out: Path) -> None:
    """Each rank records, per scenario, what the parent test needs to compare."""
    torch.set_num_threads(1)
    device = distributed.init_from_env(torch.device("cpu"))
    rank = distributed.rank_and_world()[0]
    record: dict[str, Any] = {}

    # A. One update with one minibatch and one epoch: well defined against one process.
    # batch_std: the advantage scale, too, must be that of the concatenated batch.
    trainer = _trainer(_config(epochs=1, minibatch_size=10**6, scale="batch_std"))
    assert trainer.collective.world_size == 2 and trainer.device == device
    trainer.update()  # past the first update's empty look-ahead rows
    before = _flat_params(trainer)
    optimizer = copy.deepcopy(trainer.optimizer.state_dict())  # the step updates it in place
    rollout = trainer.collect()
    metrics = trainer.learn(rollout).metrics
    record["equivalence"] = {
        "before": before,
        "optimizer": optimizer,
        "after": _flat_params(trainer),
        "grads": torch.cat([p.grad.flatten() for p in trainer.policy.parameters()]),
        "metrics": metrics,
        "rollout": _cpu(rollout),
        "generator": trainer.generator.get_state(),
    }

    # B. Several shuffled minibatches, micro-batches, a KL reference and two trust regions
    # per update (384 samples per rank): replicas stay equal.
    config = _config(
        scale="group_std",
        epochs=2,
        minibatch_size=64,
        micro_batches=2,
        kl_coef=0.05,
        anchor_samples=192,
    )
    trainer = _trainer(config)
    record["updates"] = []
    saved = out / "update-0000002.pt"
    for i in range(3):
        metrics = trainer.update()
        state = trainer.state_dict()  # every rank: it gathers every rank's episodes
        if i == 1 and rank == 0:
            checkpoint.atomic_save(state, saved)
        record["updates"].append({"params": _flat_params(trainer), "metrics": metrics})
    distributed.barrier()

    # C. Resume the checkpoint after update 2 on the same world size: update 3 again.
    run = dataclasses.replace(config.run, resume=str(saved))
    resumed = _trainer(dataclasses.replace(config, run=run))
    record["resumed"] = {"params": _flat_params(resumed), "metrics": resumed.update()}
    record["resumed"]["params_after"] = _flat_params(resumed)

    # D. A signal reaching only rank 1 stops both ranks after the same update.
    record["stop"] = resumed.update_and_agree_on_stop(stop_requested=lambda: rank == 1).stop

    # E. Names that differ between ranks (an info field only rank 0 has seen) still reduce.
    names = ["episodes", "episode_sum_r"] if rank == 0 else ["episodes"]
    ours = trainer.collective
    record["names"] = ours.agree_names(names)
    values = {n: torch.tensor(1.0 + rank) for n in record["names"]}
    kinds = {"episodes": "sum", "episode_sum_r": "max"}
    record["reduced"] = {k: float(v) for k, v in ours.reduce(values, kinds).items()}

    # F. A time budget: rank 1's clock ahead of rank 0's; after an update both read the
    # slowest rank's seconds, so the next update sets one learning rate on both.
    timed = _trainer(_config(time_budget_s=1000.0, total_env_steps=10**9))
    timed.train_s = 100.0 * (1 + rank)
    record["timed"] = [(timed.update()["lr"], timed.train_s) for _ in range(2)]

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


def test_ranks_agree_on_metrics_and_counters(ranks: Any) -> None:
    first, second = ranks
    for i, (a, b) in enumerate(zip(first["updates"], second["updates"], strict=True)):
        a, b = a["metrics"], b["metrics"]
        shared = {k for k in a if not k.startswith("mem_") and k not in TIMING_KEYS}
        assert shared == {k for k in b if not k.startswith("mem_") and k not in TIMING_KEYS}
        assert {k: a[k] for k in shared} == {k: b[k] for k in shared}
        assert a["env_steps"] == (i + 1) * 24 * 2 * GROUPS * 4  # both ranks' steps count
        assert not [k for k in a if k.startswith("_") or k in ("stop", "compared")]
    assert "episode_caught" in first["updates"][-1]["metrics"]  # 30-step games ended


def test_a_time_budget_reads_the_slowest_ranks_seconds_on_every_rank(ranks: Any) -> None:
    """Ranks whose clocks differ agree on the slowest one's seconds after each update, so a
    time budget sets the same learning rate (and the same end) on every rank."""
    first, second = (r["timed"] for r in ranks)
    assert first[0][0] != second[0][0]  # the first update: each rank's own clock
    assert first[0][1] == second[0][1] > 200.0  # then the slowest rank's seconds, agreed
    assert first[1] == second[1]  # one learning rate and one clock from then on


def test_ranks_play_different_groups(ranks: Any) -> None:
    first, second = (r["equivalence"]["rollout"] for r in ranks)
    assert not torch.equal(first["obs"][-1], second["obs"][-1])


def _concatenated(rollouts: tuple[dict[str, Any], ...]) -> Rollout:
    """One rollout holding rank 0's groups, then rank 1's; episode sums added up."""
    a, b = rollouts
    joined: dict[str, Any] = {}
    for name, value in a.items():
        if name == "episodes":
            joined[name] = {
                k: torch.minimum(v, b[name][k])
                if k == "return_min"
                else torch.maximum(v, b[name][k])
                if k == "return_max"
                else v + b[name][k]
                for k, v in value.items()
            }
        elif name == "length_max":
            joined[name] = torch.maximum(value, b[name])
        elif isinstance(value, torch.Tensor):
            joined[name] = torch.cat((value, b[name]), dim=1)
        else:
            joined[name] = value
    return Rollout(**joined)


def test_ddp_update_equals_one_process_update_on_the_concatenated_batch(ranks: Any) -> None:
    """Two ranks with G groups each take the step one process takes on all 2G groups."""
    first, second = (r["equivalence"] for r in ranks)
    rollouts = (first["rollout"], second["rollout"])
    # Ranks with unequal valid counts: a per-rank normaliser would give another step.
    assert rollouts[0]["valid"].sum() != rollouts[1]["valid"].sum()
    single = _trainer(
        _config(num_groups=2 * GROUPS, epochs=1, minibatch_size=10**6, scale="batch_std")
    )
    torch.nn.utils.vector_to_parameters(first["before"].clone(), single.policy.parameters())
    single.optimizer.load_state_dict(first["optimizer"])
    single.generator.set_state(first["generator"])
    single.env_steps = first["metrics"]["env_steps"] - 24 * 2 * GROUPS * 4  # the same lr
    expected = single.learn(_concatenated(rollouts)).metrics
    grads = torch.cat([p.grad.flatten() for p in single.policy.parameters()])

    assert torch.equal(first["after"], second["after"])
    assert (first["after"] - first["before"]).abs().max() > 1e-4  # a real step was taken
    torch.testing.assert_close(first["grads"], grads, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(first["after"], _flat_params(single), rtol=0, atol=1e-6)
    got = first["metrics"]
    for key in ("valid_steps", "episodes", "return_min", "return_max", "length_max"):
        if key in expected:
            assert got[key] == expected[key], key  # sums, min and max are exact
    for key, value in expected.items():
        if key.startswith("mem_") or key in TIMING_KEYS or key in ("update", "env_steps"):
            continue
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_a_resume_on_the_same_world_size_is_exact(ranks: Any) -> None:
    """Weights, optimiser and each rank's episodes in play continue bit for bit."""
    for rank in ranks:
        assert torch.equal(rank["resumed"]["params"], rank["updates"][1]["params"])
        assert torch.equal(rank["resumed"]["params_after"], rank["updates"][2]["params"])
        replayed, original = rank["resumed"]["metrics"], rank["updates"][2]["metrics"]
        for key in replayed:
            if key.startswith("mem_") or key in TIMING_KEYS:
                continue
            assert replayed[key] == original[key], key


def test_names_only_one_rank_has_are_reduced_over_every_rank(ranks: Any) -> None:
    for rank in ranks:
        assert rank["names"] == ["episodes", "episode_sum_r"]
        assert rank["reduced"] == {"episodes": 3.0, "episode_sum_r": 2.0}


def test_a_signal_on_one_rank_stops_every_rank_after_the_same_update(ranks: Any) -> None:
    assert ranks[0]["stop"] is True and ranks[1]["stop"] is True


def test_a_checkpoint_from_two_ranks_resumes_in_one_process(ranks: Any) -> None:
    """Weights and optimiser state are replicated, so they load on any world size; the
    episodes in play were two ranks', so one process starts new ones (and says so)."""
    saved = ranks[0]["updates"][1]
    config = _config(
        scale="group_std", kl_coef=0.05, minibatch_size=64, run={"resume": ranks[0]["checkpoint"]}
    )
    with pytest.warns(RuntimeWarning, match="another number of ranks"):
        trainer = _trainer(config)
    assert (trainer.update_index, trainer.collective.world_size) == (2, 1)
    assert trainer.env_steps == saved["metrics"]["env_steps"]
    assert torch.equal(_flat_params(trainer), saved["params"])
    metrics = trainer.update()
    assert metrics["update"] == 3 and math.isfinite(metrics["loss"])
    assert metrics["env_steps"] == saved["metrics"]["env_steps"] + 24 * GROUPS * 4


# -- without a process group ------------------------------------------------------------------


def test_without_torchrun_no_process_group_is_created(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.init_from_env(torch.device("cpu")) == torch.device("cpu")
    assert not torch.distributed.is_initialized()
    assert distributed.rank_and_world() == (0, 1) and distributed.is_main()
    trainer = _trainer(_config())
    assert isinstance(trainer.collective, collective.SingleProcess)
    x = torch.tensor(3.0)
    assert trainer.collective.sum(x) is x and trainer.collective.gather("s") == ["s"]
    assert trainer.collective.sampling_seed(0, 5) is None  # the saved generator continues


def test_a_cuda_index_other_than_local_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="LOCAL_RANK=0"):
        distributed.local_device(torch.device("cuda", 1), 0)


def test_rank_seeds_are_deterministic_and_distinct() -> None:
    seeds = {collective.rank_seed(3, u, r) for u in range(50) for r in range(8)}
    assert len(seeds) == 400 and all(0 <= s < 2**63 for s in seeds)
    assert collective.rank_seed(3, 7, 1) == collective.rank_seed(3, 7, 1)


# -- the command line ---------------------------------------------------------------------------


def test_torchrun_cli_trains_and_only_rank_zero_writes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    flags = ["--env", "fruit_env:FruitCatcher-v0", "--device", "cpu", "--no-progress"]
    flags += ["--num-groups", "2", "--group-size", "4", "--rollout-steps", "20", "--window", "4"]
    flags += ["--epochs", "1", "--minibatch-size", "64"]
    flags += ["--total-env-steps", "500", "--run-dir", str(run_dir), "--checkpoint-every", "1"]
    done = _torchrun("-m", "grpo_trainer", "train", *flags)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == list(range(1, len(rows) + 1))  # one row per update
    assert [r["env_steps"] for r in rows] == [2 * 2 * 4 * 20 * (i + 1) for i in range(len(rows))]
    assert rows[-1]["env_steps"] >= 500 > rows[-2]["env_steps"]
    last = checkpoint.load(run_dir / "checkpoints" / "last.pt")
    assert last["update_index"] == len(rows) and last["env_steps"] == rows[-1]["env_steps"]
    assert len(last["rollouts"]) == 2  # both ranks' episodes in play
    assert done.stderr.count("training fruit_env:FruitCatcher-v0") == 1  # rank 0 logs


def test_torchrun_evaluation_splits_episodes_and_a_target_stops_every_rank(
    tmp_path: Path,
) -> None:
    """Each rank plays half the eval episodes; the summed score meets the target on every
    rank alike, so both stop after the first evaluation (a rank left behind would hang)."""
    run_dir = tmp_path / "run"
    flags = ["--env", "fruit_env:FruitCatcher-v0", "--device", "cpu", "--no-progress"]
    flags += ["--num-groups", "2", "--group-size", "4", "--rollout-steps", "20", "--window", "4"]
    flags += ["--epochs", "1", "--minibatch-size", "64", "--total-env-steps", "5000"]
    flags += ["--eval-every", "600", "--eval-episodes", "6", "--target", "catch_rate=0"]
    done = _torchrun("-m", "grpo_trainer", "train", *flags, "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2]  # 640 env steps: past 600
    assert rows[-1]["eval_episodes"] == 6 and rows[-1]["target_reached_env_steps"] == 640
    best = checkpoint.load(run_dir / "checkpoints" / "best.pt")
    assert best["best_by"] == "eval_score" and len(best["rollouts"]) == 2


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
