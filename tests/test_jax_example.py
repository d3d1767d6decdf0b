"""examples/jax_consumer.py: JAX reads the env's buffers in place and sends actions back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from loading import load_module

pytest.importorskip("jax")

from fruit_env import FruitCatcherVectorEnv
from fruit_env.cli import chase_policy

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "jax_consumer.py"


def load_example() -> Any:
    return load_module(EXAMPLE, "jax_consumer_example")


def torch_chase_totals(num_envs: int, steps: int, seed: int) -> tuple[int, int, int]:
    """The same games played by the torch chase policy: caught, missed, episodes."""
    env = FruitCatcherVectorEnv(num_envs)
    obs, _ = env.reset(seed=seed)
    totals = torch.zeros(3, dtype=torch.int64)
    for _ in range(steps):
        obs, _, _, _, info = env.step(chase_policy(obs))
        ep = info["episode"]
        fields = torch.stack([ep["caught"], ep["missed"], torch.ones_like(ep["l"])])
        totals += torch.where(info["_episode"], fields, 0).sum(1)
    caught, missed, episodes = totals.tolist()
    return caught, missed, episodes


def test_jax_example_shares_buffers_and_plays_like_the_torch_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    example = load_example()
    result = example.main(["--num-envs", "8", "--steps", "210", "--seed", "3"])
    assert result["obs_shared"] is True and result["actions_shared"] is True
    assert result["actions_device"] == "cpu"
    caught, missed, episodes = torch_chase_totals(8, 210, 3)
    assert (result["caught"], result["missed"], result["episodes"]) == (caught, missed, episodes)
    assert episodes == 8  # every game ran its 200 steps once
    assert result["catch_rate"] == pytest.approx(caught / (caught + missed))
    out = capsys.readouterr().out
    assert f"caught {caught}, missed {missed}" in out
    assert "observations shared with torch: True; actions shared: True (on cpu)" in out


def test_jax_example_rejects_a_bad_step_count() -> None:
    example = load_example()
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--steps", "0"])
    assert exit_info.value.code == 2
