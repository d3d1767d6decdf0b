"""Group-relative advantages: pure tensor functions (no module state, no host syncs), and the
estimator that applies them to a rollout (`make_estimator`).

Shapes: `L` rows by `B = num_groups * group_size` sub-envs, `b` in group `b // group_size`;
`valid[t, b]`: the step's episode counts; `cut[t, b]`: its episode or path ends after t. The
first `T` rows are trained, the rest are their look-ahead.

* Windowed return: `G[t, b] = Σ_{k<W} γ^k r[t+k, b] Π_{j<k} (1 − cut[t+j, b])`.
* Per-step: `A[t, b] = (G[t, b] − mean_{j∈g(b), valid[t, j]} G[t, j]) / scale`: members start
  alike and stay in step, so each is compared with peers at the same step of the same game.
* Outcome: `A[t, b] = (R[b] − mean_{j∈g(b)} R[j]) / scale`, `R` the episode return.
* With a critic (`value_coef > 0`): GAE(λ) advantages `Â[t, b]` (Schulman et al., 2016) take
  the returns' place, `A[t, b] = (Â[t, b] − mean_{j∈g(b), valid[t, j]} Â[t, j]) / scale`, and
  `Â + V` is the critic's target, and its squared error weighs `valid / max(Var[Â + V],
  VALUE_VARIANCE_FLOOR)` (the variance over the update's valid samples, on every rank). An
  episode that a time limit ended bootstraps from the value of its last observation.
* Scale: the group's std (GRPO), the batch std (REINFORCE++) or none (Dr. GRPO). A group
  step whose values spread by at most `zero_std_eps` gets weight 0 (`frac_zero_std`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from grpo_trainer.algorithm.rollout import Rollout
from grpo_trainer.base.config import GRPOConfig

EPS = 1e-8  # keeps a division by a zero std finite
# The least target variance a critic's error is divided by: targets that barely vary (a
# sparse reward before its first success) must not make a tiny error look large.
VALUE_VARIANCE_FLOOR = 1e-2


class Advantages(NamedTuple):
    advantages: Tensor  # (T, B) float32, zero where the weight is zero
    weights: Tensor  # (T, B) float32: 1 for valid samples of group steps with spread
    zero_spread: Tensor  # (T, G) bool: group steps with valid members but no spread
    compared: Tensor  # (T, G) bool: group steps with at least one valid member
    value_targets: Tensor | None = None  # (T, B) the critic's targets (None: no critic)
    value_weights: Tensor | None = None  # (T, B) its squared error's weights (None: no critic)


def windowed_returns(
    rewards: Tensor, cut: Tensor, *, rows: int, window: int, gamma: float
) -> Tensor:
    """`G[t]` for the first `rows` rows (of `rows + window - 1`, or fewer: returns then stop at
    the last row). Equal reward sequences give bit-equal returns, so no spread is exact."""
    length = rewards.shape[0]
    if window >= length:  # every return reaches the last row: one backward pass
        keep = (~cut).to(rewards.dtype) * gamma
        out = torch.empty_like(rewards)
        running = torch.zeros_like(rewards[0])
        for t in range(length - 1, -1, -1):
            running = rewards[t] + keep[t] * running
            out[t] = running
        return out[:rows]
    if rows + window - 1 > length:
        raise ValueError(f"{rows} rows with a {window}-step window need {rows + window - 1} rows")
    returns = torch.zeros_like(rewards[:rows])
    going = torch.ones_like(returns)  # no cut yet between t and t + k
    for k in range(window):
        returns += (gamma**k) * rewards[k : k + rows] * going
        going = going * ~cut[k : k + rows]
    return returns


def gae(
    rewards: Tensor,
    cut: Tensor,
    values: Tensor,
    *,
    rows: int,
    gamma: float,
    lam: float,
    bootstrap: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GAE(λ) advantages of the first `rows` rows, and the critic's targets (advantage plus
    value), from the `(L, B)` rewards, cuts and values of every played row. A cut ends the
    sum and the bootstrap: past it lies another episode, or another member's path. Where
    `bootstrap` is set as well (a time limit ended the episode, and the next row holds its
    last observation) the sum ends but the bootstrap stays: the game could have gone on, and
    an observation without the clock cannot tell the critic that its value is about to be cut
    (Pardo et al., 2018). The last row bootstraps from nothing; it lies `L - rows` rows past
    the last trained one, where its weight is `(γλ)^(L - rows)` (1.5e-3 for MinAtar's 127
    rows at λ = 0.95)."""
    keep = (~cut).to(values.dtype)
    carry = keep if bootstrap is None else (~cut | bootstrap).to(values.dtype)
    out = torch.empty_like(values)
    running = torch.zeros_like(values[0])
    next_value = torch.zeros_like(values[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        delta = rewards[t] + gamma * carry[t] * next_value - values[t]
        running = delta + gamma * lam * keep[t] * running
        out[t] = running
        next_value = values[t]
    return out[:rows], (out + values)[:rows]


def value_weights(
    targets: Tensor, valid: Tensor, sum_over_ranks: Callable[[Tensor], Tensor] = lambda x: x
) -> Tensor:
    """The weight of the critic's squared error at each step: `valid / max(Var, floor)`, the
    variance of the valid targets over the update (and every rank). Dividing by it makes the
    critic's loss scale-free: on LunarLander, where returns run to the hundreds, the raw
    squared error outweighed the clipped policy loss under the gradient clip and the policy
    collapsed (docs/trainer.md, "A critic under PPO's seconds")."""
    variance = _weighted_variance(targets, valid, sum_over_ranks)
    return valid.to(targets.dtype) / variance.clamp_min(VALUE_VARIANCE_FLOOR).to(targets.dtype)


def _weighted_variance(
    x: Tensor, weights: Tensor, sum_over_ranks: Callable[[Tensor], Tensor]
) -> Tensor:
    """The float64 variance of `x` under `weights` (0/1 masks here), its moments summed over
    ranks, so that it does not depend on how the batch is split."""
    w, x = weights.double(), x.double()
    moments = sum_over_ranks(torch.stack((w.sum(), (w * x).sum(), (w * x * x).sum())))
    count = moments[0].clamp_min(1.0)
    return moments[2] / count - (moments[1] / count) ** 2


def episode_returns(rewards: Tensor, valid: Tensor) -> Tensor:
    """Undiscounted return of each member's episode, `(B,)` (one episode per member)."""
    return (rewards * valid).sum(0)


def _groups(x: Tensor, group_size: int) -> Tensor:
    """`(..., B)` -> `(..., G, group_size)`."""
    return x.unflatten(-1, (-1, group_size))


def _masked_mean_std(x: Tensor, mask: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """Mean and population std of `x` over `dim`, counting only `mask`ed entries."""
    count = mask.sum(dim, keepdim=True).clamp_min(1)
    mean = (x * mask).sum(dim, keepdim=True) / count
    var = (((x - mean) * mask) ** 2).sum(dim, keepdim=True) / count
    return mean, var.sqrt()


def group_relative(
    returns: Tensor,
    compare: Tensor,
    valid: Tensor,
    group_size: int,
    *,
    scale: str,
    zero_std_eps: float,
    sum_over_ranks: Callable[[Tensor], Tensor] = lambda x: x,
) -> Advantages:
    """Advantages of `(T, B)` `returns` against their group's mean over the members `compare`
    marks at the same row; samples count where `valid`. `sum_over_ranks` sums the batch-std
    moments over ranks, so `scale="batch_std"` does not depend on how the batch is split."""
    compare_f = compare.to(returns.dtype)
    grouped = _groups(returns, group_size)  # (T, G, K)
    members = _groups(compare_f, group_size)
    mean, std = _masked_mean_std(grouped, members, -1)
    compared = members.sum(-1) > 0  # (T, G)
    spread = std.squeeze(-1) > zero_std_eps
    centred = (grouped - mean).flatten(-2)
    weights = valid.to(returns.dtype) * spread.repeat_interleave(group_size, -1)
    if scale == "group_std":
        centred = centred / (std.expand_as(grouped).flatten(-2) + EPS)
    elif scale == "batch_std":
        batch_std = _weighted_variance(centred, weights, sum_over_ranks).clamp_min(0.0).sqrt()
        centred = centred / (batch_std.to(centred.dtype) + EPS)
    elif scale != "none":
        raise ValueError(f"scale must be 'group_std', 'batch_std' or 'none', got {scale!r}")
    return Advantages(centred * weights, weights, compared & ~spread, compared)


# -- what a return is: chosen once per `advantage` setting --------------------------------

Estimator = Callable[[Rollout, Tensor | None], Advantages]


def make_estimator(config: GRPOConfig, sum_over_ranks: Callable[[Tensor], Tensor]) -> Estimator:
    """The rollout's advantages: `advantage="per_step"` compares each step's discounted
    return over the rollout's window with the members of its group still playing at the same
    row; `"outcome"` gives every step of a member's episode the episode's return, compared
    with every member's. Given a critic's `values` of every played row, each step's GAE takes
    the place of its return."""

    def per_step(rollout: Rollout, trained: Tensor) -> tuple[Tensor, Tensor]:
        rows = trained.shape[0]
        returns = windowed_returns(
            rollout.rewards, rollout.cut, rows=rows, window=rollout.window, gamma=config.gamma
        )
        return returns, trained

    def outcome(rollout: Rollout, trained: Tensor) -> tuple[Tensor, Tensor]:
        returns = episode_returns(rollout.rewards, rollout.valid).expand_as(trained)
        return returns, torch.ones_like(trained)

    returns_of = outcome if config.advantage == "outcome" else per_step

    def estimate(rollout: Rollout, values: Tensor | None = None) -> Advantages:
        trained = rollout.valid[: rollout.obs.shape[0]]
        targets = None
        if values is None:
            returns, compare = returns_of(rollout, trained)
        else:  # a critic's values of every played row: its GAE is what the group compares
            returns, targets = gae(
                rollout.rewards,
                rollout.cut,
                values,
                rows=trained.shape[0],
                gamma=config.gamma,
                lam=config.gae_lambda,
                bootstrap=rollout.bootstrap,
            )
            compare = trained
        adv = group_relative(
            returns,
            compare,
            trained,
            config.group_size,
            scale=config.scale,
            zero_std_eps=config.zero_std_eps,
            sum_over_ranks=sum_over_ranks,
        )
        if targets is None:
            return adv
        weights = value_weights(targets, trained, sum_over_ranks)
        return adv._replace(value_targets=targets, value_weights=weights)

    return estimate
