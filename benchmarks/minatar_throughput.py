"""Env-only steps/s of the MinAtar games on one core: our torch envs and rules against gymnax's.

    python benchmarks/minatar_throughput.py                 # the four games, 256/1024/4096 envs
    python benchmarks/minatar_throughput.py --games breakout --quick   # fewer rounds
    python benchmarks/minatar_throughput.py --games freeway asterix --sizes 256 --no-compile
    python benchmarks/minatar_throughput.py --quick --sizes 8 --steps 5 --name smoke  # a smoke test

`--games` picks among `breakout`, `freeway`, `asterix` and `space_invaders` (all by
default). The variants, each stepping `N` games with random actions and restarting ended
ones:

* `env`: the Gymnasium env a user gets, `gymnasium.make_vec("<Game>-MinAtar-v0",
  num_envs=N)` with its defaults (NEXT_STEP autoreset, actions checked, the eager step on
  the CPU), stepped by `envs.step(actions)`: the kit's shell around the rules, with its
  seeding, action check, episode statistics and float32 observations.
* `env_same_step`: the same env with `autoreset_mode="SAME_STEP"`, gymnax's own mode (an
  ended game's last observation in `info["final_obs"]`, so two observations on such steps,
  and a second draw for the restart).
* `env_compiled`: the `env` with `compile=True`: the kit's compiled step (AOTInductor), loaded
  from its cache or built first (`first_block_s` records the first block, a build included).
* `env_kit_restart` (the games with a restart of their own: Breakout, Asterix, Space
  Invaders): the `env` with the kit's default restart (`TensorGame.restart`: a new game from
  `initial` where one ended, and a select per field) instead of the game's own, which fills
  in the constants of a new game: what the game's restart buys.
* `torch_eager`: the game's `rules` module as written: `advance` (with the step's random
  bits where the game draws any), then a `torch.where` over the state with `initial_state`
  for the games that ended (terminated or truncated), then `observe` (the restarted game's
  observation, as gymnax's step returns).
* `torch_compiled`: the same, with `advance` and the restart through `torch.compile`
  (fullgraph, static shapes, built once per size before timing; `first_block_s` records the
  first block, compile included, as for `jax`) and `observe` eager. Compiling `observe` too
  was slower for Breakout at 1024 envs and up on the CPU: inductor writes the board in a
  scalar loop over its cells per game, against eager's memset and one scatter.
* `jax`: the raw loop over gymnax's `<Game>-MinAtar`, `jax.jit(jax.vmap(env.step))`, whose
  step resets ended games itself (and also returns the final observation in `info`); the
  block ends with `jax.block_until_ready`, so JAX's asynchronous dispatch is timed in full.
* `jax_scan` (for reference, not the target): the same steps as one `jax.lax.scan` per
  block, one XLA program with no per-step dispatch.

Randomness is drawn before timing, as banks of `(steps, N)` tensors: actions for all
variants, 32 random bits per game and step for the rules' loops, a JAX key per game and step
for gymnax (the `env` rows draw their own, as the env does). So each side times its step and
nothing else. The process is pinned to one CPU (`--cpu`), torch runs one thread and XLA
its one-thread flags (set before jax is imported). The variants run in turns, one block each
per round, the order rotating from round to round, so that a shared machine's load hits all
alike; figures are medians over rounds after warm-up blocks, and the paired ratio is the
median over rounds of the two blocks' ratio; both in wall time and in this process's CPU
time (which a busy shared machine inflates less). The JSON
(`benchmarks/results/minatar_throughput.json`, or `--name`'s) keeps every block of every
game and size, the machine and the versions. (This script was `breakout_throughput.py`,
Breakout only; `--games breakout` runs what it ran.)
"""

from __future__ import annotations

import os
import sys

THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {THREAD_FLAGS}".strip()


def pin_to_one_cpu(argv: list[str]) -> int | None:
    """Pin the process to one CPU (`--cpu N`, else the first it may use) before torch or JAX
    start threads: XLA's flags leave it helper threads that otherwise run on a second core
    beside the timed one (its CPU time then exceeds its wall time)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = int(argv[argv.index("--cpu") + 1]) if "--cpu" in argv else min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


PINNED_CPU = pin_to_one_cpu(sys.argv)

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from importlib import import_module  # noqa: E402
from importlib.metadata import version  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, write_result  # noqa: E402

import fruit_env  # noqa: E402, F401  (registers the MinAtar games)
from fruit_env.kit import TensorGame, TensorVectorEnv  # noqa: E402
from fruit_env.registration import MINATAR_GAMES  # noqa: E402

StepOutput = tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
Transition = tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Game:
    """One MinAtar game as the loops need it: its ids, its rules module and its kit game."""

    env_id: str
    gymnax_id: str
    package: str  # fruit_env.games.<package>
    advance_takes_bits: bool  # the rules draw from a step's bits (spawns, car speeds)

    @property
    def rules(self) -> ModuleType:
        return import_module(f"fruit_env.games.{self.package}.rules")

    @property
    def game(self) -> type[TensorGame[Any]]:
        return MINATAR_GAMES[self.env_id][0]  # type: ignore[return-value]

    @property
    def own_restart(self) -> bool:
        return "restart" in self.game.__dict__


GAMES = {
    "breakout": Game("Breakout-MinAtar-v0", "Breakout-MinAtar", "minatar_breakout", False),
    "freeway": Game("Freeway-MinAtar-v0", "Freeway-MinAtar", "minatar_freeway", True),
    "asterix": Game("Asterix-MinAtar-v0", "Asterix-MinAtar", "minatar_asterix", True),
    "space_invaders": Game(
        "SpaceInvaders-MinAtar-v0", "SpaceInvaders-MinAtar", "minatar_space_invaders", False
    ),
}


def transition_of(game: Game) -> Callable[..., Transition]:
    """The rules' step with same-step restart of ended games, as a Gymnasium shell runs it:
    `(state, reward, terminated, truncated)`."""
    rules = game.rules

    def transition(state: Any, action: torch.Tensor, bits: torch.Tensor) -> Transition:
        if game.advance_takes_bits:
            state, reward, terminated = rules.advance(state, action, bits)
        else:
            state, reward, terminated = rules.advance(state, action)
        cut = rules.truncated(state)
        ended = terminated | cut
        fresh = rules.initial_state(bits)
        state = type(state)(
            *(
                torch.where(ended.view(-1, *[1] * (s.dim() - 1)), f, s)
                for f, s in zip(fresh, state, strict=True)
            )
        )
        return state, reward, terminated, cut

    return transition


def stepper(game: Game, transition: Callable[..., Transition]) -> Callable[..., StepOutput]:
    """A vector step from a transition: `(state, obs, reward, terminated, truncated)`, the
    observation of the restarted games where games ended, as gymnax's step returns."""
    observe = game.rules.observe

    def step(state: Any, action: torch.Tensor, bits: torch.Tensor) -> StepOutput:
        state, reward, terminated, cut = transition(state, action, bits)
        return state, observe(state), reward, terminated, cut

    return step


class TorchLoop:
    """`steps` torch steps of `n` games per block, with banked actions and random bits."""

    def __init__(
        self, game: Game, n: int, steps: int, step: Callable[..., StepOutput], seed: int
    ) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.actions = torch.randint(0, game.rules.NUM_ACTIONS, (steps, n), generator=generator)
        self.bits = torch.randint(0, 2**32, (steps, n), generator=generator)
        self.state = game.rules.initial_state(self.bits[0])
        self.step = step

    def block(self) -> None:
        state = self.state
        for action, bits in zip(self.actions, self.bits, strict=True):
            state, *_ = self.step(state, action, bits)
        self.state = state


def with_kit_restart(game: Game) -> TensorGame[Any]:
    """The game with the kit's default restart (a new game from `initial` where ended, a
    select per field) instead of its own (constants filled in)."""
    kit_restart = type(f"KitRestart{game.game.__name__}", (game.game,), {})
    kit_restart.restart = TensorGame.restart  # type: ignore[method-assign]
    return kit_restart()  # its repr names the subclass: its own compiled-step cache entry


class EnvLoop:
    """`steps` calls of `envs.step` on `gymnasium.make_vec(game.env_id)` (or a
    `TensorVectorEnv` of `kit_game`) per block, with banked actions; the env autoresets ended
    games itself."""

    def __init__(
        self,
        game: Game,
        n: int,
        steps: int,
        seed: int,
        kit_game: TensorGame[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.actions = torch.randint(0, game.rules.NUM_ACTIONS, (steps, n), generator=generator)
        if kit_game is None:
            self.envs = gym.make_vec(game.env_id, num_envs=n, **kwargs)
        else:
            self.envs = TensorVectorEnv(kit_game, n, **kwargs)
        self.envs.reset(seed=seed)

    def block(self) -> None:
        for action in self.actions:
            self.envs.step(action)


class JaxLoop:
    """`steps` gymnax steps of `n` games per block, with banked actions and keys: one jitted
    call per step (the raw loop), or with `scan` the whole block as one XLA program."""

    def __init__(self, game: Game, n: int, steps: int, seed: int, scan: bool = False) -> None:
        import gymnax
        import jax

        self.jax = jax
        self.obs_shape = game.rules.OBS_SHAPE
        env, self.params = gymnax.make(game.gymnax_id)
        self.step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
        key_actions, key_steps, key_reset = jax.random.split(jax.random.PRNGKey(seed), 3)
        self.actions = jax.random.randint(key_actions, (steps, n), 0, game.rules.NUM_ACTIONS)
        self.keys = jax.random.split(key_steps, steps * n).reshape(steps, n, -1)
        reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
        _, self.state = reset(jax.random.split(key_reset, n), self.params)
        self.scan = jax.jit(self._scan) if scan else None

    def _scan(self, state: Any, keys: Any, actions: Any) -> Any:
        """The block's final state and observation: the observation rides in the carry, so
        XLA computes it at every step (as the raw loop returns it) without storing them all."""

        def one(carry: tuple[Any, Any], key_action: tuple[Any, Any]) -> tuple[Any, None]:
            key, action = key_action
            obs, state, *_ = self.step(key, carry[1], action, self.params)
            return (obs, state), None

        obs = self.jax.numpy.zeros((len(keys[0]), *self.obs_shape), self.jax.numpy.float32)
        return self.jax.lax.scan(one, (obs, state), (keys, actions))[0]

    def block(self) -> None:
        if self.scan is not None:
            out = self.scan(self.state, self.keys, self.actions)
            state = out[1]
        else:
            state, out = self.state, None
            for key, action in zip(self.keys, self.actions, strict=True):
                out = self.step(key, state, action, self.params)
                state = out[1]
        self.jax.block_until_ready(out)
        self.state = state


def make_loops(game: Game, n: int, args: argparse.Namespace) -> tuple[dict[str, Any], dict]:
    """The variants' loops for `n` games, and the seconds of each compiled one's first block."""
    transition = transition_of(game)
    loops: dict[str, Any] = {
        "torch_eager": TorchLoop(game, n, args.steps, stepper(game, transition), seed=n),
        "env": EnvLoop(game, n, args.steps, seed=n),
        "env_same_step": EnvLoop(game, n, args.steps, seed=n, autoreset_mode="SAME_STEP"),
    }
    if game.own_restart:
        loops["env_kit_restart"] = EnvLoop(
            game, n, args.steps, seed=n, kit_game=with_kit_restart(game)
        )
    first: dict[str, float | None] = {"torch_compiled": None, "env_compiled": None}
    if args.compile:
        start = time.perf_counter()
        loops["env_compiled"] = EnvLoop(game, n, args.steps, seed=n, compile=True)
        loops["env_compiled"].block()
        first["env_compiled"] = time.perf_counter() - start
        compiled = torch.compile(transition, fullgraph=True, dynamic=False)
        loop = TorchLoop(game, n, args.steps, stepper(game, compiled), seed=n)
        start = time.perf_counter()
        loop.block()
        first["torch_compiled"] = time.perf_counter() - start
        loops["torch_compiled"] = loop
    start = time.perf_counter()
    loops["jax"] = JaxLoop(game, n, args.steps, seed=n)
    loops["jax"].block()
    first["jax"] = time.perf_counter() - start
    if args.scan:
        loops["jax_scan"] = JaxLoop(game, n, args.steps, seed=n, scan=True)
    return loops, first


def time_size(game: Game, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """One size of one game: every variant's blocks in rotating turns, medians and ratios."""
    loops, first = make_loops(game, n, args)

    names = list(loops)
    for name in names:
        for _ in range(args.warmup):
            loops[name].block()
    blocks: dict[str, list[float]] = {name: [] for name in names}
    cpu_blocks: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start, cpu_start = time.perf_counter(), time.process_time()
            loops[name].block()
            blocks[name].append(time.perf_counter() - start)
            cpu_blocks[name].append(time.process_time() - cpu_start)

    def steps_per_s(seconds: float) -> float:
        return n * args.steps / seconds

    row: dict[str, Any] = {
        "num_envs": n,
        "steps_per_block": args.steps,
        "first_block_s": first,
        "block_s": blocks,
        "block_cpu_s": cpu_blocks,
        "steps_per_s": {name: steps_per_s(statistics.median(b)) for name, b in blocks.items()},
        "steps_per_cpu_s": {
            name: steps_per_s(statistics.median(b)) for name, b in cpu_blocks.items()
        },
    }
    for key, timed in (("ratio_to_jax", blocks), ("cpu_ratio_to_jax", cpu_blocks)):
        row[key] = {
            name: statistics.median(j / o for o, j in zip(timed[name], timed["jax"], strict=True))
            for name in names
            if name != "jax"
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", nargs="+", choices=list(GAMES), default=list(GAMES))
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--steps", type=int, default=100, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="3 rounds, 1 warm-up block")
    parser.add_argument("--name", default="minatar_throughput", help="results file stem")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument(
        "--no-scan", dest="scan", action="store_false", help="skip the jax_scan variant"
    )
    parser.add_argument("--cpu", type=int, help="the one CPU to run on (default: the first)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.warmup = 3, 1
    torch.set_num_threads(1)
    machine = machine_info()  # the load average before the run; `load_average_end` after

    games: dict[str, list[dict[str, Any]]] = {}
    for name in args.games:
        rows = games[name] = []
        for n in args.sizes:
            row = time_size(GAMES[name], n, args)
            rows.append(row)
            figures = ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in row["steps_per_s"].items())
            ratios = ", ".join(f"{k} {v:.2f}x" for k, v in row["ratio_to_jax"].items())
            cpu = ", ".join(f"{k} {v:.2f}x" for k, v in row["cpu_ratio_to_jax"].items())
            print(f"{name} {n:5d} envs: {figures} steps/s; against jax: {ratios} (CPU: {cpu})")

    machine |= {
        "pinned_cpu": PINNED_CPU,
        "load_average_end": os.getloadavg(),
        "jax": version("jax"),
        "jaxlib": version("jaxlib"),
        "gymnax": version("gymnax"),
        "xla_flags": os.environ["XLA_FLAGS"],
    }
    path = write_result(
        args.name,
        {"machine": machine, "settings": vars(args), "games": games},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
