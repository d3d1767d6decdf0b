"""`python -m fruit_env`: demo output, the chase policy, key handling, and `play` without a TTY.

Also runs every Python snippet of docs/env.md and the examples, so the docs stay runnable.
"""

from __future__ import annotations

import curses
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from fruit_env import ENV_ID, FruitCatcherVectorEnv
from fruit_env.cli import (
    LEFT,
    QUIT,
    RIGHT,
    STAY,
    DemoResult,
    action_for_key,
    chase_policy,
    choose_action,
    format_result,
    main,
    play_game,
    run_demo,
)

# JAX, once another test imported it, warns on every fork; subprocesses exec at once (harmless).
pytestmark = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
ROOT = Path(__file__).resolve().parents[1]
# Subprocesses import this checkout's fruit_env, whatever else is on the path.
SUBPROCESS_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
}


def run_cli(*args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fruit_env", *args],
        cwd=ROOT,
        stdin=stdin,
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=120,
    )


def parse_summary(stdout: str) -> dict[str, float]:
    pairs = re.findall(
        r"^(episodes|mean return|mean length|caught|missed|catch rate) +(\S+)$",
        stdout,
        flags=re.MULTILINE,
    )
    return {key: float(value) for key, value in pairs}


# -- demo ----------------------------------------------------------------------------------------


def test_demo_prints_its_statistics() -> None:
    done = run_cli("demo", "--policy", "chase", "--episodes", "6", "--num-envs", "3", "--seed", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "FruitCatcher-v0 demo: policy=chase num_envs=3 device=cpu seed=1"
    summary = parse_summary(done.stdout)
    assert set(summary) == {
        "episodes",
        "mean return",
        "mean length",
        "caught",
        "missed",
        "catch rate",
    }
    assert summary["episodes"] == 6
    assert summary["caught"] + summary["missed"] > 0
    assert summary["catch rate"] == round(
        summary["caught"] / (summary["caught"] + summary["missed"]), 3
    )
    # The same run in-process gives the same figures: the CLI only formats run_demo.
    result = run_demo("chase", episodes=6, num_envs=3, seed=1)
    assert format_result(result) in done.stdout


def test_demo_show_prints_the_board_of_env_0_every_step() -> None:
    done = run_cli("demo", "--policy", "random", "--episodes", "1", "--num-envs", "1", "--show")
    assert done.returncode == 0, done.stderr
    steps = [int(n) for n in re.findall(r"^score [+-]\d+  step (\d+)$", done.stdout, re.MULTILINE)]
    assert steps == list(range(1, 201))  # one 200-step episode, one board per step
    assert done.stdout.count("+" + "-" * 20 + "+") == 2 * 200


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--episodes", "0"], "--episodes: must be at least 1, got 0"),
        (["demo", "--policy", "greedy"], "invalid choice: 'greedy'"),
        (["play", "--fps", "0"], "--fps: must be positive, got 0"),
        ([], "the following arguments are required: command"),
    ],
)
def test_bad_arguments_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_bad_device_is_one_line_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--device", "tpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fruit_env demo: device 'tpu'") and err.count("\n") == 1


def test_run_demo_is_repeatable_and_counts_exactly_the_episodes_asked_for() -> None:
    first = run_demo("random", episodes=5, num_envs=2, seed=3)
    assert first == run_demo("random", episodes=5, num_envs=2, seed=3)
    assert first.episodes == 5
    assert first.total_length == 5 * 200  # random play never reaches +-30 within 200 steps here
    assert first.total_return == first.caught - first.missed


def test_chase_catches_far_more_than_random() -> None:
    chase = run_demo("chase", episodes=16, num_envs=8, seed=0)
    random = run_demo("random", episodes=16, num_envs=8, seed=0)
    assert 0.6 <= chase.catch_rate <= 0.75
    assert 0.1 <= random.catch_rate <= 0.2
    assert chase.mean_return > 0 > random.mean_return


def test_demo_result_arithmetic() -> None:
    result = DemoResult(episodes=4, total_return=-6.0, total_length=700, caught=3, missed=9)
    assert result.mean_return == -1.5 and result.mean_length == 175.0
    assert result.catch_rate == 0.25
    assert DemoResult(1, 0.0, 1, 0, 0).catch_rate == 0.0


# -- the chase policy ----------------------------------------------------------------------------


def obs_row(basket_left: int, *slots: tuple[int, int, bool]) -> list[float]:
    """A feature observation of the default board (20 x 15, basket 3, 3 slots)."""
    row = [(basket_left + 1) / 19]
    for x, y, active in slots:
        row += [x / 19, y / 14, float(active)] if active else [0.0, 0.0, 0.0]
    return row


def test_chase_policy_moves_toward_the_lowest_active_fruit() -> None:
    obs = torch.tensor(
        [
            obs_row(8, (3, 2, True), (15, 10, True), (0, 0, False)),  # lowest is right: right
            obs_row(8, (4, 9, True), (17, 4, True), (0, 0, False)),  # lowest is left: left
            obs_row(8, (9, 12, True), (0, 1, True), (0, 0, False)),  # above the centre: stay
            obs_row(8, (0, 0, False), (18, 0, True), (0, 0, False)),  # inactive slots ignored
            obs_row(8, (0, 0, False), (0, 0, False), (0, 0, False)),  # nothing falls: stay
            obs_row(0, (2, 13, True), (0, 3, True), (19, 8, True)),  # centre 1, fruit 2: right
        ],
        dtype=torch.float32,
    )
    actions = chase_policy(obs)
    assert actions.dtype == torch.int64
    assert actions.tolist() == [RIGHT, LEFT, STAY, RIGHT, STAY, RIGHT]


def test_chase_policy_rejects_pixel_observations() -> None:
    pixels, _ = FruitCatcherVectorEnv(2, obs_mode="pixels").reset(seed=0)
    with pytest.raises(
        ValueError, match=r"feature observations .* got torch.uint8 \(2, 1, 15, 20\)"
    ):
        chase_policy(pixels)


def test_chase_policy_matches_the_env_observation_layout() -> None:
    env = FruitCatcherVectorEnv(1)
    obs, _ = env.reset(seed=0)
    fruit_x = int(env.state.fruit_x[0, 0])
    for _ in range(13):  # the first fruit lands on the 14th step
        obs, *_ = env.step(chase_policy(obs))
    basket = int(env.state.basket[0])
    assert basket <= fruit_x < basket + 3, "13 steps are enough to get under the first fruit"
    _, reward, *_ = env.step(chase_policy(obs))
    assert reward.tolist() == [1.0]


# -- play ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "action"),
    [
        (ord("a"), LEFT),
        (ord("A"), LEFT),
        (curses.KEY_LEFT, LEFT),
        (ord("d"), RIGHT),
        (ord("D"), RIGHT),
        (curses.KEY_RIGHT, RIGHT),
        (ord("s"), STAY),
        (ord(" "), STAY),
        (curses.KEY_DOWN, STAY),
        (ord("q"), QUIT),
        (ord("Q"), QUIT),
        (ord("x"), None),
        (curses.KEY_UP, None),
        (-1, None),
    ],
)
def test_action_for_key(key: int, action: int | None) -> None:
    assert action_for_key(key) == action


def test_choose_action_quit_wins_then_the_last_move() -> None:
    a, d, s, q, x = (ord(c) for c in "adsqx")
    assert choose_action([]) == STAY
    assert choose_action([x]) == STAY
    assert choose_action([a]) == LEFT
    assert choose_action([a, d]) == RIGHT
    assert choose_action([d, x, s]) == STAY
    assert choose_action([a, q, d]) == QUIT


def test_play_game_follows_the_keys_until_quit() -> None:
    env = gym.make(ENV_ID, render_mode="ansi")
    ticks = iter([[ord("a")], [curses.KEY_LEFT], [], [ord("x"), ord("a")], [ord("q")]])
    boards: list[str] = []
    result = play_game(env, lambda: next(ticks), boards.append, seed=0)
    assert result.quit and result.steps == 4
    assert env.unwrapped.basket == 8 - 3  # type: ignore[attr-defined]
    assert len(boards) == 5  # the first board, then one per step
    assert boards[-1] == result.board
    assert boards[-1].splitlines()[-1] == "score +0  step 4"
    assert boards[-1].splitlines()[15] == "|" + " " * 5 + "===" + " " * 12 + "|"


def test_play_game_ends_with_the_episode() -> None:
    env = gym.make(ENV_ID, render_mode="ansi", max_episode_steps=5)
    result = play_game(env, lambda: [], lambda board: None, seed=0)
    assert not result.quit and result.steps == 5
    assert (result.score, result.caught, result.missed) == (0, 0, 0)


def test_play_refuses_without_a_terminal() -> None:
    done = run_cli("play")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "needs an interactive terminal" in done.stderr
    assert "Traceback" not in done.stderr


# -- docs and examples ---------------------------------------------------------------------------


def doc_snippets() -> list[str]:
    text = (ROOT / "docs" / "env.md").read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("index", range(len(doc_snippets())))
def test_docs_env_snippet_runs(index: int) -> None:
    code = doc_snippets()[index]
    for module in re.findall(r"^import (jax|moviepy|imageio)\b", code, flags=re.MULTILINE):
        pytest.importorskip(module)
    exec(compile(code, f"docs/env.md snippet {index}", "exec"), {"__name__": "__doc__"})


def test_quickstart_example_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "env_quickstart.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=SUBPROCESS_ENV,
    )
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(
        r"\d+ episodes, mean return [+-]\d+\.\d\d, catch rate 0\.\d{3}\n", done.stdout
    )
    assert len((ROOT / "examples" / "env_quickstart.py").read_text().splitlines()) <= 25


def test_record_video_example_writes_a_file(tmp_path: Path) -> None:
    if not any(_importable(m) for m in ("moviepy", "imageio")):
        pytest.skip("needs moviepy or imageio (pip install -e '.[video]')")
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "record_video.py"),
            "--out",
            str(tmp_path),
            "--max-steps",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=SUBPROCESS_ENV,
    )
    assert done.returncode == 0, done.stderr
    files = [p for p in tmp_path.iterdir() if p.suffix in (".mp4", ".gif")]
    assert len(files) == 1 and files[0].stat().st_size > 0
    assert str(files[0]) in done.stdout


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True
