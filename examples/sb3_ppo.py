"""Stable-Baselines3 PPO on Fruit Catcher through `fruit_env.interop.sb3.SB3VecEnv`.

    pip install -e '.[sb3]'
    python examples/sb3_ppo.py --total-steps 200000 --num-envs 64 --seed 0

Trains `PPO("MlpPolicy", ...)`, then plays the trained (deterministic) policy and a uniform
random policy on the same seeded games and prints both catch rates,
caught / (caught + missed), read from the adapter's Monitor-format `info["episode"]`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from stable_baselines3 import PPO

from fruit_env.interop.sb3 import SB3VecEnv

Policy = Callable[[np.ndarray], np.ndarray]


def train(
    total_steps: int,
    *,
    num_envs: int = 64,
    seed: int = 0,
    device: str = "cpu",
    verbose: int = 0,
    **ppo_kwargs: Any,
) -> PPO:
    """PPO tuned for a short CPU budget: short rollouts, many epochs, a high learning rate."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be at least 1, got {total_steps}")
    venv = SB3VecEnv.make(num_envs, device=device)
    settings: dict[str, Any] = {
        "n_steps": 32,
        "batch_size": 256,
        "n_epochs": 8,
        "learning_rate": 3e-3,
        "gamma": 0.95,
        "ent_coef": 0.01,
        **ppo_kwargs,
    }
    model = PPO("MlpPolicy", venv, seed=seed, device="cpu", verbose=verbose, **settings)
    model.learn(total_timesteps=total_steps)
    return model


def catch_rate(
    policy: Policy, *, num_envs: int = 64, steps: int = 400, seed: int = 12345
) -> dict[str, float]:
    """Play `steps` steps on freshly seeded games; totals over every episode that ended."""
    venv = SB3VecEnv.make(num_envs)
    venv.seed(seed)
    obs = venv.reset()
    caught = missed = episodes = 0
    for _ in range(steps):
        obs, _, _, infos = venv.step(policy(obs))
        for info in infos:
            if "episode" in info:
                caught += info["episode"]["caught"]
                missed += info["episode"]["missed"]
                episodes += 1
    venv.close()
    return {
        "episodes": float(episodes),
        "caught": float(caught),
        "missed": float(missed),
        "catch_rate": caught / max(caught + missed, 1),
    }


def model_policy(model: PPO) -> Policy:
    return lambda obs: model.predict(obs, deterministic=True)[0]


def random_policy(seed: int = 0) -> Policy:
    rng = np.random.default_rng(seed)
    return lambda obs: rng.integers(0, 3, size=len(obs))


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-steps", type=int, default=200_000)
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where the env runs (the policy: cpu)")
    parser.add_argument("--verbose", type=int, default=0, help="SB3 logger verbosity")
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="1 is fastest for this small MLP on CPU"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    start = time.perf_counter()
    model = train(
        args.total_steps,
        num_envs=args.num_envs,
        seed=args.seed,
        device=args.device,
        verbose=args.verbose,
    )
    seconds = time.perf_counter() - start
    trained = catch_rate(model_policy(model))
    baseline = catch_rate(random_policy(args.seed))
    print(f"trained {args.total_steps} env steps in {seconds:.1f} s")
    print(f"PPO    catch rate {trained['catch_rate']:.3f} over {trained['episodes']:.0f} episodes")
    print(
        f"random catch rate {baseline['catch_rate']:.3f} over {baseline['episodes']:.0f} episodes"
    )
    return {"ppo": trained["catch_rate"], "random": baseline["catch_rate"], "seconds": seconds}


if __name__ == "__main__":
    main()
