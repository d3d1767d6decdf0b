"""The trainer's hot paths on `device="meta"`: correct placement on a GPU without one.

A meta tensor has a shape and no data. Mixing it with a tensor made on the CPU by mistake
raises, and so does reading a value on the host (`.item()`, `bool()`, `nonzero`). So an
update that runs on meta up to its one intended device-to-host copy (the metrics, in
`metrics.to_host`) allocates everything on the trainer's device and decides nothing on the
host: the env's steps, group restarts and branches, advantages, the loss, backward and the
optimizer step (foreach AdamW: the fused kernel has no meta implementation).
tests/test_trainer_syncs.py counts host reads on the CPU, where the fused path runs.
"""

from __future__ import annotations

import traceback
from typing import Any

import pytest
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.base.config import DEVICE_DEFAULTS
from grpo_trainer.envs import make_envs

META = torch.device("meta")


def _meta_trainer(env_kwargs: dict[str, Any] | None = None, **cfg: Any) -> GRPOTrainer:
    run = RunConfig(progress=False, device="meta", compile=False, env_kwargs=env_kwargs or {})
    config = GRPOConfig(
        num_groups=4,
        group_size=4,
        **{"hidden_sizes": (8,), "window": 4, "rollout_steps": 8, "minibatch_size": 64, **cfg},
        run=run,
    )
    return GRPOTrainer(make_envs(config, config.num_envs, META), config)


CONFIGS = {
    "windowed": {},
    "branching": {"rollout_steps": 16, "restart_every": 1, "branch_every": 4},
    "episodes": {"rollout": "episodes", "env_kwargs": {"max_episode_steps": 12}},
    "kl, micro-batches, group std": {"kl_coef": 0.1, "micro_batches": 2, "scale": "group_std"},
    "trust regions": {"anchor_samples": 32},
    "pixels, CNN": {"env_kwargs": {"obs_mode": "pixels"}, "cnn_channels": (4, 4)},
}


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
def test_an_update_runs_on_meta_up_to_its_one_host_copy(cfg: dict[str, Any]) -> None:
    cfg = dict(cfg)
    trainer = _meta_trainer(cfg.pop("env_kwargs", None), **cfg)
    assert not trainer.optimizer_step.fused  # no fused kernel on meta: foreach steps
    rollout = trainer.collect()
    assert rollout.obs.device == META and rollout.actions.device == META
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor") as err:
        trainer.learn(rollout)
    frames = traceback.extract_tb(err.value.__traceback__)
    ours = [frame.name for frame in frames if "grpo_trainer" in frame.filename]
    assert ours[-3:] == ["learn", "update_report", "to_host"], ours
    assert all(p.device == META for p in trainer.policy.parameters())


def test_a_gpu_run_derives_the_gpu_defaults_and_its_update_runs_on_meta() -> None:
    """Defaults for the device: a run on anything but the CPU ("meta" stands in for a GPU)
    takes the GPU's row of DEVICE_DEFAULTS (8x the samples per update, one trust region,
    the learning rate's ceiling, the budget that gives as many updates as the CPU's run),
    and that update, at 8192 sub-envs, runs on the device up to its one host copy. The CPU's
    row is unchanged; a value the user gives wins on both."""
    cpu = GRPOConfig(run=RunConfig(device="cpu"))
    assert (cpu.total_env_steps, cpu.num_envs, cpu.anchor_samples) == (2_500_000, 1024, 32_768)
    assert (cpu.minibatch_size, cpu.lr) == (4096, 1e-2)
    run = RunConfig(progress=False, device="meta", compile=False)
    gpu = GRPOConfig(run=run)
    row = DEVICE_DEFAULTS["cuda"]
    assert (gpu.total_env_steps, gpu.anchor_samples) == (row.total_env_steps, row.max_samples)
    assert gpu.num_envs * gpu.rollout_steps == row.max_samples == 262_144
    assert (gpu.num_envs, gpu.minibatch_size, gpu.lr) == (8192, 32_768, row.max_lr)
    assert gpu.total_env_steps // row.max_samples == cpu.total_env_steps // 32_768  # 76 updates
    given = GRPOConfig(total_env_steps=1_000_000, lr=3e-3, anchor_samples=4096, run=run)
    assert (given.total_env_steps, given.lr, given.anchor_samples) == (1_000_000, 3e-3, 4096)

    trainer = GRPOTrainer(make_envs(gpu, gpu.num_envs, META), gpu)
    rollout = trainer.collect()
    assert rollout.obs.shape[:2] == (gpu.rollout_steps, 8192) and rollout.obs.device == META
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor") as err:
        trainer.learn(rollout)
    ours = [
        f.name
        for f in traceback.extract_tb(err.value.__traceback__)
        if "grpo_trainer" in f.filename
    ]
    assert ours[-3:] == ["learn", "update_report", "to_host"], ours
