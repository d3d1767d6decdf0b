"""The eager step (`packed.EagerStep`) is the reference transition (`transitions.py`, core's
rules), bit for bit, on every output; the compiled step's pixel observer is core's.

States are drawn at random among those that `packed` assumes (module docstring): inactive
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

from fruit_env import FruitParams, core, packed, transitions

MODES = {
    AutoresetMode.NEXT_STEP: "next_step",
    AutoresetMode.SAME_STEP: "same_step",
    AutoresetMode.DISABLED: "disabled",
}
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def states(draw: st.DrawFn, params: FruitParams, num_envs: int) -> tuple[torch.Tensor, ...]:
    """A packed state (see `transitions.pack`), keys and counters that `packed` may assume."""
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
    dtype = draw(st.sampled_from([torch.int64, torch.int32, torch.uint8, torch.int8]))
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=num_envs, max_size=num_envs)))
    return {
        "params": params,
        "mode": draw(st.sampled_from(list(MODES))),
        "state": draw(states(params, num_envs)),
        "actions": actions.to(dtype),
        "mask": mask,
    }


def assert_transition_equal(got: tuple[torch.Tensor, packed.StepOutput], expected: Any) -> None:
    """Every output of the eager step equals the reference transition's, dtype included."""
    new_packed, out = got
    pairs = [
        ("packed", new_packed, expected.packed),
        ("obs", out.obs, expected.obs),
        ("reward", out.reward, expected.reward),
        ("terminated", out.terminated, expected.flags[0].bool()),
        ("truncated", out.truncated, expected.flags[1].bool()),
        ("ended", out.ended, expected.flags[2].bool()),
        *(
            (f"episode {k}", a, b)
            for k, a, b in zip("rlcm", out.episode, expected.episode, strict=True)
        ),
    ]
    assert (out.final_obs is None) == (expected.final_obs is None)
    if out.final_obs is not None:
        pairs.append(("final_obs", out.final_obs, expected.final_obs))
    for name, a, b in pairs:
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), name


@SETTINGS
@given(case=cases())
def test_eager_step_is_the_reference_transition(case: dict[str, Any]) -> None:
    p, mode = case["params"], case["mode"]
    state, key, counter = case["state"]
    n = state.shape[1]
    eager = packed.EagerStep(p, MODES[mode], n, torch.device("cpu"))
    reference = transitions.TRANSITIONS[mode]
    observe = core.OBSERVERS[p.obs_mode]
    mine, my_counter = state.clone(), counter.clone()
    for action in case["actions"]:
        expected = reference(p, observe, state, key, counter, action)
        mine, out = eager(mine, key, my_counter, action)
        assert_transition_equal((mine, out), expected)
        assert torch.equal(my_counter, expected.counter)
        state, counter = expected.packed, expected.counter


@SETTINGS
@given(case=cases())
def test_eager_reset_is_core_restart(case: dict[str, Any]) -> None:
    """A masked reset restarts the masked sub-envs as `core.restart` does (drawing from their
    counter, which advances), drops their pending restart, and observes like core."""
    p, mask = case["params"], case["mask"]
    state, key, counter = case["state"]
    eager = packed.EagerStep(p, "disabled", state.shape[1], torch.device("cpu"))
    my_counter = counter.clone()
    got = eager.reset(state.clone(), key, my_counter, mask)
    game, pending = transitions.unpack(state)
    game = core.restart(p, game, mask, core.draw(p, key, counter))
    assert torch.equal(got, transitions.pack(game, pending & ~mask))
    assert torch.equal(my_counter, counter + mask)
    assert torch.equal(eager.observe(got), core.OBSERVERS[p.obs_mode](p, game))


def test_the_step_takes_states_from_outside_and_keeps_its_own() -> None:
    """A state the step did not produce (a restore, a planted state) is copied in; the state
    it returns is reused as the next step's input without a copy and never aliased by an
    output."""
    p = FruitParams(max_episode_steps=5)
    eager = packed.EagerStep(p, "next_step", 3, torch.device("cpu"))
    state = transitions.pack(
        core.Game.of(core.empty_state(p, 3, torch.device("cpu"))), torch.ones(3, dtype=torch.bool)
    )
    key, counter = torch.arange(3), torch.zeros(3, dtype=torch.int64)
    first, out = eager(state, key, counter, torch.ones(3, dtype=torch.int64))
    assert first is not state and state.data_ptr() != first.data_ptr()
    second, out2 = eager(first, key, counter, torch.ones(3, dtype=torch.int64))
    outputs = [out.obs, out.reward, out.terminated, out.truncated, out.ended, *out.episode]
    for tensor in [*outputs, out2.obs, *out2.episode]:
        assert tensor.untyped_storage().data_ptr() not in (
            first.untyped_storage().data_ptr(),
            second.untyped_storage().data_ptr(),
        )


@pytest.mark.parametrize("obs_mode", ["features", "pixels"])
def test_episode_rows_are_separately_aligned(obs_mode: str) -> None:
    """The episode statistics are views of one tensor, each starting on a 64-byte boundary
    (what JAX's DLPack import needs to share memory instead of copying)."""
    p = FruitParams(obs_mode=obs_mode)
    eager = packed.EagerStep(p, "next_step", 5, torch.device("cpu"))
    state = torch.zeros((3 * p.max_fruits + 6, 5), dtype=torch.int32)
    _, out = eager(
        state, torch.arange(5), torch.zeros(5, dtype=torch.int64), torch.ones(5, dtype=torch.int64)
    )
    for row in out.episode[1:]:
        assert row.is_contiguous() and row.data_ptr() % 64 == 0


@SETTINGS
@given(case=cases())
def test_the_compiled_steps_pixels_are_cores(case: dict[str, Any]) -> None:
    """`transitions.scattered_pixels`, the pixel observer the compiled step is built with,
    draws `core.pixels`' image."""
    p = FruitParams(**{**dataclasses.asdict(case["params"]), "obs_mode": "pixels"})
    game, _ = transitions.unpack(case["state"][0])
    assert torch.equal(transitions.scattered_pixels(p, game), core.pixels(p, game))
