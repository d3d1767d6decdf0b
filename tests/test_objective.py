"""The GRPO loss (`grpo_trainer.algorithm.objective`) against values worked out by hand.

Every expected number is derived in a comment next to it. The advantages it is given are
tested in test_advantages.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grpo_trainer.algorithm.objective import LossTerms, grpo_loss, k3_kl

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
    bound_penalty: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    bound_coef: float = 0.0,
    dual_clip: float | None = None,
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
        dual_clip=dual_clip,
        kl_coef=kl_coef,
        entropy_coef=entropy_coef,
        bound_penalty=torch.zeros_like(ratios) if bound_penalty is None else bound_penalty,
        valid=torch.ones_like(ratios) if valid is None else valid,
        bound_coef=bound_coef,
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


def test_dual_clip_bounds_a_negative_advantage_whose_ratio_rose_far() -> None:
    """With dual_clip c = 3, a step with A < 0 costs at most c * |A|, and past ratio c it
    passes no gradient; below c, and for every A >= 0, the loss and gradient are those of
    the plain clip, bit for bit."""
    ratios = torch.tensor([5.0, 2.0, 5.0, 0.5, 1.0])
    advantages = torch.tensor([-1.0, -1.0, 1.0, -1.0, 0.0])
    plain, logp_plain = _loss(ratios, advantages)
    dual, logp_dual = _loss(ratios, advantages, dual_clip=3.0)
    # Surrogates: ratio 5, A=-1: min(-5, -1.28) = -5, dual max(-5, -3) = -3; ratio 2, A=-1:
    # -2 (above -3, kept); ratio 5, A=+1: 1.28; ratio 0.5, A=-1: -0.8; A=0: 0.
    # plain: -(-5 - 2 + 1.28 - 0.8 + 0) / 5 = 1.304; dual: -(-3 - 2 + 1.28 - 0.8) / 5 = 0.904
    assert plain.policy_loss.item() == pytest.approx(1.304, abs=1e-6)
    assert dual.policy_loss.item() == pytest.approx(0.904, abs=1e-6)
    (grad_plain,) = torch.autograd.grad(plain.loss, logp_plain)
    (grad_dual,) = torch.autograd.grad(dual.loss, logp_dual)
    # d(-ratio * A / 5) / d logp = -ratio * A / 5: 1.0 for ratio 5 (plain), 0 once cut.
    assert grad_plain[0].item() == pytest.approx(1.0) and grad_dual[0].item() == 0.0
    assert torch.equal(grad_plain[1:], grad_dual[1:])


def test_dual_clip_changes_nothing_where_no_negative_advantage_has_risen_past_it() -> None:
    """The default test batch (ratios up to 1.5) gives the same loss and gradient bit for bit."""
    plain, logp_plain = _loss()
    dual, logp_dual = _loss(dual_clip=3.0)
    assert torch.equal(plain.loss, dual.loss)
    (grad_plain,) = torch.autograd.grad(plain.loss, logp_plain)
    (grad_dual,) = torch.autograd.grad(dual.loss, logp_dual)
    assert torch.equal(grad_plain, grad_dual)


@pytest.mark.parametrize("dual_clip", [3.0, None])
def test_a_ratio_past_floats_range_leaves_the_loss_and_gradient_finite(
    dual_clip: float | None,
) -> None:
    """A log-ratio of 200 (exp overflows float32 past 88) on a negative advantage: the
    log-ratio is capped before the exponential, so loss and gradient stay finite and the
    step is taken rather than skipped as non-finite."""
    logp = torch.tensor([199.0, -1.0], requires_grad=True)  # old_logp is -1: log-ratio 200, 0
    out, _ = _loss(torch.ones(2), torch.tensor([-1.0, 1.0]), logp=logp, dual_clip=dual_clip)
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert math.isfinite(out.loss.item()) and bool(torch.isfinite(grad).all())
    assert grad[0].item() == 0.0  # capped (and, with the dual clip, cut): no gradient


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


def test_the_bound_penalty_counts_every_valid_sample_whatever_its_weight() -> None:
    """loss += bound_coef * Σ valid·penalty / normaliser: samples of weight 0 (group steps
    without spread, where a mean drifts past a bound) count, invalid ones do not."""
    weights = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0])
    valid = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])  # sample 4 does not count
    penalty = torch.tensor([0.0, 0.5, 2.0, 0.0, 1e6])
    base, _ = _loss(weights=weights, valid=valid, normaliser=4.0)
    out, _ = _loss(
        weights=weights, valid=valid, normaliser=4.0, bound_penalty=penalty, bound_coef=0.5
    )
    # (0.5 + 2.0) / 4 = 0.625, in the loss times 0.5: 0.3125; the other terms unchanged.
    assert out.mean_bound.item() == pytest.approx(0.625)
    assert base.mean_bound.item() == 0.0
    assert out.loss.item() == pytest.approx(base.loss.item() + 0.3125, abs=1e-6)
    assert out.policy_loss.item() == base.policy_loss.item()


class _OpCount(TorchDispatchMode):
    """Counts the aten ops dispatched inside it: on a GPU, each is a kernel launch."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _penalty_free_loss(
    bound_penalty: torch.Tensor | None, ref_logp: torch.Tensor | None
) -> tuple[LossTerms, torch.Tensor, int]:
    """A loss without bound or KL signal (kl_coef 0, a zero penalty or none), its logp's
    gradient, and the ops that loss and its backward dispatched."""
    logp = torch.tensor([-0.5, -1.0, -2.0], requires_grad=True)
    ones = torch.ones(3)
    with _OpCount() as count:
        out = grpo_loss(
            logp, logp.detach() - 0.1, torch.tensor([1.0, -1.0, 0.5]), ones, ones, ref_logp,
            normaliser=torch.tensor(3.0), clip_low=CLIP_LOW, clip_high=CLIP_HIGH, dual_clip=3.0,
            kl_coef=0.0, entropy_coef=0.01, bound_penalty=bound_penalty, valid=ones,
            bound_coef=1.0,
        )  # fmt: skip
        out.loss.backward()
    assert logp.grad is not None
    return out, logp.grad, count.ops


def test_a_head_without_bounds_and_a_run_without_reference_add_no_ops_for_their_terms() -> None:
    """bound_penalty None (a head without finite bounds) and ref_logp None leave their terms
    out: fewer ops than adding zeros, the same loss and gradient bit for bit, metrics 0."""
    skipped, grad, ops = _penalty_free_loss(None, None)
    with_zeros, grad_zeros, ops_zeros = _penalty_free_loss(torch.zeros(3), None)
    _, grad_ref, ops_ref = _penalty_free_loss(None, torch.tensor([-0.5, -1.0, -2.0]))
    assert ops < ops_zeros and ops < ops_ref
    assert skipped.loss.item() == with_zeros.loss.item()
    assert torch.equal(grad, grad_zeros) and torch.equal(grad, grad_ref)
    assert skipped.mean_bound.item() == 0.0 and skipped.kl.item() == 0.0


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
