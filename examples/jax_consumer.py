"""Fruit Catcher driven from JAX: observations in without a copy, JAX actions back out.

    pip install -e '.[jax]'
    python examples/jax_consumer.py --num-envs 256 --steps 400 --seed 0

`DLPackView(env, jax.numpy)` hands every output of the torch env to `jax.numpy.from_dlpack`,
so a CPU env's observations become JAX arrays over the same memory (a CUDA env's too, with a
CUDA build of JAX). A jitted JAX policy (the chase heuristic) picks the actions, which go back
through `torch.from_dlpack`, again without a copy. Episode statistics are summed in JAX.

The script checks the zero-copy claim itself: a tiny wrapper between env and view keeps the
last torch tensors, and the JAX arrays must point at the same buffers.
"""

from __future__ import annotations

import argparse
from typing import Any

import jax
import jax.numpy as jnp
from gymnasium.vector import VectorWrapper

from fruit_env import FruitCatcherVectorEnv
from fruit_env.interop.wrappers import DLPackView


@jax.jit
def chase(obs: jax.Array) -> jax.Array:
    """Move the basket centre toward the lowest falling fruit (as `fruit_env.cli.chase_policy`)."""
    centre = obs[:, 0]
    slots = obs[:, 1:].reshape(obs.shape[0], -1, 3)
    x, y, falling = slots[..., 0], slots[..., 1], slots[..., 2] > 0.5
    lowest = jnp.argmax(jnp.where(falling, y, -1.0), axis=1)
    target = jnp.take_along_axis(x, lowest[:, None], axis=1)[:, 0]
    offset = jnp.where(falling.any(axis=1), target - centre, 0.0)
    return (jnp.sign(offset) + 1).astype(jnp.int32)  # 0 left, 1 stay, 2 right


class KeepLast(VectorWrapper):
    """Remembers the torch tensors the env returned and the actions it got, to compare buffers."""

    def reset(self, **kwargs: Any) -> Any:
        self.last = self.env.reset(**kwargs)
        return self.last

    def step(self, actions: Any) -> Any:
        self.actions = actions
        self.last = self.env.step(actions)
        return self.last


def run(
    num_envs: int = 256, steps: int = 400, seed: int = 0, device: str = "cpu"
) -> dict[str, Any]:
    """Play `steps` steps with the JAX policy; returns catch statistics and the buffer checks."""
    env = FruitCatcherVectorEnv(num_envs, device=device)
    keep = KeepLast(env)
    view = DLPackView(keep, jnp)
    obs, _ = view.reset(seed=seed)
    shared_obs = obs.unsafe_buffer_pointer() == keep.last[0].data_ptr()
    shared_actions = True
    totals = jnp.zeros(3, dtype=jnp.int32)  # caught, missed, episodes
    for _ in range(steps):
        actions = chase(obs)
        obs, _, _, _, info = view.step(actions)
        shared_obs &= obs.unsafe_buffer_pointer() == keep.last[0].data_ptr()
        shared_actions &= keep.actions.data_ptr() == actions.unsafe_buffer_pointer()
        episode, ended = info["episode"], info["_episode"]
        fields = jnp.stack([episode["caught"], episode["missed"], jnp.ones_like(episode["l"])])
        totals += jnp.where(ended, fields, 0).sum(axis=1)
    env.close()
    caught, missed, episodes = (int(v) for v in totals)
    return {
        "jax_backend": jax.default_backend(),
        "episodes": episodes,
        "caught": caught,
        "missed": missed,
        "catch_rate": caught / max(caught + missed, 1),
        "obs_shared": bool(shared_obs),
        "actions_shared": bool(shared_actions),
        "actions_device": str(keep.actions.device),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cuda needs a CUDA build of JAX")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    result = run(args.num_envs, args.steps, args.seed, args.device)
    print(
        f"JAX ({result['jax_backend']}) played {result['episodes']} episodes: caught "
        f"{result['caught']}, missed {result['missed']}, catch rate {result['catch_rate']:.3f}"
    )
    print(
        f"observations shared with torch: {result['obs_shared']}; "
        f"actions shared: {result['actions_shared']} (on {result['actions_device']})"
    )
    return result


if __name__ == "__main__":
    main()
