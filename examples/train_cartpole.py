"""Train GRPO on Gymnasium's CartPole-v1 (numpy outputs, taken zero-copy by the trainer).

python examples/train_cartpole.py --total-env-steps 500000
"""

import argparse

import gymnasium as gym

from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.run.evaluation import evaluate

parser = argparse.ArgumentParser()
parser.add_argument("--total-env-steps", type=int, default=500_000)
parser.add_argument("--run-dir", default="runs/cartpole")
args = parser.parse_args()

config = GRPOConfig(
    total_env_steps=args.total_env_steps,
    gamma=0.99,  # the defaults otherwise
    lr=0.02,
    run=RunConfig(env="CartPole-v1", device="cpu", run_dir=args.run_dir),
)
envs = gym.make_vec(
    "CartPole-v1", num_envs=config.num_envs, vectorization_mode="vector_entry_point"
)
trainer = GRPOTrainer(envs, config)
trainer.train()

result = evaluate(trainer.policy, envs, episodes=128)
print(f"greedy mean return {result['return_mean']:.1f} over {result['episodes']:.0f} episodes")
