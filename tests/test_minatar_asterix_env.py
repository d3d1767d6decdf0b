"""`Asterix-MinAtar-v0`: the rules of `fruit_env.games.minatar_asterix.rules` on the kit,
unchanged, as a Gymnasium vector env.

It is registered when `fruit_env` is imported, with gymnax's episode limit and observation
space (so a trainer builds the network it builds for gymnax's Asterix); it passes the
trainer's conformance checker in every autoreset mode and through `python -m grpo_trainer
check`; it plays the games the rules play from the kit's random bits (the spawns too); its
faster restart is the kit's default restart; it steps on the meta device (so on any device,
with no host read); GRPO trains on it with state snapshots.
(tests/test_minatar_asterix.py tests the rules against gymnax.)
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

import fruit_env  # noqa: F401  (registers Asterix-MinAtar-v0)
from fruit_env.games.minatar_asterix import (
    AsterixState,
    AsterixVectorEnv,
    MinAtarAsterix,
    rules,
)
from fruit_env.games.minatar_asterix.game import COLOURS, GLYPHS
from fruit_env.games.minatar_pictures import BACKGROUND, SCALE
from fruit_env.kit import TensorGame, rng
from fruit_env.registration import ASTERIX_ID
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.algorithm.policy import Policy, is_image_space
from grpo_trainer.envs import make_envs
from grpo_trainer.tools.checker import CHECKS, check_vector_env

ROOT = Path(__file__).resolve().parents[1]
MODES = ["NEXT_STEP", "SAME_STEP", "DISABLED"]


def asterix(num_envs: int, **kwargs: Any) -> Any:
    return gym.make_vec(ASTERIX_ID, num_envs=num_envs, **kwargs)


# -- registration and spaces ---------------------------------------------------------------------


def test_make_vec_gives_the_kit_env_with_gymnax_limit_and_the_kits_fast_options() -> None:
    envs = asterix(3, autoreset_mode="SAME_STEP")
    assert isinstance(envs, AsterixVectorEnv) and isinstance(envs.game, MinAtarAsterix)
    assert envs.spec is not None and envs.spec.id == "Asterix-MinAtar-v0"
    assert gym.spec("Asterix-MinAtar-v0").max_episode_steps == 1000
    assert envs.max_episode_steps == 1000
    assert envs.metadata["autoreset_mode"].name == "SAME_STEP"
    assert AsterixVectorEnv.metadata["fast_kwargs"] == {"validate_actions": False}
    assert envs.single_action_space == gym.spaces.Discrete(5)
    assert asterix(2, max_episode_steps=50).max_episode_steps == 50


@pytest.mark.parametrize("limit", [0, -3, 2**31, 1.5, True, "10"])
def test_a_bad_episode_limit_is_refused_by_name(limit: Any) -> None:
    with pytest.raises(ValueError, match="max_episode_steps must be"):
        asterix(2, max_episode_steps=limit)


def test_the_observation_space_is_gymnax_so_the_trainer_builds_the_same_network() -> None:
    """gymnax's float32 Box of planes is flat features to the trainer (an MLP); a bool or
    uint8 Box would be an image (a CNN)."""
    space = asterix(2).single_observation_space
    assert space == gym.spaces.Box(0.0, 1.0, (10, 10, 4), np.float32)
    assert not is_image_space(space)
    mlp = Policy(space, gym.spaces.Discrete(5), hidden_sizes=(64, 64))
    assert mlp.scale == 1.0 and [type(m).__name__ for m in mlp.modules()].count("Conv2d") == 0
    gymnax = pytest.importorskip("gymnax")
    from grpo_trainer.envs.gymnax_vector import gymnasium_space

    env, params = gymnax.make("Asterix-MinAtar")
    assert gymnasium_space(env.observation_space(params)) == space
    assert gymnasium_space(env.action_space(params)) == asterix(2).single_action_space


# -- the checker ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_it_passes_the_checker_in_every_mode(mode: str) -> None:
    envs = asterix(6, autoreset_mode=mode)
    report = check_vector_env(envs, make_env=lambda n: asterix(n, autoreset_mode=mode))
    # the CPU default validates actions immediately: one flag read per step, free on the CPU
    assert report.statuses() == {**dict.fromkeys(CHECKS, "pass"), "host_syncs": "warn"}, str(report)
    assert mode in report["autoreset"].evidence


def test_with_its_fast_options_it_is_sync_free_even_when_strict() -> None:
    envs = asterix(6, validate_actions=False)
    report = check_vector_env(envs, strict_syncs=True)
    assert report["host_syncs"].status == "pass", str(report)


def test_the_trainers_check_command_passes_it() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "grpo_trainer", "check", "fruit_env:Asterix-MinAtar-v0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Asterix-MinAtar-v0 (AsterixVectorEnv): ok" in done.stdout
    assert "state_snapshots      pass" in done.stdout


def test_out_of_range_actions_get_the_kits_error() -> None:
    envs = asterix(3)
    envs.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions must be 0, 1, 2, 3 or 4; sub-env 1 got 5"):
        envs.step(torch.tensor([0, 5, 2]))
    with pytest.raises(ValueError, match=r"actions must have shape \(3,\), got \(2,\)"):
        envs.step(torch.tensor([0, 1]))


# -- the games it plays --------------------------------------------------------------------------


def _rules_reference(
    seed: int, actions: torch.Tensor, mode: str, limit: int
) -> list[tuple[torch.Tensor, ...]]:
    """Per step `(obs, reward, terminated, truncated, ended, final_obs or None, return,
    length)` of the rules called directly, with the kit's documented randomness: sub-env i's
    key is that of seed + i; a reset draws from counter 0; a step draws from its counter (the
    spawn's bits) and advances it by one; a NEXT_STEP restart uses its step's draw, a
    SAME_STEP restart the next counter value (which the counter then skips)."""
    n = actions.shape[1]
    key = torch.from_numpy(rng.seed_keys(np.arange(n, dtype=np.uint64) + np.uint64(seed)))
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


def _where(mask: torch.Tensor, fresh: AsterixState, state: AsterixState) -> AsterixState:
    return AsterixState(
        *(
            torch.where(mask.view(-1, *[1] * (s.dim() - 1)), f, s)
            for f, s in zip(fresh, state, strict=True)
        )
    )


@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP"])
def test_the_env_plays_the_rules_games(mode: str) -> None:
    """Every output of 600 steps of 16 sub-envs equals the rules' own, through episode ends
    by an enemy and by the time limit (set to 60 steps here, which random play often
    reaches), with gold taken along the way."""
    n, steps, seed, limit = 16, 600, 11, 60
    actions = torch.randint(0, 5, (steps, n), generator=torch.Generator().manual_seed(0))
    expected = _rules_reference(seed, actions, mode, limit)
    envs = asterix(n, autoreset_mode=mode, max_episode_steps=limit)
    obs, _ = envs.reset(seed=seed)
    assert torch.equal(obs, rules.observe(rules.initial_state(_first_bits(seed, n)), torch.float32))
    ends = {"terminated": 0, "truncated": 0, "gold": 0}
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
        ends["gold"] += int((reward > 0).sum())
    assert min(ends.values()) > 20, ends


def _first_bits(seed: int, n: int) -> torch.Tensor:
    key = torch.from_numpy(rng.seed_keys(np.arange(n, dtype=np.uint64) + np.uint64(seed)))
    return rng.draw(key, torch.zeros(n, dtype=torch.int64))


def test_its_restart_is_the_kits_restart() -> None:
    """`MinAtarAsterix.restart` gives, field by field, what `TensorGame.restart` (a new game
    where the mask holds, `initial` from the bits) gives, on states reached by play, and
    leaves the state it restarts as it was."""
    game, gen = MinAtarAsterix(), torch.Generator().manual_seed(3)
    n = 64
    state = rules.initial_state(torch.randint(0, 2**32, (n,), generator=gen))
    for step in range(60):
        bits = torch.randint(0, 2**32, (n,), generator=gen)
        state = rules.advance(state, torch.randint(0, 5, (n,), generator=gen), bits)[0]
        if step % 7:
            continue
        before = AsterixState(*(f.clone() for f in state))
        mask = torch.rand(n, generator=gen) < 0.5
        expected = TensorGame.restart(game, state, mask, bits)
        got = game.restart(state, mask, bits)
        for name, g, e, b, s in zip(
            AsterixState._fields, got, expected, before, state, strict=True
        ):
            assert g.dtype == e.dtype and torch.equal(g, e), name
            assert torch.equal(s, b), name
    assert state.entity_on.any()  # entities were in play


def test_it_steps_and_resets_outside_the_inference_mode_it_stepped_in() -> None:
    """A rollout under `torch.inference_mode()` (as trainers collect), then a masked reset
    and more steps outside it: the env writes into none of the state's tensors (which would
    raise), and plays what an env never put in inference mode plays."""
    mask = torch.tensor([True, False, True, False])
    played = []
    for inference in (True, False):
        envs = asterix(4)
        envs.reset(seed=0)
        with torch.inference_mode(inference):
            for _ in range(60):
                envs.step(torch.full((4,), 2))
        obs, _ = envs.reset(options={"reset_mask": mask})
        played.append([obs, *(envs.step(torch.full((4,), 3))[0] for _ in range(30))])
    assert all(torch.equal(a, b) for a, b in zip(*played, strict=True))


def test_snapshots_restore_a_game_and_its_randomness() -> None:
    """Sub-env 2 takes sub-env 0's snapshot and then plays exactly what sub-env 0 played,
    spawns included (they come from the restored key and counter)."""
    envs = asterix(3)
    envs.reset(seed=5)
    gen = torch.Generator().manual_seed(1)
    for _ in range(7):
        envs.step(torch.randint(0, 5, (3,), generator=gen))
    envs.restore_state(torch.tensor([2]), envs.snapshot_state(torch.tensor([0])))
    differs = 0
    for _ in range(150):
        action = torch.randint(0, 5, (3,), generator=gen)
        action[2] = action[0]
        obs, reward, terminated, truncated, _ = envs.step(action)
        assert torch.equal(obs[2], obs[0]) and reward[2] == reward[0]
        assert terminated[2] == terminated[0] and truncated[2] == truncated[0]
        differs += int(not torch.equal(obs[1], obs[0]))
    assert differs > 0  # sub-env 1, not restored, plays another game


def test_it_steps_on_the_meta_device() -> None:
    """Reset, steps through restarts, a masked reset, a snapshot and a restore on shapes
    alone: no host tensor meets a device tensor and no value is read (so the step runs
    on any device, a GPU's included, without a sync)."""
    n = 5
    for mode in MODES:
        envs = AsterixVectorEnv(n, device="meta", autoreset_mode=mode, validate_actions=False)
        obs, _ = envs.reset(seed=7)
        assert obs.is_meta and obs.shape == (n, 10, 10, 4) and obs.dtype == torch.float32
        for _ in range(3):
            obs, reward, terminated, truncated, info = envs.step(
                torch.ones(n, dtype=torch.int64, device="meta")
            )
            assert obs.is_meta and reward.is_meta and terminated.is_meta and truncated.is_meta
            assert info["episode"]["r"].is_meta and info["episode"]["l"].dtype == torch.int32
        envs.reset(options={"reset_mask": torch.ones(n, dtype=torch.bool, device="meta")})
        envs.restore_state(torch.tensor([2, 3]), envs.snapshot_state(torch.tensor([0, 4])))
        assert envs.step(torch.zeros(n, dtype=torch.int64, device="meta"))[0].is_meta


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_env_plays_the_cpu_games() -> None:
    outputs = []
    for device in ("cpu", "cuda"):
        envs = asterix(8, device=device)
        gen = torch.Generator().manual_seed(2)
        played = [envs.reset(seed=3)[0].cpu()]
        for _ in range(200):
            out = envs.step(torch.randint(0, 5, (8,), generator=gen).to(device))
            played += [t.cpu() for t in out[:4]]
        outputs.append(played)
    assert all(torch.equal(a, b) for a, b in zip(*outputs, strict=True))


def test_it_renders_the_board_the_observation_shows() -> None:
    """A new game: the player alone in the middle. After the first spawn (step 11), as
    text, every cell shows the glyph of the one plane the observation sets there; as an RGB
    frame, its colour."""
    envs = asterix(2, render_mode="ansi")
    envs.reset(seed=0)
    border = "+" + "-" * 10 + "+"
    rows = [" " * 10] * 5 + ["     A    "] + [" " * 10] * 4
    assert envs.render()[0] == "\n".join(
        [border, *[f"|{r}|" for r in rows], border, "score 0  step 0"]
    )
    frames = asterix(2, render_mode="rgb_array")
    frames.reset(seed=0)
    for _ in range(12):
        obs, *_ = envs.step(torch.zeros(2, dtype=torch.int64))
        frames.step(torch.zeros(2, dtype=torch.int64))
    planes = obs[0].bool().numpy()
    assert planes.sum() == 3 and planes.sum(2).max() == 1  # player, an entity, its trail
    text = envs.render()[0].split("\n")
    assert text[-1] == "score 0  step 12"
    frame = frames.render()[0]
    assert frame.shape == (10 * SCALE, 10 * SCALE, 3) and frame.dtype == np.uint8
    cells = frame[::SCALE, ::SCALE]  # one pixel per cell
    for y in range(10):
        for x in range(10):
            lit = np.flatnonzero(planes[y, x])
            glyph = GLYPHS[lit[0]] if len(lit) else " "
            colour = COLOURS[lit[0]] if len(lit) else BACKGROUND
            assert text[1 + y][1 + x] == glyph and tuple(cells[y, x]) == colour, (y, x)
    assert np.array_equal(frame, np.repeat(np.repeat(cells, SCALE, 0), SCALE, 1))


# -- training ------------------------------------------------------------------------------------


def test_grpo_trains_on_it_with_snapshots_and_branches() -> None:
    """The trainer starts groups through snapshots, reads the episode limit, builds its
    MLP, and trains."""
    config = GRPOConfig(
        num_groups=4,
        group_size=4,
        hidden_sizes=(16,),
        rollout_steps=32,
        window=8,
        restart_every=4,
        minibatch_size=256,
        run=RunConfig(
            env="fruit_env:Asterix-MinAtar-v0", device="cpu", progress=False, compile=False
        ),
    )
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
    """The kit's compiled step of Asterix (built once per machine into the cache) gives the
    eager games bit for bit, across restarts, a restore and a masked reset."""
    monkeypatch.setenv(
        "FRUIT_ENV_CACHE_DIR", str(Path(tempfile.gettempdir()) / "fruit_env_test_cache")
    )
    outputs = []
    for choice in (False, True):
        envs = asterix(5, compile=choice)
        assert envs.compiled is choice
        gen = torch.Generator().manual_seed(0)
        played = [envs.reset(seed=7)[0]]
        for step in range(150):
            obs, reward, terminated, truncated, info = envs.step(
                torch.randint(0, 5, (5,), generator=gen)
            )
            played += [obs, reward, terminated, truncated, *info["episode"].values()]
            if step == 40:
                envs.restore_state(torch.tensor([4, 3]), envs.snapshot_state(torch.tensor([0, 1])))
            if step == 80:
                played.append(envs.reset(options={"reset_mask": info["_episode"]})[0])
        outputs.append(played)
    for got, expected in zip(*outputs, strict=True):
        assert got.dtype == expected.dtype and torch.equal(got, expected)
