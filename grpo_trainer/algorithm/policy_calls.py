"""The three ways GRPO runs its policy, each under the run's autocast: sampling actions in a
rollout, scoring stored actions (the anchor of a clipped ratio), and one minibatch's loss.
The trainer compiles the first and the last (`accel.Compiled`)."""

from __future__ import annotations

from typing import Any

import torch

from grpo_trainer.algorithm.objective import LossTerms, grpo_loss
from grpo_trainer.algorithm.policy import Policy
from grpo_trainer.base.accel import autocast
from grpo_trainer.base.config import GRPOConfig


class PolicyCalls:
    """`policy` (and the KL `reference`, if any) as the rollout and the update call it."""

    def __init__(
        self,
        policy: Policy,
        reference: Policy | None,
        config: GRPOConfig,
        amp: str,
        device: torch.device,
    ) -> None:
        self.policy, self.reference, self.config = policy, reference, config
        self.amp, self.device = amp, device

    def sample(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One action per observation and its log-prob, from the given noise."""
        with autocast(self.amp, self.device):
            return self.policy.sample(obs, noise)

    @torch.no_grad()
    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The current policy's float32 log-probs of `actions`: the anchor of a clipped ratio."""
        with autocast(self.amp, self.device):
            logp, _ = self.policy.log_prob_entropy(obs, actions)
        return logp.float()

    def loss(
        self,
        log_prob_entropy: Any,
        obs: torch.Tensor,
        actions: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        weights: torch.Tensor,
        normaliser: torch.Tensor,
    ) -> LossTerms:
        """One minibatch's loss terms; `log_prob_entropy` is the policy's forward (through
        DDP in a distributed run, so that gradients are averaged over ranks)."""
        cfg = self.config
        with autocast(self.amp, self.device):
            logp, entropy = log_prob_entropy(obs, actions)
            ref_logp = None
            if self.reference is not None:
                with torch.no_grad():
                    ref_logp, _ = self.reference.log_prob_entropy(obs, actions)
        return grpo_loss(
            logp,
            old_logp,
            advantages,
            weights,
            entropy,
            ref_logp,
            normaliser=normaliser,
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            kl_coef=cfg.kl_coef,
            entropy_coef=cfg.entropy_coef,
        )
