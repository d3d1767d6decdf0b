"""Every env family through its adapter, against the library's own fastest loop, one core.

    python benchmarks/env_families.py throughput   # env-only and training steps/s

Env-only steps/s of each family's adapter (what the trainer steps) against the library's
own fastest loop on the same core, alternated, median of repeats after warm-up: gymnax
against a raw `jax.jit(jax.vmap(env.step))` loop (and against the old path,
`GymnaxToVectorGymWrapper` + `JaxToTorch`); Gymnasium's numpy `CartPoleVectorEnv` against
its own `step`; `SyncVectorEnv`s (classic control, MinAtar) against their own `step`. Then
the trainer's env-steps/s on each family, with fixed CartPole settings (`CARTPOLE`), the
config built by the train command's parser as a user's is. Learning on each family (time to
a threshold, gymnax against Gymnasium's numpy CartPole, say) is the study harness's job:
`python benchmarks/suite.py cartpole --set 'gymnax={"env": "gymnax:CartPole-v1"}'`.
Results go to benchmarks/results/env_families_throughput.json.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # one core for JAX too (before it is imported): per-core figures
    os.environ.setdefault(
        "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    )

import argparse
import json
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info, write_result

# 256 sub-envs, 64-step rollouts and window, gamma 0.99, 4 epochs: fixed, so that every
# family trains the same batch whatever the defaults derive from its episode limit.
CARTPOLE = ["--num-groups", "32", "--gamma", "0.99", "--window", "64", "--rollout-steps", "64"]
CARTPOLE += ["--epochs", "4"]


# -- env-only throughput -------------------------------------------------------------------------


def _steps_per_s(step: Callable[[int], Any], n: int, steps: int, repeats: int) -> list[float]:
    """Steps/s of `repeats` timed loops of `steps` calls (after one warm-up loop). Each loop
    ends when its last step's results exist: JAX dispatches asynchronously, so a loop that
    only queued its steps would be timed without their work."""
    _finish(step(0))
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for t in range(steps):
            out = step(t)
        _finish(out)
        rates.append(n * steps / (time.perf_counter() - start))
    return rates


def _finish(out: Any) -> None:
    """Wait until `out` (JAX arrays, torch tensors or numpy arrays, nested) is computed."""
    if "jax" in sys.modules:
        import jax

        jax.block_until_ready([x for x in jax.tree.leaves(out) if isinstance(x, jax.Array)])


def gymnax_loops(name: str, n: int) -> dict[str, Callable[[int], Any]]:
    """The raw compiled loop, our adapter, and the old wrapper path, for one gymnax env."""
    import gymnax
    import jax
    import jax.numpy as jnp
    from gymnasium.wrappers.vector import JaxToTorch
    from gymnax.wrappers.gym import GymnaxToVectorGymWrapper

    from grpo_trainer.envs.gymnax_vector import GymnaxVectorEnv

    env, params = gymnax.make(name)
    choices = env.action_space(params).n
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    @jax.jit
    def raw_step(keys: Any, state: Any, action: Any) -> Any:
        split = jax.vmap(jax.random.split)(keys)
        obs, state, reward, terminated, truncated, _ = vstep(split[:, 1], state, action, params)
        return split[:, 0], state, obs, reward, terminated, truncated

    vstep_env = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))

    @jax.jit
    def raw_step_env(keys: Any, state: Any, action: Any) -> Any:  # no autoreset
        split = jax.vmap(jax.random.split)(keys)
        obs, state, reward, terminated, _ = vstep_env(split[:, 1], state, action, params)
        return split[:, 0], state, obs, reward, terminated

    keys = jax.random.split(jax.random.PRNGKey(0), n)
    _, state = jax.vmap(env.reset, in_axes=(0, None))(keys, params)
    jax_actions = [jnp.asarray(np.random.default_rng(i).integers(0, choices, n)) for i in range(8)]
    torch_actions = [torch.randint(0, choices, (n,)) for _ in range(8)]
    raw = {"keys": keys, "state": state}
    bare = {"keys": keys, "state": state}

    def raw_loop(t: int) -> Any:
        out = raw_step(raw["keys"], raw["state"], jax_actions[t % 8])
        raw["keys"], raw["state"] = out[0], out[1]
        return out

    def bare_loop(t: int) -> Any:
        out = raw_step_env(bare["keys"], bare["state"], jax_actions[t % 8])
        bare["keys"], bare["state"] = out[0], out[1]
        return out

    ours = GymnaxVectorEnv(env, params, n, "cpu", check_actions=False, final_obs=False)
    full = GymnaxVectorEnv(env, params, n, "cpu")
    full.reset(seed=0)
    ours.reset(seed=0)
    old = GymnaxToVectorGymWrapper(env, num_envs=n, params=params, seed=0)
    old = JaxToTorch(old, device="cpu")
    old.reset(seed=0)
    return {
        "raw jax.jit(jax.vmap(env.step))": raw_loop,
        "raw jax.jit(jax.vmap(env.step_env)), no autoreset": bare_loop,
        "GymnaxVectorEnv, the trainer's options (ours)": lambda t: ours.step(torch_actions[t % 8]),
        "GymnaxVectorEnv, Gymnasium's defaults (final_obs, checked actions)": lambda t: full.step(
            torch_actions[t % 8]
        ),
        "GymnaxToVectorGymWrapper + JaxToTorch (before)": lambda t: old.step(torch_actions[t % 8]),
    }


def host_loops(make: Callable[[], gym.vector.VectorEnv], n: int) -> dict[str, Callable]:
    """An env's own step, and the step of the adapter the trainer puts around it."""
    from grpo_trainer.envs.state import with_state_protocol

    own, wrapped = make(), with_state_protocol(make())
    own.reset(seed=0)
    wrapped.reset(seed=list(range(n)))
    rng = np.random.default_rng(0)
    actions = [own.action_space.sample() for _ in range(8)]
    del rng
    return {
        f"{type(own.unwrapped).__name__}.step (the library's own)": lambda t: own.step(
            actions[t % 8]
        ),
        f"{type(wrapped).__name__} (ours)": lambda t: wrapped.step(actions[t % 8]),
    }


def _minatar_sync(n: int) -> gym.vector.VectorEnv:
    import minatar.gym

    minatar.gym.register_envs()
    return gym.make_vec("MinAtar/Breakout-v1", num_envs=n, vectorization_mode="sync")


def env_rows(repeats: int) -> list[dict[str, Any]]:
    """Every family's loops, alternated within a family, median steps/s."""
    families: list[tuple[str, int, int, Callable[[], dict[str, Callable]]]] = [
        ("gymnax CartPole-v1", 4096, 200, lambda: gymnax_loops("CartPole-v1", 4096)),
        ("gymnax Breakout-MinAtar", 4096, 50, lambda: gymnax_loops("Breakout-MinAtar", 4096)),
        (
            "Gymnasium CartPole-v1 (numpy CartPoleVectorEnv)",
            4096,
            200,
            lambda: host_loops(lambda: gym.make_vec("CartPole-v1", num_envs=4096), 4096),
        ),
        (
            "SyncVectorEnv Acrobot-v1",
            64,
            50,
            lambda: host_loops(
                lambda: gym.make_vec("Acrobot-v1", num_envs=64, vectorization_mode="sync"), 64
            ),
        ),
        (
            "AsyncVectorEnv CartPole-v1",
            16,
            50,
            lambda: host_loops(
                lambda: gym.make_vec("CartPole-v1", num_envs=16, vectorization_mode="async"), 16
            ),
        ),
        (
            "MinAtar Breakout-v1 (SyncVectorEnv)",
            64,
            50,
            lambda: host_loops(lambda: _minatar_sync(64), 64),
        ),
    ]
    rows = []
    for family, n, steps, make in families:
        loops = make()
        rates: dict[str, list[float]] = {name: [] for name in loops}
        for _ in range(repeats):
            for name, loop in loops.items():
                rates[name] += _steps_per_s(loop, n, steps, 1)
        medians = {name: statistics.median(r) for name, r in rates.items()}
        reference = next(iter(medians.values()))
        for name, rate in medians.items():
            rows.append(
                {
                    "family": family,
                    "num_envs": n,
                    "loop": name,
                    "steps_per_s": round(rate),
                    "vs_library_loop": round(rate / reference, 3),
                    "runs": [round(r) for r in rates[name]],
                }
            )
            print(f"{family:48s} {name:48s} {rate / 1e6:8.3f}M/s  {rate / reference:5.2f}x")
    return rows


def train_rows(updates: int) -> list[dict[str, Any]]:
    """The trainer's env-steps/s on each family with the `CARTPOLE` settings, the config
    built by the train command's parser from those flags."""
    from grpo_trainer import GRPOTrainer
    from grpo_trainer.envs import make_envs
    from grpo_trainer.tools.cli import build_parser, config_from_args

    async_ = {"vectorization_mode": "async"}
    envs: list[tuple[str, dict[str, Any], list[str]]] = [  # id, env_kwargs, more flags
        ("gymnax:CartPole-v1", {}, []),
        ("CartPole-v1", {}, []),
        ("CartPole-v1", async_, ["--num-groups", "2"]),  # 16 worker processes
        ("Acrobot-v1", {}, []),
        ("LunarLander-v3", {"vectorization_mode": "sync"}, []),
        ("minatar:Breakout-v1", {}, []),
        ("envpool:CartPole-v1", {}, []),
    ]
    rows = []
    for env, kwargs, flags in envs:
        argv = ["train", "--env", env, "--env-kwargs", json.dumps(kwargs), *CARTPOLE, *flags]
        argv += ["--device", "cpu", "--no-progress", "--no-compile"]
        config = config_from_args(build_parser().parse_args(argv))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
        trainer.update()  # warm-up (compilation of the jitted step, first allocations)
        start, steps = time.perf_counter(), trainer.env_steps
        for _ in range(updates):
            trainer.update()
        rate = (trainer.env_steps - steps) / (time.perf_counter() - start)
        method = trainer.env.restart_method.name
        row = {"env": env, "env_kwargs": kwargs, "num_envs": config.num_envs}
        rows.append({**row, "restarts": method, "env_steps_per_s": round(rate)})
        print(f"train {env:24s} {kwargs} {rate / 1e3:8.1f}k env-steps/s ({method})")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    through = sub.add_parser("throughput", help="env-only and training steps/s per family")
    through.add_argument("--repeats", type=int, default=5)
    through.add_argument("--updates", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {"env_only": env_rows(args.repeats), "training": train_rows(args.updates)}
    write_result("env_families_throughput", {"machine": machine_info(), **result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
