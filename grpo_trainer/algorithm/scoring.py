"""The passes an update makes over its rows before it trains, with its own policy.

The critic values every played row, the look-ahead included, so that each GAE sum reads one
critic; the rows an earlier policy played are re-scored, so that their clipped ratios start
at 1 as fresh rows' do (docs/trainer.md, "Windowed returns and deferred rows"). Those rows
need both, and a shared critic's value is a head on the policy's encoder, the costly part of
either pass: `RowScores.both` runs it over them once (docs/performance.md, "One pass for a
row's value and its re-scored log-prob").
"""

from __future__ import annotations

import torch

from grpo_trainer.algorithm.policy import AutocastPolicy
from grpo_trainer.algorithm.rollout import Rollout, RolloutMode


class RowScores:
    """The no-grad passes before an update: values (with a critic) and re-scored log-probs."""

    def __init__(self, calls: AutocastPolicy, rollout: RolloutMode, critic: bool) -> None:
        self.calls, self.rollout, self.critic = calls, rollout, critic

    def values(self, rollout: Rollout) -> torch.Tensor | None:
        """The critic's values of every played row, `(rows, B)` (None: no critic)."""
        if not self.critic:
            return None
        return self.calls.values(self.rollout.buffer.obs[: len(rollout.rewards)])

    def rescored(self, rollout: Rollout) -> torch.Tensor | None:
        """This policy's log-probs of the rows an earlier policy played (None: no such row)."""
        earlier = rollout.earlier_policy_rows
        if not earlier:
            return None
        return self.calls.log_prob(*_earlier_rows(rollout)).view(earlier, -1)

    def both(self, rollout: Rollout) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """`values` and `rescored`, the rows that need both from one pass: the same numbers
        as the two passes made apart, the encoder run over each played row once."""
        earlier = rollout.earlier_policy_rows
        if not self.critic or not earlier:
            return self.values(rollout), self.rescored(rollout)
        rescored, values = self.calls.log_prob_and_values(*_earlier_rows(rollout))
        later = self.calls.values(self.rollout.buffer.obs[earlier : len(rollout.rewards)])
        return torch.cat((values.view(earlier, -1), later)), rescored.view(earlier, -1)


def _earlier_rows(rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
    """The observations and actions of the rows an earlier policy played, one row each."""
    rows = rollout.earlier_policy_rows
    return rollout.obs[:rows].flatten(0, 1), rollout.actions[:rows].flatten(0, 1)
