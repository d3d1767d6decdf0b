"""Write `docs/agent.gif`: a GRPO-trained agent playing Fruit Catcher, small enough for a README.

    python scripts/make_readme_gif.py                          # train a short run, then record
    python scripts/make_readme_gif.py --checkpoint runs/x/checkpoints/best.pt   # record only

Without `--checkpoint` it trains the default GRPO config for `--train-steps` env steps (in
`--run-dir`, or a temporary directory). It then plays one greedy episode from `--seed` for at
most `--steps` steps, scales the frames by `--scale`, and writes the GIF with Pillow. It also
prints the policy's greedy catch rate over `--eval-episodes` episodes and the catches in the
recorded clip, so you can tell whether the GIF shows an agent worth showing. If the file would
exceed `--max-kb`, it retries at a smaller scale, and fails if even the smallest is too big.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.envs import make_envs
from grpo_trainer.run.evaluation import evaluate, load_policy, play_episode, write_animation

ROOT = Path(__file__).resolve().parents[1]
MIN_SCALE = 0.25


def train_checkpoint(run_dir: Path, train_steps: int, seed: int) -> Path:
    """A short GRPO run with the default config; returns its final checkpoint."""
    config = GRPOConfig(
        total_env_steps=train_steps,
        run=RunConfig(device="cpu", seed=seed, run_dir=str(run_dir), progress=False),
    )
    envs = gym.make_vec("FruitCatcher-v0", num_envs=config.num_envs, device="cpu")
    GRPOTrainer(envs, config).train()
    envs.close()
    return run_dir / "checkpoints" / "last.pt"


def scaled(frames: list[np.ndarray], scale: float) -> list[np.ndarray]:
    """Nearest-neighbour downscale: the board is flat-coloured cells, so it stays crisp."""
    from PIL import Image

    height, width = frames[0].shape[:2]
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return [np.asarray(Image.fromarray(f).resize(size, Image.NEAREST)) for f in frames]


def clip_catches(frames_env: gym.vector.VectorEnv) -> tuple[int, int]:
    """Caught and missed so far in sub-env 0 of the recording env (its episode counters)."""
    state = frames_env.unwrapped.state  # type: ignore[attr-defined]
    return int(state.caught[0]), int(state.missed[0])


def record(
    checkpoint: Path, out: Path, *, steps: int, fps: int, seed: int, scale: float, max_kb: int
) -> dict[str, float]:
    """Play, scale, write; shrink the scale until the GIF fits in `max_kb`."""
    device = torch.device("cpu")
    policy, config, _ = load_policy(checkpoint, device)
    envs = make_envs(config, 1, device, render_mode="rgb_array")
    frames = play_episode(policy, envs, steps=steps, seed=seed)
    caught, missed = clip_catches(envs)
    envs.close()
    while True:
        write_animation(scaled(frames, scale), out, fps=fps)
        size_kb = out.stat().st_size / 1024
        if size_kb <= max_kb:
            break
        if scale <= MIN_SCALE:
            out.unlink()
            raise SystemExit(f"{out}: {size_kb:.0f} KB at scale {scale} exceeds --max-kb {max_kb}")
        scale = max(MIN_SCALE, scale * 0.75)
    return {
        "frames": float(len(frames)),
        "seconds": len(frames) / fps,
        "scale": scale,
        "kb": size_kb,
        "clip_caught": float(caught),
        "clip_missed": float(missed),
    }


def greedy_catch_rate(checkpoint: Path, episodes: int, seed: int) -> float:
    device = torch.device("cpu")
    policy, config, _ = load_policy(checkpoint, device)
    envs = make_envs(config, min(episodes, 256), device)
    result = evaluate(policy, envs, episodes, greedy=True, seed=seed)
    envs.close()
    return result.get("catch_rate", 0.0)  # evaluate leaves it out when no fruit landed


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, help="record this checkpoint; skip training")
    parser.add_argument(
        "--train-steps",
        type=int,
        default=GRPOConfig().total_env_steps,
        help="env steps to train (default: the config's budget, as `make train`)",
    )
    parser.add_argument("--run-dir", type=Path, help="keep the training run here (default: temp)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "agent.gif")
    parser.add_argument("--steps", type=int, default=60, help="episode steps to record (frames)")
    parser.add_argument("--fps", type=int, default=10)
    parser.add_argument("--scale", type=float, default=1.0, help="of the 320x240 frames")
    parser.add_argument("--max-kb", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-episodes", type=int, default=256)
    args = parser.parse_args(argv)
    for name in ("train_steps", "steps", "fps", "max_kb", "eval_episodes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.scale <= 1:
        parser.error(f"--scale must be in (0, 1], got {args.scale}")
    if args.checkpoint is not None and not args.checkpoint.is_file():
        parser.error(f"--checkpoint {args.checkpoint} is not a file")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)  # small MLPs: more threads only contend on a shared CPU

    with tempfile.TemporaryDirectory(prefix="readme-gif-") as tmp:
        run_dir = args.run_dir or Path(tmp)
        checkpoint = args.checkpoint or train_checkpoint(run_dir, args.train_steps, args.seed)
        rate = greedy_catch_rate(checkpoint, args.eval_episodes, seed=args.seed + 1)
        result = record(
            checkpoint,
            args.out,
            steps=args.steps,
            fps=args.fps,
            seed=args.seed,
            scale=args.scale,
            max_kb=args.max_kb,
        )
    result["greedy_catch_rate"] = rate
    print(
        f"wrote {args.out}: {result['frames']:.0f} frames ({result['seconds']:.1f} s at "
        f"{args.fps} fps), scale {result['scale']:.2f}, {result['kb']:.0f} KB"
    )
    print(
        f"in the clip: caught {result['clip_caught']:.0f}, missed {result['clip_missed']:.0f}; "
        f"greedy catch rate over {args.eval_episodes} episodes: {rate:.3f}"
    )
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
