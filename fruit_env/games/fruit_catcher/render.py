"""Turn a game's pixel grid into an RGB frame or a text board.

Both envs render from the same uint8 grid (`FruitCatcher.pixels` / the single env's
`_pixels`), so a picture always shows exactly what the pixel observation holds.
"""

from __future__ import annotations

import numpy as np

from fruit_env.games.fruit_catcher.params import BASKET_PIXEL, FRUIT_PIXEL

RENDER_MODES = ("rgb_array", "ansi")
RENDER_FPS = 10
SCALE = 16  # screen pixels per board cell

_BACKGROUND = (24, 24, 32)
_COLOURS = {FRUIT_PIXEL: (230, 60, 50), BASKET_PIXEL: (200, 160, 60)}
_GLYPHS = {FRUIT_PIXEL: "o", BASKET_PIXEL: "="}


def rgb_frame(grid: np.ndarray, scale: int = SCALE) -> np.ndarray:
    """`(H, W)` uint8 grid -> `(H*scale, W*scale, 3)` uint8 RGB frame."""
    palette = np.empty((256, 3), dtype=np.uint8)
    palette[:] = _BACKGROUND
    for value, colour in _COLOURS.items():
        palette[value] = colour
    frame = palette[grid]
    return np.repeat(np.repeat(frame, scale, axis=0), scale, axis=1)


def ansi_board(grid: np.ndarray, *, score: int, step: int) -> str:
    """`(H, W)` uint8 grid -> a framed text board with the score line underneath."""
    width = grid.shape[1]
    rows = ["|" + "".join(_GLYPHS.get(int(v), " ") for v in row) + "|" for row in grid]
    border = "+" + "-" * width + "+"
    return "\n".join([border, *rows, border, f"score {score:+d}  step {step}"])
