"""Pictures of a MinAtar board, shared by the MinAtar games on the kit.

Each game's observation is a stack of 0/1 planes; a picture gives each plane a colour (frames)
and a glyph (text boards), and where planes share a cell the first of the game's priority
order shows. Only the palette differs from game to game, so it is the one thing a game names.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

SCALE = 16  # screen pixels per board cell
BACKGROUND = (24, 24, 32)


@dataclasses.dataclass(frozen=True)
class Palette:
    """How one game's planes look: `colours` and `glyphs` per plane, and `priority`, the
    planes that show, first on top."""

    colours: tuple[tuple[int, int, int], ...]
    glyphs: str
    priority: tuple[int, ...]

    def render(
        self, planes: np.ndarray, scores: list[int], steps: list[int], mode: str
    ) -> list[Any]:
        """`(N, 10, 10, C)` bool planes -> N RGB frames ("rgb_array") or text boards."""
        if mode == "rgb_array":
            return [self.rgb_frame(board) for board in planes]
        return [
            self.ansi_board(board, score=s, step=t)
            for board, s, t in zip(planes, scores, steps, strict=True)
        ]

    def rgb_frame(self, board: np.ndarray) -> np.ndarray:
        """`(10, 10, C)` bool planes -> `(10*SCALE, 10*SCALE, 3)` uint8 RGB frame."""
        frame = np.empty((*board.shape[:2], 3), dtype=np.uint8)
        frame[:] = BACKGROUND
        for plane in reversed(self.priority):  # the plane that shows is drawn last
            frame[board[:, :, plane]] = self.colours[plane]
        return np.repeat(np.repeat(frame, SCALE, axis=0), SCALE, axis=1)

    def ansi_board(self, board: np.ndarray, *, score: int, step: int) -> str:
        """`(10, 10, C)` bool planes -> a framed text board with the score line underneath."""

        def cell(planes: np.ndarray) -> str:
            return next((self.glyphs[p] for p in self.priority if planes[p]), " ")

        rows = ["|" + "".join(cell(planes) for planes in row) + "|" for row in board]
        border = "+" + "-" * board.shape[1] + "+"
        return "\n".join([border, *rows, border, f"score {score}  step {step}"])
