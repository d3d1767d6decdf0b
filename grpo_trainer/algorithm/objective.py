"""The GRPO loss as pure tensor functions (no module state, no host syncs).

`ρ = exp(log π(a|s) − log π_old(a|s))`, `w` the sample weight, `N` the normaliser:

    L = −Σ w·S / N + β·Σ w·KL₃ / N − c_H·Σ w·H / N + c_B·Σ v·B / N + c_V·Σ u·(V − R)² / N
    S = min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A), and max(S, c·A) where A < 0 (dual clip)

with `v` the sample's validity, `B` the head's penalty on a Gaussian past the action bounds
(its mean past them, its std past half their range), and
`V` a critic's value (where `value_coef` c_V > 0) regressed on its target `R`, with weights
`u = v / Var[R]` (`advantages.value_weights`: scale-free, whatever the returns' scale).
The dual clip (Ye et al., 2020, "Mastering Complex Control in MOBA Games with Deep
Reinforcement Learning"; off by default) bounds what a step the group ranks low can cost
when its ratio has risen far: without it that loss grows with ρ, a few such steps steer the
clipped gradient, and past ρ = e^88 it overflows (docs/trainer.md, "MinAtar on a GPU"). The
log-ratio is capped at `MAX_LOG_RATIO` before the exponential, always: beyond it the clip
has already cut the gradient of a positive advantage, and the cap keeps ρ, and so the loss
and its gradient, finite.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

MAX_LOG_RATIO = 20.0  # ρ ≤ e^20: past 1 + ε_high and the dual clip, short of fp32's e^88


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || reference): unbiased and always >= 0."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


class LossTerms(NamedTuple):
    loss: torch.Tensor
    policy_loss: torch.Tensor
    kl: torch.Tensor
    entropy: torch.Tensor
    clip_fraction: torch.Tensor
    approx_kl_old: torch.Tensor  # k3 KL(new || rollout policy), a step-size diagnostic
    mean_bound: torch.Tensor  # the bound penalty's mean over valid samples (before c_B)
    value_loss: torch.Tensor  # the critic's weighted squared error (before c_V): ~1 knows nothing


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    entropy: torch.Tensor,
    ref_logp: torch.Tensor | None,
    *,
    normaliser: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    kl_coef: float,
    entropy_coef: float,
    bound_penalty: torch.Tensor | None,
    valid: torch.Tensor,
    bound_coef: float,
    value: torch.Tensor | None = None,
    value_target: torch.Tensor | None = None,
    value_weight: torch.Tensor | None = None,
    value_coef: float = 0.0,
) -> LossTerms:
    """Clipped surrogate with asymmetric clip, k3 KL, entropy bonus and bound penalty. Sums
    are divided by `normaliser` (the trust region's valid samples per minibatch), so every
    valid step weighs the same whatever minibatch it falls in (not averaged per episode).

    The bound penalty (`ActionHead.bound_penalty`) is weighted by `valid`, not by `weights`:
    a Gaussian mean drifts past a bound exactly where every member of a group is clipped
    alike, and those group steps have no spread, so weight 0. The penalty is what pulls
    them back, so it counts on every valid sample. `bound_penalty` None: the head has no
    finite bounds, and `mean_bound` is reported as 0. The critic's error counts on every
    valid sample for the same reason: a state is worth learning whether or not its group
    disagreed; `value_weight` is its validity over the targets' variance. `value` None: no
    critic, and `value_loss` is reported as 0."""
    ratio = torch.exp((logp - old_logp).clamp_max(MAX_LOG_RATIO))
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    if dual_clip is not None:  # A ≥ 0 gives max(S, 0) = S: only negative advantages are cut
        surrogate = torch.maximum(surrogate, dual_clip * advantages.clamp_max(0.0))

    def mean(x: torch.Tensor) -> torch.Tensor:
        return (x * weights).sum() / normaliser

    policy_loss = -mean(surrogate)
    entropy_mean = mean(entropy)
    loss = policy_loss
    if ref_logp is not None:
        kl = mean(k3_kl(logp, ref_logp))
        loss = loss + kl_coef * kl
    else:
        kl = torch.zeros_like(policy_loss)
    loss = loss - entropy_coef * entropy_mean
    if bound_penalty is not None:
        mean_bound = (bound_penalty * valid).sum() / normaliser
        loss = loss + bound_coef * mean_bound
    else:
        mean_bound = torch.zeros_like(policy_loss)
    if value is not None and value_target is not None and value_weight is not None:
        value_loss = ((value.float() - value_target) ** 2 * value_weight).sum() / normaliser
        loss = loss + value_coef * value_loss
    else:
        value_loss = torch.zeros_like(policy_loss)
    clip_fraction = mean(((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).to(logp.dtype))
    approx_kl_old = mean(k3_kl(logp, old_logp).detach())
    return LossTerms(
        *(loss, policy_loss, kl, entropy_mean, clip_fraction, approx_kl_old),
        *(mean_bound.detach(), value_loss.detach()),
    )
