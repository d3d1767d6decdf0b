"""Learning speed against Stable-Baselines3 PPO, side by side, and Fruit Catcher's curve.

    python benchmarks/learning.py fruit                      # greedy catch rate vs time, defaults
    python benchmarks/learning.py cartpole --seeds 0 1 2     # GRPO vs SB3 PPO (RL-Zoo), to 475
    python benchmarks/learning.py pendulum                   # ... to -200
    python benchmarks/learning.py lunarlander                # ... to 200 (the box2d extra)
    python benchmarks/learning.py acrobot                    # sparse rewards: -1 until the goal
    python benchmarks/learning.py breakout                   # MinAtar, fixed budget, vs random

For each seed the two trainers run one after the other in this process, one torch thread
each, so that they see the same machine. "Reached" means the mean return of the latest 100
training episodes is at least the threshold, for both (SB3's `ep_info_buffer`; GRPO's last
updates' episodes). Training time excludes set-up; GRPO's includes its first update.
GRPO's settings per task are in `TASKS` (like RL-Zoo's per-env hyper-parameters); PPO's are
RL-Zoo's. Results go to benchmarks/results/learning_<task>.json.

The peers and tasks are optional extras: `pip install -c constraints.txt -e '.[sb3,box2d,minatar]'`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info, write_result

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.envs import make_envs
from grpo_trainer.run.evaluation import evaluate

CATCH_TARGET = 0.70


def _linear(start: float) -> Any:
    return lambda progress: progress * start


# GRPO's settings per task (fields over the defaults), and RL-Zoo's PPO hyper-parameters.
TASKS: dict[str, dict[str, Any]] = {
    "cartpole": {
        "env": "CartPole-v1",
        "threshold": 475.0,
        "budget": 500_000,
        "grpo": {"num_groups": 32, "gamma": 0.99, "window": 64, "rollout_steps": 64, "epochs": 4},
        "ppo": dict(
            n_envs=8,
            n_steps=32,
            batch_size=256,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            learning_rate=_linear(1e-3),
            clip_range=_linear(0.2),
        ),
    },
    "pendulum": {
        "env": "Pendulum-v1",
        "threshold": -200.0,
        "budget": 1_000_000,
        "grpo": {"num_groups": 32, "gamma": 0.95, "window": 32, "rollout_steps": 64, "epochs": 4},
        "ppo": dict(
            n_envs=4,
            n_steps=1024,
            gae_lambda=0.95,
            gamma=0.9,
            n_epochs=10,
            ent_coef=0.0,
            learning_rate=1e-3,
            clip_range=0.2,
            use_sde=True,
            sde_sample_freq=4,
        ),
    },
    "lunarlander": {
        "env": "LunarLander-v3",
        "threshold": 200.0,
        "budget": 2_000_000,
        "grpo": {"num_groups": 64, "gamma": 0.99, "window": 128, "rollout_steps": 64, "epochs": 4},
        "ppo": dict(
            n_envs=16,
            n_steps=1024,
            batch_size=64,
            gae_lambda=0.98,
            gamma=0.999,
            n_epochs=4,
            ent_coef=0.01,
        ),
    },
    "acrobot": {
        "env": "Acrobot-v1",
        "threshold": -100.0,
        "budget": 300_000,
        # 32 envs: where whole-episode GRPO saw no spread in any group for a whole run
        "grpo": {"num_groups": 4, "gamma": 0.99, "window": 128, "rollout_steps": 64, "epochs": 4},
        "ppo": dict(n_envs=16, n_steps=256, gae_lambda=0.94, gamma=0.99, n_epochs=4, ent_coef=0.0),
        "ppo_normalize": True,
    },
}


class RecentReturns:
    """The mean return of the latest `n` episodes, from GRPO's per-update means and counts."""

    def __init__(self, n: int = 100) -> None:
        self.n, self.updates = n, deque[tuple[float, float]]()

    def add(self, metrics: dict[str, float]) -> float | None:
        if metrics.get("episodes"):
            self.updates.append((metrics["return_mean"], metrics["episodes"]))
        total = weight = 0.0
        for mean, count in reversed(self.updates):
            take = min(count, self.n - weight)
            total, weight = total + mean * take, weight + take
            if weight >= self.n:
                return total / weight
        return None


def _grpo_config(task: dict[str, Any], seed: int, budget: int) -> GRPOConfig:
    run = RunConfig(env=task["env"], device="cpu", seed=seed, progress=False)
    return GRPOConfig(**{**task["grpo"], "total_env_steps": budget}, run=run)


def run_grpo(task: dict[str, Any], seed: int, budget: int) -> dict[str, Any]:
    config = _grpo_config(task, seed, budget)
    trainer = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
    recent, curve, zero_std = RecentReturns(), [], []
    start = time.perf_counter()
    while trainer.env_steps < budget:
        metrics = trainer.update()
        zero_std.append(round(metrics.get("frac_zero_std_groups", float("nan")), 3))
        mean = recent.add(metrics)
        seconds = time.perf_counter() - start
        if mean is not None:
            curve.append((trainer.env_steps, round(seconds, 2), round(mean, 2)))
            if mean >= task["threshold"]:
                break
    reached = bool(curve) and curve[-1][2] >= task["threshold"]
    return {
        "seconds": curve[-1][1] if reached else None,
        "env_steps": curve[-1][0] if reached else None,
        "frac_zero_std_groups": zero_std,
        "curve": curve,
    }


def run_ppo(task: dict[str, Any], seed: int, budget: int) -> dict[str, Any]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    threshold = task["threshold"]
    curve: list[tuple[int, float, float]] = []
    clock = {"start": 0.0}

    class StopAtThreshold(BaseCallback):
        def _on_rollout_end(self) -> None:
            buffer = self.model.ep_info_buffer
            if buffer is not None and len(buffer) >= 100:
                mean = statistics.fmean(e["r"] for e in buffer)
                seconds = time.perf_counter() - clock["start"]
                curve.append((self.model.num_timesteps, round(seconds, 2), round(mean, 2)))

        def _on_step(self) -> bool:
            buffer = self.model.ep_info_buffer
            full = buffer is not None and len(buffer) >= 100
            return not (full and statistics.fmean(e["r"] for e in buffer) >= threshold)

    hyper = dict(task["ppo"])
    env = make_vec_env(task["env"], n_envs=hyper.pop("n_envs"), seed=seed)
    if task.get("ppo_normalize"):
        env = VecNormalize(env, norm_reward=True)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **hyper)
    clock["start"] = time.perf_counter()
    model.learn(total_timesteps=budget, callback=StopAtThreshold())
    seconds = time.perf_counter() - clock["start"]
    buffer = model.ep_info_buffer
    hit = len(buffer) >= 100 and statistics.fmean(e["r"] for e in buffer) >= threshold
    return {
        "seconds": seconds if hit else None,
        "env_steps": model.num_timesteps if hit else None,
        "curve": curve,
    }


def versus(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """GRPO and SB3 PPO alternately, per seed."""
    task = TASKS[name]
    budget = args.budget or task["budget"]
    runs: dict[str, list[dict[str, Any]]] = {"grpo": [], "sb3_ppo": []}
    for seed in args.seeds:
        for trainer, fn in (("grpo", run_grpo), ("sb3_ppo", run_ppo)):
            result = {"seed": seed, **fn(task, seed, budget)}
            runs[trainer].append(result)
            print(trainer, seed, {k: v for k, v in result.items() if k != "curve"}, flush=True)

    def median(trainer: str, key: str) -> float | None:
        values = [r[key] for r in runs[trainer] if r[key] is not None]
        return statistics.median(values) if len(values) == len(runs[trainer]) else None

    medians = {t: {k: median(t, k) for k in ("seconds", "env_steps")} for t in runs}
    grpo_s, ppo_s = medians["grpo"]["seconds"], medians["sb3_ppo"]["seconds"]
    return {
        "task": name,
        "env": task["env"],
        "threshold": task["threshold"],
        "budget": budget,
        "grpo_config": _grpo_config(task, 0, budget).to_dict(),
        "ppo_hyperparameters": {k: str(v) for k, v in task["ppo"].items()},
        "runs": runs,
        "medians": medians,
        "ppo_over_grpo_wall_time": ppo_s / grpo_s if grpo_s and ppo_s else None,
    }


def fruit(args: argparse.Namespace) -> dict[str, Any]:
    """The default config; the greedy policy is evaluated every `eval_every` env steps."""
    config = GRPOConfig(run=RunConfig(seed=args.seed[0] if args.seed else 0, progress=False))
    trainer = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
    eval_envs = gym.make_vec("FruitCatcher-v0", num_envs=1000)
    curve: list[dict[str, float]] = []
    train_s, next_eval, reached = 0.0, 0, None
    while trainer.env_steps < config.total_env_steps:
        start = time.perf_counter()
        metrics = trainer.update()
        train_s += time.perf_counter() - start
        if trainer.env_steps >= next_eval or trainer.env_steps >= config.total_env_steps:
            result = evaluate(trainer.policy, eval_envs, 1000, seed=10_000 + config.run.seed)
            point = {
                "train_s": round(train_s, 2),
                "env_steps": trainer.env_steps,
                "greedy_catch_rate": round(result.get("catch_rate", 0.0), 4),
                "sampled_catch_rate": round(metrics.get("catch_rate", float("nan")), 4),
            }
            curve.append(point)
            print(point, flush=True)
            if reached is None and point["greedy_catch_rate"] >= CATCH_TARGET:
                reached = point
            next_eval += args.eval_every
    return {"task": "fruit", "config": config.to_dict(), "reached": reached, "curve": curve}


def breakout(args: argparse.Namespace) -> dict[str, Any]:
    """MinAtar Breakout (10x10x4 binary planes, no time limit): the greedy return of GRPO and of
    SB3 PPO after the same budget, against uniformly random play on the same games. PPO is SB3's
    with its default hyper-parameters and an MLP on the flattened planes (SB3's CNN does not
    take 10x10 inputs); GRPO uses its CNN."""
    import minatar.gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    minatar.gym.register_envs()
    env_id = "MinAtar/Breakout-v1"
    budget = args.budget or 1_000_000
    grpo_budget = args.grpo_budget or budget
    results = []
    for seed in args.seeds:
        config = GRPOConfig(
            num_groups=64,
            gamma=0.99,
            window=64,
            rollout_steps=64,
            epochs=2,
            total_env_steps=grpo_budget,
            run=RunConfig(env=env_id, device="cpu", seed=seed, progress=False),
        )
        trainer = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
        start = time.perf_counter()
        while trainer.env_steps < grpo_budget:
            trainer.update()
        grpo_s = time.perf_counter() - start
        eval_envs = gym.make_vec(env_id, num_envs=100, vectorization_mode="sync")
        grpo = evaluate(trainer.policy, eval_envs, 100, seed=10_000 + seed)["return_mean"]

        if args.no_ppo:
            results.append({"seed": seed, "grpo_return": grpo, "grpo_train_s": grpo_s})
            print(results[-1], flush=True)
            continue
        flat = make_vec_env(
            env_id, n_envs=8, seed=seed, wrapper_class=gym.wrappers.FlattenObservation
        )
        model = PPO("MlpPolicy", flat, seed=seed, device="cpu", verbose=0)
        start = time.perf_counter()
        model.learn(total_timesteps=budget)
        ppo_s = time.perf_counter() - start
        ppo = _ppo_greedy_return(model, env_id, seed)
        results.append(
            {
                "seed": seed,
                "grpo_return": grpo,
                "grpo_train_s": grpo_s,
                "ppo_return": ppo,
                "ppo_train_s": ppo_s,
            }
        )
        print(results[-1], flush=True)
    return {
        "task": "breakout",
        "budget": budget,
        "grpo_budget": grpo_budget,
        "grpo_config": config.to_dict(),
        "ppo": "SB3 PPO('MlpPolicy'), default hyper-parameters, 8 envs, flattened planes",
        "runs": results,
        "random_return": _random_return(env_id),
    }


def _ppo_greedy_return(model: Any, env_id: str, seed: int, episodes: int = 100) -> float:
    envs = gym.make_vec(
        env_id,
        num_envs=episodes,
        vectorization_mode="sync",
        wrappers=[gym.wrappers.FlattenObservation],
    )
    obs, _ = envs.reset(seed=[10_000 + seed + i for i in range(episodes)])
    returns, alive = np.zeros(episodes), np.ones(episodes, dtype=bool)
    for _ in range(10_000):  # the cap evaluate() applies to envs without a limit
        if not alive.any():
            break
        action, _ = model.predict(obs, deterministic=True)
        obs, reward, terminated, truncated, _ = envs.step(action)
        returns += reward * alive
        alive &= ~(terminated | truncated)
    return float(returns.mean())


def _random_return(env_id: str, episodes: int = 100) -> float:
    envs = gym.make_vec(env_id, num_envs=episodes, vectorization_mode="sync")
    envs.reset(seed=[10_000 + i for i in range(episodes)])
    envs.action_space.seed(0)
    returns, alive = np.zeros(episodes), np.ones(episodes, dtype=bool)
    while alive.any():
        _, reward, terminated, truncated, _ = envs.step(envs.action_space.sample())
        returns += reward * alive
        alive &= ~(terminated | truncated)
    return float(returns.mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=["fruit", "breakout", *TASKS])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seed", type=int, nargs="*", default=None, help="fruit: the seed")
    parser.add_argument("--budget", type=int, default=None, help="env steps per run")
    parser.add_argument("--grpo-budget", type=int, default=None, help="breakout: GRPO's")
    parser.add_argument("--no-ppo", action="store_true", help="breakout: GRPO alone")
    parser.add_argument("--eval-every", type=int, default=100_000, help="fruit: env steps")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.task == "fruit":
        result = fruit(args)
    elif args.task == "breakout":
        result = breakout(args)
    else:
        result = versus(args.task, args)
    result.update(machine=machine_info(), threads=torch.get_num_threads())
    suffix = f"_grpo_{args.grpo_budget}" if args.task == "breakout" and args.grpo_budget else ""
    path = write_result(f"learning_{args.task}{suffix}", result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
