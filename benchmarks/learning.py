"""Learning speed: how fast GRPO reaches a score, in training wall time and env steps.

    python benchmarks/learning.py fruit      # greedy catch rate vs time, default config
    python benchmarks/learning.py cartpole   # GRPO vs Stable-Baselines3 PPO (RL-Zoo), side by side
    python benchmarks/learning.py pendulum   # continuous actions: trained vs uniform random

Evaluation time is excluded from training time. Results go to benchmarks/results/ as JSON.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info, write_result

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.evaluation import evaluate

CATCH_TARGET = 0.70
CARTPOLE_TARGET = 475.0


def fruit(args: argparse.Namespace) -> dict[str, Any]:
    """Train the default config; evaluate the greedy policy every `eval_every` training seconds."""
    config = GRPOConfig(run=RunConfig(seed=args.seed, progress=False))
    trainer = GRPOTrainer(gym.make_vec("FruitCatcher-v0", num_envs=config.num_envs), config)
    eval_envs = gym.make_vec("FruitCatcher-v0", num_envs=args.episodes)
    curve: list[dict[str, float]] = []
    train_s, next_eval, reached = 0.0, 0.0, None
    while train_s < args.seconds and trainer.env_steps < config.total_env_steps:
        start = time.perf_counter()
        metrics = trainer.update()
        train_s += time.perf_counter() - start
        if train_s >= next_eval:
            result = evaluate(trainer.policy, eval_envs, args.episodes, seed=10_000 + args.seed)
            sampled = metrics["episode_caught"] / (
                metrics["episode_caught"] + metrics["episode_missed"]
            )
            point = {
                "train_s": round(train_s, 2),
                "env_steps": trainer.env_steps,
                "greedy_catch_rate": round(result.get("catch_rate", 0.0), 4),  # absent: none landed
                "sampled_catch_rate": round(sampled, 4),
                "greedy_return": round(result["return_mean"], 3),
            }
            curve.append(point)
            print(point, flush=True)
            if reached is None and point["greedy_catch_rate"] >= CATCH_TARGET:
                reached = point
            next_eval = train_s + args.eval_every
    return {
        "task": "fruit",
        "config": config.to_dict(),
        "target_catch_rate": CATCH_TARGET,
        "reached": reached,
        "curve": curve,
        "best_greedy_catch_rate": max(p["greedy_catch_rate"] for p in curve),
    }


def grpo_cartpole(seed: int, max_steps: int) -> dict[str, float]:
    """GRPO on CartPole-v1 until the mean return of an update's episodes reaches 475."""
    config = GRPOConfig(
        total_env_steps=max_steps,
        gamma=0.99,  # the defaults otherwise; CartPole's credit spans longer episodes
        lr=0.02,
        run=RunConfig(env="CartPole-v1", device="cpu", seed=seed, progress=False),
    )
    envs = gym.make_vec(
        "CartPole-v1", num_envs=config.num_envs, vectorization_mode="vector_entry_point"
    )
    trainer = GRPOTrainer(envs, config)
    start = time.perf_counter()
    while trainer.env_steps < max_steps:
        if trainer.update()["return_mean"] >= CARTPOLE_TARGET:
            return {"seconds": time.perf_counter() - start, "env_steps": trainer.env_steps}
    return {"seconds": float("nan"), "env_steps": float("nan")}


def sb3_cartpole(seed: int, max_steps: int) -> dict[str, float]:
    """SB3 PPO with RL-Zoo's CartPole-v1 hyper-parameters until its 100-episode mean is 475."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class StopAtTarget(BaseCallback):
        def _on_step(self) -> bool:
            buffer = self.model.ep_info_buffer
            full = buffer is not None and len(buffer) >= 100
            return not (full and statistics.fmean(e["r"] for e in buffer) >= CARTPOLE_TARGET)

    def linear(start: float) -> Any:
        return lambda progress: progress * start

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    start = time.perf_counter()
    model.learn(total_timesteps=max_steps, callback=StopAtTarget())
    seconds = time.perf_counter() - start
    buffer = model.ep_info_buffer
    hit = len(buffer) >= 100 and statistics.fmean(e["r"] for e in buffer) >= CARTPOLE_TARGET
    return {"seconds": seconds if hit else float("nan"), "env_steps": model.num_timesteps}


def cartpole(args: argparse.Namespace) -> dict[str, Any]:
    """Alternate GRPO and SB3 runs so both see the same machine load."""
    runs: dict[str, list[dict[str, float]]] = {"grpo": [], "sb3_ppo": []}
    for repeat in range(args.repeats):
        seed = args.seed + repeat
        for name, fn in (("grpo", grpo_cartpole), ("sb3_ppo", sb3_cartpole)):
            result = fn(seed, args.max_steps)
            runs[name].append(result)
            print(name, seed, result, flush=True)
    medians = {
        name: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "env_steps")}
        for name, rs in runs.items()
    }
    ratio = medians["sb3_ppo"]["seconds"] / medians["grpo"]["seconds"]
    return {
        "task": "cartpole",
        "target_return": CARTPOLE_TARGET,
        "runs": runs,
        "medians": medians,
        "sb3_over_grpo_wall_time": ratio,
    }


def pendulum(args: argparse.Namespace) -> dict[str, Any]:
    """Pendulum-v1 (Box actions) with the default config, against uniformly random actions."""
    steps = 600_000
    config = GRPOConfig(
        total_env_steps=steps, run=RunConfig(env="Pendulum-v1", seed=args.seed, progress=False)
    )
    trainer = GRPOTrainer(gym.make_vec("Pendulum-v1", num_envs=config.num_envs), config)
    start = time.perf_counter()
    curve = []
    while trainer.env_steps < steps:
        curve.append((trainer.update()["return_mean"], trainer.env_steps))
    seconds = time.perf_counter() - start
    eval_envs = gym.make_vec("Pendulum-v1", num_envs=100)
    trained = evaluate(trainer.policy, eval_envs, 100, seed=10_000 + args.seed)["return_mean"]
    eval_envs.action_space.seed(args.seed)
    eval_envs.reset(seed=10_000 + args.seed)
    random_return = sum(eval_envs.step(eval_envs.action_space.sample())[1] for _ in range(200))
    return {
        "task": "pendulum",
        "env_steps": trainer.env_steps,
        "train_s": seconds,
        "greedy_return_trained": trained,
        "return_random": float(random_return.mean()),
        "curve": curve,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=["fruit", "cartpole", "pendulum"])
    parser.add_argument("--seconds", type=float, default=90.0, help="fruit: training time budget")
    parser.add_argument("--eval-every", type=float, default=5.0, help="fruit: eval period (s)")
    parser.add_argument("--episodes", type=int, default=1000, help="fruit: greedy eval episodes")
    parser.add_argument("--repeats", type=int, default=3, help="cartpole: runs of each trainer")
    parser.add_argument("--max-steps", type=int, default=500_000, help="cartpole: step budget")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = {"fruit": fruit, "cartpole": cartpole, "pendulum": pendulum}[args.task](args)
    result.update(
        machine=machine_info(),
        command=" ".join(sys.argv),
        torch=torch.__version__,
        threads=torch.get_num_threads(),
    )
    path = write_result(f"learning_{args.task}", result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
