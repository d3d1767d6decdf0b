"""The rules' eager form (`eager.PackedFruitCatcher`, what the env runs when it does not
compile) is the readable rules (`rules.FruitCatcher`), bit for bit, on every output of the
kit's step in every autoreset mode and of its reset; the readable pixels are the picture
the rules describe.

States are drawn at random among those that the eager form assumes (its docstring): inactive
slots at x = y = 0, active fruits on the board above the bottom row, the basket on the board,
0/1 flags. That is more than the rules reach (test_env_properties checks that every reachable
state has these properties): two fruits may share a row, no fruit may fall, statistics and
counters take any value. Each example runs a few steps from its state with random actions,
in every autoreset mode and observation mode, and a masked reset.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from gymnasium.vector import AutoresetMode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import rule_sets

from fruit_env import FruitCatcherVectorEnv, FruitParams
from fruit_env.games.fruit_catcher.rules import FruitCatcher
from fruit_env.kit import autoreset, rng
from fruit_env.kit.autoreset import Running, Transition
from fruit_env.kit.layout import Layout, Packed

MODES = list(AutoresetMode)
CPU = torch.device("cpu")
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def states(draw: st.DrawFn, params: FruitParams, num_envs: int) -> tuple[torch.Tensor, ...]:
    """Packed rows (the board's, then the pending row), keys and counters that the eager form
    may assume."""
    p = params
    columns = []
    for _ in range(num_envs):
        slots = []
        for _ in range(p.max_fruits):
            if draw(st.booleans()):
                slots.append(
                    (draw(st.integers(0, p.width - 1)), draw(st.integers(0, p.height - 2)), 1)
                )
            else:
                slots.append((0, 0, 0))
        xs, ys, actives = zip(*slots, strict=True)
        stats = [draw(st.integers(-(2**20), 2**20)) for _ in range(4)]
        stats[1] = draw(st.integers(0, p.max_episode_steps + 3))  # t
        stats[0] = draw(st.sampled_from([p.win_score, p.lose_score, 0]) | st.integers(-50, 50))
        columns.append(
            [
                draw(st.integers(0, p.max_basket_x)),
                *xs,
                *ys,
                *actives,
                *stats,
                draw(st.integers(0, 1)),
            ]
        )
    state = torch.tensor(columns, dtype=torch.int32).T.contiguous()
    keys = torch.tensor(
        [draw(st.integers(0, 2**32 - 1)) for _ in range(num_envs)], dtype=torch.int64
    )
    counters = torch.tensor(
        [draw(st.integers(0, 2**40)) for _ in range(num_envs)], dtype=torch.int64
    )
    return state, keys, counters


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    rules = draw(rule_sets(max_width=9, max_height=8, max_score=5, max_steps=12))
    params = FruitParams(**rules)
    num_envs = draw(st.integers(1, 5))
    steps = draw(st.integers(1, 4))
    actions = torch.tensor(
        draw(
            st.lists(
                st.lists(st.integers(0, 2), min_size=num_envs, max_size=num_envs),
                min_size=steps,
                max_size=steps,
            )
        )
    )
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=num_envs, max_size=num_envs)))
    return {
        "params": params,
        "mode": draw(st.sampled_from(MODES)),
        "state": draw(states(params, num_envs)),
        "actions": actions.to(torch.int32),  # what the env's action check hands the step
        "mask": mask,
    }


def layout_of(params: FruitParams) -> Layout:
    return Layout(FruitCatcher(params).initial(torch.zeros(1, dtype=torch.int64)))


def assert_transition_equal(got: Transition, expected: Transition, layout: Layout) -> None:
    """Every output of the eager form's step equals the readable rules', dtype included."""
    pairs = [
        ("board", layout.pack(got.running.game), layout.pack(expected.running.game)),
        ("pending", got.running.pending, expected.running.pending),
        ("counter", got.counter, expected.counter),
        ("obs", got.obs, expected.obs),
        ("reward", got.reward, expected.reward),
        ("terminated", got.terminated, expected.terminated),
        ("truncated", got.truncated, expected.truncated),
        ("ended", got.ended, expected.ended),
        *(
            (f"episode {k}", a, b)
            for k, a, b in zip("rlcm", got.episode, expected.episode, strict=True)
        ),
    ]
    assert (got.final_obs is None) == (expected.final_obs is None)
    if got.final_obs is not None:
        pairs.append(("final_obs", got.final_obs, expected.final_obs))
    for name, a, b in pairs:
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), name
        if a.dtype.is_floating_point:  # -0.0 and 0.0 are equal, but not the same bits
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)), name


def both_forms(params: FruitParams, rows: torch.Tensor) -> tuple[Any, ...]:
    """The readable rules and the eager form, each with the state of `rows` in its own form."""
    readable = FruitCatcher(params)
    fast = readable.eager_form(rows.shape[1], CPU)
    layout = layout_of(params)
    pending = rows[-1] != 0
    ref = Running(layout.unpack(rows[:-1].clone()), pending)
    mine = Running(Packed(rows[:-1].T.clone()), pending.clone())
    return readable, fast, layout, ref, mine


@SETTINGS
@given(case=cases())
def test_the_eager_form_steps_as_the_readable_rules(case: dict[str, Any]) -> None:
    p, step = case["params"], autoreset.STEPS[case["mode"]]
    rows, key, counter = case["state"]
    readable, fast, layout, ref, mine = both_forms(p, rows)
    my_counter = counter.clone()
    for action in case["actions"]:
        expected = step(readable, rng.draw, ref, key, counter, action)
        got = step(fast, rng.EagerDraw(), mine, key, my_counter, action)
        assert_transition_equal(got, expected, layout)
        ref, counter = expected.running, expected.counter
        mine, my_counter = got.running, got.counter


@SETTINGS
@given(case=cases())
def test_the_eager_form_resets_as_the_readable_rules(case: dict[str, Any]) -> None:
    """A masked reset restarts the masked sub-envs from their counter (which advances), drops
    their pending restart, and observes alike."""
    p, mask = case["params"], case["mask"]
    rows, key, counter = case["state"]
    readable, fast, layout, ref, mine = both_forms(p, rows)
    ref_counter, my_counter = counter.clone(), counter.clone()  # both advance in place
    expected, expected_counter = autoreset.reset(readable, rng.draw, ref, key, ref_counter, mask)
    got, got_counter = autoreset.reset(fast, rng.EagerDraw(), mine, key, my_counter, mask)
    assert torch.equal(layout.pack(got.game), layout.pack(expected.game))
    assert torch.equal(got.pending, expected.pending)
    assert torch.equal(got_counter, expected_counter)
    assert torch.equal(fast.observe(got.game), readable.observe(expected.game))


def test_the_eager_form_takes_states_from_outside_and_hands_out_no_buffer() -> None:
    """A state the eager form did not write (a restore, a planted state) is copied in, never
    written; no output is a view of its buffers, so a kept output never changes."""
    p = FruitParams(max_episode_steps=5)
    fast = FruitCatcher(p).eager_form(3, CPU)
    outside = Packed(torch.zeros((3, 3 * p.max_fruits + 5), dtype=torch.int32))
    pending = torch.ones(3, dtype=torch.bool)
    running = Running(outside, pending)
    key, counter = torch.arange(3), torch.zeros(3, dtype=torch.int64)
    outputs = []
    for _ in range(6):
        action = torch.ones(3, dtype=torch.int64)
        t = autoreset.next_step(fast, rng.EagerDraw(), running, key, counter, action)
        outputs += [t.obs, t.reward, t.terminated, t.truncated, t.ended, *t.episode]
        running, counter = t.running, t.counter
    assert not outside.board.any()
    buffers = {b.packed.untyped_storage().data_ptr() for b in fast._buffers}
    assert running.game.board.untyped_storage().data_ptr() in buffers
    for tensor in outputs:
        assert tensor.untyped_storage().data_ptr() not in buffers


@pytest.mark.parametrize("obs_mode", ["features", "pixels"])
def test_episode_rows_are_separately_aligned(obs_mode: str) -> None:
    """The episode statistics are views of one tensor, each starting on a 64-byte boundary
    (what JAX's DLPack import needs to share memory instead of copying)."""
    env = FruitCatcherVectorEnv(5, obs_mode=obs_mode, compile=False)
    env.reset(seed=0)
    _, _, _, _, info = env.step(torch.ones(5, dtype=torch.int64))
    for row in list(info["episode"].values())[1:]:
        assert row.is_contiguous() and row.data_ptr() % 64 == 0


def pixels_by_definition(p: FruitParams, rows: torch.Tensor) -> torch.Tensor:
    """The image docs/env.md describes, cell by cell: fruit 255 over basket 128 over 0."""
    board = layout_of(p).unpack(rows[:-1])
    image = torch.zeros((rows.shape[1], 1, p.height, p.width), dtype=torch.uint8)
    for i in range(rows.shape[1]):
        left = int(board.basket[i])
        image[i, 0, p.height - 1, left : left + p.basket_width] = 128
        for x, y, active in zip(board.fruit_x, board.fruit_y, board.active, strict=True):
            if active[i]:
                image[i, 0, int(y[i]), int(x[i])] = 255
    return image


@SETTINGS
@given(case=cases())
def test_the_pixels_are_the_picture_the_rules_describe(case: dict[str, Any]) -> None:
    p = FruitParams(**{**dataclasses.asdict(case["params"]), "obs_mode": "pixels"})
    rows = case["state"][0]
    expected = pixels_by_definition(p, rows)
    assert torch.equal(FruitCatcher(p).pixels(layout_of(p).unpack(rows[:-1])), expected)
