"""The step captured in a CUDA graph (`fruit_env.kit.captured`, what `compile="auto"` runs on
CUDA), proven on the CPU: a stand-in capture calls the step on the same fixed buffers a
graph would replay, so everything the env copies into and out of them around a replay is
checked against the eager step, bit for bit. The real graph runs in the CUDA test at the end
(and in gpu-check's games step)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import pytest
import torch
from gymnasium.vector import AutoresetMode
from torch.utils._python_dispatch import TorchDispatchMode

import fruit_env  # noqa: F401  (registers the games)
from fruit_env.kit import captured

GAMES = [
    "fruit_env:FruitCatcher-v0",
    "fruit_env:Breakout-MinAtar-v0",
    "fruit_env:Freeway-MinAtar-v0",
    "fruit_env:Asterix-MinAtar-v0",
    "fruit_env:SpaceInvaders-MinAtar-v0",
]
MODES = list(AutoresetMode)
Outputs = tuple[torch.Tensor, ...]


def calls(step: Callable[[], Outputs]) -> Callable[[], Outputs]:
    """A stand-in for `cuda_graph`: each replay calls the step on the captured buffers and
    writes its outputs into the same tensors, as a graph's replay does."""
    outputs = step()

    def replay() -> Outputs:
        for kept, new in zip(outputs, step(), strict=True):
            kept.copy_(new)
        return outputs

    return replay


@pytest.fixture
def captured_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """`compile="auto"` captures on the CPU too, with the stand-in capture."""
    monkeypatch.setattr(captured, "wanted", lambda device: True)
    monkeypatch.setattr(captured, "cuda_graph", calls)


def play(env: Any, seed: int, steps: int = 60) -> list[torch.Tensor]:
    """Every output of `steps` steps of random actions, with a masked reset, a seeded one, a
    snapshot restored onto other sub-envs and a step inside inference mode on the way; each
    step's outputs are kept as returned, so a later step that overwrote them would show."""
    gen = torch.Generator().manual_seed(seed)
    n = env.num_envs
    played = [env.reset(seed=seed)[0]]
    for i in range(steps):
        action = torch.randint(0, int(env.single_action_space.n), (n,), generator=gen)
        if i == 30:
            with torch.inference_mode():
                out = env.step(action)
        else:
            out = env.step(action)
        obs, reward, terminated, truncated, info = out
        played += [obs, reward, terminated, truncated, info["_episode"], *info["episode"].values()]
        if "final_obs" in info:
            played.append(info["final_obs"])
        if i == 20:
            mask = torch.arange(n) % 3 == 0
            played.append(env.reset(options={"reset_mask": mask})[0])
        if i == 35:
            played.append(env.reset(seed=[seed + k for k in range(n)])[0])
        if i == 45:
            env.restore_state(torch.tensor([0, n - 1]), env.snapshot_state(torch.tensor([2, 3])))
    return played


def make(env_id: str, mode: AutoresetMode, choice: bool | str, n: int = 6) -> Any:
    return gym.make_vec(env_id, num_envs=n, autoreset_mode=mode, compile=choice).unwrapped


@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
@pytest.mark.parametrize("env_id", GAMES)
def test_the_captured_step_plays_the_eager_steps_games(
    env_id: str, mode: AutoresetMode, captured_here: None
) -> None:
    """Bit for bit the eager step's games across restarts, resets, a restore and inference
    mode, and no output is overwritten by the steps after it."""
    eager, graphed = make(env_id, mode, False), make(env_id, mode, "auto")
    assert graphed.captured and not eager.captured and not graphed.compiled
    expected, got = play(eager, 3), play(graphed, 3)
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a.dtype == b.dtype and torch.equal(a, b), f"output {k} differs"


def test_auto_captures_nothing_on_the_cpu() -> None:
    """Without CUDA, "auto" is the eager step (a graph needs a GPU)."""
    env = make(GAMES[1], AutoresetMode.NEXT_STEP, "auto")
    assert not env.captured and not env.compiled


def pays_one_more(outputs: Outputs) -> Outputs:
    obs, reward, *rest = outputs
    return (obs, reward + 1, *rest)


def rounds_up(outputs: Outputs) -> Outputs:
    """Observations one float step up: what dividing by a reciprocal can do on CUDA."""
    obs, *rest = outputs
    return (torch.nextafter(obs, torch.full_like(obs, 2.0)), *rest)


@pytest.mark.parametrize(("change", "output"), [(pays_one_more, 1), (rounds_up, 0)])
def test_a_graph_that_plays_other_games_is_not_used(
    change: Callable[[Outputs], Outputs],
    output: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A capture whose replay pays one more point per step, or rounds an observation the
    other way, fails its proof: the env runs the eager step (the same games as
    compile=False), after one warning that names the output."""

    def changed(step: Callable[[], Outputs]) -> Callable[[], Outputs]:
        return lambda: change(step())

    monkeypatch.setattr(captured, "wanted", lambda device: True)
    monkeypatch.setattr(captured, "cuda_graph", changed)
    with caplog.at_level(logging.WARNING, logger="fruit_env"):
        env = make(GAMES[1], AutoresetMode.NEXT_STEP, "auto")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        f"MinAtarBreakout: the step captured in a CUDA graph is not used (step 0: output "
        f"{output} differs from the eager step's); running the eager step"
    ]
    assert not env.captured
    expected = play(make(GAMES[1], AutoresetMode.NEXT_STEP, False), 5)
    assert all(torch.equal(a, b) for a, b in zip(play(env, 5), expected, strict=True))


def test_a_capture_that_fails_leaves_the_eager_step(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A capture that raises (a driver without graphs, say) is one warning with its error."""

    def fails(step: Callable[[], Outputs]) -> Callable[[], Outputs]:
        raise RuntimeError("CUDA graphs are not supported here")

    monkeypatch.setattr(captured, "wanted", lambda device: True)
    monkeypatch.setattr(captured, "cuda_graph", fails)
    with caplog.at_level(logging.WARNING, logger="fruit_env"):
        env = make(GAMES[0], AutoresetMode.NEXT_STEP, "auto")
    assert not env.captured
    assert [r.getMessage() for r in caplog.records] == [
        "FruitCatcher: the step captured in a CUDA graph is not used (RuntimeError: "
        "CUDA graphs are not supported here); running the eager step"
    ]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("env_id", GAMES)
def test_on_cuda_auto_is_a_cuda_graph_playing_the_cpus_games(env_id: str) -> None:
    """On CUDA the default step is the captured one, and it plays the CPU's eager games."""
    mode = AutoresetMode.NEXT_STEP
    on_gpu = gym.make_vec(env_id, num_envs=6, autoreset_mode=mode, device="cuda").unwrapped
    assert on_gpu.captured
    expected = play(make(env_id, mode, False), 9)
    for a, b in zip(play(on_gpu, 9), expected, strict=True):
        assert torch.equal(a.cpu(), b)


class DivisorsSeen(TorchDispatchMode):
    """Where the divisor of every true division lives: "a number", or a tensor's device."""

    def __init__(self) -> None:
        super().__init__()
        self.divisors: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        true_division = func.overloadpacket in (torch.ops.aten.div, torch.ops.aten.div_)
        if true_division and kwargs.get("rounding_mode") is None:
            divisor = args[1]
            where = divisor.device.type if isinstance(divisor, torch.Tensor) else "a number"
            self.divisors.append(where)
        return func(*args, **kwargs)


@pytest.mark.parametrize("form", ["rules", "eager form"])
def test_fruit_catchers_features_divide_by_tensors_on_the_device(form: str) -> None:
    """CUDA divides a float tensor by a host scalar as a multiplication by the scalar's
    reciprocal, which rounds 6 of Fruit Catcher's 15 row heights (y / 14) the other way: on
    an H200 the captured step (the readable rules) played other observations than the CPU.
    So the readable rules and the eager form divide by tensors on the env's device. On the
    meta device a host scalar shows as a number or as a CPU tensor."""
    env = gym.make_vec(GAMES[0], num_envs=4, device="meta", compile=False).unwrapped
    with DivisorsSeen() as seen:
        if form == "rules":
            env.game.observe(env.game.initial(torch.zeros(4, dtype=torch.int64, device="meta")))
        else:
            env.reset(seed=0)  # the eager form's observation
    assert seen.divisors and set(seen.divisors) == {"meta"}, seen.divisors
