"""The GRPO objective (`grpo_trainer.objective`) against values worked out by hand.

Every expected number is derived in a comment next to it. Layout of the small rollouts:
`T` steps by `B = groups * group_size` members, member `b` in group `b // group_size`.
"""

from __future__ import annotations

import math

import pytest
import torch

from grpo_trainer.objective import LossTerms, group_advantages, grpo_loss, k3_kl, returns_to_go


def _bool(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


# Two groups of two over T = 3 steps.
#   member 0 (group 0): rewards 1, 1, 1         valid 3 steps  -> return 3
#   member 1 (group 0): rewards 1, 0, [9]       valid 2 steps  -> return 1 (the 9 comes after
#                                                                 its end and must not count)
#   member 2 (group 1): rewards 1, 0, 0         valid 3 steps  -> return 1
#   member 3 (group 1): rewards 0, 0, 1         valid 3 steps  -> return 1
# Group 1's returns are equal (std 0): it carries no signal and is dropped.
REWARDS = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 9.0, 0.0, 1.0]])
VALID = _bool([[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 1, 1]])
# Weights: valid steps of group 0 only.
EXPECTED_WEIGHTS = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])


def test_returns_to_go_discounts_and_masks() -> None:
    """G[t] = r[t] + gamma * G[t+1] inside the episode; rewards after the end are ignored."""
    rewards = torch.tensor([[1.0, 2.0], [1.0, 0.0], [1.0, 5.0]])
    valid = _bool([[1, 1], [1, 1], [1, 0]])
    # gamma = 0.5. Member 0: G2 = 1, G1 = 1 + 0.5 * 1 = 1.5, G0 = 1 + 0.5 * 1.5 = 1.75.
    # Member 1: its reward 5 at t=2 is after the end (masked): G2 = 0, G1 = 0 + 0 = 0,
    # G0 = 2 + 0.5 * 0 = 2.
    expected = torch.tensor([[1.75, 2.0], [1.5, 0.0], [1.0, 0.0]])
    torch.testing.assert_close(returns_to_go(rewards, valid.float(), 0.5), expected)


def test_returns_to_go_gamma_one_is_the_undiscounted_tail_sum() -> None:
    """With gamma = 1, G[0] is the episode return and G[t] the sum of the remaining rewards."""
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    valid = torch.ones(3, 1)
    # Tail sums: 1 + 2 + 3 = 6, 2 + 3 = 5, 3.
    torch.testing.assert_close(
        returns_to_go(rewards, valid, 1.0), torch.tensor([[6.0], [5.0], [3.0]])
    )


def test_returns_to_go_gamma_zero_is_the_reward_itself() -> None:
    """With gamma = 0 nothing of the future counts: G[t] = r[t] on valid steps, 0 after."""
    rewards = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    valid = _bool([[1, 1], [1, 0]])
    expected = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    torch.testing.assert_close(returns_to_go(rewards, valid.float(), 0.0), expected)


def test_per_step_group_std() -> None:
    """Per-step: the return-to-go minus the group mean at t over members still playing at t."""
    adv = group_advantages(REWARDS, VALID, 2, mode="per_step", scale="group_std", gamma=0.5)
    # Group 0 returns-to-go (gamma 0.5): member 0: 1.75, 1.5, 1; member 1: 1, 0, (ended).
    # t=0: mean (1.75 + 1) / 2 = 1.375, std 0.375 -> +1, -1.
    # t=1: mean (1.5 + 0) / 2 = 0.75, std 0.75 -> +1, -1.
    # t=2: only member 0 plays: mean 1, std 0 -> 0 (no peer to compare with).
    expected = torch.tensor([[1.0, -1.0, 0.0, 0.0], [1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv.advantages, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(adv.weights, EXPECTED_WEIGHTS)
    torch.testing.assert_close(adv.returns, torch.tensor([3.0, 1.0, 1.0, 1.0]))
    assert adv.zero_std_groups.tolist() == [False, True]


def test_per_step_scale_none_keeps_the_centred_return() -> None:
    """scale='none' (Dr. GRPO): the centred return-to-go, not divided by anything."""
    adv = group_advantages(REWARDS, VALID, 2, mode="per_step", scale="none", gamma=0.5)
    # Centred values from the group_std test before division: t=0: +-0.375, t=1: +-0.75.
    expected = torch.tensor(
        [[0.375, -0.375, 0.0, 0.0], [0.75, -0.75, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    )
    torch.testing.assert_close(adv.advantages, expected)


def test_per_step_batch_std_divides_by_the_std_over_kept_valid_steps() -> None:
    """scale='batch_std': one std over every kept, valid step of the batch."""
    adv = group_advantages(REWARDS, VALID, 2, mode="per_step", scale="batch_std", gamma=0.5)
    # Kept valid centred values: 0.375, -0.375, 0.75, -0.75, 0 (5 entries; group 1 dropped).
    # Mean 0; variance (2 * 0.375^2 + 2 * 0.75^2) / 5 = 1.40625 / 5 = 0.28125.
    batch_std = math.sqrt(0.28125)
    expected = torch.tensor(
        [[0.375, -0.375, 0.0, 0.0], [0.75, -0.75, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    )
    torch.testing.assert_close(adv.advantages, expected / batch_std)


def test_outcome_group_std_on_steps_where_all_members_play() -> None:
    """Outcome: (R - mean R) / std R of the group, on every step where the whole group plays."""
    adv = group_advantages(REWARDS, VALID, 2, mode="outcome", scale="group_std")
    # Group 0 returns 3 and 1: mean 2, population std 1 -> +1 for member 0, -1 for member 1.
    torch.testing.assert_close(adv.advantages[:2, :2], torch.tensor([[1.0, -1.0], [1.0, -1.0]]))
    # Member 1 ended after two steps: its third step carries nothing.
    assert adv.advantages[2, 1] == 0 and adv.weights[2, 1] == 0
    # Group 1 is dropped.
    assert torch.count_nonzero(adv.advantages[:, 2:]) == 0
    assert adv.zero_std_groups.tolist() == [False, True]


def test_outcome_advantage_is_the_same_for_every_step_of_a_member() -> None:
    """Documented: outcome A[b] = (R[b] - mean_g R) / scale, the same for every step of b."""
    adv = group_advantages(REWARDS, VALID, 2, mode="outcome", scale="group_std")
    # Member 0 outlives member 1 by one step; its third step is still worth (3 - 2) / 1 = +1.
    torch.testing.assert_close(adv.advantages[:, 0], torch.tensor([1.0, 1.0, 1.0]))


def test_outcome_scale_none_and_batch_std() -> None:
    """Outcome with scale 'none' is R - mean R; 'batch_std' divides by the kept steps' std."""
    none = group_advantages(REWARDS, VALID, 2, mode="outcome", scale="none")
    # Returns 3 and 1, mean 2: +1 and -1 without scaling (the group std is 1 here too).
    torch.testing.assert_close(none.advantages[:2, :2], torch.tensor([[1.0, -1.0], [1.0, -1.0]]))
    # A group with returns 4 and 0 (std 2) tells 'none' from 'group_std'.
    rewards = torch.tensor([[4.0, 0.0]])
    valid = _bool([[1, 1]])
    raw = group_advantages(rewards, valid, 2, mode="outcome", scale="none")
    std = group_advantages(rewards, valid, 2, mode="outcome", scale="group_std")
    batch = group_advantages(rewards, valid, 2, mode="outcome", scale="batch_std")
    # Mean 2: centred +2 and -2; group std 2 -> +-1; batch std of {2, -2} is also 2 -> +-1.
    torch.testing.assert_close(raw.advantages, torch.tensor([[2.0, -2.0]]))
    torch.testing.assert_close(std.advantages, torch.tensor([[1.0, -1.0]]))
    torch.testing.assert_close(batch.advantages, torch.tensor([[1.0, -1.0]]))


def test_batch_std_spans_groups_while_group_std_does_not() -> None:
    """Two groups with different spreads: group_std equalises them, batch_std keeps the ratio."""
    # One step, group 0 returns 2 and 0 (centred +-1), group 1 returns 6 and 0 (centred +-3).
    rewards = torch.tensor([[2.0, 0.0, 6.0, 0.0]])
    valid = torch.ones(1, 4, dtype=torch.bool)
    by_group = group_advantages(rewards, valid, 2, mode="outcome", scale="group_std")
    by_batch = group_advantages(rewards, valid, 2, mode="outcome", scale="batch_std")
    torch.testing.assert_close(by_group.advantages, torch.tensor([[1.0, -1.0, 1.0, -1.0]]))
    # Batch std of {1, -1, 3, -3}: sqrt((1 + 1 + 9 + 9) / 4) = sqrt(5).
    expected = torch.tensor([[1.0, -1.0, 3.0, -3.0]]) / math.sqrt(5.0)
    torch.testing.assert_close(by_batch.advantages, expected)


def test_zero_std_groups_are_dropped_and_flagged() -> None:
    """A group whose members all return the same gets zero weight in every mode and scale."""
    for mode in ("per_step", "outcome"):
        for scale in ("group_std", "batch_std", "none"):
            adv = group_advantages(REWARDS, VALID, 2, mode=mode, scale=scale, gamma=0.5)
            assert adv.zero_std_groups.tolist() == [False, True], (mode, scale)
            # Members 2 and 3 have different per-step returns-to-go (1, 0, 0 vs 1, 1, 1),
            # yet equal episode returns: still dropped.
            assert torch.count_nonzero(adv.weights[:, 2:]) == 0, (mode, scale)
            assert torch.count_nonzero(adv.advantages[:, 2:]) == 0, (mode, scale)
            torch.testing.assert_close(adv.weights, EXPECTED_WEIGHTS)


def test_zero_std_threshold_is_zero_std_eps() -> None:
    """Groups whose return std is at most zero_std_eps are dropped; larger spreads are kept."""
    # One step, one group: returns 0.1 and 0 have population std 0.05.
    rewards = torch.tensor([[0.1, 0.0]])
    valid = torch.ones(1, 2, dtype=torch.bool)
    kept = group_advantages(rewards, valid, 2, mode="outcome", zero_std_eps=0.04)
    dropped = group_advantages(rewards, valid, 2, mode="outcome", zero_std_eps=0.06)
    assert kept.zero_std_groups.tolist() == [False]
    assert kept.weights.sum() == 2
    assert dropped.zero_std_groups.tolist() == [True]
    assert dropped.weights.sum() == 0


def test_every_group_dropped_gives_all_zero_advantages() -> None:
    """No signal at all: zero advantages and weights, and nothing non-finite."""
    rewards = torch.ones(3, 4)
    valid = torch.ones(3, 4, dtype=torch.bool)
    for scale in ("group_std", "batch_std", "none"):
        adv = group_advantages(rewards, valid, 2, mode="per_step", scale=scale)
        assert adv.zero_std_groups.all()
        assert torch.count_nonzero(adv.advantages) == 0
        assert torch.count_nonzero(adv.weights) == 0


def test_invalid_mode_and_scale_raise() -> None:
    """Unknown mode or scale names raise ValueError naming the bad value."""
    with pytest.raises(ValueError, match="bogus"):
        group_advantages(REWARDS, VALID, 2, mode="bogus")
    with pytest.raises(ValueError, match="bogus"):
        group_advantages(REWARDS, VALID, 2, scale="bogus")


# -- k3 KL -------------------------------------------------------------------------------------


def test_k3_kl_is_zero_for_equal_policies_and_positive_otherwise() -> None:
    """k3 = exp(r) - r - 1 with r = ref_logp - logp: 0 iff r = 0, else > 0."""
    logp = torch.tensor([-0.5, -1.0, -2.0, -3.0])
    assert torch.equal(k3_kl(logp, logp), torch.zeros(4))
    ref = torch.tensor([-0.4, -2.0, -1.0, -3.5])
    kl = k3_kl(logp, ref)
    assert bool((kl > 0).all())
    r = ref - logp
    torch.testing.assert_close(kl, torch.exp(r) - r - 1)
    # One value by hand: r = -2 - (-1) = -1 -> exp(-1) + 1 - 1 = 0.36788.
    assert kl[1].item() == pytest.approx(math.exp(-1.0))


def test_k3_kl_expectation_under_the_policy_is_the_exact_kl() -> None:
    """E_p[k3] = sum p (q/p - log(q/p) - 1) = 1 + KL(p||q) - 1: unbiased for KL(p||q)."""
    generator = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.randn(5, generator=generator), -1)
    logq = torch.log_softmax(torch.randn(5, generator=generator), -1)
    expectation = (logp.exp() * k3_kl(logp, logq)).sum()
    exact = torch.distributions.kl_divergence(
        torch.distributions.Categorical(logits=logp), torch.distributions.Categorical(logits=logq)
    )
    torch.testing.assert_close(expectation, exact)


# -- the clipped surrogate ---------------------------------------------------------------------

CLIP_LOW, CLIP_HIGH = 0.2, 0.28  # clip range [0.8, 1.28]
# Five samples: ratio 1.5 and 0.5 (outside the range, each with A = +1 and A = -1), and one
# ratio 1 with A = 2 (inside).
RATIOS = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.0])
ADVANTAGES = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0])


def _loss(
    ratios: torch.Tensor = RATIOS,
    advantages: torch.Tensor = ADVANTAGES,
    weights: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    normaliser: float = 5.0,
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    logp: torch.Tensor | None = None,
) -> tuple[LossTerms, torch.Tensor]:
    old_logp = torch.full_like(ratios, -1.0)
    if logp is None:
        logp = (old_logp + ratios.log()).requires_grad_(True)
    out = grpo_loss(
        logp,
        old_logp,
        advantages,
        torch.ones_like(ratios) if weights is None else weights,
        torch.zeros_like(ratios) if entropy is None else entropy,
        ref_logp,
        normaliser=torch.tensor(normaliser),
        clip_low=CLIP_LOW,
        clip_high=CLIP_HIGH,
        kl_coef=kl_coef,
        entropy_coef=entropy_coef,
    )
    return out, logp


def test_clipped_surrogate_values_and_clip_fraction() -> None:
    """min(ratio * A, clip(ratio) * A) for every sign/side combination, and the clip fraction."""
    out, _ = _loss()
    # ratio 1.5, A=+1: min(1.5, 1.28) = 1.28     (optimistic side clipped)
    # ratio 1.5, A=-1: min(-1.5, -1.28) = -1.5   (pessimistic side kept)
    # ratio 0.5, A=+1: min(0.5, 0.8) = 0.5       (pessimistic side kept)
    # ratio 0.5, A=-1: min(-0.5, -0.8) = -0.8    (optimistic side clipped)
    # ratio 1.0, A=2:  2
    # policy_loss = -(1.28 - 1.5 + 0.5 - 0.8 + 2) / 5 = -1.48 / 5 = -0.296
    assert out.policy_loss.item() == pytest.approx(-0.296, abs=1e-6)
    # Four of five ratios are outside [0.8, 1.28].
    assert out.clip_fraction.item() == pytest.approx(4 / 5)
    assert out.kl.item() == 0.0  # no reference policy given
    assert out.loss.item() == pytest.approx(-0.296, abs=1e-6)


def test_clipped_samples_pass_no_gradient() -> None:
    """Where the clipped term is the minimum, the sample contributes no gradient."""
    out, logp = _loss()
    (grad,) = torch.autograd.grad(out.loss, logp)
    # d(-ratio * A / 5) / d logp = -ratio * A / 5 for unclipped samples, 0 for clipped ones:
    # [clipped, -1.5 * -1 / 5 = 0.3, -0.5 * 1 / 5 = -0.1, clipped, -1 * 2 / 5 = -0.4]
    torch.testing.assert_close(grad, torch.tensor([0.0, 0.3, -0.1, 0.0, -0.4]))


def test_ratio_inside_the_clip_range_is_not_clipped() -> None:
    """Ratios within [1 - clip_low, 1 + clip_high] count neither as clipped nor get cut."""
    ratios = torch.tensor([0.81, 1.27])
    out, _ = _loss(ratios, torch.tensor([1.0, 1.0]), normaliser=2.0)
    assert out.clip_fraction.item() == 0.0
    # -(0.81 + 1.27) / 2 = -1.04
    assert out.policy_loss.item() == pytest.approx(-1.04, abs=1e-6)


def test_clip_is_asymmetric() -> None:
    """clip_high (0.28) lets the ratio rise further than clip_low (0.2) lets it fall."""
    # Ratio 1.25 with A=+1 is inside (1.25 < 1.28) although 1.25 > 1 + clip_low.
    out, _ = _loss(torch.tensor([1.25]), torch.tensor([1.0]), normaliser=1.0)
    assert out.clip_fraction.item() == 0.0
    assert out.policy_loss.item() == pytest.approx(-1.25, abs=1e-6)


def test_entropy_bonus_lowers_the_loss() -> None:
    """loss = policy_loss + kl_coef * kl - entropy_coef * entropy: more entropy, lower loss."""
    entropy = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    out, _ = _loss(entropy=entropy, entropy_coef=0.1)
    # Mean entropy over the 5 valid samples: 15 / 5 = 3; bonus 0.1 * 3 = 0.3.
    assert out.entropy.item() == pytest.approx(3.0)
    assert out.loss.item() == pytest.approx(-0.296 - 0.3, abs=1e-6)


def test_kl_term_uses_k3_and_adds_to_the_loss() -> None:
    """With a reference, kl is the weighted k3 mean and enters the loss times kl_coef."""
    ratios = torch.ones(2)
    logp = torch.tensor([-1.0, -1.0], requires_grad=True)
    ref_logp = torch.tensor([-1.0, -2.0])
    out, _ = _loss(
        ratios, torch.zeros(2), ref_logp=ref_logp, normaliser=2.0, kl_coef=0.5, logp=logp
    )
    # k3: sample 0: r = 0 -> 0; sample 1: r = -1 -> exp(-1) + 1 - 1 = exp(-1). Mean exp(-1) / 2.
    expected_kl = math.exp(-1.0) / 2
    assert out.kl.item() == pytest.approx(expected_kl)
    # Advantages are 0, so the loss is the KL term alone: 0.5 * kl.
    assert out.loss.item() == pytest.approx(0.5 * expected_kl)


def test_approx_kl_old_is_k3_to_the_rollout_policy() -> None:
    """approx_kl_old is the weighted mean k3(logp, old_logp), zero when nothing moved."""
    same, _ = _loss(torch.ones(5))
    assert same.approx_kl_old.item() == 0.0
    out, _ = _loss()
    r = -RATIOS.log()  # old_logp - logp
    expected = (torch.exp(r) - r - 1).mean()
    assert out.approx_kl_old.item() == pytest.approx(expected.item())


def test_invalid_samples_do_not_count() -> None:
    """Zero-weight samples change nothing, whatever their ratio, advantage or entropy."""
    weights = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0])
    base, _ = _loss(weights=weights, normaliser=4.0)
    changed_adv = ADVANTAGES.clone()
    changed_adv[2] = 1e6
    changed_ratio = RATIOS.clone()
    changed_ratio[2] = 40.0
    entropy = torch.tensor([0.0, 0.0, 1e6, 0.0, 0.0])
    other, _ = _loss(
        changed_ratio,
        changed_adv,
        weights=weights,
        entropy=entropy,
        normaliser=4.0,
        entropy_coef=1.0,
    )
    for name in ("loss", "policy_loss", "entropy", "clip_fraction"):
        assert getattr(other, name).item() == pytest.approx(getattr(base, name).item()), name
    # Without sample 2 (0.5 * 1): -(1.28 - 1.5 - 0.8 + 2) / 4 = -0.98 / 4 = -0.245.
    assert base.policy_loss.item() == pytest.approx(-0.245, abs=1e-6)


def test_normaliser_weighs_every_valid_step_equally_across_minibatches() -> None:
    """Minibatch sums are divided by (valid count / minibatches), not by the minibatch's own
    count: every valid step weighs the same, and the minibatch losses average to the full loss."""
    weights = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0])  # 4 valid samples, 2 minibatches
    full, _ = _loss(weights=weights, normaliser=4.0)
    # Surrogates (see the clipping test): s0 = 1.28, s1 = -1.5, s3 = -0.8, s4 = 2 (s2 invalid).
    # Full loss: -(1.28 - 1.5 - 0.8 + 2) / 4 = -0.245.
    assert full.loss.item() == pytest.approx(-0.245, abs=1e-6)
    losses = []
    # Uneven split: A = samples {0, 2} (1 valid), B = samples {1, 3, 4} (3 valid).
    for idx in (torch.tensor([0, 2]), torch.tensor([1, 3, 4])):
        out, _ = _loss(RATIOS[idx], ADVANTAGES[idx], weights=weights[idx], normaliser=4.0 / 2)
        losses.append(out.loss.item())
    # A: -1.28 / 2 = -0.64 (a per-minibatch mean would give -1.28).
    # B: -(-1.5 - 0.8 + 2) / 2 = 0.15 (a per-minibatch mean would give 0.1).
    assert losses == pytest.approx([-0.64, 0.15], abs=1e-6)
    assert sum(losses) / 2 == pytest.approx(full.loss.item(), abs=1e-6)
