"""Playing a trained policy: evaluation (whole episodes, averaged as the env reports them) and
recording one greedy episode as rgb frames (GIF/MP4) or ansi text."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from grpo_trainer.algorithm.policy import Policy, build_policy
from grpo_trainer.base import checkpoint
from grpo_trainer.base.config import GRPOConfig
from grpo_trainer.base.metrics import to_host
from grpo_trainer.envs import make_envs
from grpo_trainer.envs.env_io import EnvIO
from grpo_trainer.envs.episodes import EpisodeRunner, RunnerStep, play_until_ended, summarise

EVAL_HORIZON = 10_000  # steps an evaluation episode may last when the env declares no limit
EVAL_SEED = 12345  # the seed evaluations play by default
MAX_EVAL_ENVS = 1024  # sub-envs of an eval env: more episodes are played in rounds


def load_policy(
    path: str | Path, device: torch.device, envs: gym.vector.VectorEnv | None = None
) -> tuple[Policy, GRPOConfig, dict[str, Any]]:
    """A policy and its config from a checkpoint (loaded with `weights_only=True`).

    The checkpoint must fit the env it is played in (`envs`, or one sub-env of the
    checkpoint's own env): other spaces or another network are refused, naming each
    difference, as `--resume` does.
    """
    payload = checkpoint.load(path)
    config = GRPOConfig.from_dict(payload["config"])
    own = contextlib.closing(make_envs(config, 1, device)) if envs is None else None
    with own or contextlib.nullcontext(envs) as played:
        return _checked_policy(payload, Path(path), config, played, device), config, payload


def open_policy(
    path: str | Path, device: torch.device, num_envs: int = 1, **env_kwargs: Any
) -> tuple[Policy, gym.vector.VectorEnv]:
    """The eval and play commands' way in: the checkpoint read once, `num_envs` envs of its
    run's env made as the run made them (`make_envs`, on `device`, `env_kwargs` added), and
    its policy checked against them."""
    payload = checkpoint.load(path)
    config = GRPOConfig.from_dict(payload["config"])
    envs = make_envs(config, num_envs, device, **env_kwargs)
    try:
        return _checked_policy(payload, Path(path), config, envs, device), envs
    except BaseException:
        envs.close()
        raise


def _checked_policy(
    payload: dict[str, Any],
    path: Path,
    config: GRPOConfig,
    envs: gym.vector.VectorEnv,
    device: torch.device,
) -> Policy:
    """The checkpoint's policy, refused (naming each difference) where it does not fit."""
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    spaces = checkpoint.space_signature(obs_space, action_space)
    checkpoint.check_compatible(payload, path, spaces, config.to_dict())
    policy = build_policy(config, obs_space, action_space)
    try:
        policy.load_state_dict(payload["policy"])
    except RuntimeError as err:  # the weights are not those of the network the config names
        network = {name: getattr(config, name) for name in checkpoint.ARCHITECTURE_FIELDS}
        raise checkpoint.CheckpointError(
            f"checkpoint {path}: its weights do not fit the network its config describes "
            f"({network}) for this env's spaces: {err}"
        ) from None
    return policy.to(device).eval()


@torch.inference_mode()
def evaluate(
    policy: Policy,
    envs: gym.vector.VectorEnv,
    episodes: int,
    *,
    greedy: bool = True,
    seed: int = EVAL_SEED,
    max_episode_steps: int | None = None,
    sum_over_ranks: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
) -> dict[str, float]:
    """Mean/std return and length over `episodes`, every numeric `info["episode"]` field, and
    the ratios the env declares in `metadata["episode_ratios"]` (Fruit Catcher: `catch_rate`).
    Each sub-env plays one episode per round, with its own seed. `sum_over_ranks` adds up
    the sums of data-parallel ranks, each of which played its own episodes."""
    device = next(policy.parameters()).device
    env = EnvIO(envs, device)
    horizon = max_episode_steps or env.max_episode_steps() or EVAL_HORIZON
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    runner = EpisodeRunner(env)
    members = torch.arange(env.num_envs, device=device)

    def act(_: int, obs: torch.Tensor) -> torch.Tensor:
        return policy.act(obs, greedy=greedy, generator=generator)

    def all_ended(runner: EpisodeRunner) -> bool:  # evaluation may sync: it is not a hot path
        return not bool(runner.alive.any())

    for r in range(math.ceil(episodes / env.num_envs)):
        obs = env.reset_groups([seed + (r + 1) * env.num_envs + i for i in range(env.num_envs)], 1)
        counted = members < episodes - r * env.num_envs  # the last round may need fewer
        play_until_ended(runner, obs, act, horizon, counted=counted, stop=all_ended)
        unfinished = runner.alive  # the horizon cut them: count them as they stand
        runner.stats.add(unfinished, runner.returns, runner.lengths, {})
    sums = runner.stats.sums()
    if sum_over_ranks is not None:
        sums = sum_over_ranks(sums)
    out = to_host({**summarise(sums, env.episode_ratios), "episodes": sums["episodes"]})
    return {k: v for k, v in out.items() if not math.isnan(v)}


# -- recording -----------------------------------------------------------------------------------


def _first_frame(frames: Any) -> Any:
    """Vector envs render one frame per sub-env; we record sub-env 0."""
    if isinstance(frames, (list, tuple)):
        return frames[0]
    if isinstance(frames, np.ndarray) and frames.ndim == 4:
        return frames[0]
    return frames


@torch.inference_mode()
def play_episode(policy: Policy, envs: gym.vector.VectorEnv, *, steps: int, seed: int) -> list[Any]:
    """Frames of sub-env 0 playing greedily until its episode ends (at most `steps`)."""
    device = next(policy.parameters()).device
    env = EnvIO(envs, device)
    obs = env.reset_groups([seed] * env.num_envs, 1)
    frames = [_first_frame(envs.render())]

    def act(_: int, obs: torch.Tensor) -> torch.Tensor:
        return policy.act(obs)

    def record(_: int, step: RunnerStep) -> None:
        if step.alive[0]:  # the frame after sub-env 0's last step is its next game's
            frames.append(_first_frame(envs.render()))

    def first_ended(runner: EpisodeRunner) -> bool:
        return not bool(runner.alive[0])

    play_until_ended(EpisodeRunner(env), obs, act, steps, on_step=record, stop=first_ended)
    return frames


def write_animation(frames: list[np.ndarray], path: Path, fps: int = 10) -> None:
    """GIF through Pillow; other formats (e.g. .mp4) through imageio when installed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".gif":
        try:
            from PIL import Image
        except ImportError:
            raise ValueError(
                "writing a GIF needs Pillow: pip install 'fruit-grpo[video]'"
            ) from None
        images = [Image.fromarray(np.asarray(f, dtype=np.uint8)) for f in frames]
        images[0].save(
            path, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0
        )
        return
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise ValueError(f"writing {path.suffix} needs imageio: pip install imageio") from None
    imageio.mimsave(path, [np.asarray(f) for f in frames], fps=fps)
