"""The "before" of benchmarks/train_throughput.py: GRPO written the straightforward way.

The same algorithm as `grpo_trainer.GRPOTrainer` (group resets, per-step group-relative
advantages with batch-std scaling, clipped surrogate with DAPO's clip-higher, entropy bonus,
global-norm clipping, AdamW), the same network (two hidden layers of 64, relu as the trainer's
default or tanh, the same initialisation), the same batch, rollout length, epochs and
minibatches, written the way a first version usually is:

* a Python loop over time steps that logs with a host sync (`.item()`) every step;
* `torch.distributions.Categorical` for sampling, log-probs and entropy;
* float32 observations, int64 actions and the logits stored for every step;
* eager PyTorch, no autocast, an unfused (for-loop) AdamW, `.item()` on the loss and the
  gradient norm of every minibatch.

It exists so that the trainer's speed-up is a ratio measured on the same machine at the
same moment, not a number remembered from another day. It is a benchmark helper, not a
trainer: no checkpoints, no resume, Discrete actions and flat observations only.

    python benchmarks/naive_grpo.py --num-groups 32 --group-size 8 --updates 3
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import gymnasium as gym
import torch
from torch import nn
from torch.distributions import Categorical


class NaiveGRPO:
    """One-process GRPO on a Gymnasium vector env of torch tensors (FruitCatcher-v0)."""

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        num_groups: int,
        group_size: int,
        horizon: int,
        *,
        epochs: int = 4,
        minibatches: int = 8,
        hidden: int = 64,
        lr: float = 1e-2,
        gamma: float = 0.95,
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        entropy_coef: float = 0.01,
        max_grad_norm: float = 1.0,
        zero_std_eps: float = 1e-6,
        seed: int = 0,
        activation: str = "relu",
        device: str | torch.device = "cpu",
    ) -> None:
        self.envs, self.num_groups, self.group_size = envs, num_groups, group_size
        self.num_envs = num_groups * group_size
        self.horizon, self.epochs, self.minibatches = horizon, epochs, minibatches
        self.gamma, self.clip_low, self.clip_high = gamma, clip_low, clip_high
        self.entropy_coef, self.max_grad_norm = entropy_coef, max_grad_norm
        self.zero_std_eps, self.seed = zero_std_eps, seed
        torch.manual_seed(seed)
        obs_dim = int(envs.single_observation_space.shape[0])
        n_actions = int(envs.single_action_space.n)
        act = {"relu": nn.ReLU, "tanh": nn.Tanh}[activation]
        self.policy = nn.Sequential(
            nn.Linear(obs_dim, hidden),
            act(),
            nn.Linear(hidden, hidden),
            act(),
            nn.Linear(hidden, n_actions),
        )
        for layer in self.policy:
            if isinstance(layer, nn.Linear):
                gain = 0.01 if layer.out_features == n_actions else math.sqrt(2)
                nn.init.orthogonal_(layer.weight, gain)
                nn.init.zeros_(layer.bias)
        self.device = device = torch.device(device)
        self.policy.to(device)
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=lr, weight_decay=0.0, foreach=False
        )
        self.update_index = 0
        self.log: list[dict[str, float]] = []
        # Storage, float32 throughout, logits kept "for debugging".
        t, b = horizon, self.num_envs
        self.obs = torch.zeros(t, b, obs_dim, device=device)
        self.logits = torch.zeros(t, b, n_actions, device=device)
        self.actions = torch.zeros(t, b, dtype=torch.int64, device=device)
        self.logp = torch.zeros(t, b, device=device)
        self.rewards = torch.zeros(t, b, device=device)
        self.valid = torch.zeros(t, b, device=device)

    @property
    def bytes_per_step(self) -> int:
        """Bytes stored per env-step (for the comparison with RolloutBuffer.bytes_per_step)."""
        tensors = (self.obs, self.logits, self.actions, self.logp, self.rewards, self.valid)
        return sum(x[0, 0].numel() * x.element_size() for x in tensors)

    def update(self) -> dict[str, float]:
        """One rollout of every group and epochs x minibatches of AdamW steps."""
        start = time.perf_counter()
        seeds = []
        for g in range(self.num_groups):
            seeds += [self.seed * 1_000_003 + self.update_index * self.num_groups + g] * (
                self.group_size
            )
        obs, _ = self.envs.reset(seed=seeds)
        self.valid.zero_()
        self.rewards.zero_()
        alive = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        episode_reward = 0.0
        with torch.no_grad():
            for t in range(self.horizon):
                logits = self.policy(obs.float())
                dist = Categorical(logits=logits)
                action = dist.sample()
                self.obs[t] = obs
                self.logits[t] = logits
                self.actions[t] = action
                self.logp[t] = dist.log_prob(action)
                self.valid[t] = alive.float()
                obs, reward, terminated, truncated, _ = self.envs.step(action)
                self.rewards[t] = reward * alive
                episode_reward += (reward * alive).sum().item()  # per-step logging
                alive = alive & ~(terminated | truncated)
                if alive.sum().item() == 0:  # stop early when every episode has ended
                    break
        rollout_s = time.perf_counter() - start

        # Advantages: discounted return-to-go, centred on the mean of the group members
        # still playing at that step, scaled by the batch std of the valid samples.
        returns_to_go = torch.zeros_like(self.rewards)
        running = torch.zeros(self.num_envs, device=self.device)
        for t in reversed(range(self.horizon)):
            running = self.rewards[t] + self.gamma * running
            returns_to_go[t] = running
        returns_to_go *= self.valid
        returns = self.rewards.sum(0)
        grouped_returns = returns.view(self.num_groups, self.group_size)
        keep = (grouped_returns.std(1, unbiased=False) > self.zero_std_eps).float()
        weights = self.valid * keep.repeat_interleave(self.group_size)
        grouped = returns_to_go.view(self.horizon, self.num_groups, self.group_size)
        grouped_valid = self.valid.view(self.horizon, self.num_groups, self.group_size)
        count = grouped_valid.sum(-1, keepdim=True).clamp(min=1)
        mean = (grouped * grouped_valid).sum(-1, keepdim=True) / count
        centred = (grouped - mean).view(self.horizon, self.num_envs)
        n_valid = weights.sum()
        batch_mean = (centred * weights).sum() / n_valid.clamp(min=1)
        batch_std = (((centred - batch_mean) * weights) ** 2).sum() / n_valid.clamp(min=1)
        advantages = centred / (batch_std.sqrt() + 1e-8) * weights

        obs = self.obs.view(-1, self.obs.shape[-1])
        actions = self.actions.view(-1)
        old_logp = self.logp.view(-1)
        adv = advantages.view(-1)
        w = weights.view(-1)
        normaliser = n_valid.clamp(min=1) / self.minibatches
        losses = []
        for _ in range(self.epochs):
            order = torch.randperm(obs.shape[0], device=self.device)
            for idx in order.tensor_split(self.minibatches):
                dist = Categorical(logits=self.policy(obs[idx]))
                logp = dist.log_prob(actions[idx])
                ratio = torch.exp(logp - old_logp[idx])
                clipped = torch.clamp(ratio, 1 - self.clip_low, 1 + self.clip_high)
                surrogate = torch.min(ratio * adv[idx], clipped * adv[idx])
                policy_loss = -(surrogate * w[idx]).sum() / normaliser
                entropy = (dist.entropy() * w[idx]).sum() / normaliser
                loss = policy_loss - self.entropy_coef * entropy
                self.optimizer.zero_grad()
                loss.backward()
                grad_norm = nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                if math.isfinite(grad_norm.item()):
                    self.optimizer.step()
                losses.append(loss.item())
        self.update_index += 1
        steps = int(self.valid.sum().item())
        row = {
            "valid_steps": float(steps),
            "return_mean": float(returns.mean().item()),
            "episode_reward_sum": episode_reward,
            "loss": sum(losses) / len(losses),
            "rollout_s": rollout_s,
            "update_s": time.perf_counter() - start - rollout_s,
        }
        self.log.append(row)
        return row


def main() -> None:
    import fruit_env  # noqa: F401  (registers FruitCatcher-v0)

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-groups", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--horizon", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    envs = gym.make_vec(
        "FruitCatcher-v0", num_envs=args.num_groups * args.group_size, device=args.device
    )
    naive = NaiveGRPO(
        envs,
        args.num_groups,
        args.group_size,
        args.horizon,
        epochs=args.epochs,
        minibatches=args.minibatches,
        device=args.device,
    )
    for _ in range(args.updates):
        row: dict[str, Any] = naive.update()
        seconds = row["rollout_s"] + row["update_s"]
        print(
            f"update {naive.update_index}: {row['valid_steps'] / seconds:,.0f} env-steps/s "
            f"(rollout {row['rollout_s']:.2f} s, update {row['update_s']:.2f} s), "
            f"return {row['return_mean']:.2f}"
        )


if __name__ == "__main__":
    main()
