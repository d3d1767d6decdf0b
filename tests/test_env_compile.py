"""The compiled step and the `compile` argument.

`compile=True` builds the compiled step once (a package in the cache folder, one for every
`num_envs`, with a measurement of both steps beside it) and runs it; `"auto"`, the default,
runs it where the package is cached (or the device is CUDA) and its measurement says it is
the faster step, the eager step otherwise, and logs its choice once; `False` never does.
The compiled step's games are the eager step's, bit for bit. The choice is tested with
planted measurements: no test depends on a timing.

Packages built here go to a folder under the system's temporary directory that persists
between runs (as torch's own inductor cache does), so only the first run pays the compiles.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from fruit_env import FruitCatcherVectorEnv, compiled
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


def planted(folder: Path, package: Path, seconds: dict[int, tuple[float, float]]) -> Path:
    """`folder` as a cache holding a copy of `package` and a measurement (eager and compiled
    seconds per step by num_envs) planted beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / package.name
    shutil.copyfile(package, copy)
    compiled.save_measurement(copy, compiled.Measurement(seconds, threads=1))
    return folder


COMPILED_FASTER = {256: (4.0, 1.0), 2048: (2.0, 1.0), 16384: (2.0, 1.0)}


def rollout(env: FruitCatcherVectorEnv, steps: int, seed: int) -> list[np.ndarray]:
    """Every output of a reset and `steps` random steps (DISABLED: ended games reset)."""
    gen = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    outputs = [obs.numpy().copy()]
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(gen.integers(0, 3, env.num_envs))
        outputs += [t.numpy().copy() for t in (obs, reward, terminated, truncated)]
        outputs += [info["_episode"].numpy().copy()]
        outputs += [v.numpy().copy() for v in info["episode"].values()]
        if "final_obs" in info:
            outputs.append(info["final_obs"].numpy().copy())
        if env.autoreset_mode == AutoresetMode.DISABLED and info["_episode"].any():
            obs, _ = env.reset(options={"reset_mask": info["_episode"]})
            outputs.append(obs.numpy().copy())
    outputs += [t.numpy().copy() for t in env.state]
    return outputs


def test_auto_runs_the_eager_step_on_the_cpu_without_a_package(
    empty_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No package cached: "auto" does not make the caller wait for a compile. It says so,
    once per process, at INFO."""
    caplog.set_level(logging.INFO, logger="fruit_env")
    env = FruitCatcherVectorEnv(4, max_episode_steps=7, obs_mode="pixels")
    assert env.compiled is False
    FruitCatcherVectorEnv(4, max_episode_steps=7, obs_mode="pixels")
    choices = [r.getMessage() for r in caplog.records if "compile='auto'" in r.getMessage()]
    assert len(choices) == 1 and "eager step on cpu" in choices[0], choices
    assert str(empty_cache) in choices[0]
    assert list(empty_cache.iterdir()) == []


def test_compile_false_never_loads_a_package(shared_cache: Path) -> None:
    assert FruitCatcherVectorEnv(3, compile=False, **SHORT).compiled is False


def test_auto_decides_by_the_measured_size_nearest_num_envs() -> None:
    """The stored measurement decides, at the measured size nearest num_envs on a log scale;
    a tie goes to the eager step; without a measurement, CUDA runs the compiled step."""
    measured = compiled.Measurement({256: (2.0, 1.0), 2048: (1.0, 1.0), 16384: (1.0, 1.25)}, 1)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [measured.nearest(n) for n in (1, 700, 800, 5000, 10**6)] == [
        256,
        256,
        2048,
        2048,
        16384,
    ]
    assert compiled.auto_choice(measured, 300, cpu) == (
        True,
        "measured 2.00x faster than the eager step at 256 envs, the measured size nearest 300",
    )
    assert compiled.auto_choice(measured, 16384, cpu) == (
        False,
        "the compiled step measured 1.25x slower at 16384 envs, the measured size nearest 16384",
    )
    assert compiled.auto_choice(measured, 2048, cpu)[0] is False
    assert compiled.auto_choice(measured, 20000, cuda)[0] is False  # measured otherwise
    assert compiled.auto_choice(measured, 100, cuda)[0] is True
    assert compiled.auto_choice(None, 20000, cuda) == (True, "CUDA, not measured")
    assert compiled.auto_choice(None, 100, cpu)[0] is False


def test_a_measurement_is_kept_beside_its_package(tmp_path: Path) -> None:
    package = tmp_path / "step-next_step-features-cpu-0123.pt2"
    measured = compiled.Measurement({256: (1e-4, 2e-5), 16384: (1e-3, 9e-4)}, threads=2)
    compiled.save_measurement(package, measured)
    assert compiled.measurement_path(package).parent == tmp_path
    assert compiled.stored_measurement(package) == measured
    assert [p.name for p in tmp_path.iterdir()] == [compiled.measurement_path(package).name]
    compiled.measurement_path(package).write_text("{")  # torn or foreign: as if none
    assert compiled.stored_measurement(package) is None
    assert compiled.stored_measurement(tmp_path / "other.pt2") is None


@pytest.mark.slow
def test_auto_runs_the_step_its_stored_measurement_says_is_faster(
    shared_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Through the env: one cached package, a planted measurement in which the compiled step
    wins small batches and loses large ones; "auto" follows it and says why, once;
    compile=True still runs the compiled step. A package without a measurement is measured
    once, and the measurement kept."""
    built = FruitCatcherVectorEnv(2, compile=True, **SHORT)
    package = compiled.package_path(built.params, AutoresetMode.NEXT_STEP, built.device)
    seconds = {256: (3.0, 1.0), 2048: (1.0, 1.5), 16384: (1.0, 1.5)}
    monkeypatch.setenv("FRUIT_ENV_CACHE_DIR", str(planted(tmp_path / "a", package, seconds)))
    caplog.set_level(logging.INFO, logger="fruit_env")
    assert FruitCatcherVectorEnv(37, **SHORT).compiled is True
    assert FruitCatcherVectorEnv(9000, **SHORT).compiled is False
    assert FruitCatcherVectorEnv(9000, **SHORT).compiled is False
    assert FruitCatcherVectorEnv(9000, compile=True, **SHORT).compiled is True
    choices = [r.getMessage() for r in caplog.records if "compile='auto'" in r.getMessage()]
    assert choices == [
        "FruitCatcher: compiled step on cpu (compile='auto': measured 3.00x faster than the "
        "eager step at 256 envs, the measured size nearest 37) for NEXT_STEP, features "
        "observations",
        "FruitCatcher: eager step on cpu (compile='auto': the compiled step measured 1.50x "
        "slower at 16384 envs, the measured size nearest 9000; compile=True runs it) for "
        "NEXT_STEP, features observations",
    ]
    unmeasured = tmp_path / "b"
    unmeasured.mkdir()
    shutil.copyfile(package, unmeasured / package.name)
    monkeypatch.setenv("FRUIT_ENV_CACHE_DIR", str(unmeasured))
    FruitCatcherVectorEnv(3, **SHORT)  # either step: the machine's timing decides
    measured = compiled.stored_measurement(unmeasured / package.name)
    assert measured is not None and tuple(measured.seconds) == compiled.MEASURED_SIZES


CASES = [
    (AutoresetMode.NEXT_STEP, "features"),
    (AutoresetMode.SAME_STEP, "pixels"),
    (AutoresetMode.DISABLED, "features"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "obs_mode"), CASES, ids=[f"{m.name}-{o}" for m, o in CASES])
def test_compiled_step_matches_eager(
    shared_cache: Path,
    mode: AutoresetMode,
    obs_mode: str,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """compile=True gives bit-identical outputs and state to the eager step across episode
    ends, for two batch sizes from one package, measured at its build; "auto" then finds the
    package and, where it is measured faster, runs it."""
    rules: dict[str, Any] = {**SHORT, "autoreset_mode": mode, "obs_mode": obs_mode}
    for n in (8, 3):
        eager = FruitCatcherVectorEnv(n, compile=False, **rules)
        built = FruitCatcherVectorEnv(n, compile=True, **rules)
        assert built.compiled is True
        for got, expected in zip(rollout(built, 40, 42), rollout(eager, 40, 42), strict=True):
            assert got.dtype == expected.dtype
            assert np.array_equal(got, expected)
    packages = list(shared_cache.glob(f"step-{mode.name.lower()}-{obs_mode}-cpu-*.pt2"))
    package = compiled.package_path(built.params, mode, built.device)
    assert package in packages
    measured = compiled.stored_measurement(package)
    assert measured is not None and tuple(measured.seconds) == compiled.MEASURED_SIZES
    monkeypatch.setenv("FRUIT_ENV_CACHE_DIR", str(planted(tmp_path, package, COMPILED_FASTER)))
    caplog.set_level(logging.INFO, logger="fruit_env")
    assert FruitCatcherVectorEnv(5, **rules).compiled is True  # auto: cached, measured faster
    assert not any("compiling" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_a_second_process_loads_the_package_without_compiling(
    shared_cache: Path, tmp_path: Path
) -> None:
    """What the cache is for: a new process (any num_envs) steps at once, compiling nothing."""
    built = FruitCatcherVectorEnv(2, compile=True, **SHORT)  # built (or found) by this process
    package = compiled.package_path(built.params, AutoresetMode.NEXT_STEP, built.device)
    cache = planted(tmp_path, package, COMPILED_FASTER)
    code = (
        "import logging, sys, torch\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
        "from fruit_env import FruitCatcherVectorEnv\n"
        f"env = FruitCatcherVectorEnv(11, **{SHORT!r})\n"
        "env.reset(seed=0)\n"
        "env.step(torch.ones(11, dtype=torch.int64))\n"
        "print('compiled', env.compiled)\n"
    )
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "FRUIT_ENV_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True
    )
    assert "compiled True" in done.stdout, done.stdout + done.stderr
    assert "compiling" not in done.stdout and "timing" not in done.stdout
    assert (
        "compiled step on cpu (compile='auto': measured 4.00x faster than the eager step at "
        "256 envs, the measured size nearest 11) for NEXT_STEP, features observations"
    ) in done.stdout


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
        compiled.package_path(FruitCatcherVectorEnv(2, **rules).params, mode, cpu)
        for rules in ({}, {"width": 9}, {"obs_mode": "pixels"})
        for mode in AutoresetMode
    }
    assert len(paths) == 9
    assert all(p.parent == shared_cache for p in paths)


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


def test_compile_mode_is_checked() -> None:
    with pytest.raises(ValueError, match=r"compile_mode must be one of .*'fast'"):
        FruitCatcherVectorEnv(2, compile_mode="fast")


def test_max_autotune_has_its_own_package_and_reduce_overhead_shares_the_default(
    shared_cache: Path,
) -> None:
    """max-autotune changes the kernels, so it is cached apart; reduce-overhead replays the
    default package from a CUDA graph."""
    p, cpu, mode = (
        FruitCatcherVectorEnv(2, **SHORT).params,
        torch.device("cpu"),
        AutoresetMode.NEXT_STEP,
    )
    default = compiled.package_path(p, mode, cpu)
    assert compiled.package_path(p, mode, cpu, "reduce-overhead") == default
    assert compiled.package_path(p, mode, cpu, "max-autotune") != default


@pytest.mark.slow
def test_reduce_overhead_off_cuda_is_the_default_step_with_a_log_line(
    shared_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fruit_env")
    graphed = FruitCatcherVectorEnv(5, compile=True, compile_mode="reduce-overhead", **SHORT)
    plain = FruitCatcherVectorEnv(5, compile=True, **SHORT)
    assert graphed.compiled is True and graphed.compile_mode == "default"
    assert any(
        "compile_mode='reduce-overhead' (CUDA graphs) needs CUDA" in r.getMessage()
        for r in caplog.records
    )
    for got, expected in zip(rollout(graphed, 30, 3), rollout(plain, 30, 3), strict=True):
        assert np.array_equal(got, expected)


def _cuda_rollout(env: FruitCatcherVectorEnv, steps: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator(device=env.device).manual_seed(seed)
    obs, _ = env.reset(seed=seed)
    outputs = [obs.clone()]
    kept = []
    for step in range(steps):
        actions = torch.randint(0, 3, (env.num_envs,), generator=gen, device=env.device)
        out = env.step(actions)
        kept.append(out[0])  # a returned tensor must not change under later steps
        outputs += [out[0].clone(), out[1].clone(), out[2].clone(), out[3].clone()]
        outputs += [v.clone() for v in out[4]["episode"].values()]
        if step == steps // 2:
            obs, _ = env.reset(seed=seed + 1)  # new state tensors: the graph copies them in
            outputs.append(obs.clone())
    outputs += [k for k in kept]
    return [*outputs, *env.state]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", list(AutoresetMode), ids=[m.name for m in AutoresetMode])
def test_reduce_overhead_on_cuda_replays_the_same_games(mode: AutoresetMode) -> None:
    """The CUDA-graph step gives the compiled step's games bit for bit, across episode ends
    and a reset that replaces the state, and its outputs are fresh tensors."""
    rules: dict[str, Any] = {**SHORT, "autoreset_mode": mode, "validate_actions": False}
    graphed = FruitCatcherVectorEnv(7, device="cuda", compile_mode="reduce-overhead", **rules)
    plain = FruitCatcherVectorEnv(7, device="cuda", **rules)
    assert graphed.compiled and graphed.compile_mode == "reduce-overhead"
    for got, expected in zip(
        _cuda_rollout(graphed, 40, 5), _cuda_rollout(plain, 40, 5), strict=True
    ):
        assert torch.equal(got, expected)
