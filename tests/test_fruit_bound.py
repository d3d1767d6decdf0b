"""benchmarks/fruit_bound.py, Fruit Catcher's ceiling: the program's best paths replay in the
env to the value it computed, they catch as much as an independent search over the same
landings finds, the trainer's evaluation scores them at the bound, and scripted policies
never beat it on the same games."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from loading import load_module

from fruit_env import FruitParams
from fruit_env.cli import chase_policy, random_policy

ROOT = Path(__file__).resolve().parents[1]
SEEDS = [12345 + 12 + i for i in range(12)]  # what evaluate(..., 12, seed=12345) plays


@pytest.fixture(scope="module")
def bound() -> Any:
    return load_module(ROOT / "benchmarks" / "fruit_bound.py", "fruit_bound_benchmark")


def most_caught_by_search(games: Any, g: int, params: FruitParams) -> int:
    """The most fruit game `g` lets a basket catch, by a plain forward search over every
    reachable (basket, score) state: written apart from the benchmark's program."""
    positions = params.max_basket_x + 1
    states, ended_best = {(int(games.start[g]), 0): 0}, 0
    for t in range(params.max_episode_steps):
        landed = int(games.landed[g, t])
        following: dict[tuple[int, int], int] = {}
        for (basket, score), total in states.items():
            for move in (-1, 0, 1):
                b = min(max(basket + move, 0), positions - 1)
                caught = int(games.caught_at[g, t, b])
                after, now = score + 2 * caught - landed, total + caught
                if after >= params.win_score or after <= params.lose_score:
                    ended_best = max(ended_best, now)
                else:
                    following[(b, after)] = max(following.get((b, after), -1), now)
        states = following
    return max([ended_best, *states.values()])


@pytest.mark.parametrize("rules", [{}, {"win_score": 6, "lose_score": -4}])
def test_best_paths_replay_to_their_value_and_catch_the_most(
    bound: Any, rules: dict[str, int]
) -> None:
    params = FruitParams(**rules)  # small scores: games end early, on the path's own score
    games = bound.read_landings(SEEDS, params)
    most = bound.most_caught(games, params)
    paths, _ = bound.pooled_bound(games, params, most)
    for found in (most, paths):
        caught, missed = bound.replay(SEEDS, found, params)
        assert caught.tolist() == found.caught.tolist()
        assert missed.tolist() == found.missed.tolist()
    for g in range(3):
        assert most.caught[g] == most_caught_by_search(games, g, params)
    assert bound.rate(paths.caught, paths.missed) >= bound.rate(most.caught, most.missed)
    if rules:
        assert (paths.steps < params.max_episode_steps).any()  # the early ends were exercised


def test_the_trainers_evaluation_scores_the_paths_at_the_bound(bound: Any) -> None:
    assert bound.eval_seeds(12, 12345) == SEEDS
    assert bound.eval_seeds(1030, 0)[1023:1025] == [2047, 2048]  # round 2 starts at 2 * 1024
    params = FruitParams()
    games = bound.read_landings(SEEDS, params)
    paths, _ = bound.pooled_bound(games, params, bound.most_caught(games, params))
    expected = bound.rate(paths.caught, paths.missed)
    assert bound.evaluate_paths(paths, len(SEEDS), 12345) == pytest.approx(expected, rel=1e-6)


def test_scripted_policies_never_beat_the_bound(bound: Any) -> None:
    params = FruitParams()
    games = bound.read_landings(SEEDS, params)
    most = bound.most_caught(games, params)
    pooled, _ = bound.pooled_bound(games, params, most)
    own = bound.per_game_bound(games, params, most)
    ceiling = bound.rate(pooled.caught, pooled.missed)
    own_rates = own.caught / (own.caught + own.missed)
    rand = random_policy(len(SEEDS), torch.device("cpu"), seed=3)
    for act in (lambda _, obs: chase_policy(obs), lambda _, obs: rand(obs)):
        caught, missed = bound.play(SEEDS, act, params)
        assert bound.rate(caught, missed) <= ceiling
        assert (caught <= most.caught).all()
        assert (caught / (caught + missed) <= own_rates + 1e-12).all()
    assert float(np.mean(own_rates)) >= float(
        np.mean(pooled.caught / (pooled.caught + pooled.missed))
    )
