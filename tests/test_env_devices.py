"""Correct on a GPU without one: the step never syncs with the device and never mixes in a
host tensor.

* On `device="meta"` (shapes only, no data), a tensor mixed with a CPU tensor raises, and
  so does reading a value (`.item()`, `bool()`): reset and step running there prove both.
* `SyncCounter` (grpo_trainer/tools/syncs.py) counts the aten calls that read device data on
  the host; a step with the trainer's settings (`metadata["fast_kwargs"]`) or with deferred action
  validation makes none.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from fruit_env import ENV_ID, FruitCatcherVectorEnv
from grpo_trainer.tools.syncs import SyncCounter

MODES = list(AutoresetMode)
SHORT = {"win_score": 3, "lose_score": -3, "max_episode_steps": 6}


def check_outputs(env: FruitCatcherVectorEnv, out: tuple[Any, ...], device: str) -> None:
    """Every tensor of a step is on `device`, with the documented shape and dtype."""
    obs, reward, terminated, truncated, info = out
    n = env.num_envs
    expected = [
        (obs, (n, *env.single_observation_space.shape), obs.dtype),
        (reward, (n,), torch.float32),
        (terminated, (n,), torch.bool),
        (truncated, (n,), torch.bool),
        (info["_episode"], (n,), torch.bool),
        (info["episode"]["r"], (n,), torch.float32),
        *((info["episode"][k], (n,), torch.int32) for k in ("l", "caught", "missed")),
    ]
    if env.autoreset_mode == AutoresetMode.SAME_STEP:
        expected.append((info["final_obs"], obs.shape, obs.dtype))
        expected.append((info["_final_obs"], (n,), torch.bool))
    assert obs.dtype == (torch.float32 if env.params.obs_mode == "features" else torch.uint8)
    for tensor, shape, dtype in expected:
        assert tensor.device.type == device
        assert tuple(tensor.shape) == shape and tensor.dtype == dtype


@pytest.mark.parametrize("obs_mode", ["features", "pixels"])
@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_reset_and_step_run_on_meta(mode: AutoresetMode, obs_mode: str) -> None:
    """Seeded and masked resets, steps with device and host actions, snapshots: no host
    tensor meets a device tensor, no value is read."""
    n = 5
    env = FruitCatcherVectorEnv(
        n, device="meta", autoreset_mode=mode, obs_mode=obs_mode, validate_actions=False, **SHORT
    )
    assert not env.compiled
    obs, _ = env.reset(seed=7)
    assert obs.device.type == "meta"
    for step in range(8):
        actions: Any = torch.ones(n, dtype=torch.int64, device="meta")
        if step % 2:
            actions = np.array([0, 1, 2, 1, 0])  # numpy: moved to the device
        check_outputs(env, env.step(actions), "meta")
        if step == 3:
            mask = torch.ones(n, dtype=torch.bool, device="meta")
            obs, _ = env.reset(seed=[1, None, 2, None, 3], options={"reset_mask": mask})
            assert obs.device.type == "meta"
        if step == 5:
            obs, _ = env.reset(options={"reset_mask": np.array([True, False, True, False, True])})
    snapshot = env.snapshot_state(torch.tensor([0, 4]))
    env.restore_state(torch.tensor([2, 3]), snapshot)
    check_outputs(env, env.step(torch.zeros(n, dtype=torch.int8, device="meta")), "meta")


def test_meta_env_rejects_host_data_it_cannot_take() -> None:
    """A CPU env cannot take meta actions or masks (no data): a ValueError naming them."""
    env = FruitCatcherVectorEnv(3)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="actions must be a tensor with data"):
        env.step(torch.ones(3, dtype=torch.int64, device="meta"))
    with pytest.raises(ValueError, match="reset_mask"):
        env.reset(options={"reset_mask": torch.ones(3, dtype=torch.bool, device="meta")})


@pytest.mark.parametrize("obs_mode", ["features", "pixels"])
@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_deferred_validation_steps_on_meta(mode: AutoresetMode, obs_mode: str) -> None:
    """The default on a non-CPU device, deferred validation, keeps its record on the device:
    steps run on meta (the check itself, at reset, is the host read it is meant to be)."""
    env = FruitCatcherVectorEnv(4, device="meta", autoreset_mode=mode, obs_mode=obs_mode)
    assert env.validate_actions is True
    env.reset(seed=0)
    for _ in range(3):
        check_outputs(env, env.step(torch.full((4,), 7, device="meta")), "meta")


def fast_env(mode: AutoresetMode, obs_mode: str, **kwargs: Any) -> FruitCatcherVectorEnv:
    fast = FruitCatcherVectorEnv.metadata["fast_kwargs"]
    env = gym.make_vec(
        ENV_ID, num_envs=6, autoreset_mode=mode, obs_mode=obs_mode, **{**fast, **SHORT, **kwargs}
    )
    env.reset(seed=3)
    return env


@pytest.mark.parametrize("validation", ["fast_kwargs", "deferred"])
@pytest.mark.parametrize("obs_mode", ["features", "pixels"])
@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_a_step_reads_nothing_on_the_host(
    mode: AutoresetMode, obs_mode: str, validation: str
) -> None:
    """No host sync in 20 steps across episode ends, with the trainer's settings and with
    deferred validation (the CUDA default), invalid actions included for the latter."""
    kwargs = {} if validation == "fast_kwargs" else {"validate_actions": "deferred"}
    env = fast_env(mode, obs_mode, **kwargs)
    gen = torch.Generator().manual_seed(0)
    ended = 0
    for step in range(20):
        actions = torch.randint(0, 3, (6,), generator=gen)
        if validation == "deferred" and step == 4:
            actions[2] = 9
        with SyncCounter() as syncs:
            out = env.step(actions)
        assert syncs.count == 0, syncs.calls
        ended += int(out[4]["_episode"].sum())
    assert ended > 0
    if validation == "deferred":
        with SyncCounter() as syncs, pytest.raises(ValueError, match="sub-env 2 got 9"):
            env.check_actions()
        assert syncs.count > 0  # the check is where the flag is read


def test_the_counter_sees_what_would_sync() -> None:
    """The sync counter itself: the CPU default (immediate validation) reads a flag on the
    host every step, and the counter reports it."""
    env = FruitCatcherVectorEnv(4)
    env.reset(seed=0)
    with SyncCounter() as syncs:
        env.step(torch.ones(4, dtype=torch.int64))
    assert syncs.count > 0
    x = torch.tensor([1, 0, 2])
    with SyncCounter() as syncs:
        torch.where(x > 0, x, 0)
    assert syncs.count == 0
    with SyncCounter() as syncs:
        bool(x[0])
        x.nonzero()
        _ = x[x > 0]
    assert len(syncs.calls) == 3


def test_host_views_refuse_a_meta_env_by_name() -> None:
    """The numpy and DLPack views exist to share a step's memory with another framework;
    on meta there is none, and each says so naming the device: NumpyView when it wraps the
    env, DLPackView at the first output (where it probes what `xp` can import)."""
    from fruit_env.interop.wrappers import DLPackView, NumpyView

    env = FruitCatcherVectorEnv(2, device="meta", validate_actions=False)
    with pytest.raises(ValueError, match="the env runs on meta"):
        NumpyView(env)
    view = DLPackView(env, np)
    with pytest.raises(ValueError, match="cannot import tensors on meta"):
        view.reset(seed=0)
