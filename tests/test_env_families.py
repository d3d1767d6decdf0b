"""Groups that start alike on every env family: gymnax (`GymnaxVectorEnv`), Gymnasium's numpy
`CartPoleVectorEnv` (`ArrayStateVectorEnv`), any `SyncVectorEnv` of copyable envs
(`CopiedStateVectorEnv`: classic control, MinAtar), any `AsyncVectorEnv` of them
(`PickledStateVectorEnv`) and Fruit Catcher's own protocol.

For each family: a snapshot round trip continues bit-identically whatever the neighbours do;
the members of a group are identical after group restarts and after branches; the trainer
sees the state protocol (no "do not start alike" warning) and can branch. gymnax's step,
masked reset, snapshot and restore do not sync with the host. Each test skips without its
extra; `make test` installs them all.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from uncopyable import LockedEnv

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.envs import make_envs
from grpo_trainer.envs.array_state import ARRAY_LAYOUTS, ArrayStateVectorEnv
from grpo_trainer.envs.async_state import PickledStateVectorEnv
from grpo_trainer.envs.copied_state import CopiedStateVectorEnv
from grpo_trainer.envs.env_io import EnvIO
from grpo_trainer.tools.syncs import SyncCounter

CPU = torch.device("cpu")


def _gymnax(name: str) -> Callable[[int], Any]:
    def make(n: int) -> Any:
        pytest.importorskip("gymnax")
        config = GRPOConfig(run=RunConfig(env=f"gymnax:{name}"))
        return make_envs(config, n, CPU)

    return make


def _minatar(n: int) -> Any:
    pytest.importorskip("minatar")
    config = GRPOConfig(run=RunConfig(env="minatar:Breakout-v1"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no episode limit"
        return make_envs(config, n, CPU)


SPAWN = {"context": "spawn"}  # workers in fresh processes: forking a process with JAX can hang


def _async(name: str) -> Callable[[int], Any]:
    return lambda n: gym.make_vec(name, n, vectorization_mode="async", vector_kwargs=SPAWN)


FAMILIES: dict[str, Callable[[int], Any]] = {
    "fruit": lambda n: gym.make_vec("FruitCatcher-v0", num_envs=n),
    "gymnax-cartpole": _gymnax("CartPole-v1"),
    "gymnax-breakout": _gymnax("Breakout-MinAtar"),
    "numpy-cartpole": lambda n: gym.make_vec("CartPole-v1", num_envs=n),
    "sync-acrobot": lambda n: gym.make_vec("Acrobot-v1", num_envs=n, vectorization_mode="sync"),
    "minatar-breakout": _minatar,
    "async-cartpole": _async("CartPole-v1"),  # episodes end within the tests: autoresets
}
OPENED: list[Any] = []  # envs the current test made: AsyncVectorEnv's workers need closing


@pytest.fixture(autouse=True)
def _close_envs() -> Iterator[None]:
    yield
    while OPENED:
        OPENED.pop().close()


def _io(family: str, n: int) -> EnvIO:
    envs = FAMILIES[family](n)
    OPENED.append(envs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an adapter that cannot copy would warn
        return EnvIO(envs, CPU)


def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _actions(io: EnvIO, per_env: np.ndarray) -> torch.Tensor:
    space = io.action_space
    if isinstance(space, gym.spaces.Discrete):
        return torch.as_tensor(per_env % int(space.n))
    return torch.as_tensor(per_env, dtype=torch.float32).reshape(-1, *space.shape)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_restored_sub_env_continues_bit_identically(family: str) -> None:
    """Snapshot sub-env 1; record its next 40 steps; restore the snapshot into sub-envs 3 and
    4 while every other sub-env takes other actions: 3 and 4 replay sub-env 1 exactly."""
    io = _io(family, 6)
    assert io.restart_method.name == "snapshot"
    envs = io.envs
    io.reset_groups(list(range(6)), 1)
    rng = np.random.default_rng(0)
    for _ in range(3):
        io.step(_actions(io, rng.integers(0, 3, 6)))
    snapshot = envs.snapshot_state(torch.tensor([1, 1]))
    script = rng.integers(0, 3, 40)
    expected = []
    for a in script:
        step = io.step(_actions(io, np.array([0, a, 1, 2, 0, 1])))
        expected.append((step.obs[1].clone(), step.reward[1].clone(), step.done[1].clone()))
    envs.restore_state(np.array([3, 4]), snapshot)
    for t, a in enumerate(script):
        step = io.step(_actions(io, np.array([a + 1, a + 2, 2, a, a, 0])))
        for b in (3, 4):
            for got, want in zip(
                (step.obs[b], step.reward[b], step.done[b]), expected[t], strict=True
            ):
                assert torch.equal(got, want), (family, t, b)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_group_members_are_identical_after_restarts_and_branches(family: str) -> None:
    """Group starts, a restart of one group, and a branch of another leave every group's
    members in one state: equal actions then keep them equal."""
    size = 3
    io = _io(family, 3 * size)
    obs = io.reset_groups([11, 12, 13], size)

    def members_alike(obs: torch.Tensor) -> None:
        grouped = obs.unflatten(0, (3, size))
        assert torch.equal(grouped, grouped[:, :1].expand_as(grouped)), family

    def play(obs: torch.Tensor, steps: int, seed: int) -> torch.Tensor:
        rng = np.random.default_rng(seed)
        for _ in range(steps):
            obs = io.step(_actions(io, np.repeat(rng.integers(0, 3, 3), size))).obs
            members_alike(obs)
        return obs

    members_alike(obs)
    obs = play(obs, 5, 0)
    # members drift apart: each takes its own actions
    obs = io.step(_actions(io, np.arange(3 * size))).obs
    fresh = torch.tensor([True] * size + [False] * 2 * size)  # group 0 restarts
    source = torch.arange(3 * size)
    source[:size] = 0
    source[size : 2 * size] = size + 1  # group 1 branches from its member 1
    source[2 * size :] = 2 * size  # group 2 branches from its member 0
    obs = io.restart(obs, fresh, source, lambda: [99] * 3 * size)
    members_alike(obs)
    play(obs, 8, 1)


def test_gymnax_step_reset_and_snapshots_do_not_sync_with_the_host() -> None:
    io = _io("gymnax-cartpole", 8)
    io.reset_groups([1, 2], 4)
    actions = torch.zeros(8, dtype=torch.int64)
    io.step(actions)  # compile outside the count
    fresh = torch.tensor([True] * 4 + [False] * 4)
    source = torch.tensor([0, 0, 0, 0, 6, 6, 6, 6])
    obs = io.restart(io.step(actions).obs, fresh, source, lambda: [0] * 8)
    with SyncCounter() as syncs:
        for _ in range(5):
            obs = io.step(actions).obs
        io.restart(obs, fresh, source, lambda: [0] * 8)
    assert syncs.count == 0, syncs.calls


def test_gymnax_env_speaks_torch_and_declares_itself() -> None:
    io = _io("gymnax-cartpole", 4)  # the trainer's env: no final_obs, no autoreset
    envs = io.envs
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.DISABLED
    assert io.max_episode_steps() == 500  # gymnax's own limit, visible to the trainer
    obs, _ = envs.reset(seed=0)
    assert isinstance(obs, torch.Tensor) and obs.dtype == torch.float32 and obs.shape == (4, 4)
    _, reward, terminated, _, info = envs.step(torch.zeros(4, dtype=torch.int64))
    assert reward.dtype == torch.float32 and terminated.dtype == torch.bool
    assert info == {}


def test_a_users_gymnax_env_keeps_gymnasiums_same_step_final_observation() -> None:
    """Gymnasium's SAME_STEP contract by default: the last observation of an ended episode in
    `info["final_obs"]`, masked by `info["_final_obs"]`, while `obs` is the new episode's."""
    pytest.importorskip("gymnax")
    import gymnax

    from grpo_trainer.envs.gymnax_vector import GymnaxVectorEnv

    env, params = gymnax.make("CartPole-v1")
    envs = GymnaxVectorEnv(env, params, 4)
    envs.reset(seed=0)
    push_right = torch.ones(4, dtype=torch.int64)
    for _ in range(200):  # always pushing right topples the pole within a few dozen steps
        obs, _, terminated, truncated, info = envs.step(push_right)
        ended = terminated | truncated
        if ended.any():
            break
    assert ended.any() and torch.equal(info["_final_obs"], ended)
    assert info["final_obs"].shape == (4, 4)
    final, fresh = info["final_obs"][ended], obs[ended]
    assert (final[:, 2].abs() > 0.2).all()  # the pole angle that ended it (limit 12 degrees)
    assert (fresh.abs() <= 0.05).all()  # gymnax resets to uniform(-0.05, 0.05)


def test_the_trainers_gymnax_env_leaves_ended_sub_envs_to_the_trainer() -> None:
    """autoreset=False (the trainer's fast option): gymnax's transition alone, declared as
    Gymnasium's DISABLED mode; an ended sub-env draws no new game until a masked reset, and
    its neighbours' steps are those of gymnax's own step."""
    pytest.importorskip("gymnax")
    import gymnax

    from grpo_trainer.envs.gymnax_vector import GymnaxVectorEnv

    env, params = gymnax.make("CartPole-v1")
    plain = GymnaxVectorEnv(env, params, 4, autoreset=False)
    same_step = GymnaxVectorEnv(env, params, 4)
    assert plain.metadata["autoreset_mode"] == gym.vector.AutoresetMode.DISABLED
    for e in (plain, same_step):
        e.reset(seed=[7, 7, 8, 8])
    right = torch.tensor([1, 1, 0, 1])
    ended = torch.zeros(4, dtype=torch.bool)
    while not ended.any():
        obs, reward, terminated, truncated, _ = plain.step(right)
        ref_obs, ref_reward, ref_terminated, _, _ = same_step.step(right)
        ended = terminated | truncated
        assert torch.equal(terminated, ref_terminated) and torch.equal(reward, ref_reward)
        assert torch.equal(obs[~ended], ref_obs[~ended])
    assert (obs[ended][:, 2].abs() > 0.2).all()  # the fallen pole stays: no new game
    obs, _ = plain.reset(options={"reset_mask": ended})
    assert (obs[ended].abs() <= 0.05).all()


def test_gymnax_env_refuses_bad_input_with_a_clear_error() -> None:
    pytest.importorskip("gymnax")
    import gymnax

    from grpo_trainer.envs.gymnax_vector import GymnaxVectorEnv

    env, params = gymnax.make("CartPole-v1")
    envs = GymnaxVectorEnv(env, params, 4)  # check_actions=True: a user's env
    with pytest.raises(RuntimeError, match="call reset"):
        envs.step(torch.zeros(4, dtype=torch.int64))
    envs.reset(seed=0)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        envs.step(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="must be integers"):
        envs.step(torch.zeros(4))
    with pytest.raises(ValueError, match="out of the action space"):
        envs.step(torch.full((4,), 2))
    with pytest.raises(ValueError, match="list of 4 seeds"):
        envs.reset(seed=[1, 2])
    with pytest.raises(ValueError, match="reset_mask"):
        envs.reset(options={"reset_mask": torch.ones(3, dtype=torch.bool)})
    with pytest.raises(ValueError, match="another env or another index"):
        envs.restore_state(torch.tensor([0, 1]), envs.snapshot_state(torch.tensor([0])))


def test_gymnax_state_goes_through_a_checkpoint() -> None:
    """`EnvIO.snapshot()` (a checkpoint's env state) loads with weights_only=True and puts
    every sub-env back where it was."""
    import io as bytes_io

    env = _io("gymnax-breakout", 4)
    env.reset_groups([5, 6], 2)
    for t in range(4):
        env.step(torch.full((4,), t % 3))
    buffer = bytes_io.BytesIO()
    torch.save(env.snapshot(), buffer)
    actions = [torch.tensor([t % 3, 1, 2, 0]) for t in range(20)]
    expected = [env.step(a) for a in actions]
    buffer.seek(0)
    env.restore(torch.load(buffer, weights_only=True))
    for a, want in zip(actions, expected, strict=True):
        got = env.step(a)
        assert torch.equal(got.obs, want.obs) and torch.equal(got.reward, want.reward)


def test_copied_snapshots_copy_only_what_moves_and_outlive_steps() -> None:
    """A snapshot keeps its sub-envs as they were even after the env steps on; restoring an
    unchanged sub-env's own snapshot into it keeps the very same object."""
    envs = CopiedStateVectorEnv(gym.make_vec("Acrobot-v1", num_envs=3, vectorization_mode="sync"))
    envs.reset(seed=0)
    before = list(envs.unwrapped.envs)
    envs.restore_state(np.arange(3), envs.snapshot_state(np.arange(3)))
    assert all(a is b for a, b in zip(envs.unwrapped.envs, before, strict=True))
    kept = envs.snapshot_state(np.array([0]))
    state = copy.deepcopy(envs.unwrapped.envs[0].unwrapped.state)
    envs.step(np.array([0, 1, 2]))
    envs.restore_state(np.array([2]), kept)
    assert np.array_equal(envs.unwrapped.envs[2].unwrapped.state, state)


def test_an_env_that_cannot_be_copied_keeps_seeded_restarts_and_says_so() -> None:
    pytest.importorskip("Box2D")
    pytest.importorskip("pygame")
    envs = gym.make_vec("LunarLander-v3", num_envs=2, vectorization_mode="sync")
    with pytest.warns(RuntimeWarning, match=r"LunarLander-v3: its sub-envs cannot be copied"):
        io = EnvIO(envs, CPU)
    assert io.restart_method.name == "seeded"


def test_an_async_env_that_cannot_be_copied_keeps_seeded_restarts_and_says_so() -> None:
    """Its workers build it from its class, but its state does not pickle: the check fails in
    a throwaway worker, and the env's own workers play on with seeded restarts."""
    envs = gym.vector.AsyncVectorEnv([LockedEnv] * 2, context="spawn")
    OPENED.append(envs)
    with pytest.warns(RuntimeWarning, match=r"LockedEnv.*copied \(TypeError: cannot pickle"):
        io = EnvIO(envs, CPU)
    assert io.restart_method.name == "seeded"
    obs = io.reset_groups([3], 2)
    obs = io.step(torch.tensor([1, 0])).obs
    assert not torch.equal(obs[0], obs[1])
    obs = io.restart(obs, torch.tensor([True, True]), torch.arange(2), lambda: [5, 5])
    assert torch.equal(obs[0], obs[1])


def test_async_restores_follow_the_workers_pending_autoresets() -> None:
    """A worker keeps its NEXT_STEP flag itself. A restore into a sub-env whose episode just
    ended cancels its pending reset; a snapshot of one that just ended cannot go into one that
    did not (the worker cannot be told) and says so; own snapshots put back move nothing."""
    async_envs = gym.make_vec("CartPole-v1", 2, vectorization_mode="async", vector_kwargs=SPAWN)
    OPENED.append(async_envs)
    envs = PickledStateVectorEnv(async_envs)
    envs.reset(seed=0)
    envs.restore_state(np.arange(2), envs.snapshot_state(np.arange(2)))
    assert envs._states is None  # nothing pulled or pushed
    for t in range(100):  # sub-env 0 always pushes right; sub-env 1 balances for longer
        _, _, terminated, truncated, _ = envs.step(np.array([1, t % 2]))
        if terminated[0]:
            break
    assert terminated.tolist() == [True, False] and not truncated.any()
    ended, playing = envs.snapshot_state(np.array([0])), envs.snapshot_state(np.array([1]))
    with pytest.raises(ValueError, match="cannot be told"):
        envs.restore_state(np.array([1]), ended)
    envs.restore_state(np.array([0]), playing)
    assert np.array_equal(async_envs.observations[0], async_envs.observations[1])
    for _ in range(3):
        obs, reward, *_ = envs.step(np.array([0, 0]))
        assert np.array_equal(obs[0], obs[1]) and reward.tolist() == [1.0, 1.0]  # no reset


def test_numpy_cartpole_group_starts_match_its_own_reset() -> None:
    """A sub-env reset with seed s starts as CartPoleVectorEnv's own reset(seed=s) starts
    its sub-env 0: the adapter adds per-env seeds without changing the start distribution."""
    layout = ARRAY_LAYOUTS[CartPoleVectorEnv]
    envs = ArrayStateVectorEnv(gym.make_vec("CartPole-v1", num_envs=4), layout)
    obs, _ = envs.reset(seed=[7, 7, 8, 8])
    for b, seed in enumerate([7, 7, 8, 8]):
        own, _ = gym.make_vec("CartPole-v1", num_envs=1).reset(seed=seed)
        assert np.array_equal(obs[b], own[0])


def test_the_trainers_numpy_cartpole_leaves_ended_sub_envs_to_the_trainer() -> None:
    """The adapter the trainer puts around CartPoleVectorEnv starts no new game itself
    (Gymnasium's DISABLED mode: no twin reset per ended sub-env); an ended sub-env waits for
    its masked reset, and the others step as in the NEXT_STEP adapter."""
    from grpo_trainer.envs.state import with_state_protocol

    trainers = with_state_protocol(gym.make_vec("CartPole-v1", num_envs=2))
    users = ArrayStateVectorEnv(
        gym.make_vec("CartPole-v1", num_envs=2), ARRAY_LAYOUTS[CartPoleVectorEnv]
    )
    assert trainers.metadata["autoreset_mode"] == gym.vector.AutoresetMode.DISABLED
    assert users.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    for envs in (trainers, users):
        envs.reset(seed=[3, 4])
    ended = np.zeros(2, bool)  # pushing one way topples both poles, at their own steps
    while not ended.all():
        obs, _, terminated, _, _ = trainers.step(np.array([1, 0]))
        ref_obs, _, ref_terminated, _, _ = users.step(np.array([1, 0]))
        playing = ~ended  # until its end, a sub-env steps alike in both adapters
        assert np.array_equal(obs[playing], ref_obs[playing])
        assert np.array_equal(terminated[playing], ref_terminated[playing])
        ended |= terminated
    obs, *_ = trainers.step(np.array([1, 0]))
    assert (np.abs(obs[:, 2]) > 0.2).all()  # still fallen: no new game was drawn
    obs, _ = trainers.reset(seed=[5, None], options={"reset_mask": np.array([True, False])})
    assert np.abs(obs[0]).max() <= 0.05


@pytest.mark.parametrize(
    "env",
    ["gymnax:CartPole-v1", "CartPole-v1", "minatar:Breakout-v1", "Acrobot-v1", "async:CartPole-v1"],
)
def test_the_trainer_starts_groups_alike_and_branches(env: str) -> None:
    """No "do not start alike" warning, and branch_every runs, on every family."""
    if env.startswith("gymnax"):
        pytest.importorskip("gymnax")
    if env.startswith("minatar"):
        pytest.importorskip("minatar")
    kwargs: dict[str, Any] = {}
    if env.startswith("async:"):  # CartPoleEnv in AsyncVectorEnv's workers
        env, kwargs = env[6:], {"vectorization_mode": "async", "vector_kwargs": SPAWN}
    config = GRPOConfig(
        num_groups=4,
        group_size=4,
        hidden_sizes=(8,),
        rollout_steps=32,
        window=8,
        restart_every=4,
        branch_every=8,
        minibatch_size=256,
        run=RunConfig(env=env, env_kwargs=kwargs, device="cpu", progress=False, compile=False),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        OPENED.append(make_envs(config, config.num_envs, CPU))
        trainer = GRPOTrainer(OPENED[-1], config)
        for _ in range(2):
            metrics = trainer.update()
    said = [str(w.message) for w in caught]
    assert trainer.env.restart_method.name == "snapshot"
    assert not [s for s in said if "start" in s or "same situation" in s], said
    assert metrics["valid_steps"] > 0 and np.isfinite(metrics["loss"])


def test_gymnax_seeds_take_the_trainers_whole_range() -> None:
    """The trainer's group seeds pass 2**31 from run seed 3 on (seed x 1_000_000_007): equal
    seeds of any size start equal games, and distinct ones distinct games."""
    pytest.importorskip("gymnax")
    import gymnax

    from grpo_trainer.envs.gymnax_vector import GymnaxVectorEnv

    env, params = gymnax.make("CartPole-v1")
    envs = GymnaxVectorEnv(env, params, 4)
    big = 3 * 1_000_000_007
    obs, _ = envs.reset(seed=[big, big, big + 2**32, 2**63 + 5])
    assert torch.equal(obs[0], obs[1])
    assert not torch.equal(obs[0], obs[2]) and not torch.equal(obs[0], obs[3])
    with pytest.raises(ValueError, match=r"\[0, 2\*\*64\)"):
        envs.reset(seed=[2**64, 0, 0, 0])
