"""CleanRL-style PPO on Fruit Catcher, in torch on the env's device from start to finish.

    python examples/cleanrl_ppo.py --total-steps 1000000 --num-envs 128 --device cpu --seed 0

One file, read top to bottom as CleanRL's `ppo.py`: an actor-critic MLP, a rollout stored in
preallocated tensors, GAE, and the clipped surrogate with a value loss and an entropy bonus.
Unlike CleanRL it never touches numpy: observations, actions, rewards and episode statistics
stay tensors on `--device`, and the only host copy is one small metrics transfer per update.

The env runs in SAME_STEP autoreset mode, the convention this loop is written for: after a
step that ends an episode, `next_obs` is already the new episode's first observation and
`next_done` marks the boundary for GAE. Truncated episodes (the 200-step limit) are
bootstrapped from the value of `info["final_obs"]` instead of being treated as losses.

The catch rate, caught / (caught + missed), is read from `info["episode"]` of the episodes
that ended in each window of `--log-every` updates (all games start together, so episodes
end in bursts: a window longer than one episode always holds some).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

import torch
from torch import nn
from torch.distributions import Categorical

from fruit_env import FruitCatcherVectorEnv


@dataclasses.dataclass
class Args:
    """Hyperparameters; the defaults learn Fruit Catcher on a CPU in a few minutes."""

    total_steps: int = 1_000_000
    num_envs: int = 128
    num_steps: int = 32  # rollout length per env: a batch of num_envs * num_steps transitions
    device: str = "cpu"
    seed: int = 0
    learning_rate: float = 3e-3
    anneal_lr: bool = True
    gamma: float = 0.95
    gae_lambda: float = 0.95
    update_epochs: int = 8
    num_minibatches: int = 16
    clip_coef: float = 0.2
    clip_vloss: bool = False  # CleanRL clips the value loss; returns here span tens of units
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    log_every: int = 10  # updates per learning-curve row (and printed line)
    verbose: bool = True

    def __post_init__(self) -> None:
        names = ("total_steps", "num_envs", "num_steps", "update_epochs", "num_minibatches")
        for name in (*names, "log_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if (self.num_envs * self.num_steps) % self.num_minibatches:
            raise ValueError(
                f"num_envs * num_steps = {self.num_envs * self.num_steps} must divide into "
                f"num_minibatches = {self.num_minibatches}"
            )

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return max(1, self.total_steps // self.batch_size)


def layer_init(layer: nn.Linear, std: float = 2**0.5, bias: float = 0.0) -> nn.Linear:
    """CleanRL's orthogonal init: small final layers keep the first policy near uniform."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_size: int, num_actions: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_size, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_size, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, num_actions), std=0.01),
        )

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)

    def get_action_and_value(
        self, x: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        dist = Categorical(logits=self.actor(x))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.get_value(x)


def train(args: Args) -> dict[str, Any]:
    """Run PPO; returns the agent and the learning curve (one row per `log_every` updates)."""
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    envs = FruitCatcherVectorEnv(args.num_envs, device=device, autoreset_mode="SAME_STEP")
    obs_size = envs.single_observation_space.shape[0]
    agent = Agent(obs_size, int(envs.single_action_space.n)).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # Rollout storage, preallocated on the device.
    shape = (args.num_steps, args.num_envs)
    obs = torch.zeros((*shape, obs_size), device=device)
    actions = torch.zeros(shape, dtype=torch.int64, device=device)
    logprobs = torch.zeros(shape, device=device)
    rewards = torch.zeros(shape, device=device)
    dones = torch.zeros(shape, device=device)
    values = torch.zeros(shape, device=device)

    next_obs, _ = envs.reset(seed=args.seed)
    next_done = torch.zeros(args.num_envs, device=device)
    curve: list[dict[str, float]] = []
    env_steps = 0
    # caught, missed, episodes, return, clip fraction: summed on the device over a log window
    stats = torch.zeros(5, device=device)
    start, cpu_start = time.perf_counter(), time.process_time()
    for update in range(1, args.num_updates + 1):
        if args.anneal_lr:
            frac = 1.0 - (update - 1.0) / args.num_updates
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        for step in range(args.num_steps):
            obs[step] = next_obs
            dones[step] = next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            values[step] = value
            actions[step] = action
            logprobs[step] = logprob
            next_obs, reward, terminated, truncated, info = envs.step(action)
            with torch.no_grad():  # bootstrap cut-off episodes from their last observation
                cut = truncated & ~terminated
                bootstrap = args.gamma * agent.get_value(info["final_obs"])
                rewards[step] = reward + torch.where(cut, bootstrap, 0.0)
            next_done = (terminated | truncated).float()
            ended, episode = info["_episode"], info["episode"]
            fields = torch.stack(
                [episode["caught"].float(), episode["missed"].float(), ended.float(), episode["r"]]
            )
            stats[:4] += torch.where(ended, fields, 0.0).sum(1)
        env_steps += args.batch_size

        # GAE, backwards over the rollout.
        with torch.no_grad():
            next_value = agent.get_value(next_obs)
            advantages = torch.zeros_like(rewards)
            last_gae = torch.zeros(args.num_envs, device=device)
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    next_nonterminal, next_values = 1.0 - next_done, next_value
                else:
                    next_nonterminal, next_values = 1.0 - dones[t + 1], values[t + 1]
                delta = rewards[t] + args.gamma * next_values * next_nonterminal - values[t]
                last_gae = delta + args.gamma * args.gae_lambda * next_nonterminal * last_gae
                advantages[t] = last_gae
            returns = advantages + values

        b_obs = obs.reshape(-1, obs_size)
        b_actions, b_logprobs = actions.reshape(-1), logprobs.reshape(-1)
        b_advantages, b_returns, b_values = (
            advantages.reshape(-1),
            returns.reshape(-1),
            values.reshape(-1),
        )
        minibatch = args.batch_size // args.num_minibatches
        clipfrac_weight = 1.0 / (args.update_epochs * args.num_minibatches * args.log_every)
        for _ in range(args.update_epochs):
            order = torch.randperm(args.batch_size, device=device)
            for first in range(0, args.batch_size, minibatch):
                idx = order[first : first + minibatch]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[idx], b_actions[idx]
                )
                logratio = newlogprob - b_logprobs[idx]
                ratio = logratio.exp()
                with torch.no_grad():
                    clipped = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
                    stats[4] += clipped * clipfrac_weight
                mb_adv = b_advantages[idx]
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = torch.max(
                    -mb_adv * ratio,
                    -mb_adv * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef),
                ).mean()
                v_loss = (newvalue - b_returns[idx]) ** 2
                if args.clip_vloss:
                    v_clipped = b_values[idx] + torch.clamp(
                        newvalue - b_values[idx], -args.clip_coef, args.clip_coef
                    )
                    v_loss = torch.max(v_loss, (v_clipped - b_returns[idx]) ** 2)
                v_loss = 0.5 * v_loss.mean()
                loss = pg_loss - args.ent_coef * entropy.mean() + args.vf_coef * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

        last_window = update == args.num_updates and bool(stats[2] > 0)  # skip an empty tail
        if update % args.log_every and not last_window:
            continue
        # The one host copy of this window: episode statistics and the clip fraction.
        caught, missed, episodes, ret, clipfrac = stats.tolist()
        stats.zero_()
        row = {
            "update": float(update),
            "env_steps": float(env_steps),
            "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu_start,  # this process, all threads
            "episodes": episodes,
            "catch_rate": caught / (caught + missed) if caught + missed else float("nan"),
            "return_mean": ret / episodes if episodes else float("nan"),
            "clipfrac": clipfrac,
        }
        curve.append(row)
        if args.verbose:
            print(
                f"update {update:4d}  steps {env_steps:8d}  {row['seconds']:6.1f} s  "
                f"{env_steps / row['seconds']:7.0f} steps/s  episodes {episodes:5.0f}  "
                f"catch rate {row['catch_rate']:.3f}  return {row['return_mean']:+.2f}",
                flush=True,
            )
    envs.close()
    return {"agent": agent, "curve": curve}


@torch.no_grad()
def evaluate(
    agent: Agent, *, num_envs: int = 64, steps: int = 400, seed: int = 12345
) -> dict[str, float]:
    """Greedy (argmax) play on freshly seeded games; totals over every episode that ended."""
    device = next(agent.parameters()).device
    envs = FruitCatcherVectorEnv(num_envs, device=device, autoreset_mode="SAME_STEP")
    obs, _ = envs.reset(seed=seed)
    totals = torch.zeros(3, device=device)  # caught, missed, episodes
    for _ in range(steps):
        obs, _, _, _, info = envs.step(agent.actor(obs).argmax(-1))
        episode = info["episode"]
        fields = torch.stack([episode["caught"], episode["missed"], torch.ones_like(episode["l"])])
        totals += torch.where(info["_episode"], fields, 0).sum(1)
    envs.close()
    caught, missed, episodes = totals.tolist()
    return {"episodes": episodes, "catch_rate": caught / max(caught + missed, 1.0)}


def parse_args(argv: list[str] | None = None) -> Args:
    """Every `Args` field is a flag (`total_steps` -> `--total-steps`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in dataclasses.fields(Args):
        flag = "--" + field.name.replace("_", "-")
        if field.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
        else:
            kind = {"int": int, "float": float, "str": str}[str(field.type)]
            parser.add_argument(flag, type=kind, default=field.default)
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="CPU threads; 1 is fastest for this MLP"
    )
    namespace = vars(parser.parse_args(argv))
    torch.set_num_threads(namespace.pop("torch_threads"))
    try:
        return Args(**namespace)
    except ValueError as err:
        parser.error(str(err))
        raise  # unreachable: parser.error exits


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result = train(args)
    last = result["curve"][-1]
    greedy = evaluate(result["agent"], seed=args.seed + 12345)
    result["greedy"] = greedy
    print(
        f"done: {last['env_steps']:.0f} env steps in {last['seconds']:.1f} s; catch rate "
        f"{last['catch_rate']:.3f} while training (sampled), {greedy['catch_rate']:.3f} greedy "
        f"over {greedy['episodes']:.0f} evaluation episodes"
    )
    return result


if __name__ == "__main__":
    main()
