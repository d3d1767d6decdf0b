"""Envs from other libraries into the trainer: `gymnax:`, `envpool:`, `minatar:` and a
Box2D env, each built by `make_envs` and trained for two updates. Each test skips without
its extra; `make test` installs them all.

What each env lacks, and what the trainer does instead, is asserted too: how groups restart
(`EnvIO.restarts`), which autoreset the trainer follows, and the warning that says so.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch

from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.envs import FACTORIES, make_envs

CPU = torch.device("cpu")


def _trainer(env: str, **run: Any) -> tuple[GRPOTrainer, list[str]]:
    config = GRPOConfig(
        num_groups=4,
        group_size=4,
        hidden_sizes=(8,),
        rollout_steps=32,
        window=16,
        minibatch_size=256,
        run=RunConfig(env=env, device="cpu", progress=False, compile=False, **run),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = GRPOTrainer(make_envs(config, config.num_envs, CPU), config)
        for _ in range(2):
            metrics = trainer.update()
    assert math.isfinite(metrics["loss"]) and metrics["valid_steps"] > 0
    return trainer, [str(w.message) for w in caught]


def test_gymnax_cartpole_reaches_the_trainer_as_torch() -> None:
    pytest.importorskip("gymnax")
    from grpo_trainer.envs.gymnax_vector import GymnaxVectorEnv

    trainer, said = _trainer("gymnax:CartPole-v1")
    assert isinstance(trainer.env.envs, GymnaxVectorEnv)
    assert trainer.env.autoreset_mode.name == "DISABLED"  # the trainer starts groups itself
    assert trainer.env.restart_method.name == "snapshot"  # per-env keys, masked resets, snapshots
    assert trainer.env.max_episode_steps() == 500  # gymnax's own limit, now visible
    assert not trainer.env.envs.check_actions  # the trainer's fast option
    assert said == []
    obs, _ = trainer.env.envs.reset(seed=0)
    assert isinstance(obs, torch.Tensor) and obs.device == CPU  # JAX arrays through DLPack


def test_envpool_cartpole_says_its_seeds_are_fixed() -> None:
    pytest.importorskip("envpool")
    trainer, said = _trainer("envpool:CartPole-v1")
    assert trainer.env.autoreset_mode.name == "NEXT_STEP"
    assert trainer.env.restart_method.name == "independent"
    assert trainer.env.max_episode_steps() == 500  # from EnvPool's own spec
    assert any("envpool:CartPole-v1: seeds are fixed at creation" in s for s in said)


def test_minatar_breakout_has_image_observations_and_no_time_limit() -> None:
    pytest.importorskip("minatar")
    trainer, said = _trainer("minatar:Breakout-v1")
    assert trainer.env.observation_space.shape == (10, 10, 4)
    assert trainer.env.restart_method.name == "snapshot"  # CopiedStateVectorEnv copies new games
    assert trainer.env.max_episode_steps() is None
    assert any("minatar:Breakout-v1: no episode limit" in s for s in said)
    assert not any("sticky" in s or "start" in s for s in said)


def test_lunar_lander() -> None:
    pytest.importorskip("Box2D")
    pytest.importorskip("pygame")  # gymnasium's box2d module imports it
    trainer, said = _trainer("LunarLander-v3")
    assert trainer.env.restart_method.name == "seeded"  # Box2D sub-envs cannot be copied
    assert any("LunarLander-v3: its sub-envs cannot be copied" in s for s in said)
    assert trainer.env.max_episode_steps() == 1000


def test_a_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def needs_a_library(*args: Any) -> Any:
        raise ModuleNotFoundError("No module named 'somelib'", name="somelib")

    monkeypatch.setitem(FACTORIES, "somelib", needs_a_library)
    config = GRPOConfig(num_groups=1, group_size=2, run=RunConfig(env="somelib:Game-v0"))
    with pytest.raises(ValueError, match=r"needs 'somelib': pip install -e '\.\[somelib\]'"):
        make_envs(config, 2, CPU)
