"""Record a trained agent: one greedy episode as rgb frames (GIF/MP4) or ansi text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from grpo_trainer.algorithm.policy import Policy
from grpo_trainer.envs.env_io import EnvIO
from grpo_trainer.envs.episodes import EpisodeRunner, RunnerStep, play_until_ended


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
