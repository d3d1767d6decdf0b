"""`Freeway-MinAtar-v0`: the rules of `fruit_env.games.minatar_freeway.rules` on the kit,
unchanged, as a Gymnasium vector env.

It is registered when `fruit_env` is imported, with gymnax's episode limit and observation
space (so a trainer builds the network it builds for gymnax's Freeway); it passes the
trainer's conformance checker in every autoreset mode and through `python -m grpo_trainer
check`; it plays the games the rules play from the kit's random bits, eagerly and compiled;
it steps on the meta device (no host read, no host tensor); snapshots restore a game and its
randomness. (tests/test_minatar_freeway.py tests the rules against gymnax.)
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

from fruit_env.games.minatar_freeway import (
    FreewayState,
    FreewayVectorEnv,
    MinAtarFreeway,
    rules,
)
from fruit_env.games.minatar_freeway.game import COLOURS
from fruit_env.games.minatar_pictures import BACKGROUND, SCALE
from fruit_env.kit import rng
from fruit_env.registration import FREEWAY_ID
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.algorithm.policy import Policy, is_image_space
from grpo_trainer.envs import make_envs
from grpo_trainer.tools.checker import CHECKS, check_vector_env

ROOT = Path(__file__).resolve().parents[1]
MODES = ["NEXT_STEP", "SAME_STEP", "DISABLED"]
MOSTLY_UP = torch.tensor([0.1, 0.8, 0.1])  # action probabilities that cross the road often


def freeway(num_envs: int, **kwargs: Any) -> Any:
    return gym.make_vec(FREEWAY_ID, num_envs=num_envs, **kwargs)


def mostly_up(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Random actions, up 80% of the time: the chicken scores (and the cars get new speeds)."""
    draws = torch.multinomial(MOSTLY_UP, int(np.prod(shape)), True, generator=generator)
    return draws.view(shape)


# -- registration and spaces ---------------------------------------------------------------------


def test_make_vec_gives_the_kit_env_with_gymnax_limit_and_the_kits_fast_options() -> None:
    envs = freeway(3, autoreset_mode="SAME_STEP")
    assert isinstance(envs, FreewayVectorEnv) and isinstance(envs.game, MinAtarFreeway)
    assert envs.spec is not None and envs.spec.id == "Freeway-MinAtar-v0"
    assert gym.spec("Freeway-MinAtar-v0").max_episode_steps == 2500
    assert envs.max_episode_steps == 2500
    assert envs.metadata["autoreset_mode"].name == "SAME_STEP"
    assert FreewayVectorEnv.metadata["fast_kwargs"] == {"validate_actions": False}
    assert envs.single_action_space == gym.spaces.Discrete(3)
    assert freeway(2, max_episode_steps=50).max_episode_steps == 50


@pytest.mark.parametrize("limit", [0, -3, 2**31, 1.5, True, "10"])
def test_a_bad_episode_limit_is_refused_by_name(limit: Any) -> None:
    with pytest.raises(ValueError, match="max_episode_steps must be"):
        freeway(2, max_episode_steps=limit)


def test_the_observation_space_is_gymnax_so_the_trainer_builds_the_same_network() -> None:
    """gymnax's float32 Box of planes is flat features to the trainer (an MLP); a bool or
    uint8 Box would be an image (a CNN)."""
    space = freeway(2).single_observation_space
    assert space == gym.spaces.Box(0.0, 1.0, (10, 10, 7), np.float32)
    assert not is_image_space(space)
    mlp = Policy(space, gym.spaces.Discrete(3), hidden_sizes=(64, 64))
    assert mlp.scale == 1.0 and [type(m).__name__ for m in mlp.modules()].count("Conv2d") == 0
    gymnax = pytest.importorskip("gymnax")
    from grpo_trainer.envs.gymnax_vector import gymnasium_space

    env, params = gymnax.make("Freeway-MinAtar")
    assert gymnasium_space(env.observation_space(params)) == space


# -- the checker ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_it_passes_the_checker_in_every_mode(mode: str) -> None:
    """With a 200-step limit: Freeway's episodes end only there, and the checker's autoreset
    check plays 1000 random steps to see some end."""
    kwargs = {"autoreset_mode": mode, "max_episode_steps": 200}
    envs = freeway(6, **kwargs)
    report = check_vector_env(envs, make_env=lambda n: freeway(n, **kwargs))
    # the CPU default validates actions immediately: one flag read per step, free on the CPU
    assert report.statuses() == {**dict.fromkeys(CHECKS, "pass"), "host_syncs": "warn"}, str(report)
    assert mode in report["autoreset"].evidence


def test_with_its_fast_options_it_is_sync_free_even_when_strict() -> None:
    envs = freeway(6, validate_actions=False)
    report = check_vector_env(envs, strict_syncs=True)
    assert report["host_syncs"].status == "pass", str(report)


def test_the_trainers_check_command_passes_it() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "grpo_trainer", "check", "fruit_env:Freeway-MinAtar-v0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Freeway-MinAtar-v0 (FreewayVectorEnv): ok" in done.stdout
    assert "state_snapshots      pass" in done.stdout


def test_out_of_range_actions_get_the_kits_error() -> None:
    envs = freeway(3)
    envs.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions must be 0, 1 or 2; sub-env 1 got 3"):
        envs.step(torch.tensor([0, 3, 2]))


# -- the games it plays --------------------------------------------------------------------------


def _keys(seed: int, n: int) -> torch.Tensor:
    return torch.from_numpy(rng.seed_keys(np.arange(n, dtype=np.uint64) + np.uint64(seed)))


def _rules_reference(
    seed: int, actions: torch.Tensor, mode: str, limit: int
) -> list[tuple[Any, ...]]:
    """Per step `(obs, reward, terminated, truncated, ended, final_obs or None, return,
    length)` of the rules called directly, with the kit's documented randomness: sub-env i's
    key is that of seed + i; a reset draws from counter 0; a step draws from its counter (the
    bits `advance` takes) and advances it by one; a NEXT_STEP restart uses its step's draw, a
    SAME_STEP restart the next counter value (which the counter then skips)."""
    n = actions.shape[1]
    key = _keys(seed, n)
    counter = torch.zeros(n, dtype=torch.int64)
    state = rules.initial_state(rng.draw(key, counter))
    counter += 1
    pending = torch.zeros(n, dtype=torch.bool)
    out = []
    for action in actions:
        bits = rng.draw(key, counter)
        new, reward, terminated = rules.advance(state, action, bits)
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


def _where(mask: torch.Tensor, fresh: FreewayState, state: FreewayState) -> FreewayState:
    def pick(f: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.where(mask.view(-1, *[1] * (s.dim() - 1)), f, s)

    return FreewayState(*(pick(f, s) for f, s in zip(fresh, state, strict=True)))


@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP"])
def test_the_env_plays_the_rules_games(mode: str) -> None:
    """Every output of 450 steps of 32 sub-envs equals the rules' own, through crossings
    (which draw new speeds) and episode ends by the time limit (set to 150 steps here)."""
    n, steps, seed, limit = 32, 450, 11, 150
    actions = mostly_up((steps, n), torch.Generator().manual_seed(0))
    expected = _rules_reference(seed, actions, mode, limit)
    envs = freeway(n, autoreset_mode=mode, max_episode_steps=limit)
    obs, _ = envs.reset(seed=seed)
    first = rules.initial_state(rng.draw(_keys(seed, n), torch.zeros(n, dtype=torch.int64)))
    assert torch.equal(obs, rules.observe(first, torch.float32))
    totals = {"truncated": 0, "reward": 0.0}
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
        assert not terminated.any()  # Freeway never ends by itself
        totals["truncated"] += int(truncated.sum())
        totals["reward"] += float(reward.sum())
    assert totals["truncated"] > 50 and totals["reward"] > 20, totals


def test_snapshots_restore_a_game_and_its_randomness() -> None:
    """Sub-env 2 takes sub-env 0's snapshot and then plays exactly what sub-env 0 played,
    crossings and the new speeds they draw included."""
    envs = freeway(3)
    envs.reset(seed=5)
    gen = torch.Generator().manual_seed(1)
    for _ in range(7):
        envs.step(mostly_up((3,), gen))
    envs.restore_state(torch.tensor([2]), envs.snapshot_state(torch.tensor([0])))
    crossings = 0.0
    for _ in range(400):
        action = mostly_up((3,), gen)
        action[2] = action[0]
        obs, reward, terminated, truncated, _ = envs.step(action)
        assert torch.equal(obs[2], obs[0]) and reward[2] == reward[0]
        assert terminated[2] == terminated[0] and truncated[2] == truncated[0]
        crossings += float(reward[0])
    assert crossings >= 2
    state = envs.game_state
    assert all(torch.equal(field[2], field[0]) for field in state)


def test_it_steps_and_resets_outside_the_inference_mode_it_stepped_in() -> None:
    """A rollout under `torch.inference_mode()` (as trainers collect), then a masked reset
    and more steps outside it: the env writes into none of the state's tensors (which would
    raise), and plays what an env never put in inference mode plays."""
    mask = torch.tensor([True, False, True, False])
    played = []
    for inference in (True, False):
        envs = freeway(4, max_episode_steps=20)
        envs.reset(seed=0)
        with torch.inference_mode(inference):
            for _ in range(30):  # episodes end and restart
                envs.step(torch.ones(4, dtype=torch.int64))
        obs, _ = envs.reset(options={"reset_mask": mask})
        played.append([obs, *(envs.step(torch.full((4,), 2))[0] for _ in range(30))])
    assert all(torch.equal(a, b) for a, b in zip(*played, strict=True))


@pytest.mark.parametrize("seed", [0, 1])
def test_it_renders_the_board_the_observation_shows(seed: int) -> None:
    """A new game: the chicken in column 4 of row 9, each car in column 0 of its row with
    its trail (its speed) in the cell behind it, as text and as an RGB frame."""
    envs = freeway(2, render_mode="ansi")
    envs.reset(seed=seed)
    speeds = envs.game_state.car_speed[0].tolist()
    assert all(1 <= abs(s) <= 5 for s in speeds)
    rows = [" " * 10]
    for s in speeds:  # a car going right leaves its trail in column 9, going left in column 1
        row = ["#"] + [" "] * 9
        row[9 if s > 0 else 1] = str(abs(s))
        rows.append("".join(row))
    rows.append("    @     ")
    border = "+" + "-" * 10 + "+"
    assert envs.render()[0] == "\n".join([border, *[f"|{r}|" for r in rows], border,
                                           "score 0  step 0"])  # fmt: skip
    frames = freeway(2, render_mode="rgb_array")
    frames.reset(seed=seed)
    frame = frames.render()[0]
    assert frame.shape == (10 * SCALE, 10 * SCALE, 3) and frame.dtype == np.uint8
    cells = frame[::SCALE, ::SCALE]  # one pixel per cell
    expected = np.empty((10, 10, 3), np.uint8)
    expected[:] = BACKGROUND
    for lane, s in enumerate(speeds, start=1):
        expected[lane, 0] = COLOURS[1]
        expected[lane, 9 if s > 0 else 1] = COLOURS[1 + abs(s)]
    expected[9, 4] = COLOURS[0]
    assert np.array_equal(cells, expected)
    assert np.array_equal(frame, np.repeat(np.repeat(cells, SCALE, 0), SCALE, 1))


# -- training ------------------------------------------------------------------------------------


def test_grpo_trains_on_it_with_snapshots_and_branches() -> None:
    """The trainer starts groups through snapshots, reads the episode limit, builds its MLP
    for the (10, 10, 7) planes, and trains."""
    config = GRPOConfig(
        num_groups=4,
        group_size=4,
        hidden_sizes=(16,),
        rollout_steps=32,
        window=8,
        restart_every=4,
        minibatch_size=256,
        run=RunConfig(
            env="fruit_env:Freeway-MinAtar-v0", device="cpu", progress=False, compile=False
        ),
    )
    envs = make_envs(config, config.num_envs, torch.device("cpu"))
    assert envs.validate_actions is False  # the fast options were applied
    trainer = GRPOTrainer(envs, config)
    assert trainer.env.restart_method.name == "snapshot" and trainer.env.restart_method.can_branch
    assert trainer.env.max_episode_steps() == 2500
    for _ in range(3):
        metrics = trainer.update()
    assert metrics["valid_steps"] > 0 and np.isfinite(metrics["loss"])


# -- devices -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_it_steps_on_the_meta_device(mode: str) -> None:
    """Seeded and masked resets, steps, snapshots on `device="meta"` (shapes only): no host
    tensor meets a device tensor and no value is read, so the same code runs on any device."""
    n = 5
    envs = freeway(n, device="meta", autoreset_mode=mode, validate_actions=False)
    assert not envs.compiled
    obs, _ = envs.reset(seed=7)
    assert obs.device.type == "meta" and obs.shape == (n, 10, 10, 7)
    for step in range(6):
        obs, reward, terminated, truncated, info = envs.step(
            torch.ones(n, dtype=torch.int64, device="meta")
        )
        outputs = [obs, reward, terminated, truncated, info["_episode"], *info["episode"].values()]
        assert all(t.device.type == "meta" for t in outputs)
        dtypes = [torch.float32, *[torch.bool] * 3, torch.float32, torch.int32]
        assert [t.dtype for t in outputs[1:]] == dtypes
        if step == 3:
            mask = torch.ones(n, dtype=torch.bool, device="meta")
            obs, _ = envs.reset(seed=[1, None, 2, None, 3], options={"reset_mask": mask})
            assert obs.device.type == "meta"
    envs.restore_state(torch.tensor([2, 3]), envs.snapshot_state(torch.tensor([0, 4])))
    assert envs.step(torch.zeros(n, dtype=torch.int64, device="meta"))[0].is_meta


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_it_plays_the_same_games_on_cuda() -> None:
    """The eager step on CUDA gives the CPU's games bit for bit."""
    played = []
    for device in ("cpu", "cuda"):
        envs = freeway(64, device=device, compile=False, max_episode_steps=50)
        gen = torch.Generator().manual_seed(0)
        out = [envs.reset(seed=3)[0].cpu()]
        for _ in range(150):
            step = envs.step(mostly_up((64,), gen).to(device))
            out += [t.cpu() for t in step[:4]]
        played.append(out)
    assert all(torch.equal(a, b) for a, b in zip(*played, strict=True))


# -- the compiled path -----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_compiled_step_plays_the_eager_games(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kit's compiled step of Freeway (built once per machine into the cache) gives the
    eager games bit for bit, across crossings, restarts, a restore and a masked reset."""
    monkeypatch.setenv(
        "FRUIT_ENV_CACHE_DIR", str(Path(tempfile.gettempdir()) / "fruit_env_test_cache")
    )
    outputs, crossings = [], 0.0
    mask = torch.tensor([True, False, True, False, True])
    for choice in (False, True):
        envs = freeway(5, compile=choice, max_episode_steps=50)
        assert envs.compiled is choice
        gen = torch.Generator().manual_seed(0)
        played = [envs.reset(seed=7)[0]]
        for step in range(150):
            obs, reward, terminated, truncated, info = envs.step(mostly_up((5,), gen))
            played += [obs, reward, terminated, truncated, *info["episode"].values()]
            crossings += float(reward.sum())
            if step == 40:
                envs.restore_state(torch.tensor([4, 3]), envs.snapshot_state(torch.tensor([0, 1])))
            if step == 80:
                played.append(envs.reset(options={"reset_mask": mask})[0])
        outputs.append(played)
    assert crossings > 0
    for got, expected in zip(*outputs, strict=True):
        assert got.dtype == expected.dtype and torch.equal(got, expected)
