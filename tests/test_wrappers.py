"""NumpyView and DLPackView: same values as the torch env, same memory, actions back in."""

from __future__ import annotations

import types
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, VectorWrapper

from fruit_env import FruitCatcherVectorEnv
from fruit_env.interop.wrappers import DLPackView, NumpyView, env_device, to_torch

N = 4
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class Recorder(VectorWrapper):
    """Keeps the torch tensors the env returned and the actions it was given."""

    def reset(self, **kwargs: Any) -> Any:
        self.options = kwargs.get("options")
        self.last = self.env.reset(**kwargs)
        return self.last

    def step(self, actions: Any) -> Any:
        self.actions = actions
        self.last = self.env.step(actions)
        return self.last


def tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for key in sorted(tree) for t in tensors(tree[key])]
    if isinstance(tree, (tuple, list)):
        return [t for value in tree for t in tensors(value)]
    return []


def leaves(tree: Any) -> list[Any]:
    """Non-container leaves, in the same order as `tensors`."""
    if isinstance(tree, dict):
        return [x for key in sorted(tree) for x in leaves(tree[key])]
    if isinstance(tree, (tuple, list)):
        return [x for value in tree for x in leaves(value)]
    return [tree]


def recorded(device: str = "cpu", **kwargs: Any) -> tuple[FruitCatcherVectorEnv, Recorder]:
    env = FruitCatcherVectorEnv(N, device=device, **kwargs)
    return env, Recorder(env)


ACTIONS = np.array([[0, 1, 2, 1], [2, 2, 0, 1], [1, 0, 0, 2]], dtype=np.int64)


# -- NumpyView ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_numpy_view_shares_memory_with_every_output_tensor(mode: AutoresetMode) -> None:
    _, spy = recorded(autoreset_mode=mode, max_episode_steps=3)
    view = NumpyView(spy)
    outputs = [view.reset(seed=7)]
    torch_outputs = [spy.last]
    for step in range(6):
        outputs.append(view.step(ACTIONS[step % 3]))
        torch_outputs.append(spy.last)
        if mode == AutoresetMode.DISABLED and step == 2:  # max_episode_steps=3: all ended
            outputs.append(view.reset(options={"reset_mask": np.ones(N, dtype=bool)}))
            torch_outputs.append(spy.last)
    for out, ref in zip(outputs, torch_outputs, strict=True):
        arrays, refs = leaves(out), tensors(ref)
        assert len(arrays) == len(refs)
        for array, tensor in zip(arrays, refs, strict=True):
            assert isinstance(array, np.ndarray)
            assert array.dtype == tensor.numpy().dtype and array.shape == tuple(tensor.shape)
            assert np.shares_memory(array, tensor.numpy())
            assert array.__array_interface__["data"][0] == tensor.data_ptr()


def test_numpy_view_info_keeps_its_nested_layout() -> None:
    view = NumpyView(FruitCatcherVectorEnv(N, autoreset_mode="SAME_STEP", max_episode_steps=2))
    view.reset(seed=0)
    view.step(ACTIONS[0])
    _, reward, terminated, truncated, info = view.step(ACTIONS[1])
    assert set(info) == {"episode", "_episode", "final_obs", "_final_obs"}
    assert set(info["episode"]) == {"r", "l", "caught", "missed"}
    np.testing.assert_array_equal(info["_episode"], np.ones(N, dtype=bool))
    np.testing.assert_array_equal(info["episode"]["l"], np.full(N, 2, dtype=np.int32))
    np.testing.assert_array_equal(truncated, np.ones(N, dtype=bool))
    assert reward.dtype == np.float32 and terminated.dtype == np.bool_
    assert info["final_obs"].shape == (N, 10) and info["final_obs"].dtype == np.float32


def test_numpy_view_values_equal_the_torch_env() -> None:
    torch_env = FruitCatcherVectorEnv(N, autoreset_mode="NEXT_STEP", max_episode_steps=4)
    view = NumpyView(FruitCatcherVectorEnv(N, autoreset_mode="NEXT_STEP", max_episode_steps=4))
    expected, got = [torch_env.reset(seed=3)], [view.reset(seed=3)]
    for step in range(10):
        expected.append(torch_env.step(torch.from_numpy(ACTIONS[step % 3])))
        got.append(view.step(ACTIONS[step % 3]))
    for out, ref in zip(got, expected, strict=True):
        for array, tensor in zip(leaves(out), tensors(ref), strict=True):
            np.testing.assert_array_equal(array, tensor.numpy())


def test_a_returned_array_stays_valid_after_later_steps() -> None:
    view = NumpyView(FruitCatcherVectorEnv(N))
    view.reset(seed=1)
    obs, reward, *_ = view.step(ACTIONS[0])
    obs_before, reward_before = obs.copy(), reward.copy()
    for step in range(20):
        view.step(ACTIONS[step % 3])
    np.testing.assert_array_equal(obs, obs_before)
    np.testing.assert_array_equal(reward, reward_before)


def test_numpy_actions_reach_the_env_without_a_copy() -> None:
    _, spy = recorded()
    view = NumpyView(spy)
    view.reset(seed=0)
    actions = np.array([2, 1, 0, 2], dtype=np.int64)
    view.step(actions)
    assert isinstance(spy.actions, torch.Tensor)
    assert spy.actions.data_ptr() == actions.__array_interface__["data"][0]
    assert spy.actions.tolist() == [2, 1, 0, 2]


@pytest.mark.parametrize(
    "actions",
    [
        [2, 1, 0, 2],
        np.array([2, 1, 0, 2], dtype=np.int32),
        np.array([2, 1, 0, 2], dtype=">i8"),  # non-native byte order: converted, not rejected
        torch.tensor([2, 1, 0, 2]),
    ],
    ids=["list", "int32", "big-endian", "tensor"],
)
def test_actions_in_other_forms_are_accepted(actions: Any) -> None:
    env, spy = recorded()
    view = NumpyView(spy)
    view.reset(seed=0)
    view.step(actions)
    assert spy.actions.tolist() == [2, 1, 0, 2]
    assert env.state.basket.tolist() == [9, 8, 7, 9]


def test_read_only_actions_are_copied_not_rejected() -> None:
    _, spy = recorded()
    view = NumpyView(spy)
    view.reset(seed=0)
    actions = np.array([0, 0, 2, 2])
    actions.flags.writeable = False
    view.step(actions)
    assert spy.actions.tolist() == [0, 0, 2, 2]


def test_reset_mask_is_converted_to_a_tensor() -> None:
    env, spy = recorded(autoreset_mode="DISABLED")
    view = NumpyView(spy)
    view.reset(seed=0)
    for _ in range(3):
        view.step(np.zeros(N, dtype=np.int64))
    view.reset(options={"reset_mask": np.array([True, False, True, False])})
    assert isinstance(spy.options["reset_mask"], torch.Tensor)
    assert env.state.t.tolist() == [0, 3, 0, 3]


def test_invalid_actions_still_raise_the_env_error() -> None:
    view = NumpyView(FruitCatcherVectorEnv(N))
    view.reset(seed=0)
    with pytest.raises(ValueError, match="sub-env 2 got 3"):
        view.step(np.array([0, 1, 3, 1]))
    with pytest.raises(TypeError, match="cannot convert"):
        view.step([object()] * N)
    with pytest.raises(TypeError, match=r"cannot convert list \['a', 'b', 'c', 'd'\]"):
        view.step(list("abcd"))
    with pytest.raises(TypeError, match="cannot convert ndarray"):
        view.step(np.array(list("abcd")))


def test_views_keep_spaces_metadata_and_num_envs() -> None:
    env = FruitCatcherVectorEnv(N, obs_mode="pixels", autoreset_mode="SAME_STEP")
    for view in (NumpyView(env), DLPackView(env, np)):
        assert view.num_envs == N
        assert view.metadata is env.metadata
        assert view.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        assert view.single_observation_space == env.single_observation_space
        assert view.single_action_space == env.single_action_space
        assert view.observation_space == env.observation_space
        assert view.action_space == env.action_space
        assert view.device == torch.device("cpu")
        assert view.unwrapped is env


def test_a_non_torch_env_is_refused_with_a_type_error() -> None:
    cartpole = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="vector_entry_point")
    with pytest.raises(TypeError, match="no `device` attribute"):
        NumpyView(cartpole)
    with pytest.raises(TypeError, match="no `device` attribute"):
        env_device(cartpole)


class FakeCudaEnv(gym.vector.VectorEnv):
    """Only what the constructors look at: a device that is not the CPU."""

    device = torch.device("cuda", 0)
    num_envs = N


def test_numpy_view_refuses_a_non_cpu_env_unless_copies_are_allowed() -> None:
    with pytest.raises(ValueError, match=r"env runs on cuda:0; pass allow_copy=True"):
        NumpyView(FakeCudaEnv())
    assert NumpyView(FakeCudaEnv(), allow_copy=True).allow_copy


# -- DLPackView --------------------------------------------------------------------------------


def test_dlpack_view_with_numpy_shares_memory() -> None:
    _, spy = recorded(autoreset_mode="SAME_STEP", max_episode_steps=2)
    view = DLPackView(spy, np)
    outputs = [view.reset(seed=5)]
    refs = [spy.last]
    for step in range(4):
        outputs.append(view.step(ACTIONS[step % 3]))
        refs.append(spy.last)
    for out, ref in zip(outputs, refs, strict=True):
        for array, tensor in zip(leaves(out), tensors(ref), strict=True):
            assert isinstance(array, np.ndarray)
            assert np.shares_memory(array, tensor.numpy())
            np.testing.assert_array_equal(array, tensor.numpy())


def test_dlpack_view_with_jax_shares_buffers_and_takes_jax_actions() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    env, spy = recorded(autoreset_mode="SAME_STEP", max_episode_steps=2)
    view = DLPackView(spy, jnp)
    obs, _ = view.reset(seed=5)
    assert isinstance(obs, jax.Array)
    assert obs.unsafe_buffer_pointer() == spy.last[0].data_ptr()
    for step in range(4):
        out = view.step(jnp.asarray(ACTIONS[step % 3], dtype=jnp.int32))
        assert spy.actions.tolist() == ACTIONS[step % 3].tolist()
        for array, tensor in zip(leaves(out), tensors(spy.last), strict=True):
            assert isinstance(array, jax.Array)
            assert array.unsafe_buffer_pointer() == tensor.data_ptr()
            np.testing.assert_array_equal(np.asarray(array), tensor.numpy())
    assert env.state.t.tolist() == [0] * N  # the second step ended every episode (SAME_STEP)


def test_dlpack_view_needs_an_array_module() -> None:
    with pytest.raises(TypeError, match="array module with from_dlpack"):
        DLPackView(FruitCatcherVectorEnv(N), types.SimpleNamespace())


def _no_dlpack(tensor: Any) -> Any:
    raise BufferError("unsupported device")


FOREIGN_XP = types.SimpleNamespace(
    __name__="foreign_xp", from_dlpack=_no_dlpack, asarray=lambda a: np.array(a, copy=True)
)


def test_dlpack_view_refuses_a_device_xp_cannot_read() -> None:
    view = DLPackView(FruitCatcherVectorEnv(N), FOREIGN_XP)
    with pytest.raises(ValueError, match=r"foreign_xp.from_dlpack cannot import tensors on cpu"):
        view.reset(seed=0)


def test_dlpack_view_copies_through_the_host_when_allowed() -> None:
    _, spy = recorded()
    view = DLPackView(spy, FOREIGN_XP, allow_copy=True)
    obs, _ = view.reset(seed=0)
    np.testing.assert_array_equal(obs, spy.last[0].numpy())
    assert not np.shares_memory(obs, spy.last[0].numpy())
    obs, reward, *_ = view.step(ACTIONS[0])
    np.testing.assert_array_equal(obs, spy.last[0].numpy())
    np.testing.assert_array_equal(reward, spy.last[1].numpy())


def test_to_torch_moves_to_the_device_and_keeps_memory_on_it() -> None:
    array = np.arange(3)
    tensor = to_torch(array, torch.device("cpu"))
    assert tensor.data_ptr() == array.__array_interface__["data"][0]
    same = torch.arange(3)
    assert to_torch(same, torch.device("cpu")) is same


# -- CUDA (run on a GPU machine; skipped elsewhere) ----------------------------------------------


@CUDA
def test_numpy_view_on_cuda_copies_when_allowed() -> None:
    cuda_env = FruitCatcherVectorEnv(N, device="cuda", autoreset_mode="SAME_STEP")
    cpu_env = FruitCatcherVectorEnv(N, autoreset_mode="SAME_STEP")
    with pytest.raises(ValueError, match="allow_copy=True"):
        NumpyView(cuda_env)
    view = NumpyView(cuda_env, allow_copy=True)
    got, expected = [view.reset(seed=2)], [cpu_env.reset(seed=2)]
    for step in range(250):
        got.append(view.step(ACTIONS[step % 3]))
        expected.append(cpu_env.step(ACTIONS[step % 3]))
    for out, ref in zip(got, expected, strict=True):
        for array, tensor in zip(leaves(out), tensors(ref), strict=True):
            assert isinstance(array, np.ndarray)
            np.testing.assert_array_equal(array, tensor.numpy())


@CUDA
def test_dlpack_view_with_numpy_on_cuda() -> None:
    env = FruitCatcherVectorEnv(N, device="cuda")
    with pytest.raises(ValueError, match="cannot import tensors on cuda:0"):
        DLPackView(env, np).reset(seed=0)
    obs, _ = DLPackView(env, np, allow_copy=True).reset(seed=0)
    assert isinstance(obs, np.ndarray)
    np.testing.assert_array_equal(obs, env.reset(seed=0)[0].cpu().numpy())


@CUDA
def test_numpy_actions_are_moved_to_the_cuda_env() -> None:
    env = FruitCatcherVectorEnv(N, device="cuda")
    spy = Recorder(env)
    view = NumpyView(spy, allow_copy=True)
    view.reset(seed=0)
    view.step(np.array([2, 1, 0, 2]))
    assert spy.actions.device == torch.device("cuda", 0)
    assert env.state.basket.tolist() == [9, 8, 7, 9]


@CUDA
def test_dlpack_view_with_cupy_shares_cuda_memory_both_ways() -> None:
    cp = pytest.importorskip("cupy")
    env, spy = recorded("cuda", autoreset_mode="SAME_STEP", max_episode_steps=2)
    view = DLPackView(spy, cp)
    outputs, refs = [view.reset(seed=5)], [spy.last]
    for step in range(4):
        actions = cp.asarray(ACTIONS[step % 3])
        outputs.append(view.step(actions))
        refs.append(spy.last)
        assert spy.actions.device == env.device
        assert spy.actions.data_ptr() == actions.data.ptr  # no copy on the way in either
    for out, ref in zip(outputs, refs, strict=True):
        for array, tensor in zip(leaves(out), tensors(ref), strict=True):
            assert isinstance(array, cp.ndarray)
            assert array.data.ptr == tensor.data_ptr()
            np.testing.assert_array_equal(cp.asnumpy(array), tensor.cpu().numpy())


@CUDA
def test_dlpack_view_with_jax_on_the_gpu_shares_buffers() -> None:
    jax = pytest.importorskip("jax")
    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here")
    _, spy = recorded("cuda")
    view = DLPackView(spy, jax.numpy)
    obs, _ = view.reset(seed=0)
    assert obs.unsafe_buffer_pointer() == spy.last[0].data_ptr()
    obs, reward, *_ = view.step(jax.numpy.asarray(ACTIONS[0], dtype=jax.numpy.int32))
    assert {device.platform for device in obs.devices()} == {"gpu"}
    assert reward.unsafe_buffer_pointer() == spy.last[1].data_ptr()
    assert spy.actions.tolist() == ACTIONS[0].tolist()
