"""The step captured in a CUDA graph: on a GPU, one launch replays a whole vector step.

Why. On a GPU the eager step is hundreds of small kernels, so a step costs their launches,
not their work. On an H200 (docs/performance.md, "On a GPU"), Breakout played 2.1M env
steps/s eagerly at 4,096 sub-envs and 18.4M/s from a CUDA graph of the same step, faster
than gymnax's `jit(vmap(step))` (12.1M/s); at 262,144 sub-envs 128M against 458M (gymnax
298M). It needs no compiler, where `torch.compile` of the same step took 5-17 s in every
process. So it is what `compile="auto"` runs on CUDA.

How. The graph replays `StepGraph` (the readable rules, the function a package is exported
from) on buffers of fixed address: the packed rows with the pending row, the keys, the
counters and the actions. A state from elsewhere (a reset, a restore), new keys (a seeded
reset) or new counters are copied into them before the replay; the actions every step. The
outputs are copied out of the graph's own, which the next replay overwrites. Resets and the
observations they give run eagerly, as with a package.

Trust. A graph is played `PROOF_STEPS` steps against the eager step (the step it replaces)
from the same games and actions before it is used, every output, the state and the counters
compared bit for bit. That also catches rules that round differently from their eager form
on the device (CUDA divides by a host scalar as a multiplication by its reciprocal). A
capture that fails or plays other games gives way to the eager step, with one warning.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch
from gymnasium.vector import AutoresetMode

from fruit_env.kit import proof, rng
from fruit_env.kit.autoreset import EagerStepper, Running, Transition
from fruit_env.kit.game import TensorGame
from fruit_env.kit.layout import Layout, Packed
from fruit_env.kit.step_graph import GraphStepper, StepGraph

log = logging.getLogger("fruit_env")

PROOF_STEPS = 8  # steps a graph plays against the uncaptured step before it is trusted
WARMUP_CALLS = 3  # calls on a side stream before the capture, as torch's docs ask

Outputs = tuple[torch.Tensor, ...]
Capture = Callable[[Callable[[], Outputs]], Callable[[], Outputs]]


def cuda_graph(call: Callable[[], Outputs]) -> Callable[[], Outputs]:
    """`call` captured in a CUDA graph; the function returned replays it (one launch) and
    returns the same output tensors every time."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = call()

    def replay() -> Outputs:
        graph.replay()
        return outputs

    return replay


def wanted(device: torch.device) -> bool:
    """Whether `compile="auto"` captures the step on `device`: on CUDA."""
    return device.type == "cuda"


def stepper(
    game: TensorGame[Any],
    layout: Layout,
    mode: AutoresetMode,
    num_envs: int,
    device: torch.device,
    eager: EagerStepper,
    capture: Capture | None = None,
) -> CapturedStepper | EagerStepper:
    """The captured step once it has played the eager step's games, else `eager`, with
    one warning that says why. `capture`: `cuda_graph` unless given (a test's stand-in)."""
    try:
        captured = CapturedStepper(game, layout, mode, num_envs, device, capture or cuda_graph)
        why = captured.prove()
        if why is None:
            return captured
    except Exception as err:  # a capture can fail in many ways; the eager step must not
        why = f"{type(err).__name__}: {err}"
    log.warning(
        "%s: the step captured in a CUDA graph is not used (%s); running the eager step",
        type(game).__name__,
        why,
    )
    return eager


class CapturedStepper(GraphStepper):
    """A graph of the mode's step, stepping a `Running` state like `EagerStepper` does."""

    def __init__(
        self,
        game: TensorGame[Any],
        layout: Layout,
        mode: AutoresetMode,
        num_envs: int,
        device: torch.device,
        capture: Capture = cuda_graph,
    ) -> None:
        super().__init__(
            game, layout, mode, EagerStepper(game.eager_form(num_envs, device), layout, mode)
        )
        graph = StepGraph(game, layout, mode)
        # Buffers made in inference mode could not be written outside it later.
        with torch.inference_mode(False), torch.no_grad(), _on(device):
            keys = rng.range_keys(0, num_envs, device)
            self._start = proof.graph_inputs(game, layout, mode, keys)
            self._rows, self._key, self._counter = (t.clone() for t in self._start)
            self._action = torch.zeros(num_envs, dtype=torch.int64, device=device)
            self._replay = capture(lambda: graph(*self._inputs()))
        self._state: Packed | None = None  # the state held in `_rows`
        self._key_in: torch.Tensor | None = None  # the keys copied into `_key`

    def _inputs(self) -> tuple[torch.Tensor, ...]:
        return self._rows, self._key, self._counter, self._action

    def prove(self) -> str | None:
        """Play `PROOF_STEPS` steps of random actions from the same games, replayed and with
        the eager step (the step this one replaces), and say where they first differ (None:
        nowhere): every output, the state and the counters. Leaves no state behind: the
        next `step` copies its own in."""
        rows, key, counter = (t.clone() for t in self._start)
        running = Running(Packed(rows[:-1].T), rows[-1] != 0)
        for buffer, start in zip((self._rows, self._key, self._counter), self._start, strict=True):
            buffer.copy_(start)
        draws = torch.Generator().manual_seed(0)
        with torch.inference_mode(False), torch.no_grad():
            for i in range(PROOF_STEPS):
                shape = self._action.shape
                self._action.copy_(torch.randint(0, self.game.num_actions, shape, generator=draws))
                played = (*self._replay(), self._rows, self._counter)
                t = self._eager.step(running, key, counter, self._action.clone())
                running, counter = t.running, t.counter
                flags = torch.stack(
                    [f.to(torch.int32) for f in (t.terminated, t.truncated, t.ended)]
                )
                state = torch.cat([self.layout.pack(t.running.game), t.running.pending[None]])
                eager = (t.obs, t.reward, flags, *t.episode, *_present(t.final_obs), state, counter)
                for k, (a, b) in enumerate(zip(played, eager, strict=True)):
                    if a.dtype != b.dtype or not torch.equal(a, b):
                        return f"step {i}: output {k} differs from the eager step's"
        del self._start
        self._state = None
        return None

    def step(
        self, running: Running, key: torch.Tensor, counter: torch.Tensor, action: torch.Tensor
    ) -> Transition:
        """The mode's step; `action` of any integer dtype, clamped in the graph."""
        if running.game is not self._state:
            pending_row = running.pending.to(torch.int32)[None]
            self._rows.copy_(torch.cat([self.layout.pack(running.game), pending_row]))
            self._state = Packed(self._rows[:-1].T)
        if key is not self._key_in:
            self._key.copy_(key)
            self._key_in = key
        if counter is not self._counter:
            self._counter.copy_(counter)
        self._action.copy_(action)
        out = self._replay()
        # Copies, since the next replay overwrites the graph's outputs; the flags (2) need
        # none: `_transition` turns them into new bool tensors.
        copies = [t if i == 2 else t.clone() for i, t in enumerate(out)]
        return self._transition(copies, self._state, running, self._counter)


def _present(tensor: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    return () if tensor is None else (tensor,)


def _on(device: torch.device) -> Any:
    """The CUDA device context of `device` (a capture records on the current device)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
