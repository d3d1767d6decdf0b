"""Evaluation: play whole episodes with a trained policy and average what the env reports."""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from grpo_trainer import checkpoint
from grpo_trainer.config import GRPOConfig
from grpo_trainer.env_io import EnvIO
from grpo_trainer.policy import Policy


def make_envs(config: GRPOConfig, num_envs: int, device: torch.device, **extra: Any) -> Any:
    """`gymnasium.make_vec` for the config's env; passes `device` if the env takes one."""
    kwargs = {**config.run.env_kwargs, **extra}
    if "device" not in kwargs and _accepts_device(config.run.env):
        kwargs["device"] = str(device)
    try:
        return gym.make_vec(config.run.env, num_envs=num_envs, **kwargs)
    except (gym.error.Error, ModuleNotFoundError) as err:
        raise ValueError(f"cannot make env {config.run.env!r}: {err}") from None


def _accepts_device(env_id: str) -> bool:
    try:
        spec = gym.spec(env_id)
    except (gym.error.Error, ModuleNotFoundError):
        return False
    entry = spec.vector_entry_point
    if entry is None:
        return False
    creator = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    try:
        return "device" in inspect.signature(creator).parameters
    except (TypeError, ValueError):
        return False


def load_policy(
    path: str | Path, device: torch.device
) -> tuple[Policy, GRPOConfig, dict[str, Any]]:
    """A policy and its config from a checkpoint (loaded with `weights_only=True`)."""
    payload = checkpoint.load(path)
    config = GRPOConfig.from_dict(payload["config"])
    envs = make_envs(config, 1, device)
    try:
        policy = Policy(
            envs.single_observation_space,
            envs.single_action_space,
            config.hidden_sizes,
            config.activation,
        )
        policy.load_state_dict(payload["policy"])
    except RuntimeError as err:
        raise checkpoint.CheckpointError(f"checkpoint {path} does not fit its env: {err}") from None
    finally:
        envs.close()
    return policy.to(device).eval(), config, payload


@torch.inference_mode()
def evaluate(
    policy: Policy,
    envs: gym.vector.VectorEnv,
    episodes: int,
    *,
    greedy: bool = True,
    seed: int = 12345,
    max_episode_steps: int | None = None,
) -> dict[str, float]:
    """Mean/std return and length over `episodes`, every numeric `info["episode"]` field, and
    the ratios the env declares in `metadata["episode_ratios"]` (Fruit Catcher: `catch_rate`).

    Each sub-env plays one episode per round with its own seed; rounds repeat until enough
    episodes are done. Greedy takes the most likely action; otherwise actions are sampled.
    """
    device = next(policy.parameters()).device
    env = EnvIO(envs, device)
    horizon = max_episode_steps or env.max_episode_steps() or 10_000
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    returns: list[torch.Tensor] = []
    lengths: list[torch.Tensor] = []
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, torch.Tensor] = {}
    rounds = math.ceil(episodes / env.num_envs)
    members = torch.arange(env.num_envs, device=device)
    for r in range(rounds):
        obs = env.reset_groups([seed + (r + 1) * env.num_envs + i for i in range(env.num_envs)], 1)
        counted = members < episodes - r * env.num_envs  # the last round may need fewer
        alive = torch.ones(env.num_envs, dtype=torch.bool, device=device)
        ret = torch.zeros(env.num_envs, device=device)
        length = torch.zeros(env.num_envs, device=device)
        for _ in range(horizon):
            params = policy(obs)
            if greedy:
                action = policy.head.greedy(params)
            else:
                noise = policy.head.noise(env.num_envs, generator, device)
                action, _ = policy.head.sample(params, noise)
            step = env.step(policy.head.to_env(action))
            ret += torch.where(alive, step.reward, 0.0)
            length += alive
            ended = alive & step.done
            for name, (values, mask) in step.episode.items():
                taken = ended & mask & counted
                sums[name] = sums.get(name, 0) + torch.where(taken, values, 0.0).sum()
                counts[name] = counts.get(name, 0) + taken.sum()
            alive &= ~step.done
            obs = step.obs
            if not bool(alive.any()):  # evaluation may sync: it is not a hot path
                break
        returns.append(ret)
        lengths.append(length)
    all_returns = torch.cat(returns)[:episodes]
    out = {
        "episodes": float(all_returns.numel()),
        "return_mean": float(all_returns.mean()),
        "return_std": float(all_returns.std(correction=0)),
        "length_mean": float(torch.cat(lengths)[:episodes].mean()),
    }
    for name, total in sums.items():
        if int(counts[name]):  # no field when no counted episode reported it
            out[f"episode_{name}"] = float(total / counts[name])
    # An env may name success ratios of its episode fields in its metadata, e.g. Fruit
    # Catcher's {"catch_rate": ("caught", "missed")}: caught / (caught + missed), all games.
    for name, (hits, misses) in dict(envs.metadata.get("episode_ratios", {})).items():
        total = float(sums.get(hits, 0.0) + sums.get(misses, 0.0))
        if total > 0:  # undefined when nothing was hit or missed
            out[name] = float(sums[hits]) / total if hits in sums else 0.0
    return out
