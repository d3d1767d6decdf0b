"""GRPO on one page: group-relative advantages and a clipped surrogate, in plain PyTorch.

    python examples/grpo_one_page.py            # FruitCatcher-v0: about 10 s on one CPU core
    python examples/grpo_one_page.py --updates 100 --num-groups 32
    python examples/grpo_one_page.py --help     # every Config field, with its meaning

Read `OnePageGRPO.update()` top to bottom: `collect()` plays one episode in every sub-env,
`learn()` compares each step with its group and optimises. The formulas are those of
docs/trainer.md, and the update is the one `grpo_trainer.GRPOTrainer` makes with
`rollout="episodes"`, `scale="batch_std"`, one trust region (`anchor_samples=None`) and no KL
term (the trainer sizes minibatches in samples, this file counts them):
tests/test_one_page_grpo.py checks that both make the same update from the same rollout and
weights.

It is written the straightforward way on purpose (a Python loop over time steps that asks
the device every step whether any episode still runs, `torch.distributions.Categorical`,
float32 observations and int64 actions stored, a for-loop AdamW, eager PyTorch), and so it is
also the "naive" row that benchmarks/train_throughput.py times the trainer against. What the
trainer adds is in docs/trainer.md: windowed rollouts whose episodes run on across updates,
group restarts and branching, trust regions, any action space, compilation, mixed precision,
checkpoints, evaluation, distributed training. Flat Box observations and Discrete actions only.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import math
import time
from collections.abc import Sequence
from typing import NamedTuple

import gymnasium as gym
import torch
from torch import nn
from torch.distributions import Categorical


@dataclasses.dataclass
class Config:
    """Hyperparameters; every field is a flag (`num_groups` -> `--num-groups`). The discount,
    clips, coefficients, rate and network are the trainer's defaults; the batch is small and
    the run short, so that it trains in seconds."""

    env_id: str = "FruitCatcher-v0"
    """Gymnasium id of a vector env with flat Box observations and Discrete actions."""
    num_groups: int = 16
    """Groups per update: the env has num_groups x group_size sub-envs."""
    group_size: int = 8
    """Members per group: they start from the same state and are compared with each other."""
    horizon: int = 200
    """At most this many steps per episode (FruitCatcher-v0's own limit is 200)."""
    updates: int = 30
    """Updates to run: each plays one episode in every sub-env."""
    epochs: int = 4
    """Passes over each update's samples."""
    minibatches: int = 4
    """Gradient steps per epoch: the samples are shuffled and split into this many parts."""
    lr: float = 0.01
    """AdamW learning rate (constant)."""
    gamma: float = 0.97
    """Discount of the returns-to-go."""
    clip_low: float = 0.2
    """Ratio clip below: 1 - clip_low."""
    clip_high: float = 0.28
    """Ratio clip above: 1 + clip_high (DAPO's clip-higher)."""
    entropy_coef: float = 0.01
    """Weight of the entropy bonus."""
    max_grad_norm: float = 1.0
    """The global gradient norm is clipped to this."""
    zero_std_eps: float = 1e-6
    """A group step whose returns spread by no more than this carries no signal (weight 0)."""
    hidden: int = 64
    """Width of the two hidden layers."""
    activation: str = "relu"
    """Activation of the hidden layers: relu or tanh."""
    seed: int = 0
    """Seeds the network, the sampling, the shuffling and the groups' starts."""
    device: str = "cpu"
    """Torch device of the env, the network and the rollout."""


class Batch(NamedTuple):
    """One rollout, `T` steps of `B = num_groups * group_size` sub-envs; member `b` belongs to
    group `b // group_size`."""

    obs: torch.Tensor  # (T, B, obs_dim) float32
    actions: torch.Tensor  # (T, B) int64
    logp: torch.Tensor  # (T, B) log π_old(a|s): the log-prob under the policy that played
    rewards: torch.Tensor  # (T, B) 0 once the member's episode has ended
    valid: torch.Tensor  # (T, B) 1 while the member's episode runs, 0 after it ended


def returns_to_go(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """`G[t] = r[t] + γ G[t+1]`: rewards are 0 after an episode ends, so `G[t]` is the
    discounted return from step t to the end of the member's episode."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        running = rewards[t] + gamma * running
        returns[t] = running
    return returns


def group_advantages(
    returns: torch.Tensor, valid: torch.Tensor, group_size: int, zero_std_eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`A[t, b] = (G[t, b] − mean_{j ∈ g(b), v[t, j]} G[t, j]) / scale`, the sample weights `w`
    and which group steps had returns that spread (`(T, groups)` bool).

    Members of a group start alike and play in step, so at step t each is compared with the
    members of its group still playing at step t: the group is the baseline, no critic is
    needed. A group step whose returns do not spread says nothing about which action was
    better: weight 0. `scale` is the batch std of the centred values (REINFORCE++): one scale
    for the batch keeps a group whose returns differ a lot weighing more than one whose
    returns barely do.
    """
    grouped = returns.unflatten(1, (-1, group_size))  # (T, groups, group_size)
    members = valid.unflatten(1, (-1, group_size))
    count = members.sum(-1, keepdim=True).clamp(min=1)
    mean = (grouped * members).sum(-1, keepdim=True) / count
    std = ((((grouped - mean) * members) ** 2).sum(-1, keepdim=True) / count).sqrt()
    spread = std.squeeze(-1) > zero_std_eps
    weights = (members * spread[..., None]).flatten(1)
    centred = (grouped - mean).flatten(1)
    # Centred values average 0 over the members of every group step, so over the batch too.
    batch_std = ((weights * centred**2).sum() / weights.sum().clamp(min=1)).sqrt()
    return centred / (batch_std + 1e-8) * weights, weights, spread


def make_policy(obs_dim: int, n_actions: int, hidden: int, activation: str) -> nn.Sequential:
    """An MLP from observation to action logits, with the trainer's initialisation:
    orthogonal, gain √2 for hidden layers, 0.01 for the output (a near-uniform first policy)."""
    act = {"relu": nn.ReLU, "tanh": nn.Tanh}[activation]
    policy = nn.Sequential(
        nn.Linear(obs_dim, hidden),
        act(),
        nn.Linear(hidden, hidden),
        act(),
        nn.Linear(hidden, n_actions),
    )
    for layer in policy:
        if isinstance(layer, nn.Linear):
            gain = 0.01 if layer.out_features == n_actions else math.sqrt(2)
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)
    return policy


class OnePageGRPO:
    """GRPO on a Gymnasium vector env of torch tensors with num_groups x group_size sub-envs."""

    def __init__(self, envs: gym.vector.VectorEnv, config: Config) -> None:
        self.envs, self.config = envs, config
        self.num_envs = config.num_groups * config.group_size
        if envs.num_envs != self.num_envs:
            raise ValueError(f"the env has {envs.num_envs} sub-envs, the config {self.num_envs}")
        self.device = device = torch.device(config.device)
        torch.manual_seed(config.seed)
        obs_dim = int(envs.single_observation_space.shape[0])
        n_actions = int(envs.single_action_space.n)
        self.policy = make_policy(obs_dim, n_actions, config.hidden, config.activation).to(device)
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=config.lr, weight_decay=0.0, foreach=False
        )
        self.generator = torch.Generator(device).manual_seed(config.seed)  # minibatch order
        self.update_index = 0
        # The rollout's storage, allocated once.
        t, b = config.horizon, self.num_envs
        self.obs = torch.zeros(t, b, obs_dim, device=device)
        self.actions = torch.zeros(t, b, dtype=torch.int64, device=device)
        self.logp = torch.zeros(t, b, device=device)
        self.rewards = torch.zeros(t, b, device=device)
        self.valid = torch.zeros(t, b, device=device)

    def update(self) -> dict[str, float]:
        """One GRPO update: play an episode in every sub-env, then learn from it."""
        start = time.perf_counter()
        batch = self.collect()
        played = time.perf_counter()
        metrics = self.learn(batch)
        self.update_index += 1
        metrics["rollout_s"] = played - start
        metrics["update_s"] = time.perf_counter() - played
        return metrics

    @torch.no_grad()
    def collect(self) -> Batch:
        """Play: every group starts from a seed of its own, the same for all its members, and
        every member plays one episode (at most `horizon` steps) with the current policy."""
        cfg = self.config
        group_seeds = [
            cfg.seed * 1_000_003 + self.update_index * cfg.num_groups + g
            for g in range(cfg.num_groups)
        ]
        obs, _ = self.envs.reset(seed=[s for s in group_seeds for _ in range(cfg.group_size)])
        self.rewards.zero_()
        self.valid.zero_()
        alive = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        steps = 0
        for t in range(cfg.horizon):
            dist = Categorical(logits=self.policy(obs.float()))
            action = dist.sample()
            self.obs[t] = obs
            self.actions[t] = action
            self.logp[t] = dist.log_prob(action)
            self.valid[t] = alive
            obs, reward, terminated, truncated, _ = self.envs.step(action)
            self.rewards[t] = reward * alive  # a member's later episodes do not count
            alive = alive & ~(terminated | truncated)
            steps = t + 1
            if not alive.any():  # every episode has ended (a host sync every step)
                break
        stored = (self.obs, self.actions, self.logp, self.rewards, self.valid)
        return Batch(*(x[:steps] for x in stored))

    def learn(self, batch: Batch) -> dict[str, float]:
        """Compare each step with its group, then `epochs` passes of `minibatches` AdamW
        steps on the clipped surrogate. Returns the update's means."""
        cfg = self.config

        # Compare: G[t, b], the discounted return from step t, against the group's at step t.
        valid = batch.valid.float()
        returns = returns_to_go(batch.rewards, cfg.gamma)
        advantages, weights, spread = group_advantages(
            returns, valid, cfg.group_size, cfg.zero_std_eps
        )

        # Optimise, with ρ = exp(log π(a|s) − log π_old(a|s)):
        #   L = −Σ w·min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A) / N − c_H·Σ w·H / N
        # N = (valid samples) / minibatches: every sample weighs the same whatever
        # minibatch it falls in, a long episode counts for more steps than a short one, and
        # steps shrink as fewer groups disagree (group steps without spread count in N).
        obs, actions = batch.obs.flatten(0, 1), batch.actions.flatten(0, 1)
        old_logp, adv, w = batch.logp.flatten(), advantages.flatten(), weights.flatten()
        normaliser = valid.sum().clamp(min=1) / cfg.minibatches
        sums = {"loss": 0.0, "policy_loss": 0.0, "entropy": 0.0, "grad_norm": 0.0}
        for _ in range(cfg.epochs):
            order = torch.randperm(obs.shape[0], generator=self.generator, device=self.device)
            for idx in order.tensor_split(cfg.minibatches):
                dist = Categorical(logits=self.policy(obs[idx].float()))
                ratio = torch.exp(dist.log_prob(actions[idx]) - old_logp[idx])
                clipped = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
                surrogate = torch.min(ratio * adv[idx], clipped * adv[idx])
                policy_loss = -(surrogate * w[idx]).sum() / normaliser
                entropy = (dist.entropy() * w[idx]).sum() / normaliser
                loss = policy_loss - cfg.entropy_coef * entropy
                self.optimizer.zero_grad()
                loss.backward()
                grad_norm = nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
                if math.isfinite(grad_norm.item()):  # a non-finite gradient skips the step
                    self.optimizer.step()
                for name, value in zip(sums, (loss, policy_loss, entropy, grad_norm), strict=True):
                    sums[name] += value.item()
        steps = cfg.epochs * cfg.minibatches
        playing = batch.valid.unflatten(1, (-1, cfg.group_size)).any(-1)  # compared group steps
        return {
            **{name: total / steps for name, total in sums.items()},
            "valid_steps": valid.sum().item(),
            "return_mean": batch.rewards.sum(0).mean().item(),
            "frac_zero_std_groups": ((playing & ~spread).sum() / playing.sum()).item(),
        }


def parse_args(argv: Sequence[str] | None = None) -> Config:
    """A flag per Config field, with the field's docstring as its help."""
    tree = ast.parse(inspect.getsource(Config)).body[0]
    assert isinstance(tree, ast.ClassDef)
    docs = {
        node.target.id: doc.value.value
        for node, doc in zip(tree.body, tree.body[1:], strict=False)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
    }
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in dataclasses.fields(Config):
        flag = "--" + field.name.replace("_", "-")
        kind = type(field.default)
        parser.add_argument(flag, type=kind, default=field.default, help=docs[field.name])
    return Config(**vars(parser.parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> OnePageGRPO:
    """Train on `config.env_id` and print one line per update."""
    import fruit_env  # noqa: F401  (registers FruitCatcher-v0)

    config = parse_args(argv)
    num_envs = config.num_groups * config.group_size
    envs = gym.make_vec(config.env_id, num_envs=num_envs, device=config.device)
    grpo = OnePageGRPO(envs, config)
    for _ in range(config.updates):
        row = grpo.update()
        seconds = row["rollout_s"] + row["update_s"]
        print(
            f"update {grpo.update_index:>3}: return {row['return_mean']:6.2f}, "
            f"entropy {row['entropy']:.3f}, no spread {row['frac_zero_std_groups']:.2f}, "
            f"{row['valid_steps'] / seconds:,.0f} steps/s"
        )
    return grpo


if __name__ == "__main__":
    main()
