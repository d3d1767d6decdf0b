"""Wrong values handed to the kit, or returned by a game's rules, are refused with an error
that names the problem: snapshots from other rules, snapshot indices out of range and
snapshots of other dtypes; seeds beyond 64 bits; rule outputs of the wrong kind (checked once,
on the first step); and a size too large to seed from OS entropy one sub-env at a time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import pytest
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from fruit_env.kit import Step, TensorGame, TensorVectorEnv

ROOT = Path(__file__).resolve().parents[1]


def fruit(num_envs: int = 3, **rules: Any) -> Any:
    env = gym.make_vec("FruitCatcher-v0", num_envs=num_envs, **rules)
    env.reset(seed=0)
    return env


# -- snapshots -----------------------------------------------------------------------------------


@pytest.mark.parametrize("through_checkpoint", [False, True], ids=["snapshot", "cpu tensors"])
def test_a_snapshot_from_other_rules_is_refused_naming_them(through_checkpoint: bool) -> None:
    """Width 20 into width 10: the packed rows have the same shape, so only the rules the
    snapshot carries can tell; a checkpoint's copy (plain CPU tensors) carries them too."""
    wide, narrow = fruit(width=20), fruit(width=10)
    for _ in range(5):
        wide.step(torch.full((3,), 2))
    snapshot = wide.unwrapped.snapshot_state(torch.tensor([0, 1]))
    if through_checkpoint:
        snapshot = tuple(t.detach().clone().cpu() for t in snapshot)
    before = narrow.unwrapped.snapshot_state(torch.arange(3))
    with pytest.raises(ValueError, match="another env's rules") as refused:
        narrow.unwrapped.restore_state(torch.tensor([0, 1]), snapshot)
    assert "width=20" in str(refused.value) and "width=10" in str(refused.value)
    after = narrow.unwrapped.snapshot_state(torch.arange(3))
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))  # unchanged


def test_a_snapshot_of_the_same_rules_restores_from_another_env() -> None:
    """Another env of the same rules (a checkpoint's copy, say) takes it, and so does a
    snapshot of three tensors (from before snapshots carried their rules)."""
    source, target = fruit(width=12), fruit(width=12)
    snapshot = tuple(t.clone() for t in source.unwrapped.snapshot_state(torch.tensor([2])))
    target.unwrapped.restore_state(torch.tensor([0]), snapshot)
    target.unwrapped.restore_state(torch.tensor([1]), snapshot[:3])
    obs, *_ = target.step(torch.ones(3, dtype=torch.int64))
    expected, *_ = source.step(torch.ones(3, dtype=torch.int64))
    assert torch.equal(obs[0], expected[2]) and torch.equal(obs[1], expected[2])


@pytest.mark.parametrize(
    ("call", "index"),
    [
        ("snapshot_state", torch.tensor([0, 3])),
        ("snapshot_state", torch.tensor([-1])),
        ("snapshot_state", np.array([1, 7])),
        ("restore_state", torch.tensor([0, 5])),
        ("restore_state", [4, 0]),
    ],
)
def test_a_snapshot_index_out_of_range_names_the_index(call: str, index: Any) -> None:
    env = fruit().unwrapped
    snapshot = env.snapshot_state(torch.tensor([0, 1]))
    args = (index,) if call == "snapshot_state" else (index, snapshot)
    bad = next(int(i) for i in index if not 0 <= int(i) < 3)
    with pytest.raises(ValueError, match=rf"index .*\[0, 3\) \(num_envs=3\), got {bad}$"):
        getattr(env, call)(*args)


@pytest.mark.parametrize("field", [0, 1, 2])
def test_a_float_snapshot_names_the_tensor(field: int) -> None:
    env = fruit().unwrapped
    snapshot = list(env.snapshot_state(torch.tensor([0, 1])))
    name = ("packed", "key", "counter")[field]
    snapshot[field] = snapshot[field].float()
    with pytest.raises(ValueError, match=rf"snapshot\.{name} must be a torch\.int\d\d tensor"):
        env.restore_state(torch.tensor([0, 1]), tuple(snapshot))


# -- seeds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [2**64, 2**70, [0, 2**64 + 5, None]])
def test_seeds_of_64_bits_or_more_are_refused(seed: Any) -> None:
    """Before, they were taken modulo 2**64: seed 2**70 played seed 0's games."""
    env = fruit()
    with pytest.raises(ValueError, match=r"below 2\*\*64"):
        env.reset(seed=seed)


def test_the_single_env_refuses_them_too() -> None:
    env = gym.make("FruitCatcher-v0")
    with pytest.raises(ValueError, match=r"below 2\*\*64"):
        env.reset(seed=2**64)
    env.reset(seed=2**64 - 1)  # the largest seed is fine


# -- rule outputs ----------------------------------------------------------------------------------


class Counter(NamedTuple):
    t: torch.Tensor  # (N,) int32
    ret: torch.Tensor  # (N,) float32


class Count(TensorGame[Counter]):
    """Counts to 5; action 1 pays 1. `broken` makes one rule return a wrong value."""

    num_actions = 2
    max_episode_steps = 5

    def __init__(self, broken: str = "") -> None:
        self.broken = broken
        self.observation_space = gym.spaces.Box(0.0, 5.0, (1,), np.float32)
        self.advances = 0

    def rules_key(self) -> str:
        return repr(self.broken)

    def initial(self, bits: torch.Tensor) -> Counter:
        zero = torch.zeros_like(bits, dtype=torch.int32)
        return Counter(zero, zero.float())

    def advance(self, state: Counter, action: torch.Tensor, bits: torch.Tensor) -> Step:
        self.advances += 1
        t = state.t + 1
        reward: Any = action.to(torch.float32)
        done = t >= self.max_episode_steps
        terminated: Any = torch.zeros_like(done)
        if self.broken == "python float":
            reward = 1.0
        elif self.broken in ("int64", "float64"):
            reward = reward.to(getattr(torch, self.broken))
        elif self.broken == "int flag":
            terminated = terminated.to(torch.int64)
        elif self.broken == "reward shape":
            reward = reward[:, None]
        return Step(Counter(t, state.ret + torch.as_tensor(reward)), reward, terminated, done)

    def observe(self, state: Counter) -> torch.Tensor:
        obs = state.t[:, None].to(torch.float32)
        return obs.double() if self.broken == "float64 obs" else obs

    def episode(self, state: Counter) -> tuple[torch.Tensor, ...]:
        if self.broken == "one statistic":
            return (state.ret.clone(),)
        return state.ret.clone(), state.t.clone()


BROKEN = [
    ("python float", r"Count\.advance returned 1\.0 \(a float\) as the reward; it must be a "),
    ("int64", r"Count\.advance returned an int64 tensor of shape \(1,\) as the reward; it must "),
    ("float64", r"Count\.advance returned a float64 tensor .* as the reward; .*float32 tensor"),
    ("int flag", r"Count\.advance returned an int64 tensor .* as the terminated; .* bool tensor"),
    ("reward shape", r"Count\.advance returned a float32 tensor of shape \(1, 1\) as the reward"),
    ("one statistic", r"Count\.episode returned 1 values for the 2 episode_fields \('r', 'l'\)"),
    (
        "float64 obs",
        r"Count\.observe returned a float64 .* observation_space has dtype float32",
    ),
]


@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP", "DISABLED"])
@pytest.mark.parametrize(("broken", "message"), BROKEN, ids=[b for b, _ in BROKEN])
def test_a_wrong_rule_output_names_the_rule_at_the_first_step(
    broken: str, message: str, mode: str
) -> None:
    env = TensorVectorEnv(Count(broken), 4, autoreset_mode=mode)
    env.reset(seed=0)  # construction and reset do not play the rules
    with pytest.raises(TypeError, match=message):
        env.step(torch.ones(4, dtype=torch.int64))


def test_the_rules_are_checked_once_not_on_every_step() -> None:
    """The check plays `advance` once more on the first step, and never after."""
    game = Count()
    env = TensorVectorEnv(game, 4, validate_actions=False)
    env.reset(seed=0)
    for steps in range(1, 8):
        env.step(torch.ones(4, dtype=torch.int64))
        assert game.advances == steps + 1


def test_own_env_example_passes_the_check() -> None:
    """The game docs/env.md shows (examples/own_env.py) is what the kit promises."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        own_env = __import__("own_env")
    finally:
        sys.path.remove(str(ROOT / "examples"))
    env = own_env.make(4)
    env.reset(seed=0)
    _, reward, terminated, *_ = env.step(torch.ones(4, dtype=torch.int64))
    assert reward.dtype == torch.float32 and terminated.dtype == torch.bool


# -- sizes ---------------------------------------------------------------------------------------

HUGE = """
import resource
import gymnasium as gym
import torch
import fruit_env
with open("/proc/self/status") as f:
    used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (used + 2**30, resource.RLIM_INFINITY))
env = gym.make_vec("FruitCatcher-v0", num_envs=2**31, device="meta", validate_actions=False)
obs, _ = env.reset()
_, reward, *_ = env.step(torch.zeros(2**31, dtype=torch.int64, device="meta"))
print(tuple(obs.shape), tuple(reward.shape))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_meta_env_of_two_billion_sub_envs_is_built_without_host_memory() -> None:
    """Its unseeded keys are computed on its device: before, 2**31 seeds were drawn from OS
    entropy into a 16 GiB host array (which ran for minutes); here the process may take
    only 1 GiB more than it holds after its imports."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(HUGE)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == "(2147483648, 10) (2147483648,)"


def _keys_of(env: Any) -> torch.Tensor:
    return env.unwrapped.snapshot_state(torch.arange(env.num_envs)).key


@pytest.mark.parametrize("seeded", [False, True])
def test_keys_of_an_int_seed_or_none_are_distinct(seeded: bool) -> None:
    """Unseeded sub-envs get distinct keys, and two envs get different ones."""
    make: Callable[[], Any] = lambda: gym.make_vec("FruitCatcher-v0", num_envs=4096)  # noqa: E731
    first, second = make(), make()
    first.reset(seed=3 if seeded else None)
    second.reset(seed=3 if seeded else None)
    keys = _keys_of(first)
    assert len(torch.unique(keys)) == 4096
    assert torch.equal(keys, _keys_of(second)) is seeded
