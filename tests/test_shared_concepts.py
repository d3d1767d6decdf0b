"""Concepts both packages hold, because `grpo_trainer` never imports `fruit_env`: each pair
has one meaning, `fruit_env`'s copy is the reference (the grpo_trainer copy's docstring says
so), and these tests keep the two in agreement where both accept the input.

* devices: `fruit_env.kit.inputs.resolve_device` / `grpo_trainer.base.accel.resolve_device`;
* values to tensors: `fruit_env.interop.wrappers.to_torch` / `grpo_trainer.envs.env_io.to_tensor`;
* sub-env indices, reset masks and per-sub-env seeds: `fruit_env.kit.inputs` (`as_index`,
  `as_reset_mask`, `seeded_keys`) / `grpo_trainer.envs.host_inputs` (`host_index`,
  `host_mask`, `per_env_seeds`);
* an episode's return and length: `fruit_env.interop.wrappers.TorchEpisodeStatistics` /
  `grpo_trainer.envs.episodes.EpisodeStats` (through the `EpisodeRunner` that feeds it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from fruit_env import FruitCatcherVectorEnv
from fruit_env.interop.wrappers import TorchEpisodeStatistics, to_torch
from fruit_env.kit import inputs, rng
from grpo_trainer.base.accel import resolve_device
from grpo_trainer.envs.env_io import EnvIO, to_tensor
from grpo_trainer.envs.episodes import EpisodeRunner
from grpo_trainer.envs.host_inputs import host_index, host_mask, per_env_seeds

CPU = torch.device("cpu")


def _outcome(function: Any, *args: Any) -> Any:
    """What `function(*args)` gives: its value, or the type of error it raised."""
    try:
        return function(*args)
    except (ValueError, TypeError) as err:
        return type(err)


@pytest.mark.parametrize(
    "name", ["cpu", "meta", "cuda", "cuda:0", "cuda:7", "mps", "bogus", "cpu:x", ""]
)
def test_device_names_resolve_alike(name: str) -> None:
    """A name either resolves to the same device (type and index) in both, or both refuse it
    with a ValueError ('auto' is the trainer's only: the env takes no default device)."""
    ours, reference = _outcome(resolve_device, name), _outcome(inputs.resolve_device, name)
    if reference is ValueError or ours is ValueError:
        assert ours is reference is ValueError, (ours, reference)
        return
    assert ours.type == reference.type
    assert ours.index in (None, reference.index)


@pytest.mark.parametrize(
    "value",
    [
        np.arange(6, dtype=np.int64),
        np.arange(6, dtype=np.uint8),
        np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4),
        np.array([True, False, True]),
        torch.arange(5, dtype=torch.int32),
        torch.rand(2, 3, dtype=torch.float64),
    ],
    ids=["int64", "uint8", "float32 2-D", "bool", "torch int32", "torch float64"],
)
def test_values_become_the_same_tensors_sharing_memory(value: Any) -> None:
    """numpy arrays and tensors become equal tensors (dtype, shape, values) on the device,
    and both copies alias a CPU input rather than copy it."""
    ours, reference = to_tensor(value, CPU), to_torch(value, CPU)
    assert ours.dtype == reference.dtype and torch.equal(ours, reference)
    address = value.data_ptr() if isinstance(value, torch.Tensor) else value.ctypes.data
    assert ours.data_ptr() == reference.data_ptr() == address


@pytest.mark.parametrize(
    "index", [[0, 3, 1], np.array([2, 2], np.int32), torch.tensor([4]), np.zeros(0, np.int64)]
)
def test_sub_env_indices_agree(index: Any) -> None:
    assert np.array_equal(host_index(index, 5), inputs.as_index(index, CPU).numpy())


@pytest.mark.parametrize(
    "index", [[[0, 1]], [0.5, 1.0], np.array([True, False]), torch.tensor([[1]]), "01"]
)
def test_indices_refused_by_the_reference_are_refused(index: Any) -> None:
    assert _outcome(inputs.as_index, index, CPU) is ValueError
    assert _outcome(host_index, index, 5) is ValueError


@pytest.mark.parametrize(
    "mask",
    [np.array([True, False, True]), torch.tensor([False, False, True]), [True, True, False]],
)
def test_reset_masks_agree(mask: Any) -> None:
    assert np.array_equal(host_mask(mask, 3), inputs.as_reset_mask(mask, 3, CPU).numpy())


@pytest.mark.parametrize(
    "mask", [np.array([1, 0, 1]), np.ones(4, bool), torch.ones(3, 1, dtype=torch.bool)]
)
def test_masks_refused_by_the_reference_are_refused(mask: Any) -> None:
    assert _outcome(inputs.as_reset_mask, mask, 3, CPU) is ValueError
    assert _outcome(host_mask, mask, 3) is ValueError


@pytest.mark.parametrize(
    "seed", [7, np.int64(2**40), [5, None, 0, 9], [None] * 4, 2**64 - 2, [2**64 - 1] * 4]
)
def test_per_env_seeds_seed_the_same_sub_envs_alike(seed: Any) -> None:
    """An int seeds sub-env i with seed + i, a list one per sub-env, None none: the same
    seeds, so the same keys, as the env's own seeding."""
    mask = torch.ones(4, dtype=torch.bool)
    ours = per_env_seeds(seed, 4)
    given, keys = inputs.seeded_keys(seed, mask, CPU)  # type: ignore[misc]
    assert given.tolist() == [s is not None for s in ours]
    chosen = np.array([s for s in ours if s is not None], np.uint64)
    assert np.array_equal(rng.seed_keys(chosen), keys[given].numpy())


@pytest.mark.parametrize("seed", [True, "3", [1, 2], 1.5, -1, 2**64, [0, 2**70, None, 1]])
def test_seeds_refused_by_the_reference_are_refused(seed: Any) -> None:
    assert _outcome(inputs.seeded_keys, seed, torch.ones(4, dtype=torch.bool), CPU) is ValueError
    assert _outcome(per_env_seeds, seed, 4) is ValueError


def test_episode_returns_and_lengths_agree() -> None:
    """The same seeded games and actions, under the env's wrapper and through the trainer's
    EpisodeRunner (which restarts a SAME_STEP sub-env's count where it ends, as
    IndependentRestarts does): the same episodes, returns and lengths."""
    rules = {"win_score": 3, "lose_score": -3, "max_episode_steps": 30}
    n, mode = 6, AutoresetMode.SAME_STEP
    wrapped = TorchEpisodeStatistics(
        FruitCatcherVectorEnv(n, autoreset_mode=mode, **rules), "stats"
    )
    runner = EpisodeRunner(EnvIO(FruitCatcherVectorEnv(n, autoreset_mode=mode, **rules), CPU))
    wrapped.reset(seed=3)
    runner.env.reset_groups([3 + i for i in range(n)], 1)
    runner.begin_episodes()
    generator = torch.Generator().manual_seed(0)
    returns, lengths = [], []
    for _ in range(200):
        actions = torch.randint(0, 3, (n,), generator=generator)
        info = wrapped.step(actions)[4]
        runner.begin_episodes(runner.step(actions).ended)
        ended = info["_stats"]
        returns += info["stats"]["r"][ended].tolist()
        lengths += info["stats"]["l"][ended].tolist()
    sums = runner.stats.sums()
    assert len(returns) >= 20  # many episodes ended
    assert sums["episodes"].item() == len(returns)
    assert sums["return_sum"].item() == pytest.approx(sum(returns), abs=1e-9)
    assert sums["length_sum"].item() == sum(lengths)
    assert (sums["return_min"].item(), sums["return_max"].item()) == (min(returns), max(returns))
