"""What the four MinAtar games' rules modules promise alike, tested over each.

Each `rules` module names bad random bits, traces on the meta device (no host read, no
data-dependent shape: every field keeps its dtype and shape), and truncates at gymnax's
`max_steps_in_episode`. (tests/test_minatar_<game>.py test each game's rules against gymnax
step for step; tests/test_minatar_envs.py the games as vector envs.)
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import pytest
import torch

from fruit_env.games.minatar_asterix import rules as asterix_rules
from fruit_env.games.minatar_breakout import rules as breakout_rules
from fruit_env.games.minatar_freeway import rules as freeway_rules
from fruit_env.games.minatar_space_invaders import rules as invaders_rules


@dataclass(frozen=True)
class Rules:
    gymnax_id: str
    rules: ModuleType
    advance_takes_bits: bool
    limit: int  # gymnax's `max_steps_in_episode`
    shapes: tuple[tuple[int, ...], ...]  # each state field's shape after the sub-env axis
    planes: int

    def advance(self, state: object, action: torch.Tensor, bits: torch.Tensor) -> tuple:
        if self.advance_takes_bits:
            return self.rules.advance(state, action, bits)
        return self.rules.advance(state, action)

    def __str__(self) -> str:
        return self.gymnax_id


GAMES = [
    Rules("Breakout-MinAtar", breakout_rules, False, 1000, ((),) * 11, 4),
    Rules("Asterix-MinAtar", asterix_rules, True, 1000, ((),) * 8 + ((8,),) * 4 + ((),) * 3, 4),
    Rules("Freeway-MinAtar", freeway_rules, True, 2500, ((), *[(8,)] * 3, (), (), (), ()), 7),
    Rules("SpaceInvaders-MinAtar", invaders_rules, False, 1000, ((), *[(10,)] * 3, *[()] * 10), 6),
]
each_game = pytest.mark.parametrize("game", GAMES, ids=str)


@each_game
@pytest.mark.parametrize(
    "bits", [torch.zeros(3, dtype=torch.int32), torch.zeros(3, 1, dtype=torch.int64)]
)
def test_initial_state_names_bad_bits(game: Rules, bits: torch.Tensor) -> None:
    with pytest.raises(ValueError, match=r"bits must be an \(N,\) int64 tensor, got"):
        game.rules.initial_state(bits)


@each_game
def test_rules_trace_on_the_meta_device(game: Rules) -> None:
    """No host read and no data-dependent shape: the rules run on shapes alone. Every field
    is an int32 or bool tensor of its shape, and stays so."""
    rules, zeros = game.rules, torch.zeros(5, dtype=torch.int64, device="meta")
    state = rules.initial_state(zeros)
    new, reward, terminated = game.advance(state, zeros, zeros)
    assert all(field.is_meta for field in new)
    assert [tuple(f.shape) for f in new] == [(5, *shape) for shape in game.shapes]
    assert [(f.dtype, f.shape) for f in new] == [(f.dtype, f.shape) for f in state]
    assert {field.dtype for field in state} == {torch.int32, torch.bool}
    assert (reward.shape, reward.dtype) == ((5,), torch.float32)
    assert (terminated.shape, terminated.dtype) == ((5,), torch.bool)
    for dtype in (torch.bool, torch.float32):
        obs = rules.observe(new, dtype)
        assert obs.is_meta and (obs.shape, obs.dtype) == ((5, 10, 10, game.planes), dtype)
    assert (10, 10, game.planes) == rules.OBS_SHAPE
    assert [(t.shape, t.dtype) for t in rules.episode(new)] == [
        ((5,), torch.float32),
        ((5,), torch.int32),
    ]


@each_game
def test_the_time_limit_is_gymnax_max_steps(game: Rules) -> None:
    """Truncated from step `limit` on (by default gymnax's), not before; one step from a new
    game ends nothing by itself."""
    rules, limit = game.rules, game.limit
    assert limit == rules.MAX_STEPS_IN_EPISODE
    state = rules.initial_state(torch.zeros(3, dtype=torch.int64))
    state = state._replace(time=torch.tensor([limit - 2, limit - 1, limit], dtype=torch.int32))
    assert rules.truncated(state).tolist() == [False, False, True]
    zeros = torch.zeros(3, dtype=torch.int64)
    new, _, terminated = game.advance(state, zeros, zeros)
    assert rules.truncated(new).tolist() == [False, True, True] and not terminated.any()
    assert rules.truncated(new, limit + 1).tolist() == [False, False, True]
    assert rules.truncated(new, 2 * limit).tolist() == [False, False, False]
    gymnax = pytest.importorskip("gymnax", reason="gymnax's limit needs gymnax")
    assert gymnax.make(game.gymnax_id)[1].max_steps_in_episode == limit
