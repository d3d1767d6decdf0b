"""The four MinAtar games as Gymnasium vector envs: each game's rules on the kit, unchanged.

For every game (`GAMES`): it is registered when `fruit_env` is imported, as the docs register
a user's game (the kit's `TensorVectorEnv` around the game), with gymnax's episode limit,
action count and observation space (so a trainer builds the network it builds for gymnax's
game); it passes the trainer's conformance checker in every autoreset mode and through
`python -m grpo_trainer check`; it plays the games the rules play from the kit's random bits;
a game's own faster restart is the kit's default restart; snapshots restore a game and its
randomness; it steps on the meta device with no host read; it renders the board its
observation shows (one test per game: the pictures differ); GRPO trains on it with snapshots
and branches; its compiled step plays the eager games.
(tests/test_minatar_<game>.py test each game's rules against gymnax.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import fruit_env
from fruit_env.games import minatar_asterix, minatar_breakout, minatar_freeway
from fruit_env.games import minatar_space_invaders as minatar_invaders
from fruit_env.games.minatar_asterix import rules as asterix_rules
from fruit_env.games.minatar_breakout import rules as breakout_rules
from fruit_env.games.minatar_freeway import rules as freeway_rules
from fruit_env.games.minatar_pictures import BACKGROUND, SCALE
from fruit_env.games.minatar_space_invaders import rules as invaders_rules
from fruit_env.interop.wrappers import NumpyView
from fruit_env.kit import TensorGame, TensorVectorEnv, rng
from fruit_env.registration import ASTERIX_ID, FREEWAY_ID, SPACE_INVADERS_ID
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.algorithm.policy import Policy, is_image_space
from grpo_trainer.envs import make_envs
from grpo_trainer.tools.checker import CHECKS, check_vector_env
from grpo_trainer.tools.syncs import SyncCounter

ROOT = Path(__file__).resolve().parents[1]
MODES = ["NEXT_STEP", "SAME_STEP", "DISABLED"]
MOSTLY_UP = torch.tensor([0.1, 0.8, 0.1])  # Freeway's actions that cross the road often


def uniform(num_actions: int) -> Callable[[tuple[int, ...], torch.Generator], torch.Tensor]:
    def draw(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
        return torch.randint(0, num_actions, shape, generator=generator)

    return draw


def mostly_up(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Random actions, up 80% of the time: the chicken scores (and the cars get new speeds)."""
    draws = torch.multinomial(MOSTLY_UP, int(np.prod(shape)), True, generator=generator)
    return draws.view(shape)


@dataclass(frozen=True)
class Game:
    """What the shared tests need to know of one game; every number is gymnax's or the
    game's own, written out here rather than read from the code under test."""

    env_id: str
    gymnax_id: str
    game: type[TensorGame[Any]]
    rules: ModuleType
    num_actions: int
    planes: int
    limit: int
    bad_action: tuple[int, str]  # an action out of range, the kit's error for it
    # `rules.advance` draws from the step's bits (a spawn, new car speeds)
    advance_takes_bits: bool
    # random actions that make the game's episodes end and score
    policy: Callable[[tuple[int, ...], torch.Generator], torch.Tensor]
    # the rules-vs-env run: sub-envs, steps, time limit, and the least number of each event
    # (terminated, truncated, scoring steps) it must see
    play: tuple[int, int, int]
    events: dict[str, int]
    ends_by_itself: bool = True  # Freeway ends only at its time limit
    checker_kwargs: dict[str, Any] = field(default_factory=dict)
    compiled_play: tuple[int, int, int] = (1000, 120, 80)  # time limit, steps, masked reset at

    def make(self, num_envs: int, **kwargs: Any) -> Any:
        return gym.make_vec(self.env_id, num_envs=num_envs, **kwargs)

    def advance(self, state: Any, action: torch.Tensor, bits: torch.Tensor) -> tuple[Any, ...]:
        if self.advance_takes_bits:
            return self.rules.advance(state, action, bits)
        return self.rules.advance(state, action)

    def __str__(self) -> str:
        return self.env_id


BREAKOUT = Game(
    fruit_env.BREAKOUT_ID, "Breakout-MinAtar", minatar_breakout.MinAtarBreakout,
    breakout_rules, 3, 4, 1000, (3, "actions must be 0, 1 or 2; sub-env 1 got 3"),
    advance_takes_bits=False, policy=uniform(3), play=(16, 300, 10),
    events={"terminated": 50, "truncated": 50},
)  # fmt: skip
ASTERIX = Game(
    ASTERIX_ID, "Asterix-MinAtar", minatar_asterix.MinAtarAsterix, asterix_rules, 5, 4, 1000,
    (5, "actions must be 0, 1, 2, 3 or 4; sub-env 1 got 5"),
    advance_takes_bits=True, policy=uniform(5), play=(16, 600, 60),
    events={"terminated": 20, "truncated": 20, "scored": 20}, compiled_play=(1000, 150, 80),
)  # fmt: skip
FREEWAY = Game(
    FREEWAY_ID, "Freeway-MinAtar", minatar_freeway.MinAtarFreeway, freeway_rules, 3, 7, 2500,
    (3, "actions must be 0, 1 or 2; sub-env 1 got 3"),
    advance_takes_bits=True, policy=mostly_up, play=(32, 450, 150),
    events={"truncated": 50, "scored": 20}, ends_by_itself=False,
    # its episodes end only at the limit, and the checker's autoreset check plays 1000
    # random steps to see some end
    checker_kwargs={"max_episode_steps": 200}, compiled_play=(50, 150, 80),
)  # fmt: skip
INVADERS = Game(
    SPACE_INVADERS_ID, "SpaceInvaders-MinAtar", minatar_invaders.MinAtarSpaceInvaders,
    invaders_rules, 4, 6, 1000, (4, "actions must be 0, 1, 2 or 3; sub-env 1 got 4"),
    advance_takes_bits=False, policy=uniform(4), play=(16, 400, 60),
    events={"terminated": 20, "truncated": 20}, compiled_play=(90, 160, 100),
)  # fmt: skip
GAMES = [BREAKOUT, ASTERIX, FREEWAY, INVADERS]
each_game = pytest.mark.parametrize("game", GAMES, ids=str)


# -- registration and spaces ---------------------------------------------------------------------


@each_game
def test_make_vec_gives_the_kit_env_with_gymnax_limit_and_the_kits_fast_options(
    game: Game,
) -> None:
    envs = game.make(3, autoreset_mode="SAME_STEP")
    assert type(envs) is TensorVectorEnv and type(envs.game) is game.game
    assert envs.spec is not None and envs.spec.id == game.env_id
    assert gym.spec(game.env_id).max_episode_steps == game.limit
    assert envs.max_episode_steps == game.limit
    assert envs.metadata["autoreset_mode"].name == "SAME_STEP"
    assert envs.metadata["fast_kwargs"] == {"validate_actions": False}
    assert envs.single_action_space == gym.spaces.Discrete(game.num_actions)
    assert game.make(2, max_episode_steps=50).max_episode_steps == 50


@each_game
@pytest.mark.parametrize("limit", [0, -3, 2**31, 1.5, True, "10"])
def test_a_bad_episode_limit_is_refused_by_name(game: Game, limit: Any) -> None:
    with pytest.raises(ValueError, match="max_episode_steps must be"):
        game.make(2, max_episode_steps=limit)


@each_game
def test_a_bad_keyword_is_refused_by_name(game: Game) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_lives'"):
        game.make(2, num_lives=3)
    with pytest.raises(ValueError, match="render_mode must be one of"):
        game.make(2, render_mode="human")


@each_game
def test_the_observation_space_is_gymnax_so_the_trainer_builds_the_same_network(
    game: Game,
) -> None:
    """gymnax's float32 Box of planes is flat features to the trainer (an MLP); a bool or
    uint8 Box would be an image (a CNN)."""
    envs = game.make(2)
    space = envs.single_observation_space
    assert space == gym.spaces.Box(0.0, 1.0, (10, 10, game.planes), np.float32)
    assert not is_image_space(space)
    mlp = Policy(space, gym.spaces.Discrete(game.num_actions), hidden_sizes=(64, 64))
    assert mlp.scale == 1.0 and [type(m).__name__ for m in mlp.modules()].count("Conv2d") == 0
    gymnax = pytest.importorskip("gymnax")
    from grpo_trainer.envs.gymnax_vector import gymnasium_space

    env, params = gymnax.make(game.gymnax_id)
    assert gymnasium_space(env.observation_space(params)) == space
    assert gymnasium_space(env.action_space(params)) == envs.single_action_space
    assert params.max_steps_in_episode == envs.max_episode_steps


# -- the checker ---------------------------------------------------------------------------------


@each_game
@pytest.mark.parametrize("mode", MODES)
def test_it_passes_the_checker_in_every_mode(game: Game, mode: str) -> None:
    kwargs = {"autoreset_mode": mode, **game.checker_kwargs}
    envs = game.make(6, **kwargs)
    report = check_vector_env(envs, make_env=lambda n: game.make(n, **kwargs))
    # the CPU default validates actions immediately: one flag read per step, free on the CPU
    assert report.statuses() == {**dict.fromkeys(CHECKS, "pass"), "host_syncs": "warn"}, str(report)
    assert mode in report["autoreset"].evidence


@each_game
def test_with_its_fast_options_it_is_sync_free_even_when_strict(game: Game) -> None:
    envs = game.make(6, validate_actions=False)
    report = check_vector_env(envs, strict_syncs=True)
    assert report["host_syncs"].status == "pass", str(report)


@each_game
def test_the_trainers_check_command_passes_it(game: Game) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "grpo_trainer", "check", f"fruit_env:{game.env_id}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{game.env_id} (TensorVectorEnv): ok" in done.stdout
    assert "state_snapshots      pass" in done.stdout


@each_game
def test_out_of_range_actions_get_the_kits_error(game: Game) -> None:
    envs = game.make(3)
    envs.reset(seed=0)
    bad, message = game.bad_action
    with pytest.raises(ValueError, match=message):
        envs.step(torch.tensor([0, bad, 2]))
    with pytest.raises(ValueError, match=r"actions must have shape \(3,\), got \(2,\)"):
        envs.step(torch.tensor([0, 1]))


# -- the games it plays --------------------------------------------------------------------------


def _keys(seed: int, n: int) -> torch.Tensor:
    return torch.from_numpy(rng.seed_keys(np.arange(n, dtype=np.uint64) + np.uint64(seed)))


def _where(mask: torch.Tensor, fresh: Any, state: Any) -> Any:
    def pick(f: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.where(mask.view(-1, *[1] * (s.dim() - 1)), f, s)

    return type(state)(*(pick(f, s) for f, s in zip(fresh, state, strict=True)))


def _rules_reference(
    game: Game, seed: int, actions: torch.Tensor, mode: str, limit: int
) -> list[tuple[Any, ...]]:
    """Per step `(obs, reward, terminated, truncated, ended, final_obs or None, return,
    length)` of the rules called directly, with the kit's documented randomness: sub-env i's
    key is that of seed + i; a reset draws from counter 0; a step draws from its counter (the
    bits `advance` takes, where it takes any) and advances it by one; a NEXT_STEP restart uses
    its step's draw, a SAME_STEP restart the next counter value (which the counter then
    skips)."""
    rules, n = game.rules, actions.shape[1]
    key, counter = _keys(seed, n), torch.zeros(n, dtype=torch.int64)
    state = rules.initial_state(rng.draw(key, counter))
    counter += 1
    pending = torch.zeros(n, dtype=torch.bool)
    out = []
    for action in actions:
        bits = rng.draw(key, counter)
        new, reward, terminated = game.advance(state, action, bits)
        truncated = rules.truncated(new, limit)
        ret, length = rules.episode(new)
        final = None
        if mode == "NEXT_STEP":
            keep = ~pending
            reward, terminated, truncated = reward * keep, terminated & keep, truncated & keep
            new = _where(pending, rules.initial_state(bits), new)
            pending = terminated | truncated
            ended = pending
        else:  # SAME_STEP
            ended = terminated | truncated
            final = rules.observe(new, torch.float32)
            new = _where(ended, rules.initial_state(rng.draw(key, counter + 1)), new)
            counter += ended
        counter += 1
        state = new
        out.append((rules.observe(state, torch.float32), reward, terminated, truncated, ended,
                    final, ret, length))  # fmt: skip
    return out


@each_game
@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP"])
def test_the_env_plays_the_rules_games(game: Game, mode: str) -> None:
    """Every output of the env equals the rules' own through episode ends by the game and by
    the time limit (set short enough for random play to reach it) and through scoring steps
    (which draw new bits in Asterix and Freeway); `game.events` says how many of each."""
    (n, steps, limit), seed = game.play, 11
    actions = game.policy((steps, n), torch.Generator().manual_seed(0))
    expected = _rules_reference(game, seed, actions, mode, limit)
    envs = game.make(n, autoreset_mode=mode, max_episode_steps=limit)
    obs, _ = envs.reset(seed=seed)
    first = game.rules.initial_state(rng.draw(_keys(seed, n), torch.zeros(n, dtype=torch.int64)))
    assert torch.equal(obs, game.rules.observe(first, torch.float32))
    seen = {"terminated": 0, "truncated": 0, "scored": 0}
    for action, want in zip(actions, expected, strict=True):
        obs, reward, terminated, truncated, info = envs.step(action)
        w_obs, w_reward, w_term, w_trunc, w_ended, w_final, w_return, w_length = want
        assert torch.equal(obs, w_obs) and torch.equal(reward, w_reward)
        assert torch.equal(terminated, w_term) and torch.equal(truncated, w_trunc)
        assert torch.equal(info["_episode"], w_ended)
        assert torch.equal(info["episode"]["r"][w_ended], w_return[w_ended])
        assert torch.equal(info["episode"]["l"][w_ended], w_length[w_ended])
        if w_final is not None:
            assert torch.equal(info["final_obs"][w_ended], w_final[w_ended])
        seen["terminated"] += int(terminated.sum())
        seen["truncated"] += int(truncated.sum())
        seen["scored"] += int((reward > 0).sum())
    assert all(seen[event] > least for event, least in game.events.items()), seen
    assert game.ends_by_itself or seen["terminated"] == 0, seen


@pytest.mark.parametrize("game", [BREAKOUT, ASTERIX, INVADERS], ids=str)  # their own restarts
def test_its_restart_is_the_kits_restart(game: Game) -> None:
    """The game's `restart` gives, field by field, what `TensorGame.restart` (a new game
    where the mask holds, `initial` from the bits) gives, on states reached by play, and
    leaves the state it restarts as it was."""
    assert "restart" in game.game.__dict__  # its own, not the kit's
    tensor_game, gen, n = game.game(), torch.Generator().manual_seed(3), 64
    rules = game.rules
    start = rules.initial_state(torch.randint(0, 2**32, (n,), generator=gen))
    state = start
    for step in range(60):
        bits = torch.randint(0, 2**32, (n,), generator=gen)
        state = game.advance(state, game.policy((n,), gen), bits)[0]
        if step % 7:
            continue
        before = type(state)(*(f.clone() for f in state))
        mask = torch.rand(n, generator=gen) < 0.5
        bits = torch.randint(0, 2**32, (n,), generator=gen)
        expected = TensorGame.restart(tensor_game, state, mask, bits)
        got = tensor_game.restart(state, mask, bits)
        for name, g, e, b, s in zip(state._fields, got, expected, before, state, strict=True):
            assert g.dtype == e.dtype and torch.equal(g, e), name
            assert torch.equal(s, b), name
    # play moved the games away from their starts (so the restarts replaced something)
    assert not all(torch.equal(a, b) for a, b in zip(start, state, strict=True))
    if game is ASTERIX:
        assert state.entity_on.any()  # entities were in play


@each_game
def test_it_steps_and_resets_outside_the_inference_mode_it_stepped_in(game: Game) -> None:
    """A rollout under `torch.inference_mode()` (as trainers collect), then a masked reset
    and more steps outside it: the env writes into none of the state's tensors (which would
    raise), and plays what an env never put in inference mode plays."""
    mask = torch.tensor([True, False, True, False])
    played = []
    for inference in (True, False):
        envs = game.make(4, max_episode_steps=20)
        envs.reset(seed=0)
        gen = torch.Generator().manual_seed(4)
        with torch.inference_mode(inference):
            for _ in range(60):  # episodes end and restart
                envs.step(game.policy((4,), gen))
        obs, _ = envs.reset(options={"reset_mask": mask})
        played.append([obs, *(envs.step(game.policy((4,), gen))[0] for _ in range(30))])
    assert all(torch.equal(a, b) for a, b in zip(*played, strict=True))


@each_game
def test_snapshots_restore_a_game_and_its_randomness(game: Game) -> None:
    """Sub-env 2 takes sub-env 0's snapshot and then plays exactly what sub-env 0 played,
    though the two had played differently before: the same outputs, scoring steps, episode ends
    and the bits they draw included, and at the end the same state, key and counter."""
    envs = game.make(3)
    envs.reset(seed=5)
    gen = torch.Generator().manual_seed(1)
    for _ in range(30):
        obs = envs.step(game.policy((3,), gen))[0]
    assert not torch.equal(obs[2], obs[0])
    envs.restore_state(torch.tensor([2]), envs.snapshot_state(torch.tensor([0])))
    differs, events = 0, 0
    for _ in range(400):
        action = game.policy((3,), gen)
        action[2] = action[0]
        obs, reward, terminated, truncated, _ = envs.step(action)
        assert torch.equal(obs[2], obs[0]) and reward[2] == reward[0]
        assert terminated[2] == terminated[0] and truncated[2] == truncated[0]
        differs += int(not torch.equal(obs[1], obs[0]))
        events += int(reward[0] > 0 or terminated[0] or truncated[0])  # each draws new bits
    assert differs > 0  # sub-env 1, not restored, plays another game
    assert events >= 2
    assert all(torch.equal(f[2], f[0]) for f in envs.game_state)
    mine, theirs = envs.snapshot_state(torch.tensor([2])), envs.snapshot_state(torch.tensor([0]))
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True))  # key and counter too


@each_game
def test_numpy_views_it_without_a_copy(game: Game) -> None:
    """The kit's interop works on any torch vector env: numpy arrays over its tensors."""
    envs = game.make(3)
    view = NumpyView(envs)
    obs, _ = view.reset(seed=0)
    assert isinstance(obs, np.ndarray) and obs.dtype == np.float32
    assert obs.shape == (3, 10, 10, game.planes)
    obs, reward, *_, info = view.step(np.array([0, 1, 2]))
    assert isinstance(reward, np.ndarray) and isinstance(info["_episode"], np.ndarray)
    assert not obs.flags.owndata and not reward.flags.owndata  # views of the env's tensors
    assert np.array_equal(obs, game.rules.observe(envs.game_state, torch.float32).numpy())


# -- pictures (one test per game: each draws its own board) --------------------------------------


def _text_board(rows: list[str], status: str = "score 0  step 0") -> str:
    """A 10x10 game's ansi picture: its `rows` inside a border, then the status line."""
    border = "+" + "-" * 10 + "+"
    return "\n".join([border, *[f"|{r}|" for r in rows], border, status])


def _frame_cells(frame: np.ndarray) -> np.ndarray:
    """One pixel per board cell of an RGB frame, checked to be those cells scaled up."""
    assert frame.shape == (10 * SCALE, 10 * SCALE, 3) and frame.dtype == np.uint8
    cells = frame[::SCALE, ::SCALE]
    assert np.array_equal(frame, np.repeat(np.repeat(cells, SCALE, 0), SCALE, 1))
    return cells


@pytest.mark.parametrize("seed", [0, 1])  # one ball starts left, the other right
def test_breakout_renders_the_board_the_observation_shows(seed: int) -> None:
    """A new game: the wall in rows 1-3, the ball at one end of row 3 (over a brick and its
    trail), the paddle in column 4 of row 9; as text and as an RGB frame."""
    envs = BREAKOUT.make(2, render_mode="ansi")
    envs.reset(seed=seed)
    column = int(envs.game_state.ball_x[0])
    ball_row = "o#########" if column == 0 else "#########o"
    empty, wall = " " * 10, "#" * 10
    rows = [empty, wall, wall, ball_row, *[empty] * 5, "    =     "]
    assert envs.render()[0] == _text_board(rows)
    frames = BREAKOUT.make(2, render_mode="rgb_array")
    frames.reset(seed=seed)
    frame = frames.render()[0]
    cells = _frame_cells(frame)
    expected = np.empty((10, 10, 3), np.uint8)
    expected[:] = BACKGROUND
    expected[1:4] = minatar_breakout.game.COLOURS[3]  # bricks
    expected[3, column] = minatar_breakout.game.COLOURS[1]  # the ball
    expected[9, 4] = minatar_breakout.game.COLOURS[0]  # the paddle
    assert np.array_equal(cells, expected)


def test_asterix_renders_the_board_the_observation_shows() -> None:
    """A new game: the player alone in the middle. After the first spawn (step 11), as
    text, every cell shows the glyph of the one plane the observation sets there; as an RGB
    frame, its colour."""
    envs = ASTERIX.make(2, render_mode="ansi")
    envs.reset(seed=0)
    rows = [" " * 10] * 5 + ["     A    "] + [" " * 10] * 4
    assert envs.render()[0] == _text_board(rows)
    frames = ASTERIX.make(2, render_mode="rgb_array")
    frames.reset(seed=0)
    for _ in range(12):
        obs, *_ = envs.step(torch.zeros(2, dtype=torch.int64))
        frames.step(torch.zeros(2, dtype=torch.int64))
    planes = obs[0].bool().numpy()
    assert planes.sum() == 3 and planes.sum(2).max() == 1  # player, an entity, its trail
    text = envs.render()[0].split("\n")
    assert text[-1] == "score 0  step 12"
    frame = frames.render()[0]
    cells = _frame_cells(frame)
    for y in range(10):
        for x in range(10):
            lit = np.flatnonzero(planes[y, x])
            glyph = minatar_asterix.game.GLYPHS[lit[0]] if len(lit) else " "
            colour = minatar_asterix.game.COLOURS[lit[0]] if len(lit) else BACKGROUND
            assert text[1 + y][1 + x] == glyph and tuple(cells[y, x]) == colour, (y, x)


@pytest.mark.parametrize("seed", [0, 1])
def test_freeway_renders_the_board_the_observation_shows(seed: int) -> None:
    """A new game: the chicken in column 4 of row 9, each car in column 0 of its row with
    its trail (its speed) in the cell behind it, as text and as an RGB frame."""
    envs = FREEWAY.make(2, render_mode="ansi")
    envs.reset(seed=seed)
    speeds = envs.game_state.car_speed[0].tolist()
    assert all(1 <= abs(s) <= 5 for s in speeds)
    rows = [" " * 10]
    for s in speeds:  # a car going right leaves its trail in column 9, going left in column 1
        row = ["#"] + [" "] * 9
        row[9 if s > 0 else 1] = str(abs(s))
        rows.append("".join(row))
    rows.append("    @     ")
    assert envs.render()[0] == _text_board(rows)
    frames = FREEWAY.make(2, render_mode="rgb_array")
    frames.reset(seed=seed)
    frame = frames.render()[0]
    cells = _frame_cells(frame)
    expected = np.empty((10, 10, 3), np.uint8)
    expected[:] = BACKGROUND
    for lane, s in enumerate(speeds, start=1):
        expected[lane, 0] = minatar_freeway.game.COLOURS[1]
        expected[lane, 9 if s > 0 else 1] = minatar_freeway.game.COLOURS[1 + abs(s)]
    expected[9, 4] = minatar_freeway.game.COLOURS[0]
    assert np.array_equal(cells, expected)


def test_space_invaders_renders_the_board_the_observation_shows() -> None:
    """A new game: the block in rows 0-3 of columns 2-7 marching left, the cannon in column
    5 of row 9; after a shot, the cannon's bullet a row above it; as text and as RGB."""
    envs = INVADERS.make(2, render_mode="ansi")
    envs.reset(seed=0)
    block, empty = "  <<<<<<  ", " " * 10
    rows = [block] * 4 + [empty] * 5 + ["     ^    "]
    assert envs.render()[0] == _text_board(rows)
    envs.step(torch.tensor([3, 0]))
    rows[8] = "     |    "
    assert envs.render()[0] == _text_board(rows, "score 0  step 1")
    frames = INVADERS.make(2, render_mode="rgb_array")
    frames.reset(seed=0)
    frame = frames.render()[0]
    cells = _frame_cells(frame)
    expected = np.empty((10, 10, 3), np.uint8)
    expected[:] = BACKGROUND
    expected[0:4, 2:8] = minatar_invaders.game.COLOURS[2]  # aliens marching left
    expected[9, 5] = minatar_invaders.game.COLOURS[0]  # the cannon
    assert np.array_equal(cells, expected)


# -- devices -------------------------------------------------------------------------------------


@each_game
@pytest.mark.parametrize("mode", MODES)
def test_it_steps_on_the_meta_device_without_a_host_read(game: Game, mode: str) -> None:
    """Seeded and masked resets, steps across restarts, a snapshot and a restore, with the
    trainer's fast options, on `device="meta"` (shapes only: no host tensor may meet a device
    tensor, no value may be read) and counted on the CPU: no aten call reads device data, so
    the same code runs on any device without a sync."""
    n, fast = 5, TensorVectorEnv.metadata["fast_kwargs"]
    for device in ("meta", "cpu"):
        envs = game.make(n, device=device, autoreset_mode=mode, max_episode_steps=4, **fast)
        assert not envs.compiled
        obs, _ = envs.reset(seed=7)
        assert obs.device.type == device and obs.shape == (n, 10, 10, game.planes)
        for step in range(12):
            action = torch.full((n,), step % game.num_actions, device=device)
            with SyncCounter() as syncs:
                obs, reward, terminated, truncated, info = envs.step(action)
            assert syncs.count == 0, syncs.calls
            outputs = [obs, reward, terminated, truncated, info["_episode"]]
            outputs += info["episode"].values()
            assert all(t.device.type == device for t in outputs)
            dtypes = [torch.float32, torch.float32, *[torch.bool] * 3, torch.float32, torch.int32]
            assert [t.dtype for t in outputs] == dtypes and reward.shape == (n,)
            if step == 3:
                mask = torch.ones(n, dtype=torch.bool, device=device)
                obs, _ = envs.reset(seed=[1, None, 2, None, 3], options={"reset_mask": mask})
                assert obs.device.type == device
        envs.restore_state(torch.tensor([2, 3]), envs.snapshot_state(torch.tensor([0, 4])))
        assert envs.step(torch.zeros(n, dtype=torch.int64, device=device))[0].device.type == device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@each_game
@pytest.mark.parametrize("choice", [False, pytest.param(True, marks=pytest.mark.package)])
def test_a_cuda_env_plays_the_cpu_games(game: Game, choice: bool | str) -> None:
    """The eager and the compiled step on CUDA give the CPU's eager games bit for bit."""
    played = []
    for device, compile in (("cpu", False), ("cuda", choice)):
        envs = game.make(64, device=device, compile=compile, max_episode_steps=50)
        gen = torch.Generator().manual_seed(2)
        out = [envs.reset(seed=3)[0].cpu()]
        for _ in range(200):
            step = envs.step(game.policy((64,), gen).to(device))
            out += [t.cpu() for t in step[:4]]
        played.append(out)
    assert all(torch.equal(a, b) for a, b in zip(*played, strict=True))


# -- training ------------------------------------------------------------------------------------


@each_game
def test_grpo_trains_on_it_with_snapshots_and_branches(game: Game) -> None:
    """The trainer starts groups through snapshots (so `branch_ended`, on by default,
    branches ended members from a group mate's state), reads the episode limit, builds its
    MLP, and trains."""
    config = GRPOConfig(
        num_groups=4,
        group_size=4,
        hidden_sizes=(16,),
        rollout_steps=32,
        window=8,  # the default follows the game's limit: longer than these updates
        restart_every=4,
        minibatch_size=256,
        run=RunConfig(env=f"fruit_env:{game.env_id}", device="cpu", progress=False, compile=False),
    )
    assert config.branch_ended
    envs = make_envs(config, config.num_envs, torch.device("cpu"))
    assert envs.validate_actions is False  # the fast options were applied
    trainer = GRPOTrainer(envs, config)
    assert trainer.env.restart_method.name == "snapshot" and trainer.env.restart_method.can_branch
    assert trainer.env.max_episode_steps() == game.limit
    for _ in range(3):
        metrics = trainer.update()
    assert metrics["valid_steps"] > 0 and np.isfinite(metrics["loss"])


# -- the compiled path -----------------------------------------------------------------------------


@pytest.mark.slow
@each_game
def test_the_compiled_step_plays_the_eager_games(
    game: Game, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kit's compiled step of the game (built once per machine into the cache) gives the
    eager games bit for bit, across scoring steps, restarts, a restore and a masked reset."""
    monkeypatch.setenv(
        "FRUIT_ENV_CACHE_DIR", str(Path(tempfile.gettempdir()) / "fruit_env_test_cache")
    )
    (limit, steps, reset_at), outputs, events = game.compiled_play, [], 0
    mask = torch.tensor([True, False, True, False, True])
    for choice in (False, True):
        envs = game.make(5, compile=choice, max_episode_steps=limit)
        assert envs.compiled is choice
        gen = torch.Generator().manual_seed(0)
        played = [envs.reset(seed=7)[0]]
        for step in range(steps):
            obs, reward, terminated, truncated, info = envs.step(game.policy((5,), gen))
            played += [obs, reward, terminated, truncated, *info["episode"].values()]
            events += int((terminated | truncated | (reward > 0)).sum())
            if step == 40:
                envs.restore_state(torch.tensor([4, 3]), envs.snapshot_state(torch.tensor([0, 1])))
            if step == reset_at:
                played.append(envs.reset(options={"reset_mask": info["_episode"] | mask})[0])
        outputs.append(played)
    assert events > 0  # games scored or ended
    for got, expected in zip(*outputs, strict=True):
        assert got.dtype == expected.dtype and torch.equal(got, expected)
