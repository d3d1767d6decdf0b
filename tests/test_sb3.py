"""SB3VecEnv: the Stable-Baselines3 VecEnv contract, checked against SB3's own DummyVecEnv."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from loading import load_module

pytest.importorskip("stable_baselines3")

from stable_baselines3.common.env_checker import check_env
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    VecCheckNan,
    VecMonitor,
    VecNormalize,
)

from fruit_env import ENV_ID, FruitCatcherVectorEnv
from fruit_env.interop.sb3 import SB3VecEnv
from fruit_env.interop.wrappers import NumpyView

# Short, busy episodes that both terminate (score +3 / -3) and truncate (13 steps).
RULES = {
    "width": 7,
    "height": 6,
    "basket_width": 1,
    "max_fruits": 5,
    "min_fruits": 2,
    "min_spawn_gap": 1,
    "spawn_prob": 0.7,
    "win_score": 3,
    "lose_score": -3,
}
MAX_STEPS = 13
N = 6
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sb3_ppo.py"


def adapter(num_envs: int = N, **kwargs: Any) -> SB3VecEnv:
    return SB3VecEnv.make(num_envs, max_episode_steps=MAX_STEPS, **{**RULES, **kwargs})


def reference(num_envs: int = N) -> DummyVecEnv:
    """SB3's own VecEnv over the numpy single game (Monitor adds the episode dict)."""
    return DummyVecEnv(
        [lambda: Monitor(gym.make(ENV_ID, max_episode_steps=MAX_STEPS, **RULES))] * num_envs
    )


# -- the step contract, against DummyVecEnv ----------------------------------------------------


def test_steps_match_dummy_vec_env_over_the_single_game() -> None:
    ours, ref = adapter(), reference()
    assert ours.seed(3) == ref.seed(3) == [3, 4, 5, 6, 7, 8]
    np.testing.assert_array_equal(ours.reset(), ref.reset())
    actions = np.random.default_rng(0).integers(0, 3, size=(60, N))
    kinds = {"terminated": 0, "truncated": 0}
    for step_actions in actions:
        obs, rewards, dones, infos = ours.step(step_actions)
        ref_obs, ref_rewards, ref_dones, ref_infos = ref.step(step_actions)
        np.testing.assert_array_equal(obs, ref_obs)
        np.testing.assert_array_equal(rewards, ref_rewards)
        np.testing.assert_array_equal(dones, ref_dones)
        assert obs.dtype == np.float32 and rewards.dtype == np.float32 and dones.dtype == bool
        for i in range(N):
            if not dones[i]:
                assert infos[i] == {}
                continue
            mine, theirs = infos[i], ref_infos[i]
            assert set(mine) == {"terminal_observation", "TimeLimit.truncated", "episode"}
            np.testing.assert_array_equal(
                mine["terminal_observation"], theirs["terminal_observation"]
            )
            assert mine["TimeLimit.truncated"] is theirs["TimeLimit.truncated"]
            assert mine["episode"]["r"] == theirs["episode"]["r"]
            assert mine["episode"]["l"] == theirs["episode"]["l"]
            kinds["truncated" if mine["TimeLimit.truncated"] else "terminated"] += 1
    assert kinds["terminated"] > 0 and kinds["truncated"] > 0  # both paths were exercised


def test_episode_info_is_in_monitor_format_with_catch_counts() -> None:
    venv = adapter(2, win_score=30, lose_score=-30)
    venv.seed(0)
    venv.reset()
    rewards = np.zeros(2)
    for _ in range(MAX_STEPS):
        _, reward, dones, infos = venv.step(np.array([0, 2]))
        rewards += reward
    assert dones.all()
    for i, info in enumerate(infos):
        episode = info["episode"]
        assert set(episode) == {"r", "l", "t", "caught", "missed"}
        assert isinstance(episode["r"], float) and isinstance(episode["l"], int)
        assert episode["r"] == rewards[i] == episode["caught"] - episode["missed"]
        assert episode["l"] == MAX_STEPS and episode["t"] >= 0.0
        assert info["TimeLimit.truncated"] is True


def test_returned_arrays_are_fresh_each_step() -> None:
    """SB3 keeps the previous observation across `step`; it must not change under it."""
    venv = adapter()
    first = venv.reset()
    kept = first.copy()
    obs, rewards, *_ = venv.step(np.ones(N, dtype=np.int64))
    kept_obs, kept_rewards = obs.copy(), rewards.copy()
    for _ in range(20):
        venv.step(np.zeros(N, dtype=np.int64))
    np.testing.assert_array_equal(first, kept)
    np.testing.assert_array_equal(obs, kept_obs)
    np.testing.assert_array_equal(rewards, kept_rewards)


def test_pixel_observations_keep_their_dtype_and_values() -> None:
    venv = SB3VecEnv.make(3, obs_mode="pixels", max_episode_steps=4)
    twin = FruitCatcherVectorEnv(
        3, obs_mode="pixels", max_episode_steps=4, autoreset_mode="SAME_STEP"
    )
    venv.seed(1)
    np.testing.assert_array_equal(venv.reset(), twin.reset(seed=[1, 2, 3])[0].numpy())
    for t in range(6):
        actions = np.array([t % 3, 2, 0])
        obs, _, dones, infos = venv.step(actions)
        twin_obs, *_, twin_info = twin.step(torch.from_numpy(actions))
        assert obs.dtype == np.uint8 and obs.shape == (3, 1, 15, 20)
        np.testing.assert_array_equal(obs, twin_obs.numpy())
        for i in np.flatnonzero(dones):
            final = infos[i]["terminal_observation"]
            assert final.dtype == np.uint8
            np.testing.assert_array_equal(final, twin_info["final_obs"][i].numpy())
    assert venv.observation_space == twin.single_observation_space


def test_seeds_apply_once_and_repeat_games() -> None:
    venv = adapter()
    assert venv.seed(11) == list(range(11, 11 + N))
    first = venv.reset()
    for _ in range(5):
        venv.step(np.ones(N, dtype=np.int64))
    unseeded = venv.reset()  # the seeds were used up: the random streams go on
    assert not np.array_equal(unseeded, first)
    venv.seed(11)
    np.testing.assert_array_equal(venv.reset(), first)


def test_torch_actions_are_accepted() -> None:
    venv, twin = adapter(), adapter()
    venv.seed(0)
    twin.seed(0)
    venv.reset()
    twin.reset()
    obs, *_ = venv.step(torch.tensor([0, 1, 2, 0, 1, 2]))
    twin_obs, *_ = twin.step(np.array([0, 1, 2, 0, 1, 2]))
    np.testing.assert_array_equal(obs, twin_obs)


def test_steps_read_the_host_only_through_the_preallocated_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After the first step, no output tensor is converted on its own: one packed copy."""
    venv = adapter()
    venv.seed(0)
    venv.reset()
    venv.step(np.ones(N, dtype=np.int64))  # builds the buffers
    buffer = venv.host_buffer

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an output tensor was copied to the host on its own")

    for name in ("numpy", "cpu", "tolist", "item", "__array__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    ended = 0
    for step_actions in np.random.default_rng(3).integers(0, 3, size=(30, N)):
        obs, rewards, dones, infos = venv.step(step_actions)
        ended += int(dones.sum())
        assert all("episode" in infos[i] for i in np.flatnonzero(dones))
        assert venv.host_buffer is buffer  # the same buffer, reused every step
        assert not np.shares_memory(obs, buffer) and not np.shares_memory(rewards, buffer)
    assert ended > 0  # terminal observations and episode stats came through the buffer too


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_env_gives_the_same_outputs_as_a_cpu_env() -> None:
    on_gpu, on_cpu = adapter(device="cuda"), adapter()
    assert on_gpu.device.type == "cuda"
    on_gpu.seed(4)
    on_cpu.seed(4)
    np.testing.assert_array_equal(on_gpu.reset(), on_cpu.reset())
    for step_actions in np.random.default_rng(4).integers(0, 3, size=(30, N)):
        gpu_out, cpu_out = on_gpu.step(step_actions), on_cpu.step(step_actions)
        for got, want in zip(gpu_out[:3], cpu_out[:3], strict=True):
            np.testing.assert_array_equal(got, want)
        for got, want in zip(gpu_out[3], cpu_out[3], strict=True):
            assert got.keys() == want.keys()
            if got:
                np.testing.assert_array_equal(
                    got["terminal_observation"], want["terminal_observation"]
                )
                assert {k: v for k, v in got["episode"].items() if k != "t"} == {
                    k: v for k, v in want["episode"].items() if k != "t"
                }


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["NEXT_STEP", "DISABLED"])
def test_other_autoreset_modes_are_refused(mode: str) -> None:
    with pytest.raises(ValueError, match="SB3VecEnv needs an env with autoreset_mode=SAME_STEP"):
        SB3VecEnv(FruitCatcherVectorEnv(2, autoreset_mode=mode))
    with pytest.raises(ValueError, match="SB3VecEnv needs autoreset_mode=SAME_STEP"):
        SB3VecEnv.make(2, autoreset_mode=mode)


def test_the_refusal_names_the_users_own_env() -> None:
    """A game of the user's own (examples/own_env.py), registered or built directly: the
    error names it and how to build it in SAME_STEP mode, not Fruit Catcher."""
    own_env = load_module(EXAMPLE.parent / "own_env.py", "own_env_for_sb3")
    with pytest.raises(ValueError, match="SAME_STEP") as registered:
        SB3VecEnv(gym.make_vec("TreasureHunt-v0", num_envs=2))
    with pytest.raises(ValueError, match="SAME_STEP") as built:
        SB3VecEnv(own_env.make(2, autoreset_mode="DISABLED"))
    for refused in (registered, built):
        assert "FruitCatcher" not in str(refused.value)
    assert "gym.make_vec('TreasureHunt-v0', num_envs, autoreset_mode='SAME_STEP')" in str(
        registered.value
    )
    assert "TensorVectorEnv(TreasureHunt(...), n, autoreset_mode='SAME_STEP')" in str(built.value)


def test_non_vector_envs_and_numpy_views_are_refused() -> None:
    with pytest.raises(TypeError, match=r"wraps a gymnasium\.vector\.VectorEnv"):
        SB3VecEnv(gym.make(ENV_ID))  # type: ignore[arg-type]
    venv = SB3VecEnv(NumpyView(FruitCatcherVectorEnv(2, autoreset_mode="SAME_STEP")))
    with pytest.raises(TypeError, match="not a NumpyView/DLPackView"):
        venv.reset()


def test_step_wait_without_step_async_is_an_error() -> None:
    venv = adapter()
    venv.reset()
    with pytest.raises(RuntimeError, match="without step_async"):
        venv.step_wait()


def test_bad_actions_and_reset_options_raise_clear_errors() -> None:
    venv = adapter()
    venv.reset()
    with pytest.raises(ValueError, match="actions must be 0, 1 or 2; sub-env 2 got 5"):
        venv.step(np.array([0, 1, 5, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"actions must have shape \(6,\)"):
        venv.step(np.array([0, 1]))
    venv.set_options({"difficulty": 3})
    with pytest.raises(ValueError, match="takes no per-env reset options"):
        venv.reset()


# -- attributes and methods ----------------------------------------------------------------------


def test_get_set_attr_env_method_and_env_is_wrapped() -> None:
    venv = adapter(render_mode="ansi")
    assert venv.get_attr("render_mode") == ["ansi"] * N
    assert venv.get_attr("num_envs", indices=[1, 3]) == [N, N]
    assert venv.has_attr("params") and not venv.has_attr("no_such_attribute")
    with pytest.raises(AttributeError, match="no attribute 'no_such_attribute'"):
        venv.get_attr("no_such_attribute")
    venv.set_attr("validate_actions", False)
    assert venv.env.validate_actions is False  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="indices must be None or all of them"):
        venv.set_attr("validate_actions", True, indices=[0])
    venv.reset()
    boards = venv.env_method("render", indices=[0, 2])
    assert len(boards) == 2 and all(isinstance(b, str) for b in boards)
    assert boards == [venv.env.render()[0], venv.env.render()[2]]
    assert venv.env_is_wrapped(Monitor) == [False] * N
    assert SB3VecEnv(
        NumpyView(FruitCatcherVectorEnv(2, autoreset_mode="SAME_STEP"))
    ).env_is_wrapped(
        NumpyView  # type: ignore[arg-type]
    ) == [True, True]


def test_rgb_render_tiles_every_sub_env() -> None:
    venv = SB3VecEnv.make(4, render_mode="rgb_array")
    assert venv.render_mode == "rgb_array"
    venv.reset()
    images = venv.get_images()
    assert len(images) == 4 and images[0].shape == (240, 320, 3)
    assert venv.render(mode="rgb_array").shape == (480, 640, 3)  # SB3 tiles 2 x 2


# -- SB3's wrappers and checks on top --------------------------------------------------------------


def test_sb3_check_env_accepts_the_single_game() -> None:
    check_env(gym.make(ENV_ID), warn=True)


def test_vec_monitor_agrees_with_our_episode_info() -> None:
    venv = VecMonitor(adapter())
    venv.seed(0)
    venv.reset()
    ours = adapter()
    ours.seed(0)
    ours.reset()
    actions = np.random.default_rng(1).integers(0, 3, size=(40, N))
    ended = 0
    for step_actions in actions:
        _, _, dones, infos = venv.step(step_actions)
        _, _, _, our_infos = ours.step(step_actions)
        for i in np.flatnonzero(dones):
            assert infos[i]["episode"]["r"] == our_infos[i]["episode"]["r"]
            assert infos[i]["episode"]["l"] == our_infos[i]["episode"]["l"]
            ended += 1
    assert ended > N


def test_vec_normalize_and_vec_check_nan_run_on_top() -> None:
    venv = VecCheckNan(VecNormalize(adapter(), gamma=0.9), raise_exception=True)
    venv.seed(0)
    obs = venv.reset()
    assert obs.shape == (N, 16)  # 1 + 3 values per fruit slot, 5 slots
    saw_terminal = False
    for step_actions in np.random.default_rng(2).integers(0, 3, size=(30, N)):
        obs, rewards, dones, infos = venv.step(step_actions)
        assert np.isfinite(obs).all() and np.isfinite(rewards).all()
        for i in np.flatnonzero(dones):
            terminal = infos[i]["terminal_observation"]
            assert terminal.shape == (16,) and np.isfinite(terminal).all()
            saw_terminal = True
    assert saw_terminal
    normalize = venv.venv
    assert isinstance(normalize, VecNormalize) and normalize.obs_rms.count > 30 * N


# -- learning ----------------------------------------------------------------------------------


def load_example() -> Any:
    return load_module(EXAMPLE, "sb3_ppo_example")


@pytest.mark.slow
def test_ppo_learns_to_catch_far_above_random() -> None:
    example = load_example()
    model = example.train(100_000, num_envs=64, seed=0)
    trained = example.catch_rate(example.model_policy(model))
    baseline = example.catch_rate(example.random_policy(0))
    assert 0.10 < baseline["catch_rate"] < 0.20  # chance: a 3-wide basket on a 20-wide board
    assert trained["episodes"] >= 64 and baseline["episodes"] >= 64
    assert trained["catch_rate"] > baseline["catch_rate"] + 0.12
    assert model.ep_info_buffer and "caught" in model.ep_info_buffer[-1]  # ep_rew_mean's source
