"""GRPO on one page: group-relative advantages and a clipped surrogate, in plain PyTorch.

    python examples/grpo_one_page.py            # FruitCatcher-v0: about 30 s on one CPU core
    python examples/grpo_one_page.py --rollout episodes --updates 30 --epochs 4
    python examples/grpo_one_page.py --help     # every Config field, with its meaning

Read `OnePageGRPO.update()` top to bottom: `collect()` plays, `learn()` compares each step
with its group and optimises. It is the update `grpo_trainer.GRPOTrainer` makes by default
(`rollout="windowed"`, docs/trainer.md): every sub-env plays `rollout_steps` steps, episodes
run on across updates, a step's return looks `window` steps ahead (so the last `window - 1`
rows wait for the next rollout, which re-scores them and weighs them by their truncated
importance), groups restart together, and a member whose episode ended takes the state of
one still playing. tests/test_one_page_grpo.py checks
that from the same weights and env both play the same rollouts, compute the same advantages
and reach the same parameters, update after update, with `obs_storage="float32"` (the
trainer's default stores Fruit Catcher's observations as float16, this file as float32).
`--rollout episodes` is the trainer's `rollout="episodes"`, one episode per member.

Left out: more than one trust region (the trainer splits updates of over `anchor_samples`
samples, 32,768 on the CPU), `branch_every` and the KL term (off by default), restarts for
envs without state snapshots and masked resets (fruit_env's envs have them: docs/env.md), any
but flat Box observations and Discrete actions. It is written the straightforward way on
purpose (a Python loop over steps, `torch.distributions.Categorical` in the loss, float32
observations stored, a for-loop AdamW, eager PyTorch): in episodes mode it is the "naive" row
that benchmarks/train_throughput.py times the trainer against.
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
    """Hyperparameters; every field is a flag (`num_groups` -> `--num-groups`). The window,
    discount, epochs, clips, coefficients and network are the trainer's defaults for Fruit
    Catcher; the batch is small and the run short, so that it trains in seconds."""

    env_id: str = "FruitCatcher-v0"
    """Gymnasium id of a vector env with flat Box observations and Discrete actions."""
    num_groups: int = 16
    """Groups per update: the env has num_groups x group_size sub-envs."""
    group_size: int = 8
    """Members per group: they start from the same state and are compared with each other."""
    rollout: str = "windowed"
    """windowed: rollout_steps per update, episodes run on; episodes: one whole episode each."""
    rollout_steps: int = 32
    """windowed: steps every sub-env plays per update."""
    window: int = 32
    """windowed: how many steps ahead a step's return looks."""
    restart_every: int = 8
    """windowed: steps between the checks that restart groups and branch ended members."""
    horizon: int = 200
    """episodes: at most this many steps per episode (FruitCatcher-v0's own limit is 200)."""
    updates: int = 60
    """Updates to run; the learning rate decays linearly over them."""
    epochs: int = 8
    """Passes over each update's samples."""
    minibatches: int = 8
    """Gradient steps per epoch: the samples are shuffled and split into this many parts."""
    lr: float = 0.01
    """AdamW learning rate at the start; it decays linearly to 0.02 x lr over the updates."""
    gamma: float = 0.96875
    """Discount of the returns-to-go (the trainer's 1 - 1 / window)."""
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
    """Seeds the network, the sampling, the branching, the shuffling and the groups' starts."""
    device: str = "cpu"
    """Torch device of the env, the network and the rollout."""


class Batch(NamedTuple):
    """One rollout of `B = num_groups * group_size` sub-envs (member `b` belongs to group
    `b // group_size`): `T` trained rows, and `L >= T` rows of what the steps brought, the
    rows after the `T`th being the look-ahead of the returns."""

    obs: torch.Tensor  # (T, B, obs_dim) float32
    actions: torch.Tensor  # (T, B) int64
    logp: torch.Tensor  # (T, B) log π_old(a|s): the log-prob under the policy that played
    rewards: torch.Tensor  # (L, B) 0 where the step does not count (valid is False)
    valid: torch.Tensor  # (L, B) bool: the member's episode counts at this step
    cut: torch.Tensor  # (L, B) bool: ...and ends at it, so returns stop there
    carried: int  # leading rows played by an earlier policy (they waited for their look-ahead)


def returns_to_go(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """Episodes mode: `G[t] = r[t] + γ G[t+1]`. Rewards are 0 after an episode ends, so
    `G[t]` is the discounted return from step t to the end of the member's episode."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        running = rewards[t] + gamma * running
        returns[t] = running
    return returns


def windowed_returns(
    rewards: torch.Tensor, cut: torch.Tensor, rows: int, window: int, gamma: float
) -> torch.Tensor:
    """Windowed mode: `G[t] = Σ_{k<W} γ^k r[t+k]` for the first `rows` rows, stopping where
    the episode ends (`cut`). Members with the same rewards get bit-identical returns."""
    returns = torch.zeros_like(rewards[:rows])
    going = torch.ones_like(returns)  # 1 while no episode end lies between t and t + k
    for k in range(window):
        returns += (gamma**k) * rewards[k : k + rows] * going
        going = going * ~cut[k : k + rows]
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
    hidden_layers = (nn.Linear(obs_dim, hidden), act(), nn.Linear(hidden, hidden), act())
    policy = nn.Sequential(*hidden_layers, nn.Linear(hidden, n_actions))
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
        self.num_envs = b = config.num_groups * config.group_size
        if envs.num_envs != self.num_envs:
            raise ValueError(f"the env has {envs.num_envs} sub-envs, the config {self.num_envs}")
        if config.rollout not in ("windowed", "episodes"):
            raise ValueError(f"rollout must be 'windowed' or 'episodes', got {config.rollout!r}")
        if config.rollout == "windowed" and not hasattr(envs, "snapshot_state"):
            raise ValueError(f"windowed rollouts need state snapshots, which {envs} lacks")
        self.device = device = torch.device(config.device)
        torch.manual_seed(config.seed)
        obs_dim = int(envs.single_observation_space.shape[0])
        n_actions = int(envs.single_action_space.n)
        self.policy = make_policy(obs_dim, n_actions, config.hidden, config.activation).to(device)
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=config.lr, weight_decay=0.0, foreach=False
        )
        # One generator draws everything random, in the trainer's order: actions, branch
        # donors, minibatch order.
        self.generator = torch.Generator(device).manual_seed(config.seed)
        self.update_index = self.steps = 0  # steps: played by each sub-env, windowed
        self.index = torch.arange(b, device=device)
        self.leader = self.index // config.group_size * config.group_size  # group's first
        self.next_obs: torch.Tensor | None = None  # windowed: where the next rollout starts
        self.alive = torch.zeros(b, dtype=torch.bool, device=device)
        self.from_start = torch.ones(b, dtype=torch.bool, device=device)
        self.episode_return = torch.zeros(b, device=device)
        self.ended = torch.zeros(2, device=device)  # episodes that ended: count, return sum
        # The rollout's storage, allocated once: windowed, T rows and their look-ahead.
        windowed = config.rollout == "windowed"
        t = config.rollout_steps + config.window - 1 if windowed else config.horizon
        self.obs = torch.zeros(t, b, obs_dim, device=device)
        self.actions = torch.zeros(t, b, dtype=torch.int64, device=device)
        self.logp = torch.zeros(t, b, device=device)
        self.rewards = torch.zeros(t, b, device=device)
        self.valid = torch.zeros(t, b, dtype=torch.bool, device=device)
        self.cut = torch.zeros(t, b, dtype=torch.bool, device=device)

    def update(self) -> dict[str, float]:
        """One GRPO update: play, then learn from what was played."""
        start = time.perf_counter()
        batch = self.collect()
        played = time.perf_counter()
        metrics = self.learn(batch)
        return {**metrics, "rollout_s": played - start, "update_s": time.perf_counter() - played}

    def collect(self) -> Batch:
        """Play with the current policy (`rollout`: windowed, or whole episodes)."""
        self.ended.zero_()
        return self.play_window() if self.config.rollout == "windowed" else self.play_episodes()

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions and their log-probs. Gumbel-max: argmax(log π + Gumbel noise) is a sample of
        π, drawn from uniforms of our generator (as the trainer draws them)."""
        logp_all = torch.log_softmax(self.policy(obs.float()), -1)
        uniform = torch.rand(logp_all.shape, generator=self.generator, device=self.device)
        gumbel = -torch.log(-torch.log(uniform.clamp(1e-20, 1.0 - 1e-7)))
        action = torch.argmax(logp_all + gumbel, -1)
        return action, logp_all.gather(-1, action[:, None]).squeeze(-1)

    def play(self, t: int, obs: torch.Tensor) -> torch.Tensor:
        """Row t: act on `obs`, step every sub-env, record; returns the next observations."""
        action, self.logp[t] = self.sample(obs)
        self.obs[t], self.actions[t], self.valid[t] = obs, action, self.alive
        obs, reward, terminated, truncated, _ = self.envs.step(action)
        done = terminated | truncated
        self.rewards[t] = reward * self.alive  # a step after the episode ended does not count
        self.cut[t] = ended = self.alive & done
        self.episode_return += self.rewards[t]
        counted = ended & self.from_start  # episodes played from their start, each once
        self.ended += torch.stack((counted.sum(), (self.episode_return * counted).sum()))
        self.alive = self.alive & ~done
        return obs

    def begin_episodes(self, draw: int) -> torch.Tensor:
        """Every group starts a game of its own seed (numbered as the trainer's `GroupSeeds`),
        the same for all its members; returns the first observations."""
        first = self.config.seed * 1_000_000_007 + draw * self.config.num_groups
        seeds = [first + b // self.config.group_size for b in range(self.num_envs)]
        obs, _ = self.envs.reset(seed=seeds)
        self.alive.fill_(True)
        self.from_start.fill_(True)
        self.episode_return.zero_()
        return obs

    @torch.no_grad()
    def play_window(self) -> Batch:
        """Windowed: the last rollout's look-ahead rows move to the front, then every sub-env
        plays `rollout_steps` steps on from where it stopped (the first rollout starts every
        group, and its look-ahead rows are empty)."""
        cfg = self.config
        obs = self.begin_episodes(draw=1) if self.next_obs is None else self.next_obs
        waiting = cfg.window - 1
        for x in (self.obs, self.actions, self.logp, self.rewards, self.valid, self.cut):
            x[:waiting] = x[cfg.rollout_steps :].clone()
        for t in range(waiting, waiting + cfg.rollout_steps):
            obs = self.play(t, obs)
            self.steps += 1
            if self.steps % cfg.restart_every == 0:
                obs = self.restart_groups(obs)
        self.next_obs = obs
        trained = cfg.rollout_steps
        rows = (self.obs[:trained], self.actions[:trained], self.logp[:trained])
        return Batch(*rows, self.rewards, self.valid, self.cut, min(waiting, trained))

    def restart_groups(self, obs: torch.Tensor) -> torch.Tensor:
        """Every `restart_every` steps: a group whose members have all ended starts a new game
        (its first member resets, the others copy its state), and a member that ended while
        others play on takes the state of one of them, chosen at random, and plays on from
        there (a branch: the trainer's `branch_ended`, its default on envs with snapshots)."""
        k = self.config.group_size
        alive = self.alive.view(-1, k)
        fresh = (~alive.any(1)).repeat_interleave(k)
        scores = torch.rand(alive.shape, generator=self.generator, device=self.device)
        donor = (scores * alive).argmax(1).repeat_interleave(k) + self.leader
        source = torch.where(fresh, self.leader, torch.where(self.alive, self.index, donor))
        leaders = fresh & (source == self.index)
        new_obs, _ = self.envs.reset(options={"reset_mask": leaders})
        obs = torch.where(leaders[:, None], new_obs, obs)
        self.envs.restore_state(self.index, self.envs.snapshot_state(source))
        self.alive = self.alive[source] | fresh
        self.from_start = (self.from_start & (source == self.index)) | fresh  # a branch is not
        self.episode_return = self.episode_return[source] * ~fresh
        return obs[source]

    @torch.no_grad()
    def play_episodes(self) -> Batch:
        """Episodes: every group starts from a seed of its own, the same for all its members,
        and every member plays one episode (at most `horizon` steps)."""
        obs = self.begin_episodes(draw=self.update_index)
        self.rewards.zero_()
        self.valid.zero_()
        self.cut.zero_()
        steps = 0
        for t in range(self.config.horizon):
            obs = self.play(t, obs)
            steps = t + 1
            if not self.alive.any():  # every episode has ended (a host sync every step)
                break
        stored = (self.obs, self.actions, self.logp, self.rewards, self.valid, self.cut)
        return Batch(*(x[:steps] for x in stored), 0)

    def compare(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """G[t, b], the discounted return from step t, against the group's at step t: the
        advantages, weights and spread of `group_advantages` for the trained rows."""
        cfg, trained = self.config, batch.obs.shape[0]
        if cfg.rollout == "windowed":
            returns = windowed_returns(batch.rewards, batch.cut, trained, cfg.window, cfg.gamma)
        else:
            returns = returns_to_go(batch.rewards, cfg.gamma)
        valid = batch.valid[:trained].float()
        return group_advantages(returns, valid, cfg.group_size, cfg.zero_std_eps)

    def learn(self, batch: Batch) -> dict[str, float]:
        """Compare, then `epochs` passes of `minibatches` AdamW steps on the clipped
        surrogate. Returns the update's means."""
        cfg = self.config
        for group in self.optimizer.param_groups:  # the trainer's linear decay, floor 2%
            group["lr"] = cfg.lr * max(1.0 - self.update_index / cfg.updates, 0.02)
        advantages, weights, spread = self.compare(batch)

        # Rows an earlier policy played are re-scored by this one, so that the clipped ratio
        # measures this update's step, as it does for fresh rows, and each weighs
        # min(1, π(a|s) / π_played(a|s)): an action the policy has since given up counts as
        # often as the policy would now play it (truncated importance weight).
        old_logp, carried = batch.logp.clone(), batch.carried
        if carried:
            with torch.no_grad():
                logits = self.policy(batch.obs[:carried].float())
                old_logp[:carried] = Categorical(logits=logits).log_prob(batch.actions[:carried])
            weights = weights.clone()
            weights[:carried] *= (old_logp[:carried] - batch.logp[:carried]).clamp(max=0).exp()

        # Optimise, with ρ = exp(log π(a|s) − log π_old(a|s)):
        #   L = −Σ w·min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A) / N − c_H·Σ w·H / N
        # N = (valid samples) / minibatches: every sample weighs the same whatever
        # minibatch it falls in, a long episode counts for more steps than a short one, and
        # steps shrink as fewer groups disagree (group steps without spread count in N).
        obs, actions = batch.obs.flatten(0, 1), batch.actions.flatten(0, 1)
        old_logp, adv, w = old_logp.flatten(), advantages.flatten(), weights.flatten()
        valid = batch.valid[: batch.obs.shape[0]].float()
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
        self.update_index += 1
        steps = cfg.epochs * cfg.minibatches
        playing = valid.unflatten(1, (-1, cfg.group_size)).any(-1)  # compared group steps
        episodes, returns = self.ended.tolist()  # those the rollout saw end, from the start
        return {
            **{name: total / steps for name, total in sums.items()},
            "valid_steps": valid.sum().item(),
            "frac_zero_std_groups": ((playing & ~spread).sum() / playing.sum()).item(),
            "episodes": episodes,
            "return_mean": returns / episodes if episodes else math.nan,
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
            f"update {grpo.update_index:>3}: {row['episodes']:3.0f} episodes ended, "
            f"return {row['return_mean']:6.2f}, "
            f"entropy {row['entropy']:.3f}, no spread {row['frac_zero_std_groups']:.2f}, "
            f"{row['valid_steps'] / seconds:,.0f} steps/s"
        )
    return grpo


if __name__ == "__main__":
    main()
