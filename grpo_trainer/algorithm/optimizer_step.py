"""What an update optimises and how: its samples (`Samples`), trust regions, one optimiser
step per minibatch (`OptimizerStep`) and the sums over its steps (`LossTotals`).

A non-finite step must not reach the weights, and asking the host would stall a GPU, so the
verdict stays a tensor: the fused optimizer takes it as `found_inf` (as GradScaler does); a
foreach step is taken and then undone where the verdict says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from torch import nn

from grpo_trainer.algorithm.advantages import Advantages
from grpo_trainer.algorithm.objective import LossTerms
from grpo_trainer.algorithm.rollout import Rollout
from grpo_trainer.base.accel import make_optimizer
from grpo_trainer.base.collective import Collective
from grpo_trainer.base.config import GRPOConfig


class Samples(NamedTuple):
    """One entry per trained env step, flattened over rows and sub-envs."""

    obs: torch.Tensor
    actions: torch.Tensor
    old_logp: torch.Tensor  # the behaviour policy's log-prob: the anchor of the clipped ratio
    advantages: torch.Tensor
    weights: torch.Tensor  # 1 for valid samples of group steps with spread, else 0
    valid: torch.Tensor  # 1 where the step belongs to an episode that counts
    value_targets: torch.Tensor | None = None  # the critic's targets (None: no critic)
    value_weights: torch.Tensor | None = None  # its squared error's weights (None: no critic)

    @classmethod
    def of(cls, rollout: Rollout, old_logp: torch.Tensor, adv: Advantages) -> Samples:
        valid = rollout.valid[: rollout.obs.shape[0]].to(adv.weights.dtype)
        columns = (rollout.obs, rollout.actions, old_logp, adv.advantages, adv.weights, valid)
        critic = (adv.value_targets, adv.value_weights)
        return cls(
            *(t.flatten(0, 1) for t in columns), *(t if t is None else t.flatten() for t in critic)
        )

    def importance_weighted(self, logp: torch.Tensor, played_logp: torch.Tensor) -> Samples:
        """The samples with each weight times min(1, π(a|s) / π_played(a|s)): `logp` is the
        current policy's log-prob of the rows (`old_logp`), `played_logp` the policy's that
        played them. Rows that wait for their look-ahead were played by a policy up to
        window / rollout_steps updates old (4 on MinAtar). Re-scoring anchors their ratio at
        the current policy but keeps the old policy's choice of actions, so an action the
        policy has since all but given up (log-prob -30) is still pushed down with a full
        gradient, which spreads the logits further: on MinAtar Breakout that loop ended in a
        dead policy (docs/trainer.md). The truncated importance weight (IMPALA's ρ̄ = 1,
        Espeholt et al., 2018) counts such a row as often as the current policy would play
        it, and never more than once. A fresh row's weight is exactly 1."""
        factor = (logp - played_logp).flatten().clamp_max(0.0).exp()
        return self._replace(weights=self.weights * factor)

    @property
    def size(self) -> int:
        return self.obs.shape[0]

    def rows(self, index: torch.Tensor) -> Samples:
        """The samples at `index` (index_select: faster than x[index] on the CPU)."""
        return Samples(*(None if t is None else t.index_select(0, index) for t in self))

    def anchored(self, log_prob: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Samples:
        """A trust region re-anchored: its ratios start at 1 for the policy `log_prob` scores."""
        return self._replace(old_logp=log_prob(self.obs, self.actions))

    def rows_to_train(self, penalised: bool) -> torch.Tensor:
        """Which rows a minibatch keeps where `GRPO.drop_flat_rows`: not those whose every
        loss term is 0. Those add exact zeros to the step, yet cost a forward and a backward
        pass each. A row of weight 0 (a group step without spread, a step that does not count)
        has a zero surrogate, KL and entropy term; its bound penalty is weighted by `valid`
        instead, so where the penalty is on (`penalised`: a coefficient above 0 and a head
        with finite bounds) every valid row stays. Why not only those past a bound: whether
        a row's mean is past one is known only after its forward pass, and the rows of
        weight 0 are the very ones that drift (once every member of a group is clipped, the
        group has no spread). A row whose advantage or log-prob is not finite stays too (a
        NaN return or observation makes both so): it makes the step non-finite, which is
        skipped and counted, as with every row."""
        keep = self.valid > 0 if penalised else self.weights > 0  # weight > 0: valid too
        return keep | ~torch.isfinite(self.advantages) | ~torch.isfinite(self.old_logp)


def trust_regions(
    samples: int, anchor_samples: int | None, generator: torch.Generator, device: torch.device
) -> list[torch.Tensor | None]:
    """The batch's samples split at random into parts of about `anchor_samples`, each
    optimised from an anchor of its own (`[None]`: the whole batch, from one): the clip bounds
    how far one anchor lets the policy move (docs/trainer.md, "Trust regions at large
    batches")."""
    parts = 1 if anchor_samples is None else -(-samples // anchor_samples)
    if parts == 1:
        return [None]
    order = torch.randperm(samples, generator=generator, device=device)
    return list(order.tensor_split(parts))


class LossTotals:
    """Sums over an update's optimiser steps, on the device: loss terms, grad norm, skips."""

    def __init__(self, device: torch.device) -> None:
        self.terms = torch.zeros(len(LossTerms._fields), device=device)
        self.grad_norm = torch.zeros((), device=device)
        self.skipped = torch.zeros((), device=device)
        self.steps = 0

    def add(self, terms: torch.Tensor, grad_norm: torch.Tensor, finite: torch.Tensor) -> None:
        self.terms += terms
        self.grad_norm += grad_norm
        self.skipped += (~finite).float()
        self.steps += 1

    def means(self) -> dict[str, torch.Tensor]:
        """Each term's and the gradient norm's mean over the steps; `skipped_steps` a count."""
        means = dict(zip(LossTerms._fields, self.terms / self.steps, strict=True))
        return {**means, "grad_norm": self.grad_norm / self.steps, "skipped_steps": self.skipped}


class OptimizerStep:
    """AdamW (fused where the device has it) with gradient clipping and device-side skips."""

    def __init__(
        self, policy: nn.Module, config: GRPOConfig, amp: str, collective: Collective
    ) -> None:
        self.policy, self.collective = policy, collective
        self.max_grad_norm = config.max_grad_norm
        self.optimizer, self.fused = make_optimizer(
            policy.parameters(), config.lr, config.run.fused_optimizer
        )
        self.scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def apply(self, loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Clip and apply the gradients unless not finite: (grad norm, verdict), on the device."""
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        params = [p for p in self.policy.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        finite = self.collective.finite(grad_norm, loss)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif self.fused:
            self.optimizer.found_inf = (~finite).float()  # type: ignore[attr-defined]
            self.optimizer.step()
            del self.optimizer.found_inf  # type: ignore[attr-defined]
        else:
            self._step_where(finite)
        return torch.nan_to_num(grad_norm, nan=0.0, posinf=0.0), finite

    @torch.no_grad()
    def _step_where(self, finite: torch.Tensor) -> None:
        """A foreach step kept only where `finite`: parameters, Adam's moments and step count."""
        before = {id(t): t.clone() for t in self._tensors(finite.device)}
        self.optimizer.step()
        for t in self._tensors(finite.device):  # state this first step made falls back to zero
            old = before.get(id(t))
            t.copy_(torch.where(finite, t, torch.zeros_like(t) if old is None else old))

    def _tensors(self, device: torch.device) -> Iterator[torch.Tensor]:
        for p in self.policy.parameters():
            state = self.optimizer.state.get(p, {})
            yield p
            yield from (t for t in state.values() if t.device == device)

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
        }

    def load_state_dict(self, optimizer: dict[str, Any], scaler: dict[str, Any] | None) -> None:
        """Adam's state from a checkpoint. The implementation (fused or foreach) stays this
        run's choice: a fused step's `found_inf` on a foreach optimizer would fail in torch."""
        implementation = [
            {k: g[k] for k in ("fused", "foreach") if k in g} for g in self.optimizer.param_groups
        ]
        self.optimizer.load_state_dict(optimizer)
        for group, kept in zip(self.optimizer.param_groups, implementation, strict=True):
            group.update(kept)
        if self.scaler and scaler:
            self.scaler.load_state_dict(scaler)
