"""`Breakout-MinAtar-v0`: the rules of `fruit_env.games.minatar_breakout.rules` on the kit,
unchanged, as a Gymnasium vector env.

It is registered when `fruit_env` is imported, with gymnax's episode limit and observation
space (so a trainer builds the network it builds for gymnax's Breakout); it passes the
trainer's conformance checker in every autoreset mode and through `python -m grpo_trainer
check`; it plays the games the rules play from the kit's random bits; its faster in-place
restart is the kit's default restart; GRPO trains on it with state snapshots.
(tests/test_minatar_breakout.py tests the rules against gymnax.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import fruit_env
from fruit_env.games.minatar_breakout import (
    BreakoutState,
    BreakoutVectorEnv,
    MinAtarBreakout,
    rules,
)
from fruit_env.games.minatar_breakout.game import COLOURS
from fruit_env.games.minatar_pictures import BACKGROUND, SCALE
from fruit_env.interop.wrappers import NumpyView
from fruit_env.kit import TensorGame, rng
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.algorithm.policy import Policy, is_image_space
from grpo_trainer.envs import make_envs
from grpo_trainer.tools.checker import CHECKS, check_vector_env

ROOT = Path(__file__).resolve().parents[1]
MODES = ["NEXT_STEP", "SAME_STEP", "DISABLED"]


def breakout(num_envs: int, **kwargs: Any) -> Any:
    return gym.make_vec(fruit_env.BREAKOUT_ID, num_envs=num_envs, **kwargs)


# -- registration and spaces ---------------------------------------------------------------------


def test_make_vec_gives_the_kit_env_with_gymnax_limit_and_the_kits_fast_options() -> None:
    envs = breakout(3, autoreset_mode="SAME_STEP")
    assert isinstance(envs, BreakoutVectorEnv) and isinstance(envs.game, MinAtarBreakout)
    assert envs.spec is not None and envs.spec.id == "Breakout-MinAtar-v0"
    assert gym.spec("Breakout-MinAtar-v0").max_episode_steps == 1000
    assert envs.max_episode_steps == 1000
    assert envs.metadata["autoreset_mode"].name == "SAME_STEP"
    assert BreakoutVectorEnv.metadata["fast_kwargs"] == {"validate_actions": False}
    assert envs.single_action_space == gym.spaces.Discrete(3)
    assert breakout(2, max_episode_steps=50).max_episode_steps == 50


@pytest.mark.parametrize("limit", [0, -3, 2**31, 1.5, True, "10"])
def test_a_bad_episode_limit_is_refused_by_name(limit: Any) -> None:
    with pytest.raises(ValueError, match="max_episode_steps must be"):
        breakout(2, max_episode_steps=limit)


def test_the_observation_space_is_gymnax_so_the_trainer_builds_the_same_network() -> None:
    """gymnax's float32 Box of planes is flat features to the trainer (an MLP); a bool or
    uint8 Box would be an image (a CNN)."""
    space = breakout(2).single_observation_space
    assert space == gym.spaces.Box(0.0, 1.0, (10, 10, 4), np.float32)
    assert not is_image_space(space)
    mlp = Policy(space, gym.spaces.Discrete(3), hidden_sizes=(64, 64))
    assert mlp.scale == 1.0 and [type(m).__name__ for m in mlp.modules()].count("Conv2d") == 0
    gymnax = pytest.importorskip("gymnax")
    from grpo_trainer.envs.gymnax_vector import gymnasium_space

    env, params = gymnax.make("Breakout-MinAtar")
    assert gymnasium_space(env.observation_space(params)) == space


# -- the checker ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_it_passes_the_checker_in_every_mode(mode: str) -> None:
    envs = breakout(6, autoreset_mode=mode)
    report = check_vector_env(envs, make_env=lambda n: breakout(n, autoreset_mode=mode))
    # the CPU default validates actions immediately: one flag read per step, free on the CPU
    assert report.statuses() == {**dict.fromkeys(CHECKS, "pass"), "host_syncs": "warn"}, str(report)
    assert mode in report["autoreset"].evidence


def test_with_its_fast_options_it_is_sync_free_even_when_strict() -> None:
    envs = breakout(6, validate_actions=False)
    report = check_vector_env(envs, strict_syncs=True)
    assert report["host_syncs"].status == "pass", str(report)


def test_the_trainers_check_command_passes_it() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "grpo_trainer", "check", "fruit_env:Breakout-MinAtar-v0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Breakout-MinAtar-v0 (BreakoutVectorEnv): ok" in done.stdout
    assert "state_snapshots      pass" in done.stdout


def test_out_of_range_actions_get_the_kits_error() -> None:
    envs = breakout(3)
    envs.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions must be 0, 1 or 2; sub-env 1 got 3"):
        envs.step(torch.tensor([0, 3, 2]))
    with pytest.raises(ValueError, match=r"actions must have shape \(3,\), got \(2,\)"):
        envs.step(torch.tensor([0, 1]))


# -- the games it plays --------------------------------------------------------------------------


def _rules_reference(
    seed: int, actions: torch.Tensor, mode: str, limit: int
) -> list[tuple[torch.Tensor, ...]]:
    """Per step `(obs, reward, terminated, truncated, ended, final_obs or None, return,
    length)` of the rules called directly, with the kit's documented randomness: sub-env i's
    key is that of seed + i; a reset draws from counter 0; a step draws from its counter and
    advances it by one; a NEXT_STEP restart uses its step's draw, a SAME_STEP restart the
    next counter value (which the counter then skips)."""
    n = actions.shape[1]
    key = torch.from_numpy(rng.seed_keys(np.arange(n, dtype=np.uint64) + np.uint64(seed)))
    counter = torch.zeros(n, dtype=torch.int64)
    state = rules.initial_state(rng.draw(key, counter))
    counter += 1
    pending = torch.zeros(n, dtype=torch.bool)
    out = []
    for action in actions:
        bits = rng.draw(key, counter)
        new, reward, terminated = rules.advance(state, action)
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


def _where(mask: torch.Tensor, fresh: BreakoutState, state: BreakoutState) -> BreakoutState:
    return BreakoutState(*(torch.where(mask, f, s) for f, s in zip(fresh, state, strict=True)))


@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP"])
def test_the_env_plays_the_rules_games(mode: str) -> None:
    """Every output of 300 steps of 16 sub-envs equals the rules' own, through episode ends
    by the ball and by the time limit (set to 10 steps here, which random play often reaches)."""
    n, steps, seed, limit = 16, 300, 11, 10
    actions = torch.randint(0, 3, (steps, n), generator=torch.Generator().manual_seed(0))
    expected = _rules_reference(seed, actions, mode, limit)
    envs = breakout(n, autoreset_mode=mode, max_episode_steps=limit)
    obs, _ = envs.reset(seed=seed)
    assert torch.equal(obs, rules.observe(rules.initial_state(_first_bits(seed, n)), torch.float32))
    ends = {"terminated": 0, "truncated": 0}
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
        ends["terminated"] += int(terminated.sum())
        ends["truncated"] += int(truncated.sum())
    assert ends["terminated"] > 50 and ends["truncated"] > 50, ends


def _first_bits(seed: int, n: int) -> torch.Tensor:
    key = torch.from_numpy(rng.seed_keys(np.arange(n, dtype=np.uint64) + np.uint64(seed)))
    return rng.draw(key, torch.zeros(n, dtype=torch.int64))


def test_its_restart_is_the_kits_restart() -> None:
    """`MinAtarBreakout.restart` gives, field by field, what `TensorGame.restart` (a new
    game where the mask holds, `initial` from the bits) gives, on states reached by play, and
    leaves the state it restarts as it was."""
    game, gen = MinAtarBreakout(), torch.Generator().manual_seed(3)
    n = 64
    state = rules.initial_state(torch.randint(0, 2**32, (n,), generator=gen))
    for step in range(60):
        state = rules.advance(state, torch.randint(0, 3, (n,), generator=gen))[0]
        if step % 7:
            continue
        before = BreakoutState(*(f.clone() for f in state))
        mask = torch.rand(n, generator=gen) < 0.5
        bits = torch.randint(0, 2**32, (n,), generator=gen)
        expected = TensorGame.restart(game, state, mask, bits)
        got = game.restart(state, mask, bits)
        for name, g, e, b, s in zip(
            BreakoutState._fields, got, expected, before, state, strict=True
        ):
            assert g.dtype == e.dtype and torch.equal(g, e), name
            assert torch.equal(s, b), name


def test_it_steps_and_resets_outside_the_inference_mode_it_stepped_in() -> None:
    """A rollout under `torch.inference_mode()` (as trainers collect), then a masked reset
    and more steps outside it: the env writes into none of the state's tensors (which would
    raise), and plays what an env never put in inference mode plays."""
    mask = torch.tensor([True, False, True, False])
    played = []
    for inference in (True, False):
        envs = breakout(4)
        envs.reset(seed=0)
        with torch.inference_mode(inference):
            for _ in range(30):  # episodes end and restart
                envs.step(torch.ones(4, dtype=torch.int64))
        obs, _ = envs.reset(options={"reset_mask": mask})
        played.append([obs, *(envs.step(torch.full((4,), 2))[0] for _ in range(30))])
    assert all(torch.equal(a, b) for a, b in zip(*played, strict=True))


def test_snapshots_restore_a_game_and_its_randomness() -> None:
    """Sub-env 2 takes sub-env 0's snapshot and then plays exactly what sub-env 0 played."""
    envs = breakout(3)
    envs.reset(seed=5)
    gen = torch.Generator().manual_seed(1)
    for _ in range(7):
        envs.step(torch.randint(0, 3, (3,), generator=gen))
    envs.restore_state(torch.tensor([2]), envs.snapshot_state(torch.tensor([0])))
    for _ in range(80):
        action = torch.randint(0, 3, (3,), generator=gen)
        action[2] = action[0]
        obs, reward, terminated, truncated, _ = envs.step(action)
        assert torch.equal(obs[2], obs[0]) and reward[2] == reward[0]
        assert terminated[2] == terminated[0] and truncated[2] == truncated[0]


def test_numpy_views_it_without_a_copy() -> None:
    """The kit's interop works on any torch vector env: numpy arrays over its tensors."""
    envs = breakout(3)
    view = NumpyView(envs)
    obs, _ = view.reset(seed=0)
    assert isinstance(obs, np.ndarray) and obs.dtype == np.float32 and obs.shape == (3, 10, 10, 4)
    obs, reward, *_, info = view.step(np.array([0, 1, 2]))
    assert isinstance(reward, np.ndarray) and isinstance(info["_episode"], np.ndarray)
    assert not obs.flags.owndata and not reward.flags.owndata  # views of the env's tensors
    assert np.array_equal(obs, rules.observe(envs.game_state, torch.float32).numpy())


@pytest.mark.parametrize("seed", [0, 1])  # one ball starts left, the other right
def test_it_renders_the_board_the_observation_shows(seed: int) -> None:
    """A new game: the wall in rows 1-3, the ball at one end of row 3 (over a brick and its
    trail), the paddle in column 4 of row 9; as text and as an RGB frame."""
    envs = breakout(2, render_mode="ansi")
    envs.reset(seed=seed)
    column = int(envs.game_state.ball_x[0])
    ball_row = "o#########" if column == 0 else "#########o"
    empty, wall = " " * 10, "#" * 10
    rows = [empty, wall, wall, ball_row, *[empty] * 5, "    =     "]
    border = "+" + "-" * 10 + "+"
    assert envs.render()[0] == "\n".join([border, *[f"|{r}|" for r in rows], border,
                                           "score 0  step 0"])  # fmt: skip
    frames = breakout(2, render_mode="rgb_array")
    frames.reset(seed=seed)
    frame = frames.render()[0]
    assert frame.shape == (10 * SCALE, 10 * SCALE, 3) and frame.dtype == np.uint8
    cells = frame[::SCALE, ::SCALE]  # one pixel per cell
    expected = np.empty((10, 10, 3), np.uint8)
    expected[:] = BACKGROUND
    expected[1:4] = COLOURS[3]  # bricks
    expected[3, column] = COLOURS[1]  # the ball
    expected[9, 4] = COLOURS[0]  # the paddle
    assert np.array_equal(cells, expected)
    assert np.array_equal(frame, np.repeat(np.repeat(cells, SCALE, 0), SCALE, 1))


# -- training ------------------------------------------------------------------------------------


def test_grpo_trains_on_it_with_snapshots_and_branches() -> None:
    """The trainer starts groups through snapshots (so `branch_ended`, on by default,
    branches ended members from a group mate's state), reads the episode limit, builds its
    MLP, and trains."""
    config = GRPOConfig(
        num_groups=4,
        group_size=4,
        hidden_sizes=(16,),
        rollout_steps=32,
        window=8,  # the default follows the 1000-step limit: longer than these updates
        restart_every=4,
        minibatch_size=256,
        run=RunConfig(
            env="fruit_env:Breakout-MinAtar-v0", device="cpu", progress=False, compile=False
        ),
    )
    assert config.branch_ended
    envs = make_envs(config, config.num_envs, torch.device("cpu"))
    assert envs.validate_actions is False  # the fast options were applied
    trainer = GRPOTrainer(envs, config)
    assert trainer.env.restart_method.name == "snapshot" and trainer.env.restart_method.can_branch
    assert trainer.env.max_episode_steps() == 1000
    for _ in range(3):
        metrics = trainer.update()
    assert metrics["valid_steps"] > 0 and np.isfinite(metrics["loss"])


# -- the compiled path -----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_compiled_step_plays_the_eager_games(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kit's compiled step of Breakout (built once per machine into the cache) gives the
    eager games bit for bit, across restarts, a restore and a masked reset."""
    monkeypatch.setenv(
        "FRUIT_ENV_CACHE_DIR", str(Path(tempfile.gettempdir()) / "fruit_env_test_cache")
    )
    outputs = []
    for choice in (False, True):
        envs = breakout(5, compile=choice)
        assert envs.compiled is choice
        gen = torch.Generator().manual_seed(0)
        played = [envs.reset(seed=7)[0]]
        for step in range(120):
            obs, reward, terminated, truncated, info = envs.step(
                torch.randint(0, 3, (5,), generator=gen)
            )
            played += [obs, reward, terminated, truncated, *info["episode"].values()]
            if step == 40:
                envs.restore_state(torch.tensor([4, 3]), envs.snapshot_state(torch.tensor([0, 1])))
            if step == 80:
                played.append(envs.reset(options={"reset_mask": info["_episode"]})[0])
        outputs.append(played)
    for got, expected in zip(*outputs, strict=True):
        assert got.dtype == expected.dtype and torch.equal(got, expected)
