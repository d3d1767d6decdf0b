"""A compiled package is proven in a child process before the env trusts it.

A package is native code: a bad one can kill the process with a signal that no `try`
catches (on CUDA, torch's loader once did, with SIGSEGV). So the env plays a package in a child
process against the eager step first, records the verdict beside the package, and runs the
eager step, with one warning that says why, when the child crashed, failed or disagreed.
These tests make the child crash for real (a segfault, an abort) and check that the parent
lives on, falls back, and asks the child only once per package and device.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from fruit_env import FruitCatcherVectorEnv
from fruit_env.kit import compiled, proof, step_graph

SHORT = {"width": 8, "height": 6, "win_score": 3, "lose_score": -3, "max_episode_steps": 6}
CPU = torch.device("cpu")
SHARED_CACHE = Path(tempfile.gettempdir()) / "fruit_env_test_cache"  # as test_env_compile's

CHILDREN = {
    "segfault": ("import ctypes\nctypes.string_at(0)\n", "SIGSEGV"),
    "abort": ("import os\nos.abort()\n", "SIGABRT"),
    "error": ("raise SystemExit('cannot load: bad package')\n", "cannot load: bad package"),
    "other games": ("print('step 3, output 1: differs')\nraise SystemExit(3)\n", "differs"),
}


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty cache whose packages are placeholders: what is tested is what happens after
    the build, so nothing is compiled."""
    monkeypatch.setenv("FRUIT_ENV_CACHE_DIR", str(tmp_path / "cache"))

    def placeholder(game: Any, layout: Any, mode: Any, device: Any, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"not a package")

    monkeypatch.setattr(compiled, "build", placeholder)
    return tmp_path / "cache"


def child(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, body: str) -> Path:
    """Make the check's child process run `body`, counting its runs in the returned file."""
    runs = tmp_path / "runs"
    script = tmp_path / "child.py"
    script.write_text(f"open({str(runs)!r}, 'a').write('x')\n" + body)
    monkeypatch.setattr(proof, "CHILD", script)
    return runs


@pytest.mark.parametrize("kind", CHILDREN, ids=CHILDREN.keys())
def test_the_parent_survives_a_child_check_that_dies_and_runs_eager(
    kind: str,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    body, named = CHILDREN[kind]
    runs = child(monkeypatch, tmp_path, body)
    with caplog.at_level(logging.WARNING, logger="fruit_env"):
        env = FruitCatcherVectorEnv(3, compile=True, **SHORT)
    assert env.compiled is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and named in warnings[0] and "eager" in warnings[0], warnings
    env.reset(seed=0)  # the eager step plays
    env.step(np.array([0, 1, 2]))
    [verdict] = cache.glob("*.verdict.json")
    recorded = json.loads(verdict.read_text())
    assert recorded["ok"] is False and named in recorded["reason"]
    assert runs.read_text() == "x"


def test_a_recorded_verdict_is_not_checked_again(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Once per machine, package and device: the second env reads the verdict, and says
    again (once) why it runs eager, naming the file that holds the verdict."""
    runs = child(monkeypatch, tmp_path, CHILDREN["segfault"][0])
    FruitCatcherVectorEnv(3, compile=True, **SHORT)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fruit_env"):
        assert FruitCatcherVectorEnv(5, compile=True, **SHORT).compiled is False
    assert runs.read_text() == "x"
    [message] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "SIGSEGV" in message and "verdict.json" in message


def test_a_rebuilt_package_is_checked_again(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A verdict belongs to the package it judged: deleting the package (not its verdict)
    and building it anew asks the child again."""
    runs = child(monkeypatch, tmp_path, CHILDREN["abort"][0])
    FruitCatcherVectorEnv(3, compile=True, **SHORT)
    [package] = cache.glob("*.pt2")
    package.unlink()
    FruitCatcherVectorEnv(3, compile=True, **SHORT)
    assert runs.read_text() == "xx"


def test_a_verdict_is_kept_per_device(cache: Path) -> None:
    package = cache / "game.pt2"
    paths = {proof.verdict_path(package, torch.device(d)) for d in ("cpu", "cuda:0", "cuda:1")}
    assert len(paths) == 3 and all(p.parent == cache for p in paths)


def test_the_real_check_refuses_a_package_that_is_not_one(
    cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """torch's own loader, in the child, on a file that is no package: the parent lives on."""
    with caplog.at_level(logging.WARNING, logger="fruit_env"):
        env = FruitCatcherVectorEnv(3, compile=True, **SHORT)
    assert env.compiled is False
    [message] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "its check" in message


@pytest.mark.slow
def test_the_check_passes_a_real_package_and_catches_other_games(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A real package agrees with its eager graph; against a graph that pays one more point
    per step, the child names the difference."""
    monkeypatch.setenv("FRUIT_ENV_CACHE_DIR", str(SHARED_CACHE))
    env = FruitCatcherVectorEnv(3, compile=True, **SHORT)
    assert env.compiled is True
    mode, game, layout = AutoresetMode.NEXT_STEP, env.game, env.layout
    package = compiled.package_path(game, mode, CPU)
    graph = step_graph.StepGraph(game, layout, mode)
    assert proof.check(package, game, layout, mode, CPU, graph) is None

    class MorePoints(torch.nn.Module):
        def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            obs, reward, *rest = graph(*inputs)
            return (obs, reward + 1, *rest)

    why = proof.check(package, game, layout, mode, CPU, MorePoints())
    assert why is not None and "output 1" in why and "differs" in why


BASE = """
import torch
from fruit_env.kit import Step, TensorGame

class BaseRules(TensorGame):
    num_actions = 2

    def initial(self, bits):
        return (bits % {start},)
"""
GAME = """
from {base} import BaseRules

class Game(BaseRules):
    pass
"""


def test_a_package_is_rebuilt_when_rules_a_game_inherits_change(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The game's class in one module, the rules it inherits in another: editing the base's
    module gives another package, so the next env builds it instead of loading a stale one."""
    monkeypatch.setenv("FRUIT_ENV_CACHE_DIR", str(tmp_path / "cache"))
    builds: list[Path] = []

    def build(game: Any, layout: Any, mode: Any, device: Any, path: Path) -> None:
        builds.append(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")

    monkeypatch.setattr(compiled, "build", build)

    def built_for(start: int) -> Path:
        names = ("inherited_rules", "inheriting_game")
        (tmp_path / "inherited_rules.py").write_text(BASE.format(start=start))
        (tmp_path / "inheriting_game.py").write_text(GAME.format(base=names[0]))
        monkeypatch.syspath_prepend(str(tmp_path))
        try:
            for name in names:
                spec = importlib.util.spec_from_file_location(name, tmp_path / f"{name}.py")
                assert spec is not None and spec.loader is not None
                sys.modules[name] = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(sys.modules[name])
            compiled._sources.cache_clear()
            game = sys.modules[names[1]].Game()
            return compiled.built(game, None, AutoresetMode.NEXT_STEP, CPU)  # type: ignore[arg-type]
        finally:
            for name in names:
                sys.modules.pop(name, None)

    first = built_for(5)
    assert built_for(5) == first and len(builds) == 1  # unchanged rules: loaded, not rebuilt
    assert built_for(6) != first and len(builds) == 2  # the base's rules changed: rebuilt


def test_the_key_leaves_libraries_out_and_covers_the_kit() -> None:
    roots = compiled._source_roots(type(FruitCatcherVectorEnv(2, compile=False).game))
    kit = Path(compiled.__file__).resolve().parent
    assert kit in roots and kit.parent in roots  # the kit and the game's package
    assert not any("site-packages" in str(root) for root in roots)


def test_the_child_imports_nothing_of_fruit_env() -> None:
    """It runs by path in a fresh interpreter: it must not need fruit_env on the path."""
    source = textwrap.dedent(proof.CHILD.read_text())
    assert "fruit_env" not in source.split('"""', 2)[2]
