"""Fruit Catcher's ceiling: the best catch rate any policy can reach on a set of games.

    python benchmarks/fruit_bound.py                  # the 1000 games `make train` is scored on
    python benchmarks/fruit_bound.py --episodes 300 --seed 0

Why it can be computed. Where the fruits fall does not depend on the basket: spawns depend on
the fruits alone, and every random draw comes from the game's seed and step. So a game's
landings (step and column) are fixed by its seed, and only which of them the basket catches
is the policy's. With the landings known in advance, dynamic programming over (step, basket
column, score) finds the basket path that does best; no policy, which cannot see the future,
does better on the same games. The score matters because a game ends at +30 or -30, which
decides which landings count.

What "catch rate" means here: caught / (caught + missed), summed over all games, the ratio
`python -m grpo_trainer eval` and the evaluation during training report (`make train`'s
final line is this number over the default 1000 games). A game's landings depend on its path only
through an early end, so the games cannot be maximised one at a time for a pooled ratio;
Dinkelbach's method does it exactly: for a ratio lambda = q / p, each game maximises
p * caught - q * landed (integers), and lambda is raised to the ratio of the paths found
until no path does better. The mean of the games' own rates (each game's best ratio, by the
same method per game) is reported too.

How it is checked. Each game's best path is replayed in the env (`gymnasium.make_vec
("FruitCatcher-v0")`, the default rules): the caught and missed fruit it reports must equal
the program's, game by game, which also tests the premise above. Then all the paths are
played through `grpo_trainer`'s own `evaluate` on the games it plays for `--episodes` and
`--seed`: its catch rate must equal the bound. The landings are read from the feature
observations of each game played with the basket held still, in an env whose win and lose
scores are out of reach (the fruits do not depend on them either; the replay checks that
too). The chase and random policies of `python -m fruit_env demo` are scored on the same
games for reference. Results go to benchmarks/results/fruit_bound.json.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info, write_result

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from fruit_env import FruitParams

LEFT, STAY, RIGHT = 0, 1, 2
UNREACHABLE = 1 << 30  # win/lose scores no game reaches: the probe plays every step
MAX_EVAL_ENVS = 1024  # grpo_trainer's evaluate plays at most this many games per round


class Landings(NamedTuple):
    """Every game's fruit landings, fixed by its seed, and where its basket starts."""

    caught_at: np.ndarray  # (G, T, B) int: [g, t, b] of the fruit landing on step t + 1, those
    #                        a basket with its left edge at b catches
    landed: np.ndarray  # (G, T) int: [g, t] the fruit landing on step t + 1
    start: np.ndarray  # (G,) int: the basket's left edge at reset


class Paths(NamedTuple):
    """A basket path per game and what it scores."""

    actions: np.ndarray  # (G, T) int: 0 left, 1 stay, 2 right (after the game ends: stay)
    caught: np.ndarray  # (G,) int
    missed: np.ndarray  # (G,) int
    steps: np.ndarray  # (G,) int: the step the game ends on


def eval_seeds(episodes: int, seed: int) -> list[int]:
    """The seeds of the games `evaluate(policy, envs, episodes, seed=seed)` plays on an eval
    env of min(episodes, 1024) sub-envs: round r gives sub-env i the seed
    seed + (r + 1) * num_envs + i. (The replay through evaluate checks this.)"""
    num_envs = min(episodes, MAX_EVAL_ENVS)
    seeds: list[int] = []
    for r in range(math.ceil(episodes / num_envs)):
        take = min(num_envs, episodes - r * num_envs)
        seeds += [seed + (r + 1) * num_envs + i for i in range(take)]
    return seeds


def read_landings(seeds: list[int], params: FruitParams) -> Landings:
    """Play each game with the basket held still, scores out of reach, for its whole length,
    and read the landings off the feature observations: a fruit one row above the basket's
    row lands on the next step."""
    p = params
    if p.obs_mode != "features":
        raise ValueError("the landings are read from feature observations")
    envs = gym.make_vec(
        "FruitCatcher-v0",
        num_envs=len(seeds),
        win_score=UNREACHABLE,
        lose_score=-UNREACHABLE,
        **_rules(p, "win_score", "lose_score"),
    )
    obs, _ = envs.reset(seed=seeds)
    x_max, y_max = p.width - 1, p.height - 1
    start = np.rint(obs[:, 0].numpy() * x_max - (p.basket_width - 1) / 2).astype(np.int64)
    positions = p.max_basket_x + 1
    caught_at = np.zeros((len(seeds), p.max_episode_steps, positions), dtype=np.int64)
    landed = np.zeros((len(seeds), p.max_episode_steps), dtype=np.int64)
    lefts = np.arange(positions)
    stay = torch.full((len(seeds),), STAY)
    for t in range(p.max_episode_steps):
        fruits = obs[:, 1:].numpy().reshape(len(seeds), p.max_fruits, 3)
        x = np.rint(fruits[..., 0] * x_max).astype(np.int64)
        y = np.rint(fruits[..., 1] * y_max).astype(np.int64)
        lands = (fruits[..., 2] > 0.5) & (y == p.height - 2)  # (G, S)
        landed[:, t] = lands.sum(1)
        inside = (x[:, :, None] >= lefts) & (x[:, :, None] < lefts + p.basket_width)
        caught_at[:, t] = (lands[:, :, None] & inside).sum(1)
        obs, *_ = envs.step(stay)
    envs.close()
    return Landings(caught_at, landed, start)


def best_paths(
    games: Landings, params: FruitParams, p: np.ndarray, q: np.ndarray, chunk: int = 100
) -> tuple[Paths, np.ndarray]:
    """Each game's path maximising p * caught - q * landed (p, q: integers per game), and
    that value. Dynamic programming backwards over steps, on (basket, score); the score
    ends the game at win_score or lose_score. Ties go to staying, then left, then right."""
    out = [
        _best_paths_chunk(_take(games, sl), params, p[sl], q[sl])
        for sl in (slice(i, i + chunk) for i in range(0, len(games.start), chunk))
    ]
    paths = Paths(*(np.concatenate([o[0][k] for o in out]) for k in range(len(Paths._fields))))
    return paths, np.concatenate([o[1] for o in out])


def _take(games: Landings, sl: slice) -> Landings:
    return Landings(games.caught_at[sl], games.landed[sl], games.start[sl])


def _best_paths_chunk(
    games: Landings, params: FruitParams, p: np.ndarray, q: np.ndarray
) -> tuple[Paths, np.ndarray]:
    win, lose = params.win_score, params.lose_score
    n, steps, positions = games.caught_at.shape
    scores = win - lose - 1  # the scores a game goes on with: lose + 1 .. win - 1
    score_of = np.arange(scores) + lose + 1
    pp, qq = p.reshape(n, 1), q.reshape(n, 1)
    value = np.zeros((n, positions, scores), dtype=np.int64)  # after the last step: nothing
    choice = np.empty((steps, n, positions, scores), dtype=np.int8)
    left = np.maximum(np.arange(positions) - 1, 0)
    right = np.minimum(np.arange(positions) + 1, positions - 1)
    for t in range(steps - 1, -1, -1):
        c = games.caught_at[:, t]  # (n, B): caught if the basket moves to b on step t + 1
        k = games.landed[:, t : t + 1]  # (n, 1)
        gain = pp * c - qq * k  # (n, B)
        after = score_of + (2 * c - k)[:, :, None]  # (n, B, S): the score after the step
        goes_on = (after > lose) & (after < win)
        index = np.clip(after - lose - 1, 0, scores - 1)
        later = np.take_along_axis(value, index, axis=2) * goes_on
        reach = gain[:, :, None] + later  # (n, B, S): the value of moving to b
        options = np.stack([reach[:, left], reach, reach[:, right]])  # left, stay, right
        order = np.argmax(options[[STAY, LEFT, RIGHT]], axis=0)  # first best in this order
        choice[t] = np.array([STAY, LEFT, RIGHT], dtype=np.int8)[order]
        value = np.max(options, axis=0)
    rows = np.arange(n)
    best = value[rows, games.start, -lose - 1]  # score 0 at the start

    basket, score = games.start.copy(), np.zeros(n, dtype=np.int64)
    alive = np.ones(n, dtype=bool)
    actions = np.full((n, steps), STAY, dtype=np.int64)
    caught, missed = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    ended = np.full(n, steps, dtype=np.int64)
    for t in range(steps):
        a = np.where(alive, choice[t, rows, basket, score - lose - 1], STAY)
        basket = np.clip(basket + a - 1, 0, positions - 1)
        c = games.caught_at[rows, t, basket] * alive
        m = games.landed[:, t] * alive - c
        caught, missed, score = caught + c, missed + m, score + c - m
        actions[:, t] = a
        over = alive & ((score >= win) | (score <= lose))
        ended[over] = t + 1
        alive &= ~over
        score = np.clip(score, lose + 1, win - 1)  # ended games: any index; they stay put
    if not np.array_equal(p * caught - q * (caught + missed), best):
        raise AssertionError("the forward pass does not score what the program found")
    return Paths(actions, caught, missed, ended), best


def most_caught(games: Landings, params: FruitParams) -> Paths:
    """Each game's path that catches the most fruit (where Dinkelbach's iteration starts)."""
    n = len(games.start)
    return best_paths(games, params, np.ones(n, dtype=np.int64), np.zeros(n, dtype=np.int64))[0]


def pooled_bound(games: Landings, params: FruitParams, start: Paths) -> tuple[Paths, int]:
    """The paths with the largest pooled catch rate, and the iterations it took: lambda is
    the pooled ratio of the latest paths, until no paths beat it (their value sums to 0)."""
    paths, n = start, len(games.start)
    for iteration in range(1, 100):
        caught, landed = int(paths.caught.sum()), int((paths.caught + paths.missed).sum())
        paths, value = best_paths(games, params, np.full(n, landed), np.full(n, caught))
        if value.sum() == 0:  # lambda is the best ratio, and these paths reach it
            return paths, iteration
    raise RuntimeError("Dinkelbach's iteration did not settle")


def per_game_bound(games: Landings, params: FruitParams, start: Paths) -> Paths:
    """Each game's path with its own largest catch rate: the same iteration, game by game."""
    paths = start
    for _ in range(100):
        landed = np.maximum(paths.caught + paths.missed, 1)
        paths, value = best_paths(games, params, landed, paths.caught)
        if (value == 0).all():
            return paths
    raise RuntimeError("Dinkelbach's iteration did not settle")


def play(
    seeds: list[int], act: Callable[[int, torch.Tensor], torch.Tensor], params: FruitParams
) -> tuple[np.ndarray, np.ndarray]:
    """Caught and missed fruit of each game's first episode, played by `act(step, obs)` in
    the env with the given rules."""
    envs = gym.make_vec("FruitCatcher-v0", num_envs=len(seeds), **_rules(params))
    obs, _ = envs.reset(seed=seeds)
    caught = np.full(len(seeds), -1, dtype=np.int64)
    missed = np.full(len(seeds), -1, dtype=np.int64)
    for t in range(params.max_episode_steps):
        obs, _, _, _, info = envs.step(act(t, obs))
        ended = info["_episode"].numpy() & (caught < 0)
        caught[ended] = info["episode"]["caught"].numpy()[ended]
        missed[ended] = info["episode"]["missed"].numpy()[ended]
    envs.close()
    if (caught < 0).any():
        raise AssertionError("a game did not end within max_episode_steps")
    return caught, missed


def replay(seeds: list[int], paths: Paths, params: FruitParams) -> tuple[np.ndarray, np.ndarray]:
    actions = torch.as_tensor(paths.actions)
    return play(seeds, lambda t, _: actions[:, t], params)


class ReplayPolicy(torch.nn.Module):
    """Plays fixed action sequences, one step per call, as a `grpo_trainer` policy."""

    def __init__(self, actions: np.ndarray) -> None:
        super().__init__()
        self.actions = torch.as_tensor(actions)
        self.step = 0
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # evaluate reads the device off it

    def act(self, obs: torch.Tensor, greedy: bool = True, generator: Any = None) -> torch.Tensor:
        column = self.actions[:, min(self.step, self.actions.shape[1] - 1)]
        self.step += 1
        return column


def evaluate_paths(paths: Paths, episodes: int, seed: int) -> float | None:
    """The catch rate `grpo_trainer`'s evaluate reports for these paths on its games (one
    round of sub-envs only: a policy cannot tell the rounds apart)."""
    from grpo_trainer.run.evaluation import evaluate

    if episodes > MAX_EVAL_ENVS:
        return None
    envs = gym.make_vec("FruitCatcher-v0", num_envs=episodes)
    result = evaluate(ReplayPolicy(paths.actions), envs, episodes, seed=seed)
    envs.close()
    return result["catch_rate"]


def _rules(params: FruitParams, *leave_out: str) -> dict[str, Any]:
    """The rules as make_vec keyword arguments (its time limit is the env's own)."""
    fields = params.__dataclass_fields__
    return {k: getattr(params, k) for k in fields if k not in leave_out}


def rate(caught: np.ndarray, missed: np.ndarray) -> float:
    return float(caught.sum() / (caught + missed).sum())


def chase_and_random(seeds: list[int], params: FruitParams) -> dict[str, float]:
    """The demo's scripted policies on the same games, for reference."""
    from fruit_env.cli import chase_policy, random_policy

    rand = random_policy(len(seeds), torch.device("cpu"), seed=0)
    return {
        "chase": rate(*play(seeds, lambda _, obs: chase_policy(obs), params)),
        "random": rate(*play(seeds, lambda _, obs: rand(obs), params)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1000, help="games (as eval --episodes)")
    parser.add_argument(
        "--seed", type=int, default=12345, help="as eval --seed (default: eval's own)"
    )
    parser.add_argument("--name", default="fruit_bound", help="results file stem")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error("--episodes must be positive")
    torch.set_num_threads(1)
    params = FruitParams()
    start = time.perf_counter()
    seeds = eval_seeds(args.episodes, args.seed)
    games = read_landings(seeds, params)
    most = most_caught(games, params)
    paths, iterations = pooled_bound(games, params, most)
    own = per_game_bound(games, params, most)
    solve_s = time.perf_counter() - start

    caught, missed = replay(seeds, paths, params)
    if not (np.array_equal(caught, paths.caught) and np.array_equal(missed, paths.missed)):
        bad = np.flatnonzero((caught != paths.caught) | (missed != paths.missed))
        raise AssertionError(f"the env replays games {bad[:10].tolist()} differently")
    bound = rate(paths.caught, paths.missed)
    via_evaluate = evaluate_paths(paths, args.episodes, args.seed)
    if via_evaluate is not None and not math.isclose(via_evaluate, bound, rel_tol=1e-6):
        raise AssertionError(
            f"grpo_trainer's evaluate scores the paths {via_evaluate}, not {bound}"
        )
    landed = paths.caught + paths.missed
    result = {
        "episodes": args.episodes,
        "seed": args.seed,
        "games": "the games `python -m grpo_trainer eval --episodes N --seed S` plays: "
        "sub-env i of round r reset with seed S + (r + 1) * min(N, 1024) + i",
        "rules": _rules(params),
        "definition": "catch rate = total caught / total landed over all games (pooled), as "
        "grpo_trainer's evaluation reports it",
        "bound_catch_rate": round(bound, 6),
        "caught": int(paths.caught.sum()),
        "landed": int(landed.sum()),
        "games_ended_early": int((paths.steps < params.max_episode_steps).sum()),
        "most_caught_paths_catch_rate": round(rate(most.caught, most.missed), 6),
        "per_game_mean_bound": round(float(np.mean(own.caught / (own.caught + own.missed))), 6),
        "dinkelbach_iterations": iterations,
        "replayed_in_env": "every game's caught and missed equal the program's",
        "evaluate_catch_rate": via_evaluate,
        "scripted_policies_catch_rate": chase_and_random(seeds, params),
        "solve_s": round(solve_s, 2),
        "per_game": {"caught": paths.caught.tolist(), "landed": landed.tolist()},
        "machine": machine_info(),
    }
    path = write_result(args.name, result)
    print(
        f"bound: catch rate {bound:.4f} over {args.episodes} games "
        f"({result['caught']} of {result['landed']}); per-game mean "
        f"{result['per_game_mean_bound']:.4f}; chase "
        f"{result['scripted_policies_catch_rate']['chase']:.4f} -> {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
