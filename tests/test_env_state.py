"""Sub-env state snapshots (`snapshot_state` / `restore_state`, docs/env.md).

A restored sub-env must continue exactly as its source would have, whatever its new
neighbours do, in every autoreset mode; snapshots are device tensors taken without a sync.
"""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from gymnasium.vector import AutoresetMode

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]
SHORT = {"win_score": 3, "lose_score": -3, "max_episode_steps": 40}  # episodes end in the run


def _env(n: int, mode: AutoresetMode, **kw: object) -> gym.vector.VectorEnv:
    return gym.make_vec("FruitCatcher-v0", num_envs=n, autoreset_mode=mode, **{**SHORT, **kw})


def _row(out: tuple, i: int) -> list[torch.Tensor]:
    obs, reward, terminated, truncated, info = out
    rows = [obs[i], reward[i], terminated[i], truncated[i], info["_episode"][i]]
    rows += [v[i] for v in info["episode"].values()]
    if "final_obs" in info:
        rows.append(info["final_obs"][i])
    return rows


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("obs_mode", ["features", "pixels"])
def test_restored_sub_env_continues_bit_identically(mode: AutoresetMode, obs_mode: str) -> None:
    source = _env(5, mode, obs_mode=obs_mode)
    source.reset(seed=11)
    gen = torch.Generator().manual_seed(0)
    for _ in range(13):  # somewhere mid-episode
        source.step(torch.randint(0, 3, (5,), generator=gen))
    snapshot = source.snapshot_state(torch.tensor([3]))

    target = _env(7, mode, obs_mode=obs_mode)
    target.reset(seed=99)
    target.restore_state(torch.tensor([4]), snapshot)
    for t in range(120):  # across several episode ends
        mine = int(torch.randint(0, 3, (), generator=gen))
        a_src = torch.randint(0, 3, (5,), generator=gen)
        a_dst = torch.randint(0, 3, (7,), generator=gen)  # other neighbours, other actions
        a_src[3], a_dst[4] = mine, mine
        out_src, out_dst = source.step(a_src), target.step(a_dst)
        if mode == AutoresetMode.DISABLED and bool(out_src[2][3] | out_src[3][3]):
            mask = torch.zeros(5, dtype=torch.bool)
            mask[3] = True
            source.reset(options={"reset_mask": mask})
            mask = torch.zeros(7, dtype=torch.bool)
            mask[4] = True
            target.reset(options={"reset_mask": mask})
            continue  # each restarted from its own (equal) key and counter: compare on
        for a, b in zip(_row(out_src, 3), _row(out_dst, 4), strict=True):
            assert torch.equal(a, b), f"step {t}"


def test_restore_many_at_once_clones_one_state_into_a_group() -> None:
    """One snapshot row restored into several sub-envs: they play alike from there."""
    env = _env(6, AutoresetMode.NEXT_STEP)
    env.reset(seed=[1, 2, 3, 4, 5, 6])
    for _ in range(7):
        env.step(torch.tensor([0, 1, 2, 0, 1, 2]))
    env.restore_state(torch.tensor([0, 1, 2, 3]), env.snapshot_state(torch.tensor([5, 5, 5, 5])))
    for _ in range(60):
        obs, reward, *_ = env.step(torch.ones(6, dtype=torch.long))
        assert torch.equal(obs[:4], obs[5:6].expand(4, -1))
        assert torch.equal(reward[:4], reward[5:6].expand(4))


def test_snapshot_needs_a_reset_first() -> None:
    env = _env(2, AutoresetMode.NEXT_STEP)
    with pytest.raises(RuntimeError, match="reset"):
        env.snapshot_state(torch.tensor([0]))


def test_bad_index_and_foreign_snapshot_are_refused() -> None:
    env = _env(3, AutoresetMode.NEXT_STEP)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="1-D integer"):
        env.snapshot_state(torch.tensor([0.0]))
    snap = env.snapshot_state(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="another index"):
        env.restore_state(torch.tensor([0]), snap)
    other = gym.make_vec("FruitCatcher-v0", num_envs=3, max_fruits=5)
    other.reset(seed=0)
    with pytest.raises(ValueError, match="another env"):
        env.restore_state(torch.tensor([0, 1]), other.snapshot_state(torch.tensor([0, 1])))
    with pytest.raises(ValueError, match="snapshot_state"):
        env.restore_state(torch.tensor([0]), {"packed": 1})


def test_snapshot_round_trips_through_a_tuple_of_cpu_tensors() -> None:
    """What a checkpoint stores (plain CPU tensors) restores the same state."""
    env = _env(4, AutoresetMode.NEXT_STEP)
    env.reset(seed=5)
    for _ in range(9):
        env.step(torch.tensor([0, 2, 1, 0]))
    everything = torch.arange(4)
    saved = [t.clone().cpu() for t in env.snapshot_state(everything)]
    before = env.step(torch.ones(4, dtype=torch.long))
    env.restore_state(everything, tuple(saved))
    after = env.step(torch.ones(4, dtype=torch.long))
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
