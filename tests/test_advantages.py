"""The advantage estimator (`grpo_trainer.algorithm.advantages`) against hand-computed values.

Windowed returns-to-go: `G[t] = Σ_{k<W} γ^k r[t+k] Π_{j<k} (1 − cut[t+j])`, compared within
the group at the same row; docs/trainer.md has the formulas.
"""

from __future__ import annotations

import math

import pytest
import torch

from grpo_trainer.algorithm.advantages import episode_returns, group_relative, windowed_returns


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def _b(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


# -- windowed returns --------------------------------------------------------------------------


def test_window_reaches_into_the_look_ahead_rows_of_the_next_rollout() -> None:
    """Two trained rows, window 3: row 1's return straddles the update boundary (rows 2 and 3
    are the look-ahead a rollout stores for the next one)."""
    rewards = _t([[1.0], [2.0], [4.0], [8.0]])
    cut = torch.zeros(4, 1, dtype=torch.bool)
    g = windowed_returns(rewards, cut, rows=2, window=3, gamma=0.5)
    # G[0] = 1 + 0.5*2 + 0.25*4 = 3; G[1] = 2 + 0.5*4 + 0.25*8 = 6 (the 8 is never in G[0]).
    torch.testing.assert_close(g, _t([[3.0], [6.0]]))


def test_an_episode_ending_inside_the_window_stops_the_return() -> None:
    """The episode ends at row 1 (cut): rows 2.. belong to the next episode and do not count."""
    rewards = _t([[1.0], [2.0], [100.0], [100.0]])
    cut = _b([[0], [1], [0], [0]])
    g = windowed_returns(rewards, cut, rows=2, window=3, gamma=0.5)
    # G[0] = 1 + 0.5*2 = 2; G[1] = 2 (its episode's last reward).
    torch.testing.assert_close(g, _t([[2.0], [2.0]]))


def test_a_group_restart_starts_fresh_returns() -> None:
    """Two members ended at row 1 and their group restarted at row 2: the restart rows are a
    new episode, whose returns see only its own rewards."""
    rewards = _t([[1.0, 0.0], [0.0, 1.0], [3.0, 3.0], [0.0, 5.0], [1.0, 1.0]])
    cut = _b([[0, 0], [1, 1], [0, 0], [0, 0], [0, 0]])
    g = windowed_returns(rewards, cut, rows=3, window=3, gamma=1.0)
    # Member 0: G0 = 1 + 0 = 1, G1 = 0, G2 = 3 + 0 + 1 = 4.
    # Member 1: G0 = 0 + 1 = 1, G1 = 1, G2 = 3 + 5 + 1 = 9.
    torch.testing.assert_close(g, _t([[1.0, 1.0], [0.0, 1.0], [4.0, 9.0]]))


def test_a_branch_cuts_every_members_window_at_the_branch_row() -> None:
    """A branch after row 0 replaces the members' paths: row 0 keeps only its own reward."""
    rewards = _t([[1.0, 2.0], [7.0, 7.0], [1.0, 0.0]])
    cut = _b([[1, 1], [0, 0], [0, 0]])
    g = windowed_returns(rewards, cut, rows=2, window=2, gamma=1.0)
    torch.testing.assert_close(g, _t([[1.0, 2.0], [8.0, 7.0]]))


def test_whole_rollout_window_matches_the_backward_recursion() -> None:
    """A window reaching past the last row (episodes mode) is the return to the end."""
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(9, 5, generator=gen)
    cut = torch.rand(9, 5, generator=gen) < 0.2
    full = windowed_returns(rewards, cut, rows=9, window=9, gamma=0.9)
    expected = torch.zeros(9, 5)
    running = torch.zeros(5)
    for t in range(8, -1, -1):
        running = rewards[t] + 0.9 * running * ~cut[t]
        expected[t] = running
    torch.testing.assert_close(full, expected)
    # The windowed loop with a window longer than what remains agrees with it on row 0..3.
    windowed = windowed_returns(
        torch.cat((rewards, torch.zeros(9, 5))),
        torch.cat((cut, torch.ones(9, 5, dtype=torch.bool))),
        rows=4,
        window=10,
        gamma=0.9,
    )
    torch.testing.assert_close(windowed, expected[:4])


def test_identical_reward_sequences_give_bit_identical_returns() -> None:
    """Members that played alike must show exactly zero spread, whatever came after."""
    gen = torch.Generator().manual_seed(1)
    column = torch.randn(40, 1, generator=gen)
    rewards = torch.cat((column, column, column), 1)
    rewards[30:, 1] = 5.0  # differ only beyond row 0's window
    g = windowed_returns(
        rewards, torch.zeros_like(rewards, dtype=torch.bool), rows=8, window=20, gamma=0.97
    )
    assert torch.equal(g[:8, 0], g[:8, 2])
    assert torch.equal(g[:8, 0], g[:8, 1])


def test_too_few_rows_for_the_window_is_an_error() -> None:
    with pytest.raises(ValueError, match="need 5 rows"):
        windowed_returns(
            torch.zeros(4, 1), torch.zeros(4, 1, dtype=torch.bool), rows=3, window=3, gamma=1.0
        )


# -- group comparison --------------------------------------------------------------------------

# Two groups of two over three rows. Member 1 has ended after row 1 (not valid at row 2).
RETURNS = _t([[3.0, 1.0, 2.0, 2.0], [2.0, 0.0, 1.0, 1.0], [1.0, 9.0, 4.0, 0.0]])
VALID = _b([[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 1, 1]])


def test_per_step_group_std() -> None:
    adv = group_relative(RETURNS, VALID, VALID, 2, scale="group_std", zero_std_eps=1e-6)
    # Group 0: row 0 mean 2, std 1 -> +1, -1; row 1 mean 1, std 1 -> +1, -1; row 2: member 0
    # alone (no peer: no spread, weight 0). Group 1: rows 0 and 1 equal (no spread); row 2:
    # 4 and 0, mean 2, std 2 -> +1, -1.
    expected = _t([[1.0, -1.0, 0.0, 0.0], [1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 1.0, -1.0]])
    torch.testing.assert_close(adv.advantages, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(adv.weights, _t([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1]]))
    assert adv.zero_spread.tolist() == [[False, True], [False, True], [True, False]]
    assert adv.compared.all()


def test_scale_none_and_batch_std() -> None:
    none = group_relative(RETURNS, VALID, VALID, 2, scale="none", zero_std_eps=1e-6)
    centred = _t([[1.0, -1.0, 0.0, 0.0], [1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 2.0, -2.0]])
    torch.testing.assert_close(none.advantages, centred)
    batch = group_relative(RETURNS, VALID, VALID, 2, scale="batch_std", zero_std_eps=1e-6)
    # Kept values 1, -1, 1, -1, 2, -2: mean 0, variance (4 * 1 + 2 * 4) / 6 = 2.
    torch.testing.assert_close(batch.advantages, centred / math.sqrt(2.0))


def test_batch_std_sums_its_moments_over_ranks() -> None:
    """With another rank's identical batch summed in, the std is unchanged."""
    one = group_relative(RETURNS, VALID, VALID, 2, scale="batch_std", zero_std_eps=1e-6)
    two = group_relative(
        RETURNS,
        VALID,
        VALID,
        2,
        scale="batch_std",
        zero_std_eps=1e-6,
        sum_over_ranks=lambda x: 2 * x,
    )
    torch.testing.assert_close(one.advantages, two.advantages)


def test_zero_std_eps_is_the_spread_threshold() -> None:
    returns = _t([[0.1, 0.0]])  # population std 0.05
    valid = torch.ones(1, 2, dtype=torch.bool)
    kept = group_relative(returns, valid, valid, 2, scale="none", zero_std_eps=0.04)
    dropped = group_relative(returns, valid, valid, 2, scale="none", zero_std_eps=0.06)
    assert kept.weights.sum() == 2 and not kept.zero_spread.any()
    assert dropped.weights.sum() == 0 and dropped.zero_spread.all()
    assert torch.count_nonzero(dropped.advantages) == 0


def test_no_signal_anywhere_is_all_zero_and_finite() -> None:
    returns = torch.ones(3, 4)
    valid = torch.ones(3, 4, dtype=torch.bool)
    for scale in ("group_std", "batch_std", "none"):
        adv = group_relative(returns, valid, valid, 2, scale=scale, zero_std_eps=1e-6)
        assert torch.count_nonzero(adv.advantages) == 0 and torch.count_nonzero(adv.weights) == 0
        assert torch.isfinite(adv.advantages).all()


def test_outcome_compares_whole_episode_returns_on_every_valid_step() -> None:
    rewards = _t([[1.0, 1.0], [1.0, 0.0], [1.0, 9.0]])
    valid = _b([[1, 1], [1, 1], [1, 0]])
    ret = episode_returns(rewards, valid)
    assert ret.tolist() == [3.0, 1.0]  # the 9 came after member 1's end
    adv = group_relative(
        ret.expand(3, 2),
        torch.ones(3, 2, dtype=torch.bool),
        valid,
        2,
        scale="group_std",
        zero_std_eps=1e-6,
    )
    torch.testing.assert_close(adv.advantages, _t([[1.0, -1.0], [1.0, -1.0], [1.0, 0.0]]))


def test_unknown_scale_is_refused() -> None:
    with pytest.raises(ValueError, match="bogus"):
        group_relative(RETURNS, VALID, VALID, 2, scale="bogus", zero_std_eps=0.0)
