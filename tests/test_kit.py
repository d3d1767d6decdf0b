"""The kit (`fruit_env.kit`) around a game it has never seen: a toy defined here.

The toy has what a game may have: randomness in its steps as well as its starts, fields of
several dtypes and shapes, its own episode statistics and a render hook. The env built
around it passes the trainer's conformance checker in every autoreset mode, eagerly and
compiled, with the same games either way; the packed layout keeps every field exactly; and
the kit imports no game.
"""

from __future__ import annotations

import ast
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import pytest
import torch

from fruit_env.kit import Step, TensorGame, TensorVectorEnv
from fruit_env.kit.layout import Layout, Packed
from grpo_trainer.tools.checker import CHECKS, check_vector_env

ROOT = Path(__file__).resolve().parents[1]
MODES = ["NEXT_STEP", "SAME_STEP", "DISABLED"]


class Inner(NamedTuple):
    cells: torch.Tensor  # (N, 2, 3) int8: a little board
    lit: torch.Tensor  # (N,) bool


class Walk(NamedTuple):
    position: torch.Tensor  # (N,) int32
    inner: Inner
    heat: torch.Tensor  # (N,) float32
    t: torch.Tensor  # (N,) int16
    score: torch.Tensor  # (N,) float32


class RandomWalk(TensorGame[Walk]):
    """A walk on 0..9 from a random start, pushed one extra cell by a random gust now and
    then; reaching 9 wins 1, reaching 0 loses 1; 16 steps at most."""

    num_actions = 3
    episode_fields = ("r", "l", "heat")
    max_episode_steps = 16
    render_modes = ("ansi",)

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)

    def __repr__(self) -> str:
        return "RandomWalk()"

    def initial(self, bits: torch.Tensor) -> Walk:
        n = bits.shape[0]
        cells = (bits[:, None, None] >> torch.arange(6).view(1, 2, 3)) & 1
        return Walk(
            position=(1 + bits % 8).to(torch.int32),
            inner=Inner(cells.to(torch.int8), (bits & 1) == 1),
            heat=torch.zeros(n, dtype=torch.float32),
            t=torch.zeros(n, dtype=torch.int16),
            score=torch.zeros(n, dtype=torch.float32),
        )

    def advance(self, state: Walk, action: torch.Tensor, bits: torch.Tensor) -> Step:
        gust = ((bits >> 8) % 4 == 0).to(torch.int32)  # a quarter of the steps
        position = (state.position + action - 1 + gust).clamp(0, 9)
        won, lost = position == 9, position == 0
        reward = won.to(torch.float32) - lost.to(torch.float32)
        t = state.t + 1
        inner = Inner(state.inner.cells ^ gust.to(torch.int8)[:, None, None], ~state.inner.lit)
        heat = state.heat + 0.1 * position
        new = Walk(position, inner, heat, t, state.score + reward)
        return Step(new, reward, won | lost, t >= self.max_episode_steps)

    def observe(self, state: Walk) -> torch.Tensor:
        lit = state.inner.lit.to(torch.float32)
        return torch.stack([state.position / 9, lit, state.inner.cells.sum((1, 2)) / 6], 1)

    def episode(self, state: Walk) -> tuple[torch.Tensor, ...]:
        return state.score.clone(), state.t.to(torch.int32), state.heat.clone()

    def render(self, state: Walk, mode: str) -> list[Any]:
        return ["." * int(p) + "o" + "." * (9 - int(p)) for p in state.position.tolist()]


def toy(num_envs: int, mode: str, **kwargs: Any) -> TensorVectorEnv:
    return TensorVectorEnv(RandomWalk(), num_envs, autoreset_mode=mode, **kwargs)


@pytest.mark.parametrize("mode", MODES)
def test_the_toy_passes_the_checker_in_every_mode(mode: str) -> None:
    env = toy(6, mode)
    report = check_vector_env(env, steps=24, make_env=lambda n: toy(n, mode))
    # the CPU default validates actions immediately: one flag read per step, free on the CPU
    assert report.statuses() == {**dict.fromkeys(CHECKS, "pass"), "host_syncs": "warn"}, str(report)
    assert mode in report["autoreset"].evidence


def test_the_toy_reports_its_episodes_and_renders() -> None:
    """The game's own statistics go to `info["episode"]` under its names, its render hook
    is the env's `render`, and its time limit is the env's `max_episode_steps`."""
    env = toy(3, "NEXT_STEP", render_mode="ansi")
    env.reset(seed=1)
    returns = torch.zeros(3)
    for _ in range(40):
        _, reward, _, _, info = env.step(torch.full((3,), 2))
        returns += reward
        if info["_episode"].any():
            break
    assert set(info["episode"]) == {"r", "l", "heat"} and info["_episode"].any()
    ended = info["_episode"]
    assert torch.equal(info["episode"]["r"][ended], returns[ended])
    assert env.max_episode_steps == 16
    assert env.render() == ["." * p + "o" + "." * (9 - p) for p in env.game_state.position.tolist()]
    with pytest.raises(ValueError, match=r"render_mode must be one of \('ansi',\)"):
        toy(3, "NEXT_STEP", render_mode="rgb_array")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["SAME_STEP"])  # the mode with the most to do
def test_the_toy_plays_the_same_games_compiled(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled path is the kit's, not a game's: any game compiles, and plays the eager
    games bit for bit, across restarts, a restore and a masked reset."""
    monkeypatch.setenv(
        "FRUIT_ENV_CACHE_DIR", str(Path(tempfile.gettempdir()) / "fruit_env_test_cache")
    )
    outputs = []
    for choice in (False, True):
        env = toy(5, mode, compile=choice)
        assert env.compiled is choice
        gen = torch.Generator().manual_seed(0)
        played = [env.reset(seed=7)[0]]
        for step in range(30):
            obs, reward, terminated, truncated, info = env.step(
                torch.randint(0, 3, (5,), generator=gen)
            )
            played += [obs, reward, terminated, truncated, *info["episode"].values()]
            played += [info.get("final_obs", obs)]
            if step == 10:
                env.restore_state(torch.tensor([4, 3]), env.snapshot_state(torch.tensor([0, 1])))
            if step == 20:
                played.append(env.reset(options={"reset_mask": info["_episode"]})[0])
        outputs.append(played)
    for got, expected in zip(*outputs, strict=True):
        assert got.dtype == expected.dtype and torch.equal(got, expected)


def test_the_layout_keeps_every_field_exactly() -> None:
    """Packed rows hold bool, small integers and float32 (NaN, -0.0 and infinities too) bit
    for bit; `Packed` states pack to the same rows; fields of several dimensions keep their
    row-major order."""
    game = RandomWalk()
    state = game.initial(torch.arange(5, dtype=torch.int64) * 977)
    state = state._replace(heat=torch.tensor([float("nan"), -0.0, float("inf"), 1e-40, -3.5]))
    layout = Layout(state)
    rows = layout.pack(state)
    assert rows.dtype == torch.int32 and rows.shape == (layout.rows, 5) and layout.rows == 1 + 6 + 4
    assert torch.equal(rows[1:7].T.reshape(5, 2, 3), state.inner.cells.to(torch.int32))
    back = layout.unpack(rows)
    for got, expected in zip(_leaves(back), _leaves(state), strict=True):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert torch.equal(_bits(got), _bits(expected))
    assert torch.equal(layout.pack(Packed(rows.T)), rows)


def test_the_layout_refuses_what_it_cannot_keep() -> None:
    with pytest.raises(ValueError, match=r"state field 'inner.lit' must be .* got torch.int64"):
        Layout(
            Walk(*RandomWalk().initial(torch.zeros(2, dtype=torch.int64)))._replace(
                inner=Inner(torch.zeros(2, 2, 3), torch.zeros(2, dtype=torch.int64))
            )
        )
    with pytest.raises(ValueError, match="a game state is a NamedTuple of tensors"):
        Layout({"position": torch.zeros(2)})


def test_the_kit_imports_no_game() -> None:
    """Nothing under fruit_env/kit imports from fruit_env.games (or any other part of
    fruit_env outside the kit), wherever the import stands."""
    for path in sorted((ROOT / "fruit_env" / "kit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                if name.startswith("fruit_env"):
                    assert name.startswith("fruit_env.kit"), f"{path.name} imports {name}"


def _leaves(node: Any) -> list[torch.Tensor]:
    if isinstance(node, torch.Tensor):
        return [node]
    return [leaf for child in node for leaf in _leaves(child)]


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int32) if tensor.dtype == torch.float32 else tensor


@pytest.mark.parametrize("env_id", ["FruitCatcher-v0", "Breakout-MinAtar-v0"])
def test_a_reset_or_restore_under_inference_mode_then_steps_outside_it(env_id: str) -> None:
    """A rollout resets and restores under torch.inference_mode; the env must still step
    after it (its counter advances in place, which an inference tensor refuses)."""
    envs = gym.make_vec(env_id, num_envs=4, device="cpu")
    with torch.inference_mode():
        envs.reset(seed=[1, 2, 3, 4])
    envs.step(torch.zeros(4, dtype=torch.int64))
    snapshot = envs.snapshot_state(torch.tensor([0, 1]))
    with torch.inference_mode():
        envs.restore_state(torch.tensor([2, 3]), snapshot)
    _, reward, *_ = envs.step(torch.ones(4, dtype=torch.int64))
    assert reward.shape == (4,)
    envs.close()
