"""Train GRPO on FruitCatcher-v0 with the Python API, then evaluate the greedy policy.

python examples/train_fruit_catcher.py --total-env-steps 4000000 --device auto
"""

import argparse

import gymnasium as gym

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.base.accel import resolve_device
from grpo_trainer.run.evaluation import evaluate

parser = argparse.ArgumentParser()
parser.add_argument("--total-env-steps", type=int, default=4_000_000)
parser.add_argument("--device", default="auto")
parser.add_argument("--run-dir", default="runs/fruit_catcher")
args = parser.parse_args()

device = str(resolve_device(args.device))
config = GRPOConfig(
    total_env_steps=args.total_env_steps, run=RunConfig(device=device, run_dir=args.run_dir)
)
trainer = GRPOTrainer(
    gym.make_vec("FruitCatcher-v0", num_envs=config.num_envs, device=device), config
)
trainer.train()

eval_envs = gym.make_vec("FruitCatcher-v0", num_envs=1000, device=device)
result = evaluate(trainer.policy, eval_envs, episodes=1000)
print(f"greedy catch rate {result['catch_rate']:.3f}, mean return {result['return_mean']:.2f}")
