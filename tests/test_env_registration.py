"""Registration: `make_vec` gives the torch vector env, `make` a checked numpy single env."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

import fruit_env
from fruit_env import ENV_ID, FruitCatcherEnv, FruitCatcherVectorEnv, FruitParams

RULES: dict[str, Any] = {
    "width": 9,
    "height": 7,
    "basket_width": 2,
    "max_fruits": 4,
    "min_fruits": 2,
    "spawn_prob": 0.25,
    "min_spawn_gap": 2,
    "win_score": 5,
    "lose_score": -4,
}


def test_make_vec_returns_torch_env_with_kwargs() -> None:
    """make_vec builds FruitCatcherVectorEnv with every rule and option passed through
    (max_episode_steps defaulting to the registered 200)."""
    env = gym.make_vec(
        ENV_ID,
        num_envs=5,
        device="cpu",
        autoreset_mode="SameStep",
        validate_actions=False,
        obs_mode="pixels",
        **RULES,
    )
    assert isinstance(env, FruitCatcherVectorEnv)
    assert env.num_envs == 5
    assert env.device == torch.device("cpu")
    assert env.validate_actions is False
    assert env.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    assert env.params == FruitParams(**RULES, obs_mode="pixels", max_episode_steps=200)
    assert env.spec is not None and env.spec.id == ENV_ID


def test_registered_spec_limits_episodes_to_200() -> None:
    """The registered spec says 200 steps; make() wraps the single env in a 200-step
    TimeLimit; make_vec() gives the vector env the same limit."""
    assert gym.spec(ENV_ID).max_episode_steps == 200
    single = gym.make(ENV_ID)
    assert single.spec is not None and single.spec.max_episode_steps == 200
    assert isinstance(single.unwrapped, FruitCatcherEnv)
    vec = gym.make_vec(ENV_ID, num_envs=2)
    assert vec.params.max_episode_steps == 200  # type: ignore[attr-defined]


def test_make_vec_max_episode_steps_truncates_there() -> None:
    """make_vec(max_episode_steps=7) truncates every sub-env on step 7, not before."""
    env = gym.make_vec(ENV_ID, num_envs=3, max_episode_steps=7, win_score=99, lose_score=-99)
    env.reset(seed=0)
    flags = [env.step(np.array([0, 1, 2]))[3].tolist() for _ in range(8)]
    assert flags[:7] == [[False] * 3] * 6 + [[True] * 3]
    assert flags[7] == [False] * 3  # NEXT_STEP: the following step restarts


def test_make_max_episode_steps_truncates_single_env() -> None:
    """make(max_episode_steps=7) truncates the numpy game on step 7, not before."""
    env = gym.make(ENV_ID, max_episode_steps=7, win_score=99, lose_score=-99)
    env.reset(seed=0)
    truncated = [env.step(1)[3] for _ in range(7)]
    assert truncated == [False] * 6 + [True]


@pytest.mark.parametrize("obs_mode", ["features", "pixels"])
@pytest.mark.parametrize("mode", list(AutoresetMode), ids=[m.name for m in AutoresetMode])
def test_output_types_shapes_and_devices(obs_mode: str, mode: AutoresetMode) -> None:
    """reset/step return torch tensors on the env's device: features float32
    (N, 1 + 3*max_fruits) in [0, 1] or pixels uint8 (N, 1, H, W); reward float32 (N,);
    terminated/truncated bool (N,); episode statistics and masks of shape (N,)."""
    n = 4
    env = gym.make_vec(ENV_ID, num_envs=n, obs_mode=obs_mode, autoreset_mode=mode, **RULES)
    if obs_mode == "features":
        obs_dtype, obs_shape = torch.float32, (n, 1 + 3 * RULES["max_fruits"])
    else:
        obs_dtype, obs_shape = torch.uint8, (n, 1, RULES["height"], RULES["width"])
    assert env.observation_space.shape == obs_shape
    obs, info = env.reset(seed=1)
    assert info == {}
    outputs = [obs]
    for _ in range(30):
        obs, reward, terminated, truncated, info = env.step(torch.randint(0, 3, (n,)))
        outputs.append(obs)
        assert (reward.dtype, reward.shape) == (torch.float32, (n,))
        assert (terminated.dtype, terminated.shape) == (torch.bool, (n,))
        assert (truncated.dtype, truncated.shape) == (torch.bool, (n,))
        assert (info["_episode"].dtype, info["_episode"].shape) == (torch.bool, (n,))
        assert set(info["episode"]) == {"r", "l", "caught", "missed"}
        assert all(v.shape == (n,) for v in info["episode"].values())
        assert ("final_obs" in info) == (mode == AutoresetMode.SAME_STEP)
        if mode == AutoresetMode.SAME_STEP:
            assert info["final_obs"].shape == obs_shape
            assert info["_final_obs"].dtype == torch.bool
        for tensor in (obs, reward, terminated, truncated):
            assert isinstance(tensor, torch.Tensor)
            assert tensor.device == env.device
    for obs in outputs:
        assert (obs.dtype, obs.shape) == (obs_dtype, obs_shape)
        assert env.observation_space.contains(obs.numpy())
    if obs_mode == "features":
        assert all(((o >= 0) & (o <= 1)).all() for o in outputs)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, AutoresetMode.NEXT_STEP),
        (AutoresetMode.DISABLED, AutoresetMode.DISABLED),
        ("SameStep", AutoresetMode.SAME_STEP),
        ("same_step", AutoresetMode.SAME_STEP),
        ("NEXT_STEP", AutoresetMode.NEXT_STEP),
        ("Disabled", AutoresetMode.DISABLED),
    ],
)
def test_autoreset_mode_metadata_is_the_enum(
    given: AutoresetMode | str | None, expected: AutoresetMode
) -> None:
    """metadata["autoreset_mode"] is an AutoresetMode (default NEXT_STEP), whatever spelling
    was given, and setting it on one env leaves the class metadata alone."""
    kwargs = {} if given is None else {"autoreset_mode": given}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # make_vec warns when the metadata is not the enum
        env = gym.make_vec(ENV_ID, num_envs=2, **kwargs)
    assert isinstance(env.metadata["autoreset_mode"], AutoresetMode)
    assert env.metadata["autoreset_mode"] is expected
    assert FruitCatcherVectorEnv.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP


@pytest.mark.parametrize("obs_mode", ["features", "pixels"])
def test_single_env_passes_gymnasium_check_env(obs_mode: str) -> None:
    """gymnasium.make("FruitCatcher-v0") passes check_env without any warning."""
    env = gym.make(ENV_ID, obs_mode=obs_mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


def test_register_envs_is_idempotent() -> None:
    """Calling register_envs() again keeps the one registered spec."""
    spec = gym.spec(ENV_ID)
    fruit_env.register_envs()
    assert gym.spec(ENV_ID) is spec
    assert spec.entry_point == "fruit_env.games.fruit_catcher.single_env:FruitCatcherEnv"
    assert spec.vector_entry_point == "fruit_env.games.fruit_catcher.env:FruitCatcherVectorEnv"


def test_module_prefixed_id_works_in_fresh_interpreter() -> None:
    """In a fresh interpreter that never imported fruit_env, make_vec and make with
    "fruit_env:FruitCatcher-v0" import and register the package by themselves."""
    code = textwrap.dedent(
        """
        import sys
        import gymnasium as gym
        assert "fruit_env" not in sys.modules
        envs = gym.make_vec("fruit_env:FruitCatcher-v0", num_envs=3, width=6)
        obs, _ = envs.reset(seed=0)
        obs, reward, *_ = envs.step([0, 1, 2])
        env = gym.make("fruit_env:FruitCatcher-v0")
        shape = "x".join(map(str, obs.shape))
        print(type(envs).__name__, shape, reward.dtype, type(env.unwrapped).__name__)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[1],  # the repository root, as for pytest itself
    )
    assert result.returncode == 0, result.stderr
    # 1 + 3 * max_fruits = 10 features for the default 3 fruit slots
    assert result.stdout.split() == [
        "FruitCatcherVectorEnv",
        "3x10",
        "torch.float32",
        "FruitCatcherEnv",
    ]
