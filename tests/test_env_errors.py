"""Bad input: every mistake is a ValueError naming the argument, and nothing is corrupted."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from fruit_env import ENV_ID, FruitCatcherEnv, FruitCatcherVectorEnv, FruitParams
from fruit_env.games.fruit_catcher.env import FruitState

NAN = float("nan")


def dtype_id(dtype: Any) -> str:
    return f"np.{dtype.__name__}" if isinstance(dtype, type) else str(dtype)


# -- constructor -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_envs": 0}, "num_envs"),
        ({"num_envs": -1}, "num_envs"),
        ({"num_envs": 2.5}, "num_envs"),
        ({"num_envs": True}, "num_envs"),
        ({"num_envs": "4"}, "num_envs"),
        ({"basket_width": 21}, "basket_width"),  # board is 20 wide
        ({"basket_width": 0}, "basket_width"),
        ({"width": 4, "basket_width": 5}, "basket_width"),
        ({"min_fruits": 4}, "min_fruits"),  # max_fruits is 3
        ({"max_fruits": 2, "min_fruits": 3}, "min_fruits"),
        ({"min_fruits": 0}, "min_fruits"),
        ({"max_fruits": 0}, "max_fruits"),
        ({"spawn_prob": 1.5}, "spawn_prob"),
        ({"spawn_prob": -0.1}, "spawn_prob"),
        ({"spawn_prob": NAN}, "spawn_prob"),
        ({"spawn_prob": float("inf")}, "spawn_prob"),
        ({"spawn_prob": "0.5"}, "spawn_prob"),
        ({"spawn_prob": True}, "spawn_prob"),
        ({"width": 1}, "width"),
        ({"width": 20.0}, "width"),
        ({"height": 1}, "height"),
        ({"min_spawn_gap": -1}, "min_spawn_gap"),
        ({"win_score": 0}, "win_score"),
        ({"lose_score": 0}, "lose_score"),
        ({"max_episode_steps": 0}, "max_episode_steps"),
        ({"obs_mode": "rgb"}, "obs_mode"),
        ({"device": "tpu"}, "device"),
        ({"device": "cuda:99"}, "cuda:99"),
        ({"device": "ipu"}, "device"),
        ({"compile": "yes"}, "compile"),
        ({"compile": 1}, "compile"),
        ({"validate_actions": "later"}, "validate_actions"),
        ({"validate_actions": 1}, "validate_actions"),
        ({"autoreset_mode": "sometimes"}, "autoreset_mode"),
        ({"autoreset_mode": 1}, "autoreset_mode"),
        ({"render_mode": "human"}, "render_mode"),
    ],
)
def test_bad_constructor_args(kwargs: dict[str, Any], match: str) -> None:
    """Invalid constructor arguments raise ValueError naming the argument, both directly
    and through gymnasium.make_vec."""
    args = {"num_envs": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        FruitCatcherVectorEnv(**args)
    with pytest.raises(ValueError, match=match):
        gym.make_vec(ENV_ID, **args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_a_value_error() -> None:
    """device="cuda" on a machine without CUDA says so, as a ValueError."""
    with pytest.raises(ValueError, match="CUDA is not available"):
        FruitCatcherVectorEnv(2, device="cuda")


@pytest.mark.parametrize("device", ["mps", "xpu"])
def test_unavailable_accelerator_is_a_value_error(device: str) -> None:
    """device="mps" / "xpu" on a machine without that backend raises a ValueError naming it."""
    available = {"mps": torch.backends.mps.is_available, "xpu": torch.xpu.is_available}
    if available[device]():
        pytest.skip(f"{device} is available here")
    with pytest.raises(ValueError, match=device):
        FruitCatcherVectorEnv(2, device=device)


def test_unknown_rule_is_rejected_by_name() -> None:
    """A misspelt rule argument is rejected, naming it (a TypeError, as for any unexpected
    keyword argument in Python)."""
    with pytest.raises((TypeError, ValueError), match="widht"):
        FruitCatcherVectorEnv(2, widht=10)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"spawn_prob": NAN}, "spawn_prob"),
        ({"min_fruits": 5}, "min_fruits"),
        ({"obs_mode": "voxels"}, "obs_mode"),
        ({"render_mode": "video"}, "render_mode"),
    ],
)
@pytest.mark.filterwarnings("ignore:.*render_mode='video'")  # Gymnasium warns first
def test_bad_single_env_args(kwargs: dict[str, Any], match: str) -> None:
    """The numpy single env validates its arguments the same way."""
    with pytest.raises(ValueError, match=match):
        gym.make(ENV_ID, **kwargs)


def test_single_env_rejects_max_episode_steps_kwarg() -> None:
    """FruitCatcherEnv leaves truncation to TimeLimit and says where the limit belongs."""
    with pytest.raises(ValueError, match="max_episode_steps"):
        FruitCatcherEnv(max_episode_steps=5)


# -- actions -----------------------------------------------------------------------------------


def fresh_env(**kwargs: Any) -> FruitCatcherVectorEnv:
    env = FruitCatcherVectorEnv(3, **kwargs)
    env.reset(seed=123)
    return env


def snapshot(env: FruitCatcherVectorEnv) -> list[torch.Tensor]:
    return [t.clone() for t in (*env.state, env.pending)]


def assert_unchanged(env: FruitCatcherVectorEnv, before: list[torch.Tensor]) -> None:
    after = [*env.state, env.pending]
    for name, a, b in zip((*FruitState._fields, "pending"), after, before, strict=True):
        assert torch.equal(a, b), name


BAD_ACTIONS: list[tuple[Any, str]] = [
    (np.array([0, 1]), "shape"),
    (np.array([[0, 1, 2]]), "shape"),
    (np.array([[0], [1], [2]]), "shape"),
    (np.int64(1), "shape"),
    ([0, 1, 2, 1], "shape"),
    (torch.tensor([0, 1]), "shape"),
    (torch.tensor([[0, 1, 2]]), "shape"),
    (np.array([0.0, 1.0, 2.0]), "integer dtype"),
    (np.array([0, 1, 2], dtype=np.float32), "integer dtype"),
    (torch.tensor([0.0, 1.0, 2.0]), "integer dtype"),
    (np.array([True, False, True]), "integer dtype"),
    (torch.tensor([True, False, True]), "integer dtype"),
    (np.array([0, 1, 2], dtype=np.complex64), "integer dtype"),
    (np.array([0, -1, 2]), "0, 1 or 2"),
    (np.array([0, 1, 3]), "0, 1 or 2"),
    (torch.tensor([-1, 1, 1]), "0, 1 or 2"),
    (torch.tensor([1, 3, 1]), "0, 1 or 2"),
    (torch.tensor([1, 1, 255], dtype=torch.uint8), "0, 1 or 2"),
    ([1, 1, 7], "0, 1 or 2"),
    (None, "actions"),
    ([0, None, 2], "actions"),
]


@pytest.mark.parametrize(("actions", "match"), BAD_ACTIONS)
def test_bad_actions_rejected_and_state_untouched(actions: Any, match: str) -> None:
    """Bad actions raise ValueError naming the problem; the env's state is unchanged and
    it keeps playing exactly like a twin that never saw the bad call."""
    env, twin = fresh_env(), fresh_env()
    before = snapshot(env)
    with pytest.raises(ValueError, match=match):
        env.step(actions)
    assert_unchanged(env, before)
    for row in ([0, 1, 2], [2, 2, 0], [1, 0, 1]):
        got, expected = env.step(np.array(row)), twin.step(np.array(row))
        for a, b in zip(got[:4], expected[:4], strict=True):
            assert torch.equal(a, b)


def test_out_of_range_reports_the_sub_env() -> None:
    """The message names the first offending sub-env and its value."""
    env = fresh_env()
    with pytest.raises(ValueError, match="sub-env 2 got 9"):
        env.step(np.array([1, 1, 9]))


def test_string_actions_are_a_value_error() -> None:
    """An array of strings is rejected with a ValueError like other non-integer actions."""
    env = fresh_env()
    with pytest.raises(ValueError, match="actions"):
        env.step(np.array(["0", "1", "2"]))


@pytest.mark.parametrize(
    "dtype",
    [np.int8, np.int16, np.int32, np.int64, np.uint8, torch.int8, torch.int32, torch.uint8],
    ids=dtype_id,
)
def test_any_integer_dtype_is_accepted(dtype: Any) -> None:
    """Integer actions of any width, numpy or torch, act the same as int64 ones."""
    env, twin = fresh_env(), fresh_env()
    for row in ([0, 1, 2], [2, 0, 1], [0, 0, 2]):
        if isinstance(dtype, torch.dtype):
            actions: Any = torch.tensor(row, dtype=dtype)
        else:
            actions = np.array(row, dtype=dtype)
        got, expected = env.step(actions), twin.step(np.array(row, dtype=np.int64))
        for a, b in zip(got[:4], expected[:4], strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize(
    "dtype",
    [np.uint16, np.uint32, np.uint64, torch.uint16, torch.uint32, torch.uint64],
    ids=dtype_id,
)
def test_wide_unsigned_actions_are_accepted(dtype: Any, validate: bool) -> None:
    """Unsigned actions wider than 8 bits are integers too and move the basket like int64."""
    env = fresh_env(validate_actions=validate)
    start = env.state.basket.clone()
    if isinstance(dtype, torch.dtype):
        actions: Any = torch.tensor([0, 1, 2], dtype=dtype)
    else:
        actions = np.array([0, 1, 2], dtype=dtype)
    env.step(actions)
    assert torch.equal(env.state.basket, start + torch.tensor([-1, 0, 1], dtype=torch.int32))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_unvalidated_actions_are_clamped(kind: str) -> None:
    """validate_actions=False: values below 0 act as 0 (left), above 2 as 2 (right)."""
    env = fresh_env(validate_actions=False)
    start = env.state.basket.clone()  # centred: 17 // 2 = 8 on the default board
    assert start.tolist() == [8, 8, 8]
    raw = [-5, 1, 7]
    actions = np.array(raw) if kind == "numpy" else torch.tensor(raw)
    env.step(actions)
    assert env.state.basket.tolist() == [7, 8, 9]
    env.step(actions if kind == "numpy" else actions.to(torch.int8))
    assert env.state.basket.tolist() == [6, 8, 10]


def test_unvalidated_actions_still_check_shape_and_dtype() -> None:
    """validate_actions=False skips the range check only."""
    env = fresh_env(validate_actions=False)
    with pytest.raises(ValueError, match="shape"):
        env.step(np.array([1, 1]))
    with pytest.raises(ValueError, match="integer dtype"):
        env.step(np.array([1.0, 1.0, 1.0]))


def test_step_before_reset_is_a_runtime_error() -> None:
    """Stepping a fresh env without reset() raises RuntimeError asking for reset."""
    env = FruitCatcherVectorEnv(2)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.array([1, 1]))


# -- seeds and reset options -------------------------------------------------------------------

BAD_RESETS: list[tuple[dict[str, Any], str]] = [
    ({"seed": -1}, "non-negative"),
    ({"seed": [1, 2]}, "num_envs=3"),
    ({"seed": [1, 2, 3, 4]}, "num_envs=3"),
    ({"seed": [1, -2, 3]}, "non-negative"),
    ({"seed": [1, "2", 3]}, "seed"),
    ({"seed": [1, 2.0, 3]}, "seed"),
    ({"seed": "123"}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"seed": True}, "seed"),
    ({"options": {"reset_mak": np.ones(3, dtype=bool)}}, "reset_mak"),
    ({"options": {"seed": 3}}, "unknown reset options"),
    ({"options": {"reset_mask": np.ones(2, dtype=bool)}}, "reset_mask"),
    ({"options": {"reset_mask": np.ones((3, 1), dtype=bool)}}, "reset_mask"),
    ({"options": {"reset_mask": np.ones(3, dtype=np.int64)}}, "reset_mask"),
    ({"options": {"reset_mask": torch.ones(3)}}, "reset_mask"),
    ({"options": {"reset_mask": [1, 0, 1]}}, "reset_mask"),
]


@pytest.mark.parametrize(("kwargs", "match"), BAD_RESETS)
def test_bad_reset_rejected_and_state_untouched(kwargs: dict[str, Any], match: str) -> None:
    """Bad seeds and reset options raise ValueError naming them; nothing changes."""
    env, twin = fresh_env(), fresh_env()
    env.step(np.array([0, 1, 2]))
    twin.step(np.array([0, 1, 2]))
    before = snapshot(env)
    with pytest.raises(ValueError, match=match):
        env.reset(**kwargs)
    assert_unchanged(env, before)
    got, expected = env.step(np.array([1, 2, 0])), twin.step(np.array([1, 2, 0]))
    for a, b in zip(got[:4], expected[:4], strict=True):
        assert torch.equal(a, b)


def test_reset_options_dict_not_modified() -> None:
    """reset() reads options without popping from the caller's dict."""
    env = fresh_env()
    options = {"reset_mask": np.array([True, False, True])}
    env.reset(options=options)
    assert list(options) == ["reset_mask"]


def test_reset_mask_accepts_list_and_torch_bools() -> None:
    """A reset_mask may be a list of bools or a torch bool tensor, with the same effect."""
    envs = [fresh_env() for _ in range(3)]
    masks: list[Any] = [
        np.array([True, False, True]),
        [True, False, True],
        torch.tensor([True, False, True]),
    ]
    for env, mask in zip(envs, masks, strict=True):
        env.step(np.array([0, 0, 0]))
        env.reset(options={"reset_mask": mask})
    for env in envs[1:]:
        for a, b in zip(env.state, envs[0].state, strict=True):
            assert torch.equal(a, b)
    assert envs[0].state.t.tolist() == [0, 1, 0]


def test_params_are_immutable() -> None:
    """FruitParams is frozen: rules cannot change under a running env."""
    params = FruitParams()
    with pytest.raises(AttributeError):
        params.width = 5  # type: ignore[misc]


# -- when invalid actions are reported ---------------------------------------------------------


def test_validation_is_immediate_on_the_cpu_by_default() -> None:
    """validate_actions=True on the CPU: the step itself raises (and changes nothing)."""
    env = fresh_env()
    assert env.validate_actions is True
    with pytest.raises(ValueError, match="sub-env 1 got 7"):
        env.step(np.array([1, 7, 1]))
    immediate = fresh_env(validate_actions="immediate")
    with pytest.raises(ValueError, match="sub-env 0 got -1"):
        immediate.step(np.array([-1, 1, 1]))


def _check_points() -> dict[str, Any]:
    return {
        "check_actions": lambda env: env.check_actions(),
        "reset": lambda env: env.reset(),
        "render": lambda env: env.render(),
        "close": lambda env: env.close(),
    }


@pytest.mark.parametrize("check", list(_check_points()))
def test_deferred_validation_raises_at_the_next_check_point(check: str) -> None:
    """validate_actions="deferred": the step runs; the next reset(), render(), close() or
    check_actions() raises, naming the first offending sub-env and its value, once."""
    env = fresh_env(validate_actions="deferred", render_mode="ansi")
    env.step(np.array([0, 1, 2]))
    env.step(np.array([1, 7, -2]))  # no error here
    env.step(np.array([2, 2, 2]))
    with pytest.raises(ValueError, match=r"sub-env 1 got 7 \(in a step since the last check"):
        _check_points()[check](env)
    _check_points()[check](env)  # reported once: the record is cleared


def test_deferred_validation_keeps_the_first_offence_and_clamps() -> None:
    """The error names the first invalid action since the last check; the steps ran with
    out-of-range actions clamped, as with validate_actions=False."""
    env = fresh_env(validate_actions="deferred")
    twin = fresh_env(validate_actions=False)
    for row in ([0, 1, 5], [-3, 1, 1], [2, 0, 1]):
        got, expected = env.step(np.array(row)), twin.step(np.array(row))
        for a, b in zip(got[:4], expected[:4], strict=True):
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match="sub-env 2 got 5"):
        env.check_actions()
    env.check_actions()
    env.step(np.array([1, 1, 1]))
    env.check_actions()  # valid steps since: nothing to report


def test_close_with_a_pending_error_still_closes() -> None:
    env = fresh_env(validate_actions="deferred")
    env.step(np.array([3, 1, 1]))
    with pytest.raises(ValueError, match="sub-env 0 got 3"):
        env.close()
    with pytest.raises(RuntimeError, match="closed"):
        env.step(np.array([1, 1, 1]))


def test_validate_actions_can_be_changed_later() -> None:
    """The setting is an attribute (SB3's set_attr uses it); bad values are refused by name."""
    env = fresh_env()
    env.validate_actions = "deferred"
    env.step(np.array([1, 1, 4]))
    with pytest.raises(ValueError, match="sub-env 2 got 4"):
        env.reset()
    env.validate_actions = False
    env.step(np.array([1, 1, 4]))
    env.check_actions()
    with pytest.raises(ValueError, match="validate_actions"):
        env.validate_actions = "sometimes"


# -- sizes -------------------------------------------------------------------------------------


def test_a_huge_pixel_board_is_a_value_error_naming_its_arguments() -> None:
    """A batch whose observations cannot fit in memory is refused up front (it used to fail
    with a MemoryError, or worse, on its first reset)."""
    with pytest.raises(ValueError, match=r"num_envs=1000000 .*width=10000, height=10000"):
        gym.make_vec(ENV_ID, num_envs=10**6, obs_mode="pixels", width=10**4, height=10**4)
    with pytest.raises(ValueError, match=r"num_envs=1000000000000 .*max_fruits=3"):
        FruitCatcherVectorEnv(10**12)
