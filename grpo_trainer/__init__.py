"""GRPO (Group Relative Policy Optimization) for any Gymnasium vector environment.

    from grpo_trainer import GRPOConfig, GRPOTrainer
    envs = gymnasium.make_vec("CartPole-v1", num_envs=256, vectorization_mode="vector_entry_point")
    GRPOTrainer(envs, GRPOConfig(num_groups=32, group_size=8)).train()

The trainer sees environments only through the Gymnasium vector API and their spaces.
"""

from grpo_trainer.base.config import GRPOConfig, RunConfig
from grpo_trainer.run.harness import TrainingStopped
from grpo_trainer.run.trainer import GRPOTrainer

__all__ = ["GRPOConfig", "GRPOTrainer", "RunConfig", "TrainingStopped"]
__version__ = "0.1.0"
