"""Rendering: RGB frames and text boards show exactly the game state and the pixel observation."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from fruit_env import FruitCatcherVectorEnv
from fruit_env.games.fruit_catcher.params import BASKET_PIXEL, FRUIT_PIXEL
from fruit_env.games.fruit_catcher.render import SCALE

# JAX, once another test imported it, warns on every fork; subprocesses exec at once (harmless).
pytestmark = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
W, H = 20, 15
ACTIONS = [0, 0, 2, 1, 2, 2, 2, 0, 1, 1]


def cell_colours(frame: np.ndarray) -> np.ndarray:
    """`(H, W, 3)` colour of each board cell, after checking every cell is one flat colour."""
    cells = frame[::SCALE, ::SCALE]
    np.testing.assert_array_equal(np.repeat(np.repeat(cells, SCALE, 0), SCALE, 1), frame)
    return cells


def expected_grid(env: FruitCatcherVectorEnv, i: int) -> np.ndarray:
    """The board of sub-env i built from its state: 2 = fruit, 1 = basket, 0 = empty."""
    s = env.state
    grid = np.zeros((H, W), dtype=np.int64)
    left = int(s.basket[i])
    grid[H - 1, left : left + 3] = 1
    slots = zip(s.fruit_x[i].tolist(), s.fruit_y[i].tolist(), s.active[i].tolist(), strict=True)
    for x, y, active in slots:
        if active:
            grid[y, x] = 2
    return grid


def classify(cells: np.ndarray, palette: dict[int, tuple[int, ...]]) -> np.ndarray:
    grid = np.full(cells.shape[:2], -1)
    for value, colour in palette.items():
        grid[(cells == colour).all(-1)] = value
    assert (grid >= 0).all(), "a cell has a colour outside the palette"
    return grid


def palette_of(env: FruitCatcherVectorEnv) -> dict[int, tuple[int, ...]]:
    """Read the three colours off a frame and check they look like what they stand for."""
    grid = expected_grid(env, 0)
    cells = cell_colours(env.render()[0])  # type: ignore[index]
    colours = {v: tuple(int(c) for c in cells[grid == v][0]) for v in (0, 1, 2)}
    assert len(set(colours.values())) == 3
    r, g, b = colours[2]
    assert r >= 200 and g < 100 and b < 100, f"fruit should be red, got {colours[2]}"
    r, g, b = colours[1]
    assert r >= 150 and g >= 120 and b < 100, f"basket should be yellow-brown, got {colours[1]}"
    assert max(colours[0]) < 64, f"background should be dark, got {colours[0]}"
    return colours


def test_vector_rgb_frames_show_every_sub_env_board() -> None:
    env = FruitCatcherVectorEnv(3, render_mode="rgb_array")
    env.reset(seed=11)
    palette = palette_of(env)
    for step in range(40):
        env.step(torch.tensor([ACTIONS[step % 10], 1, 2]))
        frames = env.render()
        assert isinstance(frames, list) and len(frames) == 3
        for i, frame in enumerate(frames):
            assert frame.shape == (H * SCALE, W * SCALE, 3) and frame.dtype == np.uint8
            grid = classify(cell_colours(frame), palette)
            np.testing.assert_array_equal(grid, expected_grid(env, i))
    assert env.state.active.sum() > 3  # several fruits were on the boards at the end


def test_rgb_frames_agree_with_the_pixel_observation() -> None:
    env = FruitCatcherVectorEnv(4, render_mode="rgb_array", obs_mode="pixels", max_episode_steps=12)
    obs, _ = env.reset(seed=0)
    palette = palette_of(env)
    to_pixel = {0: 0, 1: BASKET_PIXEL, 2: FRUIT_PIXEL}
    for step in range(30):  # crosses two autoresets
        for i, frame in enumerate(env.render()):  # type: ignore[union-attr]
            grid = classify(cell_colours(frame), palette)
            np.testing.assert_array_equal(np.vectorize(to_pixel.get)(grid), obs[i, 0].numpy())
        obs, *_ = env.step(torch.full((4,), ACTIONS[step % 10]))


def test_ansi_boards_show_fruit_basket_and_score() -> None:
    env = FruitCatcherVectorEnv(2, render_mode="ansi")
    env.reset(seed=4)
    for step in range(25):
        env.step(torch.tensor([ACTIONS[step % 10], 2]))
    boards = env.render()
    assert isinstance(boards, list) and len(boards) == 2
    for i, board in enumerate(boards):
        lines = board.splitlines()
        assert len(lines) == H + 3
        assert lines[0] == lines[H + 1] == "+" + "-" * W + "+"
        rows = [line[1:-1] for line in lines[1 : H + 1]]
        assert all(len(row) == W for row in rows)
        glyphs = np.array([[{" ": 0, "=": 1, "o": 2}[c] for c in row] for row in rows])
        np.testing.assert_array_equal(glyphs, expected_grid(env, i))
        assert lines[-1] == f"score {int(env.state.score[i]):+d}  step 25"


def test_no_render_mode_renders_nothing() -> None:
    env = FruitCatcherVectorEnv(2)
    env.reset(seed=0)
    assert env.render() is None


@pytest.mark.parametrize("mode", ["rgb_array", "ansi"])
def test_single_env_renders_like_the_vector_env(mode: str) -> None:
    single = gym.make("FruitCatcher-v0", render_mode=mode, obs_mode="pixels")
    vector = FruitCatcherVectorEnv(1, render_mode=mode, obs_mode="pixels")
    obs, _ = single.reset(seed=9)
    vector.reset(seed=9)
    palette = palette_of(vector) if mode == "rgb_array" else {}
    to_pixel = {0: 0, 1: BASKET_PIXEL, 2: FRUIT_PIXEL}
    for step in range(30):
        frame = single.render()
        if mode == "rgb_array":
            np.testing.assert_array_equal(frame, vector.render()[0])  # type: ignore[index]
            grid = classify(cell_colours(frame), palette)  # type: ignore[arg-type]
            np.testing.assert_array_equal(np.vectorize(to_pixel.get)(grid), obs[0])
        else:
            assert frame == vector.render()[0]  # type: ignore[index]
        obs, *_ = single.step(ACTIONS[step % 10])
        vector.step(torch.tensor([ACTIONS[step % 10]]))


def test_record_video_writes_a_video_of_the_episode(tmp_path: Path) -> None:
    pytest.importorskip("moviepy")
    env = gym.make("FruitCatcher-v0", render_mode="rgb_array", max_episode_steps=20)
    folder = tmp_path / "videos"
    env = gym.wrappers.RecordVideo(
        env, str(folder), episode_trigger=lambda episode: True, disable_logger=True
    )
    env.reset(seed=0)
    done = False
    while not done:
        _, _, terminated, truncated, _ = env.step(1)
        done = terminated or truncated
    env.close()
    videos = sorted(folder.glob("*.mp4"))
    assert [v.name for v in videos] == ["rl-video-episode-0.mp4"]
    assert videos[0].stat().st_size > 1000
    iio = pytest.importorskip("imageio.v3")  # moviepy brings imageio and its ffmpeg reader
    frames = iio.imread(videos[0])
    assert frames.shape[1:] == (H * SCALE, W * SCALE, 3)
    assert len(frames) == 21  # the reset frame and one per step
