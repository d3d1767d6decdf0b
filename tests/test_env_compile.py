"""The compiled path and the `compile` argument.

`compile=True` builds the compiled step once (a package in the cache folder, one for every
`num_envs`) and runs it; `"auto"`, the default, and `False` run the eager step on every
device. The compiled step's games are the eager step's, bit for bit,
and a package is never loaded for other rules or other code.

Packages built here go to a folder under the system's temporary directory that persists
between runs (as torch's own inductor cache does), so only the first run pays the compiles.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from fruit_env import FruitCatcherVectorEnv
from fruit_env.kit import compiled
from grpo_trainer.tools.syncs import SyncCounter

SHORT = {"width": 8, "height": 6, "win_score": 3, "lose_score": -3, "max_episode_steps": 6}
TEST_CACHE = Path(tempfile.gettempdir()) / "fruit_env_test_cache"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def shared_cache(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FRUIT_ENV_CACHE_DIR", str(TEST_CACHE))
    return TEST_CACHE


@pytest.fixture
def empty_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("FRUIT_ENV_CACHE_DIR", str(tmp_path))
    return tmp_path


def rollout(env: FruitCatcherVectorEnv, steps: int, seed: int) -> list[np.ndarray]:
    """Every output of a reset and `steps` random steps (DISABLED: ended games reset), with
    a snapshot restored on the way."""
    gen = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    outputs = [obs.numpy().copy()]
    for step in range(steps):
        obs, reward, terminated, truncated, info = env.step(gen.integers(0, 3, env.num_envs))
        outputs += [t.numpy().copy() for t in (obs, reward, terminated, truncated)]
        outputs += [info["_episode"].numpy().copy()]
        outputs += [v.numpy().copy() for v in info["episode"].values()]
        if "final_obs" in info:
            outputs.append(info["final_obs"].numpy().copy())
        if env.autoreset_mode == AutoresetMode.DISABLED and info["_episode"].any():
            obs, _ = env.reset(options={"reset_mask": info["_episode"]})
            outputs.append(obs.numpy().copy())
        if step == steps // 2:
            source = torch.zeros(env.num_envs, dtype=torch.int64)
            env.restore_state(torch.arange(env.num_envs), env.snapshot_state(source))
    outputs += [t.numpy().copy() for t in env.state]
    return outputs


def test_auto_runs_the_eager_step_on_the_cpu_and_builds_nothing(empty_cache: Path) -> None:
    """ "auto" on the CPU never makes its caller wait for a compile, and neither does False."""
    assert FruitCatcherVectorEnv(4, max_episode_steps=7, obs_mode="pixels").compiled is False
    assert FruitCatcherVectorEnv(4, compile=False).compiled is False
    assert list(empty_cache.iterdir()) == []


def test_auto_never_builds_a_package_on_cuda_either(monkeypatch: pytest.MonkeyPatch) -> None:
    """ "auto" is the eager step on CUDA too: the stepper asks for no package there (the
    device is only named; the eager form is a stand-in, since this machine may have no GPU)."""
    env = FruitCatcherVectorEnv(4, compile=False)
    monkeypatch.setattr(compiled, "built", lambda *a: pytest.fail("auto built a package"))
    monkeypatch.setattr(compiled, "EagerStepper", lambda *a: "the eager step")
    monkeypatch.setattr(env.game, "eager_form", lambda *a: None)
    for device in ("cuda", "cpu"):
        chosen = compiled.stepper(
            "auto", env.game, env.layout, env.autoreset_mode, 4, torch.device(device)
        )
        assert chosen == "the eager step"


CASES = [
    (AutoresetMode.NEXT_STEP, "features"),
    (AutoresetMode.SAME_STEP, "pixels"),
    (AutoresetMode.DISABLED, "features"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "obs_mode"), CASES, ids=[f"{m.name}-{o}" for m, o in CASES])
def test_compiled_step_matches_eager(
    shared_cache: Path, mode: AutoresetMode, obs_mode: str
) -> None:
    """compile=True gives bit-identical outputs and state to the eager step across episode
    ends, a restore and resets, for two batch sizes from one package."""
    rules: dict[str, Any] = {**SHORT, "autoreset_mode": mode, "obs_mode": obs_mode}
    for n in (8, 3):
        eager = FruitCatcherVectorEnv(n, compile=False, **rules)
        built = FruitCatcherVectorEnv(n, compile=True, **rules)
        assert built.compiled is True
        for got, expected in zip(rollout(built, 40, 42), rollout(eager, 40, 42), strict=True):
            assert got.dtype == expected.dtype
            assert np.array_equal(got, expected)
    package = compiled.package_path(built.game, mode, built.device)
    assert package.parent == shared_cache and package.is_file()


@pytest.mark.slow
def test_a_second_process_loads_the_package_without_compiling(shared_cache: Path) -> None:
    """What the cache is for: a new process (any num_envs) steps at once, compiling nothing."""
    FruitCatcherVectorEnv(2, compile=True, **SHORT)  # built (or found) by this process
    code = (
        "import logging, sys, torch\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
        "from fruit_env import FruitCatcherVectorEnv\n"
        f"env = FruitCatcherVectorEnv(11, compile=True, **{SHORT!r})\n"
        "env.reset(seed=0)\n"
        "env.step(torch.ones(11, dtype=torch.int64))\n"
        "print('compiled', env.compiled)\n"
    )
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "FRUIT_ENV_CACHE_DIR": str(shared_cache)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True
    )
    assert "compiled True" in done.stdout, done.stdout + done.stderr
    assert "compiling" not in done.stdout


def test_compile_true_falls_back_to_eager_when_it_cannot_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cache folder that cannot be created: a warning, then the eager step (same games)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("FRUIT_ENV_CACHE_DIR", str(blocker / "cache"))
    env = FruitCatcherVectorEnv(3, compile=True, **SHORT)
    assert env.compiled is False
    assert any(r.levelno == logging.WARNING for r in caplog.records)
    env.reset(seed=0)
    env.step(np.array([0, 1, 2]))


def test_compile_true_on_a_device_without_compiled_steps_runs_eager(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = FruitCatcherVectorEnv(3, device="meta", compile=True, validate_actions=False)
    assert env.compiled is False
    assert any("meta" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_package_names_follow_what_the_code_depends_on(shared_cache: Path) -> None:
    """Rules, mode and observation mode each give their own package; sizes share one."""
    cpu = torch.device("cpu")
    paths = {
        compiled.package_path(FruitCatcherVectorEnv(n, compile=False, **rules).game, mode, cpu)
        for rules in ({}, {"width": 9}, {"obs_mode": "pixels"})
        for mode in AutoresetMode
        for n in (2, 300)
    }
    assert len(paths) == 9
    assert all(p.parent == shared_cache for p in paths)


TOY = """
import torch
from fruit_env.kit import Step, TensorGame

class Toy(TensorGame):
    num_actions = 2

    def initial(self, bits):
        return (bits % {start},)
"""


def test_a_package_is_never_loaded_for_other_code(tmp_path: Path) -> None:
    """The package's name covers the source of the game's module: a game whose code changed
    (same class, same rules, same repr) gets another package, so no process loads a stale
    one built in another worktree or before an edit."""

    def path_of(start: int) -> Path:
        module = tmp_path / "toy_rules.py"
        module.write_text(TOY.format(start=start))
        spec = importlib.util.spec_from_file_location("toy_rules", module)
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        sys.modules["toy_rules"] = loaded
        try:
            spec.loader.exec_module(loaded)
            compiled._sources.cache_clear()
            return compiled.package_path(loaded.Toy(), AutoresetMode.NEXT_STEP, torch.device("cpu"))
        finally:
            del sys.modules["toy_rules"]

    assert path_of(5) != path_of(6)
    assert path_of(5) == path_of(5)


@pytest.mark.slow
@pytest.mark.parametrize("validation", [False, "deferred"])
def test_the_compiled_step_reads_nothing_on_the_host(shared_cache: Path, validation: Any) -> None:
    """The shell around the compiled step syncs no more than the eager one: no host read per
    step with the trainer's settings or deferred validation; the deferred check still
    reports an invalid action."""
    env = FruitCatcherVectorEnv(6, compile=True, validate_actions=validation, **SHORT)
    assert env.compiled is True
    env.reset(seed=0)
    gen = torch.Generator().manual_seed(1)
    for step in range(10):
        actions = torch.randint(0, 3, (6,), generator=gen)
        actions[4] = 5 if step == 3 else actions[4]
        with SyncCounter() as syncs:
            env.step(actions)
        assert syncs.count == 0, syncs.calls
    if validation == "deferred":
        with pytest.raises(ValueError, match="sub-env 4 got 5"):
            env.check_actions()


def test_compile_is_checked() -> None:
    with pytest.raises(ValueError, match=r"compile must be True, False or 'auto', got 'fast'"):
        FruitCatcherVectorEnv(2, compile="fast")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.package
@pytest.mark.parametrize("mode", list(AutoresetMode), ids=[m.name for m in AutoresetMode])
def test_the_compiled_step_on_cuda_plays_the_eager_games(
    mode: AutoresetMode, caplog: pytest.LogCaptureFixture
) -> None:
    """On CUDA `compile=True` gives the eager step's games bit for bit, across episode ends and
    a reset that replaces the state: the package's, or the eager step's after one warning that
    says why the package is not used (torch 2.11's loader died on it on an H100)."""
    rules: dict[str, Any] = {**SHORT, "autoreset_mode": mode, "validate_actions": False}
    plays = []
    for choice in (True, False):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="fruit_env"):
            env = FruitCatcherVectorEnv(7, device="cuda", compile=choice, **rules)
        said = [r for r in caplog.records if "the compiled step is not used" in r.getMessage()]
        assert len(said) == (1 if choice and not env.compiled else 0)
        assert env.compiled is False or choice is True
        gen = torch.Generator(device="cuda").manual_seed(5)
        outputs = [env.reset(seed=5)[0]]
        for step in range(40):
            out = env.step(torch.randint(0, 3, (7,), generator=gen, device="cuda"))
            outputs += [*out[:4], *out[4]["episode"].values()]
            if step == 20:
                outputs.append(env.reset(seed=6)[0])
        plays.append([*outputs, *env.state])
    for got, expected in zip(*plays, strict=True):
        assert torch.equal(got, expected)
