"""Record one game of FruitCatcher-v0 played by the chase policy, as an MP4 or a GIF.

    pip install -e '.[video]'
    python examples/record_video.py --out videos

With moviepy installed, Gymnasium's `RecordVideo` writes the MP4. Without moviepy, the frames
from `render()` go into a GIF via imageio.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from fruit_env.cli import chase_policy


def act(obs: np.ndarray) -> int:
    """The batched chase policy applied to one game's observation."""
    return int(chase_policy(torch.from_numpy(obs)[None])[0])


def play(env: gym.Env, seed: int) -> list[np.ndarray]:
    """One episode; returns the frames (the reset frame, then one per step)."""
    obs, _ = env.reset(seed=seed)
    frames = [env.render()]
    done = False
    while not done:
        obs, _, terminated, truncated, _ = env.step(act(obs))
        frames.append(env.render())
        done = terminated or truncated
    return frames


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("videos"), help="output folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=200, help="episode length limit")
    args = parser.parse_args()

    env = gym.make("FruitCatcher-v0", render_mode="rgb_array", max_episode_steps=args.max_steps)
    if importlib.util.find_spec("moviepy") is not None:
        env = gym.wrappers.RecordVideo(
            env, str(args.out), episode_trigger=lambda e: True, disable_logger=True
        )
        play(env, args.seed)
        env.close()  # RecordVideo writes the file here
        path = args.out / "rl-video-episode-0.mp4"
    elif importlib.util.find_spec("imageio") is not None:
        import imageio.v3 as iio

        frames = play(env, args.seed)
        env.close()
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "fruit_catcher.gif"
        fps = env.metadata["render_fps"]
        iio.imwrite(path, np.stack(frames), duration=1000 / fps, loop=0)
    else:
        print("needs moviepy or imageio: pip install -e '.[video]'", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
