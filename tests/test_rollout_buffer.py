"""`RolloutBuffer.shift_lookahead`: the look-ahead rows open the next rollout, in order."""

from __future__ import annotations

import pytest
import torch

from grpo_trainer.algorithm.policy import CategoricalHead
from grpo_trainer.algorithm.rollout.buffer import RolloutBuffer


@pytest.mark.parametrize(
    ("trained", "lookahead"),
    [(32, 127), (32, 31), (8, 8), (4, 13), (5, 12), (16, 0)],
    ids=["MinAtar's window", "Fruit Catcher's", "equal", "overlap, a partial block", "odd", "none"],
)
def test_the_lookahead_rows_move_to_the_front_and_the_rest_stays(
    trained: int, lookahead: int
) -> None:
    buffer = RolloutBuffer(trained, lookahead, 3, (2,), torch.uint8, CategoricalHead(5), "cpu")
    rows = trained + lookahead
    for t in buffer.tensors.values():  # every entry names its row (flags: the row's parity)
        names = torch.arange(rows) if t.dtype != torch.bool else torch.arange(rows) % 2 == 1
        t.copy_(names.view(rows, *[1] * (t.dim() - 1)).expand_as(t))
    before = {name: t.clone() for name, t in buffer.tensors.items()}
    buffer.shift_lookahead()
    for name, t in buffer.tensors.items():
        expected = before[name].clone()
        expected[:lookahead] = before[name][trained:]
        assert torch.equal(t, expected), name
