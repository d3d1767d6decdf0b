"""The "naive" row of benchmarks/train_throughput.py: examples/grpo_one_page.py, GRPO written
the straightforward way, under the call this benchmark has always made.

The implementation lives in the example only, so that the GRPO people read and the reference
the trainer's speed is measured against are one program, not two copies that drift apart.
It is what a first version usually is: a Python loop over time steps with a host sync every
step, `torch.distributions.Categorical`, float32 observations and int64 actions stored, eager
PyTorch without autocast, a for-loop AdamW and `.item()` on every minibatch's figures. The
speed-up is thus a ratio measured on the same machine at the same moment, not a number
remembered from another day.

    python examples/grpo_one_page.py --rollout episodes --num-groups 32 --group-size 8 --updates 3
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gymnasium as gym

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from grpo_one_page import Config, OnePageGRPO


class NaiveGRPO(OnePageGRPO):
    """`OnePageGRPO` in episodes mode (the row this benchmark has always timed), built from
    the benchmark's arguments; `fields` are `Config` fields."""

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        num_groups: int,
        group_size: int,
        horizon: int,
        **fields: Any,
    ) -> None:
        config = Config(
            num_groups=num_groups,
            group_size=group_size,
            rollout="episodes",
            horizon=horizon,
            **fields,
        )
        super().__init__(envs, config)
