"""`fruit_env.interop.wrappers.TorchEpisodeStatistics`: Gymnasium's vector `RecordEpisodeStatistics`
on the device. The same games are played by a torch env under our wrapper and by its numpy
view under Gymnasium's; every ended episode's return and length, the masks and the queues
agree, in all three autoreset modes, and a step reads nothing on the host."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers.vector import RecordEpisodeStatistics

from fruit_env import FruitCatcherVectorEnv
from fruit_env.interop.wrappers import NumpyView, TorchEpisodeStatistics
from grpo_trainer.tools.syncs import SyncCounter

# Short games that end at different steps (a score limit of 3 or a 30-step time limit).
RULES = {"win_score": 3, "lose_score": -3, "max_episode_steps": 30}
MODES = list(AutoresetMode)


def make(mode: AutoresetMode, n: int = 6, **kwargs: Any) -> FruitCatcherVectorEnv:
    return FruitCatcherVectorEnv(n, autoreset_mode=mode, **RULES, **kwargs)


@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_statistics_equal_gymnasiums_on_the_same_games(mode: AutoresetMode) -> None:
    ours = TorchEpisodeStatistics(make(mode), stats_key="stats", buffer_length=7)
    theirs = RecordEpisodeStatistics(NumpyView(make(mode)), stats_key="stats", buffer_length=7)
    ours.reset(seed=3)
    theirs.reset(seed=3)
    gen = torch.Generator().manual_seed(0)
    steps_with_ends = 0
    for _ in range(200):
        actions = torch.randint(0, 3, (6,), generator=gen)
        _, _, term, trunc, info = ours.step(actions)
        _, _, _, _, expected = theirs.step(actions.numpy())
        assert info["_stats"].dtype == torch.bool and info["_stats"].shape == (6,)
        if "stats" in expected:  # Gymnasium adds the key only on steps where an episode ended
            steps_with_ends += 1
            np.testing.assert_array_equal(info["_stats"].numpy(), expected["_stats"])
            for key in ("r", "l"):
                np.testing.assert_array_equal(info["stats"][key].numpy(), expected["stats"][key])
            assert info["stats"]["r"].dtype == torch.float64
            assert info["stats"]["l"].dtype == torch.int64
            assert (info["stats"]["t"][info["_stats"]] >= 0).all()
        else:
            assert not info["_stats"].any() and not info["stats"]["l"].any()
        assert "episode" in info and "_episode" in info  # the env's own entries are kept
        if mode == AutoresetMode.DISABLED and (term | trunc).any():
            ours.reset(options={"reset_mask": term | trunc})
            theirs.reset(options={"reset_mask": (term | trunc).numpy()})
    assert steps_with_ends > 10
    assert ours.episode_count == theirs.episode_count > 20
    assert ours.return_queue.tolist() == list(theirs.return_queue)
    assert ours.length_queue.tolist() == list(theirs.length_queue)
    assert len(ours.time_queue) == 7


def test_returns_equal_the_envs_own_episode_records() -> None:
    """FruitCatcher reports its episodes itself: our wrapper agrees with it (NEXT_STEP)."""
    env = TorchEpisodeStatistics(make(AutoresetMode.NEXT_STEP), stats_key="stats")
    env.reset(seed=1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(120):
        *_, info = env.step(torch.randint(0, 3, (6,), generator=gen))
        assert torch.equal(info["_stats"], info["_episode"])
        ended = info["_stats"]
        assert torch.equal(info["stats"]["r"][ended], info["episode"]["r"][ended].double())
        assert torch.equal(info["stats"]["l"][ended], info["episode"]["l"][ended].long())


def test_more_ends_in_one_step_than_the_buffer_holds() -> None:
    """Five episodes end together, the buffer holds three: the last three in sub-env order
    stay, as in Gymnasium's deque."""
    rules = {"win_score": 1, "lose_score": -1, "max_episode_steps": 4}
    ours = TorchEpisodeStatistics(FruitCatcherVectorEnv(5, **rules), "stats", buffer_length=3)
    theirs = RecordEpisodeStatistics(
        NumpyView(FruitCatcherVectorEnv(5, **rules)), stats_key="stats", buffer_length=3
    )
    ours.reset(seed=2)
    theirs.reset(seed=2)
    for _ in range(4):  # every game ends at the 4-step limit at the latest
        actions = torch.zeros(5, dtype=torch.int64)
        ours.step(actions)
        theirs.step(actions.numpy())
    assert ours.episode_count == theirs.episode_count == 5
    assert ours.return_queue.tolist() == list(theirs.return_queue)
    assert ours.length_queue.tolist() == list(theirs.length_queue)


@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_a_step_reads_nothing_on_the_host(mode: AutoresetMode) -> None:
    env = TorchEpisodeStatistics(make(mode, validate_actions=False), stats_key="stats")
    env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    ended = torch.zeros((), dtype=torch.int64)
    for _ in range(40):
        actions = torch.randint(0, 3, (6,), generator=gen)
        with SyncCounter() as syncs:
            *_, info = env.step(actions)
        assert syncs.count == 0, syncs.calls
        ended += info["_stats"].sum()
    assert ended > 0


def test_runs_on_meta() -> None:
    """Shapes only, no data: the wrapper allocates nothing on the host per step."""
    env = TorchEpisodeStatistics(
        FruitCatcherVectorEnv(4, device="meta", validate_actions=False, compile=False),
        stats_key="stats",
    )
    env.reset(seed=0)
    *_, info = env.step(torch.ones(4, dtype=torch.int64, device="meta"))
    assert info["stats"]["r"].device.type == "meta" and info["_stats"].shape == (4,)


def test_refuses_to_overwrite_an_info_key() -> None:
    env = TorchEpisodeStatistics(make(AutoresetMode.NEXT_STEP))  # stats_key="episode"
    env.reset(seed=0)
    with pytest.raises(ValueError, match="already has 'episode'"):
        env.step(torch.ones(6, dtype=torch.int64))
    with pytest.raises(ValueError, match="buffer_length"):
        TorchEpisodeStatistics(make(AutoresetMode.NEXT_STEP), buffer_length=0)


def test_statistics_pass_the_checker() -> None:
    from grpo_trainer.tools.checker import check_vector_env

    env = TorchEpisodeStatistics(make(AutoresetMode.SAME_STEP, validate_actions=False), "stats")
    report = check_vector_env(env, steps=16, strict_syncs=True)
    assert report.ok, str(report)
    assert report["host_syncs"].status == "pass"
    assert "stats" in report["info_masks"].evidence
