"""The rules of Fruit Catcher, one hand-built scenario at a time.

Each test builds a `FruitState` by hand (or plants one in a vector env through `env.state`)
and checks one rule of docs/env.md exactly, on the readable rules (`rules.FruitCatcher`) or
through the env. Spawning is made predictable with `spawn_prob` 0.0 / 1.0 and by computing
the column from the documented hash in `kit.rng`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from fruit_env import FruitCatcherVectorEnv, FruitParams
from fruit_env.games.fruit_catcher import params as rules_params
from fruit_env.games.fruit_catcher.env import FruitState
from fruit_env.games.fruit_catcher.rules import FruitCatcher
from fruit_env.kit import Step, rng

Fruit = tuple[int, int] | None  # (column, row) of an active slot, None for an empty slot


def make_state(
    params: FruitParams,
    games: Sequence[dict[str, object]],
) -> FruitState:
    """A batch of hand-built games. Each game is a dict with `basket` and `fruits` (one entry
    per slot, or fewer: the rest are empty) and optional score/t/caught/missed/key/counter."""
    slots = params.max_fruits
    fruit_x, fruit_y, active = [], [], []
    for game in games:
        fruits: list[Fruit] = list(game["fruits"])  # type: ignore[call-overload]
        fruits += [None] * (slots - len(fruits))
        fruit_x.append([0 if f is None else f[0] for f in fruits])
        fruit_y.append([0 if f is None else f[1] for f in fruits])
        active.append([f is not None for f in fruits])

    def column(name: str, default: int = 0, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.tensor([int(g.get(name, default)) for g in games], dtype=dtype)  # type: ignore[call-overload]

    return FruitState(
        basket=column("basket"),
        fruit_x=torch.tensor(fruit_x, dtype=torch.int32),
        fruit_y=torch.tensor(fruit_y, dtype=torch.int32),
        active=torch.tensor(active, dtype=torch.bool),
        score=column("score"),
        t=column("t"),
        caught=column("caught"),
        missed=column("missed"),
        key=column("key", 12345, torch.int64),
        counter=column("counter", 7, torch.int64),
    )


def step(params: FruitParams, state: FruitState, action: torch.Tensor) -> tuple[FruitState, Step]:
    """One step of the readable rules, drawing from each game's key and counter (which
    advances, as the env's does)."""
    bits = rng.draw(state.key, state.counter)
    result = FruitCatcher(params).advance(state.board, action.to(torch.int32), bits)
    return FruitState.of(result.state, state.key, state.counter + 1), result


def reset(params: FruitParams, state: FruitState, mask: torch.Tensor) -> FruitState:
    """A new game where `mask` holds, drawn from the current counter (which advances there)."""
    bits = rng.draw(state.key, state.counter)
    board = FruitCatcher(params).restart(state.board, mask, bits)
    return FruitState.of(board, state.key, state.counter + mask)


def features(params: FruitParams, state: FruitState) -> torch.Tensor:
    return FruitCatcher(params).features(state.board)


def step_one(params: FruitParams, action: int = 1, **game: object) -> tuple[FruitState, Step]:
    """Step a single hand-built game with one action."""
    state = make_state(params, [game])
    return step(params, state, torch.tensor([action]))


def fruits_of(state: FruitState, env: int = 0) -> list[Fruit]:
    """The slots of one game as (column, row) or None, for readable assertions."""
    xs, ys, act = state.fruit_x[env].tolist(), state.fruit_y[env].tolist(), state.active[env]
    return [(x, y) if a else None for x, y, a in zip(xs, ys, act.tolist(), strict=True)]


def spawn_column(params: FruitParams, key: int, counter: int) -> int:
    """The column the rules promise for a fruit drawn with (key, counter)."""
    return int(rules_params.column(rng.draw(key, counter), params.width))


# A small board: columns 0..6, rows 0..5 (row 5 is the basket row), basket 3 wide.
SMALL = FruitParams(width=7, height=6, basket_width=3, spawn_prob=0.0)


# -- catching and missing --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "reward"),
    [(0, -1), (1, -1), (2, 1), (3, 1), (4, 1), (5, -1), (6, -1)],
)
def test_fruit_reaching_bottom_scores_by_basket_cover(column: int, reward: int) -> None:
    """A fruit entering the bottom row scores +1 inside the basket's columns 2..4, else -1,
    and its slot is emptied (x = y = 0)."""
    # Slot 0 is one row above the bottom; slot 1 keeps a fruit falling so nothing spawns.
    state, result = step_one(SMALL, basket=2, fruits=[(column, 4), (6, 1)])
    assert result.reward.tolist() == [float(reward)]
    assert fruits_of(state) == [None, (6, 2), None]
    assert state.fruit_x[0, 0] == 0 and state.fruit_y[0, 0] == 0
    assert (state.caught.item(), state.missed.item()) == ((1, 0) if reward > 0 else (0, 1))
    assert state.score.item() == reward


@pytest.mark.parametrize(
    ("action", "column", "reward"),
    [
        (0, 1, 1),  # basket 2 -> 1 covers 1..3 before the fruit lands: caught
        (0, 4, -1),  # ... and no longer covers 4: missed
        (2, 5, 1),  # basket 2 -> 3 covers 3..5
        (2, 2, -1),
    ],
)
def test_basket_moves_before_fruit_lands(action: int, column: int, reward: int) -> None:
    """The catch is judged against the basket position after this step's move."""
    state, result = step_one(SMALL, action, basket=2, fruits=[(column, 4), (0, 0)])
    assert state.basket.item() == 2 + action - 1
    assert result.reward.item() == reward


def test_fruits_fall_one_row_per_step_without_scoring() -> None:
    """Fruits above the second-to-last row just move down one row; nothing scores."""
    state, result = step_one(SMALL, basket=2, fruits=[(3, 0), None, (1, 3)])
    assert fruits_of(state) == [(3, 1), None, (1, 4)]
    assert result.reward.item() == 0.0
    assert state.caught.item() == 0 and state.missed.item() == 0


def test_step_advances_time_and_counter_and_keeps_key() -> None:
    """One step: t + 1, random counter + 1, key unchanged, score/caught/missed accumulate."""
    state, _ = step_one(
        SMALL, basket=2, fruits=[(3, 4), (0, 1)], score=-2, t=9, caught=3, missed=5, counter=41
    )
    assert state.t.item() == 10
    assert state.counter.item() == 42
    assert state.key.item() == 12345
    assert (state.score.item(), state.caught.item(), state.missed.item()) == (-1, 4, 5)


# -- basket clamping --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("basket", "action", "expected"),
    [
        (0, 0, 0),  # left edge: cannot move further left
        (0, 1, 0),
        (0, 2, 1),
        (2, 0, 1),
        (2, 2, 3),
        (4, 0, 3),
        (4, 1, 4),
        (4, 2, 4),  # right edge: left edge 4 + width 3 = column 7 = board width
    ],
)
def test_basket_moves_and_is_clamped(basket: int, action: int, expected: int) -> None:
    """Actions move the basket by -1/0/+1, clamped to [0, width - basket_width] = [0, 4]."""
    state, _ = step_one(SMALL, action, basket=basket, fruits=[(0, 0)])
    assert state.basket.item() == expected


def test_full_width_basket_never_moves() -> None:
    """With basket_width == width the basket has exactly one position, 0, and catches all."""
    params = FruitParams(width=4, height=3, basket_width=4, spawn_prob=0.0)
    for action in (0, 1, 2):
        state, result = step_one(params, action, basket=0, fruits=[(3, 1), (0, 0)])
        assert state.basket.item() == 0
        assert result.reward.item() == 1.0


def test_env_basket_walks_to_each_edge_and_stays() -> None:
    """In the vector env, 20 lefts then 20 rights pin the basket at 0 then at width - bw."""
    env = FruitCatcherVectorEnv(2, width=9, basket_width=2)
    env.reset(seed=3)
    start = 7 // 2  # new games centre the basket: max_basket_x // 2 with max_basket_x = 7
    assert env.state.basket.tolist() == [start, start]
    expected = start
    for action in [0] * 20 + [2] * 20:
        env.step(np.full(2, action))
        expected = min(max(expected + action - 1, 0), 7)
        assert env.state.basket.tolist() == [expected, expected]
    assert expected == 7


# -- spawning ----------------------------------------------------------------------------------

GAP = FruitParams(width=7, height=10, max_fruits=3, min_fruits=1, spawn_prob=1.0, min_spawn_gap=3)


@pytest.mark.parametrize(("row", "spawns"), [(0, False), (1, False), (2, True), (3, True)])
def test_random_spawn_waits_for_gap(row: int, spawns: bool) -> None:
    """With spawn_prob=1, a fruit spawns only once the highest fruit (after falling) is at
    least min_spawn_gap=3 rows down: a fruit at row 1 falls to 2 (no), at row 2 to 3 (yes)."""
    state, _ = step_one(GAP, fruits=[(5, row)], key=99, counter=12)
    expected_new = (spawn_column(GAP, 99, 12), 0) if spawns else None
    assert fruits_of(state) == [(5, row + 1), expected_new, None]


@pytest.mark.parametrize(("rows", "spawns"), [((6, 1), False), ((6, 2), True), ((1, 6), False)])
def test_spawn_gap_is_measured_from_the_highest_fruit(rows: tuple[int, int], spawns: bool) -> None:
    """The gap rule looks at the highest (smallest-row) fruit, whichever slot holds it."""
    state, _ = step_one(GAP, fruits=[(1, rows[0]), (2, rows[1])], key=5, counter=0)
    assert state.active[0].sum().item() == (3 if spawns else 2)
    if spawns:
        assert fruits_of(state)[2] == (spawn_column(GAP, 5, 0), 0)


def test_zero_gap_spawns_every_step_until_max() -> None:
    """min_spawn_gap=0 and spawn_prob=1: one new fruit per step until max_fruits=3 fall."""
    params = FruitParams(width=7, height=10, max_fruits=3, spawn_prob=1.0, min_spawn_gap=0)
    state = make_state(params, [{"fruits": [(0, 0)]}])
    counts = []
    for _ in range(4):
        state, _ = step(params, state, torch.tensor([1]))
        counts.append(int(state.active.sum()))
    assert counts == [2, 3, 3, 3]
    assert sorted(state.fruit_y[0].tolist()) == [2, 3, 4]  # spawned at 0 on steps 1 and 2


def test_spawn_prob_zero_never_spawns_above_min() -> None:
    """spawn_prob=0: with min_fruits=1 already falling, no fruit spawns however big the gap."""
    params = FruitParams(width=7, height=20, spawn_prob=0.0, min_spawn_gap=0)
    state = make_state(params, [{"fruits": [(4, 0)]}])
    for row in range(1, 19):
        state, _ = step(params, state, torch.tensor([1]))
        assert fruits_of(state) == [(4, row), None, None]


def test_spawn_decision_uses_16_bit_threshold() -> None:
    """With spawn_prob=0.5 a fruit spawns exactly when the draw's low 16 bits are < 32768;
    over 256 keys both outcomes occur."""
    params = FruitParams(width=7, height=10, spawn_prob=0.5, min_spawn_gap=3)
    keys = list(range(1000, 1256))
    state = make_state(params, [{"fruits": [(2, 5)], "key": k, "counter": 3} for k in keys])
    new_state, _ = step(params, state, torch.ones(len(keys), dtype=torch.int64))
    spawned = new_state.active[:, 1].tolist()
    expected = [rules_params.spawn_bits(rng.draw(k, 3)) < 32768 for k in keys]
    assert spawned == expected
    assert 0 < sum(spawned) < len(keys)


def test_forced_spawn_below_min_fruits_ignores_gap_and_prob() -> None:
    """With spawn_prob=0 and the gap unmet, a fruit still spawns while fewer than
    min_fruits=2 are falling."""
    params = FruitParams(width=7, height=10, min_fruits=2, spawn_prob=0.0, min_spawn_gap=5)
    state, _ = step_one(params, fruits=[(3, 0)], key=7, counter=4)
    assert fruits_of(state) == [(3, 1), (spawn_column(params, 7, 4), 0), None]


def test_forced_spawn_when_last_fruit_lands() -> None:
    """min_fruits=1: when the only fruit lands, a new one spawns in row 0 the same step,
    taking the first free slot (slot 0, which the landed fruit just vacated)."""
    state, result = step_one(SMALL, basket=2, fruits=[(3, 4)], key=11, counter=2)
    assert result.reward.item() == 1.0
    assert fruits_of(state) == [(spawn_column(SMALL, 11, 2), 0), None, None]


def test_no_spawn_at_max_fruits() -> None:
    """All max_fruits=3 slots falling: nothing spawns even with spawn_prob=1 and gap 0."""
    params = FruitParams(width=7, height=10, spawn_prob=1.0, min_spawn_gap=0)
    state, _ = step_one(params, fruits=[(0, 3), (1, 5), (2, 7)])
    assert fruits_of(state) == [(0, 4), (1, 6), (2, 8)]


def test_new_fruit_takes_first_free_slot() -> None:
    """A spawn fills the lowest-index empty slot, here slot 1 between two active ones."""
    params = FruitParams(width=7, height=10, max_fruits=4, spawn_prob=1.0, min_spawn_gap=0)
    state, _ = step_one(params, fruits=[(0, 3), None, (2, 7), None], key=3, counter=9)
    assert fruits_of(state) == [(0, 4), (spawn_column(params, 3, 9), 0), (2, 8), None]


def test_landing_and_spawn_in_same_step_reuse_slot() -> None:
    """A fruit landing frees its slot before the spawn, so the new fruit can take it."""
    params = FruitParams(width=7, height=6, spawn_prob=1.0, min_spawn_gap=0, max_fruits=2)
    state, result = step_one(params, basket=0, fruits=[(6, 4), (1, 2)], key=8, counter=1)
    assert result.reward.item() == -1.0
    assert fruits_of(state) == [(spawn_column(params, 8, 1), 0), (1, 3)]


# -- episode end -------------------------------------------------------------------------------

ENDS = FruitParams(width=7, height=6, spawn_prob=0.0, win_score=2, lose_score=-2)


@pytest.mark.parametrize(
    ("score", "column", "terminated"),
    [
        (1, 3, True),  # 1 + catch = 2 = win_score
        (0, 3, False),
        (-1, 0, True),  # -1 + miss = -2 = lose_score
        (1, 0, False),
        (-1, 3, False),
    ],
)
def test_terminates_at_win_and_lose_score(score: int, column: int, terminated: bool) -> None:
    """terminated is true exactly when the score reaches +win_score or lose_score."""
    state, result = step_one(ENDS, basket=2, fruits=[(column, 4), (0, 0)], score=score)
    assert state.score.item() == score + (1 if 2 <= column <= 4 else -1)
    assert result.terminated.tolist() == [terminated]
    assert result.truncated.tolist() == [False]


@pytest.mark.parametrize(("t", "truncated"), [(0, False), (3, False), (4, True)])
def test_truncates_at_max_episode_steps(t: int, truncated: bool) -> None:
    """truncated is true on the step that brings t to max_episode_steps=5."""
    params = FruitParams(width=7, height=6, spawn_prob=0.0, max_episode_steps=5)
    state, result = step_one(params, basket=2, fruits=[(0, 0)], t=t)
    assert state.t.item() == t + 1
    assert result.truncated.tolist() == [truncated]
    assert result.terminated.tolist() == [False]


def test_terminated_and_truncated_together() -> None:
    """Reaching the win score on the last allowed step sets both flags."""
    params = FruitParams(width=7, height=6, spawn_prob=0.0, win_score=2, max_episode_steps=5)
    _, result = step_one(params, basket=2, fruits=[(3, 4), (0, 0)], score=1, t=4)
    assert (result.terminated.item(), result.truncated.item()) == (True, True)


def test_env_truncates_at_max_episode_steps() -> None:
    """A vector env with max_episode_steps=7 (scores out of reach) truncates every sub-env
    on step 7 and not before, reporting an episode length of 7."""
    env = FruitCatcherVectorEnv(3, max_episode_steps=7, win_score=1000, lose_score=-1000)
    env.reset(seed=0)
    for k in range(1, 8):
        _, _, terminated, truncated, info = env.step(np.array([0, 1, 2]))
        assert not terminated.any()
        assert truncated.tolist() == [k == 7] * 3
        assert info["_episode"].tolist() == [k == 7] * 3
    assert info["episode"]["l"].tolist() == [7, 7, 7]
    env.step(np.array([1, 1, 1]))  # NEXT_STEP: this step starts new games
    assert env.state.t.tolist() == [0, 0, 0]


# -- new games and observations ---------------------------------------------------------------


def test_new_game_layout() -> None:
    """reset with a mask: masked games get a centred basket, one fruit at row 0 in slot 0
    (column from the current counter), zero score/t/caught/missed and counter + 1; the
    unmasked game is untouched."""
    params = FruitParams(width=8, height=6, basket_width=3)  # max_basket_x = 5
    game = {"basket": 0, "fruits": [(1, 2), (6, 4)], "score": 3, "t": 9, "caught": 4}
    state = make_state(params, [{**game, "key": 21, "counter": 5}, {**game, "key": 22}])
    new = reset(params, state, torch.tensor([True, False]))
    assert new.basket.tolist() == [5 // 2, 0]
    assert fruits_of(new, 0) == [(spawn_column(params, 21, 5), 0), None, None]
    assert fruits_of(new, 1) == [(1, 2), (6, 4), None]
    for name in ("score", "t", "caught", "missed"):
        assert getattr(new, name).tolist() == [0, getattr(state, name)[1].item()]
    assert new.counter.tolist() == [6, 7]
    assert new.key.tolist() == [21, 22]


def test_feature_observation_by_hand() -> None:
    """Features: basket centre, then (x, y, active) per slot, each scaled to [0, 1]."""
    params = FruitParams(width=7, height=9, basket_width=3, max_fruits=2)
    state = make_state(params, [{"basket": 0, "fruits": [(6, 2)]}])
    obs = features(params, state).numpy()
    f32 = np.float32
    # centre of a basket at 0..2 is column 1, over x_max = 6; fruit at column 6 row 2 of 0..8
    expected = np.array([[f32(1) / f32(6), 1.0, 0.25, 1.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    assert obs.dtype == np.float32
    assert np.array_equal(obs, expected)


def test_pixel_observation_by_hand() -> None:
    """Pixels: fruit 255, basket (bottom row) 128, empty 0."""
    params = FruitParams(width=5, height=4, basket_width=2, obs_mode="pixels")
    state = make_state(params, [{"basket": 3, "fruits": [(0, 0), (4, 2)]}])
    expected = np.array(
        [
            [255, 0, 0, 0, 0],
            [0, 0, 0, 0, 0],
            [0, 0, 0, 0, 255],
            [0, 0, 0, 128, 128],
        ],
        dtype=np.uint8,
    )
    obs = FruitCatcher(params).pixels(state.board).numpy()
    assert obs.dtype == np.uint8
    assert np.array_equal(obs, expected[None, None])


# -- autoreset semantics of the vector env, on a planted state ---------------------------------


_ENV_RULES = {"width": 7, "height": 6, "spawn_prob": 0.0, "win_score": 2, "lose_score": -2}
assert FruitParams(**_ENV_RULES) == ENDS  # the planted states below are built for ENDS


def planted_env(mode: AutoresetMode) -> FruitCatcherVectorEnv:
    """Two games: game 0 is one catch from winning (score 1 of 2, fruit above the basket);
    game 1 has a fruit falling mid-board."""
    env = FruitCatcherVectorEnv(2, autoreset_mode=mode, **_ENV_RULES)
    env.reset(seed=0)
    env.state = make_state(
        ENDS,
        [
            {"basket": 2, "fruits": [(3, 4), (5, 1)], "score": 1, "t": 6, "caught": 3,
             "missed": 2, "key": 40, "counter": 10},
            {"basket": 1, "fruits": [(0, 1)], "t": 6, "key": 41, "counter": 10},
        ],
    )  # fmt: skip
    return env


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_terminal_step_reports_episode(mode: AutoresetMode) -> None:
    """The winning step reports reward 1, terminated, `_episode` and the episode's
    return 2, length 7, caught 4, missed 2 (planted values plus this step)."""
    env = planted_env(mode)
    _, reward, terminated, truncated, info = env.step(np.array([1, 1]))
    assert reward.tolist() == [1.0, 0.0]
    assert terminated.tolist() == [True, False]
    assert truncated.tolist() == [False, False]
    assert info["_episode"].tolist() == [True, False]
    episode = info["episode"]
    assert (episode["r"][0].item(), episode["l"][0].item()) == (2.0, 7)
    assert (episode["caught"][0].item(), episode["missed"][0].item()) == (4, 2)


def test_next_step_mode_restarts_on_following_step() -> None:
    """NEXT_STEP: the terminal observation is returned as obs; the next step starts a new
    game, ignores the action, and reports reward 0 and no termination."""
    env = planted_env(AutoresetMode.NEXT_STEP)
    obs, *_ = env.step(np.array([1, 1]))
    assert obs[0, 0].item() == np.float32(3) / np.float32(6)  # basket at 2: centre column 3
    assert env.state.score[0].item() == 2
    obs, reward, terminated, truncated, info = env.step(np.array([0, 1]))
    assert reward.tolist() == [0.0, 0.0]
    assert terminated.tolist() == [False, False]
    assert truncated.tolist() == [False, False]
    assert info["_episode"].tolist() == [False, False]
    state = env.state
    assert state.basket[0].item() == 4 // 2  # centred, the "left" action ignored
    assert (state.score[0].item(), state.t[0].item(), state.caught[0].item()) == (0, 0, 0)
    # new game drawn from the counter before this step (10 + 1 from the terminal step)
    assert fruits_of(state, 0) == [(spawn_column(ENDS, 40, 11), 0), None, None]
    assert state.counter[0].item() == 12
    assert fruits_of(state, 1) == [(0, 3), None, None]  # game 1 kept playing
    assert np.array_equal(obs.numpy(), features(ENDS, state).numpy())


def test_same_step_mode_restarts_at_once() -> None:
    """SAME_STEP: obs already shows the new game; the terminal observation is in
    info["final_obs"], flagged by info["_final_obs"]."""
    env = planted_env(AutoresetMode.SAME_STEP)
    obs, _, terminated, _, info = env.step(np.array([1, 1]))
    assert terminated.tolist() == [True, False]
    assert info["_final_obs"].tolist() == [True, False]
    state = env.state
    assert (state.score[0].item(), state.t[0].item(), state.basket[0].item()) == (0, 0, 2)
    assert fruits_of(state, 0) == [(spawn_column(ENDS, 40, 11), 0), None, None]
    assert np.array_equal(obs.numpy(), features(ENDS, state).numpy())
    final = info["final_obs"][0].numpy()
    # terminal game: basket 2 (centre 3/6), fruit slot 0 caught, fruit (5, 1) now at row 2
    f32 = np.float32
    expected = np.array(
        [f32(3) / f32(6), 0, 0, 0, f32(5) / f32(6), f32(2) / f32(5), 1, 0, 0, 0], dtype=np.float32
    )
    assert np.array_equal(final, expected)


def test_disabled_mode_keeps_state_until_masked_reset() -> None:
    """DISABLED: nothing restarts by itself; reset(options={"reset_mask": m}) restarts only
    the masked sub-envs and leaves the others exactly as they were."""
    env = planted_env(AutoresetMode.DISABLED)
    env.step(np.array([1, 1]))
    assert env.state.score[0].item() == 2
    assert env.state.t.tolist() == [7, 7]
    before = env.state
    obs, info = env.reset(options={"reset_mask": np.array([True, False])})
    assert info == {}
    after = env.state
    assert (after.score[0].item(), after.t[0].item()) == (0, 0)
    assert fruits_of(after, 0) == [(spawn_column(ENDS, 40, 11), 0), None, None]
    for name in FruitState._fields:
        assert torch.equal(getattr(after, name)[1], getattr(before, name)[1]), name
    assert np.array_equal(obs.numpy(), features(ENDS, after).numpy())
