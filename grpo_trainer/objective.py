"""The GRPO objective as pure tensor functions (no module state, no host syncs).

Shapes: `T` time steps by `B = num_groups * group_size` members, member `b` in group
`b // group_size`. `valid[t, b]` is true while member b's episode is running at step t.

* Outcome advantage: `A[b] = (R[b] - mean_g R) / scale`, the same for every step of b.
* Per-step advantage: `A[t, b] = (G[t, b] - mean_g G[t]) / scale`, where `G` is the
  discounted return-to-go and the group mean is taken over members still playing at t.
  Members of a group face identical starts, so at each step they are compared with peers
  in the same situation.
* Scale: the group's std (GRPO), the batch std (REINFORCE++ style) or none (Dr. GRPO).
* Groups whose episode returns have (near-)zero spread carry no signal and get zero weight.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

_EPS = 1e-8


class Advantages(NamedTuple):
    advantages: torch.Tensor  # (T, B) float32, zero where invalid or dropped
    weights: torch.Tensor  # (T, B) float32, 1 for valid samples of kept groups, else 0
    returns: torch.Tensor  # (B,) undiscounted episode returns
    zero_std_groups: torch.Tensor  # (G,) bool, groups dropped for lack of signal


def returns_to_go(rewards: torch.Tensor, valid: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted return from each step to the end of its episode, `(T, B)`."""
    masked = rewards * valid
    out = torch.empty_like(masked)
    running = torch.zeros_like(masked[0])
    for t in range(masked.shape[0] - 1, -1, -1):
        running = masked[t] + gamma * running
        out[t] = running
    return out


def _group_view(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """`(..., B)` -> `(..., G, group_size)`."""
    return x.unflatten(-1, (-1, group_size))


def _masked_mean_std(
    x: torch.Tensor, mask: torch.Tensor, dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population std of `x` over `dim`, counting only `mask`ed entries."""
    count = mask.sum(dim, keepdim=True).clamp_min(1)
    mean = (x * mask).sum(dim, keepdim=True) / count
    var = (((x - mean) * mask) ** 2).sum(dim, keepdim=True) / count
    return mean, var.sqrt()


def group_advantages(
    rewards: torch.Tensor,
    valid: torch.Tensor,
    group_size: int,
    *,
    mode: str = "per_step",
    scale: str = "group_std",
    gamma: float = 1.0,
    zero_std_eps: float = 1e-6,
) -> Advantages:
    """Group-relative advantages for a rollout of `(T, B)` rewards."""
    valid_f = valid.to(rewards.dtype)
    returns = (rewards * valid_f).sum(0)
    grouped_returns = _group_view(returns, group_size)  # (G, K)
    return_mean, return_std = _masked_mean_std(
        grouped_returns, torch.ones_like(grouped_returns), -1
    )
    zero_std = return_std.squeeze(-1) <= zero_std_eps  # (G,)

    if mode == "outcome":  # one comparison per episode, broadcast to its steps
        centred = (grouped_returns - return_mean).flatten().expand_as(rewards)
        std = return_std.expand_as(grouped_returns).flatten().expand_as(rewards)
    elif mode == "per_step":  # compared with the peers still playing at the same step
        grouped = _group_view(returns_to_go(rewards, valid_f, gamma), group_size)  # (T, G, K)
        step_mean, step_std = _masked_mean_std(grouped, _group_view(valid_f, group_size), -1)
        centred = (grouped - step_mean).flatten(-2)
        std = step_std.expand_as(grouped).flatten(-2)
    else:
        raise ValueError(f"advantage mode must be 'per_step' or 'outcome', got {mode!r}")

    keep = (~zero_std).repeat_interleave(group_size).to(rewards.dtype)  # (B,)
    weights = valid_f * keep
    if scale == "group_std":
        centred = centred / (std + _EPS)
    elif scale == "batch_std":
        _, batch_std = _masked_mean_std(centred.flatten(), weights.flatten(), 0)
        centred = centred / (batch_std + _EPS)
    elif scale != "none":
        raise ValueError(f"scale must be 'group_std', 'batch_std' or 'none', got {scale!r}")
    return Advantages(centred * weights, weights, returns, zero_std)


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
    kl_coef: float,
    entropy_coef: float,
) -> LossTerms:
    """Clipped surrogate with asymmetric clip, k3 KL and entropy bonus.

    Sums are divided by `normaliser` (the batch's valid-sample count over the number of
    minibatches), so every valid step of the rollout weighs the same whatever minibatch it
    falls in: the loss is aggregated over steps, not averaged per episode.
    """
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)

    def mean(x: torch.Tensor) -> torch.Tensor:
        return (x * weights).sum() / normaliser

    policy_loss = -mean(surrogate)
    entropy_mean = mean(entropy)
    kl = mean(k3_kl(logp, ref_logp)) if ref_logp is not None else torch.zeros_like(policy_loss)
    loss = policy_loss + kl_coef * kl - entropy_coef * entropy_mean
    clip_fraction = mean(((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).to(logp.dtype))
    approx_kl_old = mean(k3_kl(logp, old_logp).detach())
    return LossTerms(loss, policy_loss, kl, entropy_mean, clip_fraction, approx_kl_old)
