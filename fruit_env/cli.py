"""`python -m fruit_env`: play Fruit Catcher in a terminal, or watch scripted policies play it.

    python -m fruit_env play [--fps 4] [--seed S]
    python -m fruit_env demo [--policy random|chase] [--episodes N] [--num-envs N]
                             [--device cpu|cuda] [--seed S] [--show] [--fps F]

Checking a vector env is the trainer's command, which builds any env it trains on:
`python -m grpo_trainer check ENV_ID`; `python -m fruit_env check` says so and exits 2.

`play` needs an interactive terminal: without one (stdin or stdout not a TTY) it prints why
on stderr and exits with status 2, like any other usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import gymnasium as gym
import torch

from fruit_env.games.fruit_catcher.env import FruitCatcherVectorEnv
from fruit_env.registration import ENV_ID, register_envs

LEFT, STAY, RIGHT = 0, 1, 2
QUIT = -1  # not an env action: what `action_for_key` returns for the quit key

Policy = Callable[[torch.Tensor], torch.Tensor]

# -- policies (vectorised over the batch, on the env's device) --------------------------------


def chase_policy(obs: torch.Tensor) -> torch.Tensor:
    """Move the basket centre toward the lowest active fruit; stay when none is falling.

    `obs` is the feature observation `(N, 1 + 3*slots)`: basket centre, then (x, y, active) per
    slot. Centre and fruit columns share one scale, so "fruit above the centre" is equality.
    """
    if obs.dim() != 2 or obs.shape[1] % 3 != 1 or not obs.dtype.is_floating_point:
        raise ValueError(
            "chase_policy needs feature observations (N, 1 + 3*slots) of floats, got "
            f"{obs.dtype} {tuple(obs.shape)}"
        )
    centre = obs[:, 0]
    x, y, active = obs[:, 1:].unflatten(1, (-1, 3)).unbind(-1)
    falling = active > 0.5
    lowest = torch.where(falling, y, -1.0).argmax(1, keepdim=True)
    target = x.gather(1, lowest).squeeze(1)
    offset = torch.where(falling.any(1), target - centre, 0.0)
    return (torch.sign(offset) + 1).to(torch.int64)  # -1 -> left, 0 -> stay, +1 -> right


def random_policy(num_envs: int, device: torch.device, seed: int) -> Policy:
    """Uniform actions from a seeded generator on `device`, so a demo run is repeatable."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def act(obs: torch.Tensor) -> torch.Tensor:
        return torch.randint(0, 3, (num_envs,), generator=generator, device=device)

    return act


def make_policy(name: str, num_envs: int, device: torch.device, seed: int) -> Policy:
    """A demo policy by name: "random" or "chase"."""
    if name == "chase":
        return chase_policy
    if name == "random":
        return random_policy(num_envs, device, seed)
    raise ValueError(f"policy must be 'random' or 'chase', got {name!r}")


# -- demo ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DemoResult:
    """Totals over the episodes a demo counted."""

    episodes: int
    total_return: float
    total_length: int
    caught: int
    missed: int

    @property
    def mean_return(self) -> float:
        return self.total_return / self.episodes

    @property
    def mean_length(self) -> float:
        return self.total_length / self.episodes

    @property
    def catch_rate(self) -> float:
        """caught / (caught + missed); 0 when no fruit landed."""
        landed = self.caught + self.missed
        return self.caught / landed if landed else 0.0


def run_demo(
    policy: str,
    *,
    episodes: int,
    num_envs: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
    show: bool = False,
    fps: float = 0.0,
    out: TextIO | None = None,
) -> DemoResult:
    """Play `episodes` episodes with a scripted policy and total their statistics.

    Sub-env i counts the first `episodes // num_envs` (+1 for the first `episodes % num_envs`)
    episodes it plays: a fixed quota per sub-env, so short episodes are not over-represented
    as they would be by counting whichever episodes end first.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    num_envs = min(num_envs, episodes)  # a sub-env with a quota of 0 would only waste time
    env = FruitCatcherVectorEnv(num_envs, device=device, render_mode="ansi" if show else None)
    act = make_policy(policy, num_envs, env.device, seed)
    out = out or sys.stdout

    index = torch.arange(num_envs, device=env.device)
    quota = episodes // num_envs + (index < episodes % num_envs).to(torch.int64)
    counted = torch.zeros(num_envs, dtype=torch.int64, device=env.device)
    # return, length, caught, missed; integers (returns are whole numbers), exact on any device
    totals = torch.zeros(4, dtype=torch.int64, device=env.device)

    check_every = 1 if show else 32  # each check is one host sync
    obs, _ = env.reset(seed=seed)
    step = 0
    while True:
        obs, _, _, _, info = env.step(act(obs))
        step += 1
        count = info["_episode"] & (counted < quota)
        counted += count
        stats = torch.stack(
            [info["episode"][k].to(torch.int64) for k in ("r", "l", "caught", "missed")]
        )
        totals += torch.where(count, stats, 0).sum(1)
        if show:
            _show(env.render()[0], out, fps)  # type: ignore[index]
        if step % check_every == 0 and bool((counted >= quota).all()):
            break
    env.close()
    ret, length, caught, missed = totals.tolist()
    return DemoResult(episodes, float(ret), length, caught, missed)


def _show(board: str, out: TextIO, fps: float) -> None:
    if out.isatty():
        out.write("\x1b[H\x1b[2J")  # home + clear, so the board redraws in place
    out.write(board + "\n\n")
    out.flush()
    if fps > 0:
        time.sleep(1.0 / fps)


def format_result(result: DemoResult) -> str:
    """The summary lines `demo` prints (tests parse them)."""
    return "\n".join(
        [
            f"episodes     {result.episodes}",
            f"mean return  {result.mean_return:+.2f}",
            f"mean length  {result.mean_length:.1f}",
            f"caught       {result.caught}",
            f"missed       {result.missed}",
            f"catch rate   {result.catch_rate:.3f}",
        ]
    )


# -- play ----------------------------------------------------------------------------------------


def action_for_key(key: int) -> int | None:
    """What a key press means: LEFT, STAY, RIGHT or QUIT; None for keys the game ignores.

    `key` is a curses key code (characters are their `ord`, arrows `curses.KEY_*`).
    """
    return _KEYS.get(key)


def choose_action(keys: Sequence[int]) -> int:
    """One tick's action from its key presses: quit wins, then the last move, else stay."""
    actions = [a for a in map(action_for_key, keys) if a is not None]
    if QUIT in actions:
        return QUIT
    return actions[-1] if actions else STAY


def _key_table() -> dict[int, int]:
    table = {ord(c): LEFT for c in "aA"} | {ord(c): RIGHT for c in "dD"}
    table |= {ord(c): STAY for c in "sS "} | {ord(c): QUIT for c in "qQ"}
    try:
        import curses
    except ImportError:  # no curses (Windows without windows-curses): letters still work
        return table
    return table | {curses.KEY_LEFT: LEFT, curses.KEY_RIGHT: RIGHT, curses.KEY_DOWN: STAY}


_KEYS = _key_table()
HELP = "left: <- or a   right: -> or d   stay: down, s or space   quit: q"


@dataclasses.dataclass(frozen=True)
class PlayResult:
    score: int
    caught: int
    missed: int
    steps: int
    quit: bool
    board: str


def play_game(
    env: gym.Env[Any, Any],
    read_keys: Callable[[], Sequence[int]],
    draw: Callable[[str], None],
    *,
    seed: int | None = None,
) -> PlayResult:
    """One game driven by key presses; `read_keys` returns the keys of one tick.

    The terminal sits behind `read_keys` and `draw`, so this loop runs in tests without one.
    """
    env.reset(seed=seed)
    board = env.render()
    draw(board)
    quit_ = False
    while True:
        action = choose_action(read_keys())
        if action == QUIT:
            quit_ = True
            break
        _, _, terminated, truncated, _ = env.step(action)
        board = env.render()
        draw(board)
        if terminated or truncated:
            break
    game = env.unwrapped
    return PlayResult(game.score, game.caught, game.missed, game.t, quit_, board)  # type: ignore[attr-defined]


def play(fps: float = 4.0, seed: int | None = None) -> int:
    """Play one game in this terminal with curses; returns the exit status."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print(
            "fruit_env play needs an interactive terminal (stdin or stdout is not a TTY); "
            "try `python -m fruit_env demo --show` to watch a game instead",
            file=sys.stderr,
        )
        return 2
    import curses

    register_envs()
    env = gym.make(ENV_ID, render_mode="ansi")
    tick = 1.0 / fps

    def session(screen: Any) -> PlayResult:
        curses.curs_set(0)

        def read_keys() -> list[int]:
            """Keys pressed during one tick; returns when the tick is over (quit: at once)."""
            keys: list[int] = []
            deadline = time.monotonic() + tick
            while (left := deadline - time.monotonic()) > 0:
                screen.timeout(max(1, round(left * 1000)))
                key = screen.getch()
                if key != -1:
                    keys.append(key)
                    if action_for_key(key) == QUIT:
                        break
            return keys

        def draw(board: str) -> None:
            screen.erase()
            for row, line in enumerate([*board.splitlines(), "", HELP]):
                try:
                    screen.addstr(row, 0, line)
                except curses.error:  # terminal too small: show what fits
                    break
            screen.refresh()

        return play_game(env, read_keys, draw, seed=seed)

    result = curses.wrapper(session)
    env.close()
    print(result.board)
    ending = "quit" if result.quit else "game over"
    print(
        f"{ending}: score {result.score:+d}, caught {result.caught}, missed {result.missed}, "
        f"{result.steps} steps"
    )
    return 0


# -- entry point ---------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fruit_env", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    play_cmd = commands.add_parser("play", help="play one game in this terminal")
    play_cmd.add_argument("--fps", type=_positive_float, default=4.0, help="steps per second")
    play_cmd.add_argument("--seed", type=int, default=None, help="seed of the game")

    demo = commands.add_parser("demo", help="run a scripted policy and print its statistics")
    demo.add_argument("--policy", choices=("random", "chase"), default="chase")
    demo.add_argument("--episodes", type=_positive_int, default=100)
    demo.add_argument("--num-envs", type=_positive_int, default=16)
    demo.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    demo.add_argument("--seed", type=int, default=0, help="sub-env i gets seed + i")
    demo.add_argument("--show", action="store_true", help="print the board of env 0 every step")
    demo.add_argument(
        "--fps", type=float, default=0.0, help="with --show: frames per second (0 = no delay)"
    )
    return parser


MOVED_CHECK = (
    "python -m fruit_env check has moved: run python -m grpo_trainer check ENV_ID "
    "(the same options; it builds the env as the trainer does)"
)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["check"]:  # whatever follows: the command is the trainer's now
        print(MOVED_CHECK, file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    if args.command == "play":
        return play(fps=args.fps, seed=args.seed)
    try:
        result = run_demo(
            args.policy,
            episodes=args.episodes,
            num_envs=args.num_envs,
            device=args.device,
            seed=args.seed,
            show=args.show,
            fps=args.fps,
        )
    except ValueError as err:  # a bad --device, say: one line, not a traceback
        print(f"fruit_env demo: {err}", file=sys.stderr)
        return 2
    print(
        f"{ENV_ID} demo: policy={args.policy} num_envs={min(args.num_envs, args.episodes)} "
        f"device={args.device} seed={args.seed}"
    )
    print(format_result(result))
    return 0
