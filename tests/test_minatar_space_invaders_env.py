"""`SpaceInvaders-MinAtar-v0`: the rules of `fruit_env.games.minatar_space_invaders.rules` on the
kit, unchanged, as a Gymnasium vector env.

It is registered when `fruit_env` is imported, with gymnax's episode limit and observation
space (so a trainer builds the network it builds for gymnax's SpaceInvaders); it passes the
trainer's conformance checker in every autoreset mode and through `python -m grpo_trainer
check`; it plays the games the rules play; its faster restart is the kit's default
restart; it steps on the meta device without a host read; its compiled step plays the eager
games. (tests/test_minatar_space_invaders.py tests the rules against gymnax.)
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

import fruit_env  # noqa: F401  (registers the ids)
from fruit_env.games.minatar_pictures import BACKGROUND, SCALE
from fruit_env.games.minatar_space_invaders import (
    MinAtarSpaceInvaders,
    SpaceInvadersState,
    SpaceInvadersVectorEnv,
    rules,
)
from fruit_env.games.minatar_space_invaders.game import COLOURS
from fruit_env.kit import TensorGame
from fruit_env.registration import SPACE_INVADERS_ID
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.algorithm.policy import Policy, is_image_space
from grpo_trainer.envs import make_envs
from grpo_trainer.tools.checker import CHECKS, check_vector_env
from grpo_trainer.tools.syncs import SyncCounter

ROOT = Path(__file__).resolve().parents[1]
MODES = ["NEXT_STEP", "SAME_STEP", "DISABLED"]


def invaders(num_envs: int, **kwargs: Any) -> Any:
    return gym.make_vec(SPACE_INVADERS_ID, num_envs=num_envs, **kwargs)


# -- registration and spaces ---------------------------------------------------------------------


def test_make_vec_gives_the_kit_env_with_gymnax_limit_and_the_kits_fast_options() -> None:
    envs = invaders(3, autoreset_mode="SAME_STEP")
    assert isinstance(envs, SpaceInvadersVectorEnv)
    assert isinstance(envs.game, MinAtarSpaceInvaders)
    assert envs.spec is not None and envs.spec.id == "SpaceInvaders-MinAtar-v0"
    assert gym.spec("SpaceInvaders-MinAtar-v0").max_episode_steps == 1000
    assert envs.max_episode_steps == 1000
    assert envs.metadata["autoreset_mode"].name == "SAME_STEP"
    assert SpaceInvadersVectorEnv.metadata["fast_kwargs"] == {"validate_actions": False}
    assert envs.single_action_space == gym.spaces.Discrete(4)
    assert invaders(2, max_episode_steps=50).max_episode_steps == 50


@pytest.mark.parametrize("limit", [0, -3, 2**31, 1.5, True, "10"])
def test_a_bad_episode_limit_is_refused_by_name(limit: Any) -> None:
    with pytest.raises(ValueError, match="max_episode_steps must be"):
        invaders(2, max_episode_steps=limit)


def test_the_observation_space_is_gymnax_so_the_trainer_builds_the_same_network() -> None:
    """gymnax's float32 Box of planes is flat features to the trainer (an MLP); a bool or
    uint8 Box would be an image (a CNN)."""
    space = invaders(2).single_observation_space
    assert space == gym.spaces.Box(0.0, 1.0, (10, 10, 6), np.float32)
    assert not is_image_space(space)
    mlp = Policy(space, gym.spaces.Discrete(4), hidden_sizes=(64, 64))
    assert mlp.scale == 1.0 and [type(m).__name__ for m in mlp.modules()].count("Conv2d") == 0
    gymnax = pytest.importorskip("gymnax")
    from grpo_trainer.envs.gymnax_vector import gymnasium_space

    env, params = gymnax.make("SpaceInvaders-MinAtar")
    assert gymnasium_space(env.observation_space(params)) == space
    assert params.max_steps_in_episode == invaders(1).max_episode_steps


# -- the checker ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_it_passes_the_checker_in_every_mode(mode: str) -> None:
    envs = invaders(6, autoreset_mode=mode)
    report = check_vector_env(envs, make_env=lambda n: invaders(n, autoreset_mode=mode))
    # the CPU default validates actions immediately: one flag read per step, free on the CPU
    assert report.statuses() == {**dict.fromkeys(CHECKS, "pass"), "host_syncs": "warn"}, str(report)
    assert mode in report["autoreset"].evidence


def test_with_its_fast_options_it_is_sync_free_even_when_strict() -> None:
    envs = invaders(6, validate_actions=False)
    report = check_vector_env(envs, strict_syncs=True)
    assert report["host_syncs"].status == "pass", str(report)


def test_the_trainers_check_command_passes_it() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "grpo_trainer", "check", "fruit_env:SpaceInvaders-MinAtar-v0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SpaceInvaders-MinAtar-v0 (SpaceInvadersVectorEnv): ok" in done.stdout
    assert "state_snapshots      pass" in done.stdout


def test_out_of_range_actions_get_the_kits_error() -> None:
    envs = invaders(3)
    envs.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions must be 0, 1, 2 or 3; sub-env 1 got 4"):
        envs.step(torch.tensor([0, 4, 2]))
    with pytest.raises(ValueError, match=r"actions must have shape \(3,\), got \(2,\)"):
        envs.step(torch.tensor([0, 1]))


# -- the games it plays --------------------------------------------------------------------------


def _new_games(n: int) -> SpaceInvadersState:
    return rules.initial_state(torch.zeros(n, dtype=torch.int64))


def _where(mask: torch.Tensor, fresh: SpaceInvadersState, state: SpaceInvadersState) -> Any:
    return SpaceInvadersState(
        *(
            torch.where(mask.view(-1, *[1] * (s.dim() - 1)), f, s)
            for f, s in zip(fresh, state, strict=True)
        )
    )


def _rules_reference(actions: torch.Tensor, mode: str, limit: int) -> list[tuple[Any, ...]]:
    """Per step `(obs, reward, terminated, truncated, ended, final_obs or None, return,
    length)` of the rules called directly. Every game starts the same way (the kit's random
    bits decide nothing), so the seed does not matter; a NEXT_STEP restart happens on the
    step after the end, a SAME_STEP restart on the step of the end."""
    n = actions.shape[1]
    state = _new_games(n)
    pending = torch.zeros(n, dtype=torch.bool)
    out = []
    for action in actions:
        new, reward, terminated = rules.advance(state, action)
        truncated = rules.truncated(new, limit)
        ret, length = rules.episode(new)
        final = None
        if mode == "NEXT_STEP":
            keep = ~pending
            reward, terminated, truncated = reward * keep, terminated & keep, truncated & keep
            new = _where(pending, _new_games(n), new)
            pending = terminated | truncated
            ended = pending
        else:  # SAME_STEP
            ended = terminated | truncated
            final = rules.observe(new, torch.float32)
            new = _where(ended, _new_games(n), new)
        state = new
        out.append((rules.observe(state, torch.float32), reward, terminated, truncated, ended,
                    final, ret, length))  # fmt: skip
    return out


@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP"])
def test_the_env_plays_the_rules_games(mode: str) -> None:
    """Every output of 400 steps of 16 sub-envs equals the rules' own, through episode ends
    by the aliens and by the time limit (set to 60 steps here, which random play often
    reaches)."""
    n, steps, seed, limit = 16, 400, 11, 60
    actions = torch.randint(0, 4, (steps, n), generator=torch.Generator().manual_seed(0))
    expected = _rules_reference(actions, mode, limit)
    envs = invaders(n, autoreset_mode=mode, max_episode_steps=limit)
    obs, _ = envs.reset(seed=seed)
    assert torch.equal(obs, rules.observe(_new_games(n), torch.float32))
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
    assert ends["terminated"] > 20 and ends["truncated"] > 20, ends


def test_its_restart_is_the_kits_restart() -> None:
    """`MinAtarSpaceInvaders.restart` gives, field by field, what `TensorGame.restart` (a new
    game where the mask holds) gives, on states reached by play, and leaves the state it
    restarts as it was."""
    game, gen = MinAtarSpaceInvaders(), torch.Generator().manual_seed(3)
    n = 64
    state = _new_games(n)
    for step in range(60):
        state = rules.advance(state, torch.randint(0, 4, (n,), generator=gen))[0]
        if step % 7:
            continue
        before = SpaceInvadersState(*(f.clone() for f in state))
        mask = torch.rand(n, generator=gen) < 0.5
        bits = torch.randint(0, 2**32, (n,), generator=gen)
        expected = TensorGame.restart(game, state, mask, bits)
        got = game.restart(state, mask, bits)
        for name, g, e, b, s in zip(
            SpaceInvadersState._fields, got, expected, before, state, strict=True
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
        envs = invaders(4, max_episode_steps=20)
        envs.reset(seed=0)
        with torch.inference_mode(inference):
            for _ in range(30):  # episodes end and restart
                envs.step(torch.full((4,), 3))
        obs, _ = envs.reset(options={"reset_mask": mask})
        played.append([obs, *(envs.step(torch.full((4,), 2))[0] for _ in range(30))])
    assert all(torch.equal(a, b) for a, b in zip(*played, strict=True))


def test_snapshots_restore_a_game_and_its_randomness() -> None:
    """Sub-env 2 takes sub-env 0's snapshot and then plays exactly what sub-env 0 played,
    though the two had played differently before."""
    envs = invaders(3)
    envs.reset(seed=5)
    gen = torch.Generator().manual_seed(1)
    for _ in range(30):
        obs = envs.step(torch.randint(0, 4, (3,), generator=gen))[0]
    assert not torch.equal(obs[2], obs[0])
    envs.restore_state(torch.tensor([2]), envs.snapshot_state(torch.tensor([0])))
    for _ in range(150):
        action = torch.randint(0, 4, (3,), generator=gen)
        action[2] = action[0]
        obs, reward, terminated, truncated, _ = envs.step(action)
        assert torch.equal(obs[2], obs[0]) and reward[2] == reward[0]
        assert terminated[2] == terminated[0] and truncated[2] == truncated[0]
    mine, theirs = envs.snapshot_state(torch.tensor([2])), envs.snapshot_state(torch.tensor([0]))
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True))  # key and counter too


@pytest.mark.parametrize("mode", MODES)
def test_it_steps_on_the_meta_device_without_a_host_read(mode: str) -> None:
    """Shapes only, no data: a reset, steps across a masked reset, and no aten call that
    reads device data, with the trainer's settings; the same step counted on the CPU."""
    fast = SpaceInvadersVectorEnv.metadata["fast_kwargs"]
    for device in ("meta", "cpu"):
        envs = invaders(5, device=device, autoreset_mode=mode, **fast)
        obs, _ = envs.reset(seed=0)
        assert obs.device.type == device and obs.shape == (5, 10, 10, 6)
        for step in range(12):
            with SyncCounter() as syncs:
                obs, reward, terminated, truncated, _ = envs.step(
                    torch.full((5,), step % 4, device=device)
                )
            assert syncs.count == 0, syncs.calls
            assert obs.device.type == device and obs.dtype == torch.float32
            assert reward.shape == (5,) and terminated.dtype == truncated.dtype == torch.bool
        mask = torch.ones(5, dtype=torch.bool, device=device)
        assert envs.reset(options={"reset_mask": mask})[0].device.type == device


def test_it_renders_the_board_the_observation_shows() -> None:
    """A new game: the block in rows 0-3 of columns 2-7 marching left, the cannon in column
    5 of row 9; after a shot, the cannon's bullet a row above it; as text and as RGB."""
    envs = invaders(2, render_mode="ansi")
    envs.reset(seed=0)
    block, empty = "  <<<<<<  ", " " * 10
    border = "+" + "-" * 10 + "+"
    rows = [block] * 4 + [empty] * 5 + ["     ^    "]
    assert envs.render()[0] == "\n".join([border, *[f"|{r}|" for r in rows], border,
                                           "score 0  step 0"])  # fmt: skip
    envs.step(torch.tensor([3, 0]))
    rows[8] = "     |    "
    assert envs.render()[0] == "\n".join([border, *[f"|{r}|" for r in rows], border,
                                           "score 0  step 1"])  # fmt: skip
    frames = invaders(2, render_mode="rgb_array")
    frames.reset(seed=0)
    frame = frames.render()[0]
    assert frame.shape == (10 * SCALE, 10 * SCALE, 3) and frame.dtype == np.uint8
    cells = frame[::SCALE, ::SCALE]  # one pixel per cell
    expected = np.empty((10, 10, 3), np.uint8)
    expected[:] = BACKGROUND
    expected[0:4, 2:8] = COLOURS[2]  # aliens marching left
    expected[9, 5] = COLOURS[0]  # the cannon
    assert np.array_equal(cells, expected)
    assert np.array_equal(frame, np.repeat(np.repeat(cells, SCALE, 0), SCALE, 1))


# -- training ------------------------------------------------------------------------------------


def test_grpo_trains_on_it_with_snapshots() -> None:
    """The trainer starts groups through snapshots, reads the episode limit, builds its MLP,
    and trains."""
    config = GRPOConfig(
        num_groups=4,
        group_size=4,
        hidden_sizes=(16,),
        rollout_steps=32,
        window=8,
        restart_every=4,
        minibatch_size=256,
        run=RunConfig(
            env="fruit_env:SpaceInvaders-MinAtar-v0", device="cpu", progress=False, compile=False
        ),
    )
    envs = make_envs(config, config.num_envs, torch.device("cpu"))
    assert envs.validate_actions is False  # the fast options were applied
    trainer = GRPOTrainer(envs, config)
    assert trainer.env.restart_method.name == "snapshot"
    assert trainer.env.max_episode_steps() == 1000
    for _ in range(3):
        metrics = trainer.update()
    assert metrics["valid_steps"] > 0 and np.isfinite(metrics["loss"])


# -- the compiled path -----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_compiled_step_plays_the_eager_games(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kit's compiled step of Space Invaders (built once per machine into the cache)
    gives the eager games bit for bit, across restarts, a restore and a masked reset."""
    monkeypatch.setenv(
        "FRUIT_ENV_CACHE_DIR", str(Path(tempfile.gettempdir()) / "fruit_env_test_cache")
    )
    outputs, ends = [], []
    for choice in (False, True):
        envs = invaders(5, compile=choice, max_episode_steps=90)
        assert envs.compiled is choice
        gen = torch.Generator().manual_seed(0)
        played = [envs.reset(seed=7)[0]]
        for step in range(160):
            obs, reward, terminated, truncated, info = envs.step(
                torch.randint(0, 4, (5,), generator=gen)
            )
            played += [obs, reward, terminated, truncated, *info["episode"].values()]
            ends.append(int(terminated.sum()))
            if step == 40:
                envs.restore_state(torch.tensor([4, 3]), envs.snapshot_state(torch.tensor([0, 1])))
            if step == 100:
                played.append(envs.reset(options={"reset_mask": info["_episode"]})[0])
        outputs.append(played)
    for got, expected in zip(*outputs, strict=True):
        assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert sum(ends) > 0  # games ended and restarted
