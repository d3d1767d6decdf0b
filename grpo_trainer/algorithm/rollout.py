"""Rollouts: play the policy in every sub-env and store what the update needs, on the device.

Two ways to play, one storage:

* `WindowedRollout` (the default): every update plays `rollout_steps` steps in every sub-env,
  and episodes run on across updates. A step's return looks `window` steps ahead, so the
  last `window - 1` rows of a rollout wait, stored, for the next one (`RolloutBuffer.carry`).
  Groups whose members have all ended start again together (`GroupRestarts`).
* `EpisodeRollout`: every member plays one whole episode per update from a group reset.

Storage per env-step is what the loss needs and nothing else: the observation (in the
compact dtype the policy reads), the action (uint8 for up to 256 choices), the rollout
policy's log-prob, the reward, and two flags: `valid` (the step belongs to an episode that
counts) and `cut` (its episode, or the member's path, ends there: returns stop at it).
No step of the loop waits on the device.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from gymnasium.vector import AutoresetMode

from grpo_trainer.algorithm.policy import ActionHead
from grpo_trainer.base.config import GRPOConfig
from grpo_trainer.envs.env_io import EnvIO
from grpo_trainer.envs.episodes import EpisodeRunner, RunnerStep, play_until_ended

SampleFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class RolloutBuffer:
    """`(rows, num_envs, ...)` tensors, allocated once and reused every update.

    Rows `[0, ready)` are trained on; the last `carry` rows are the look-ahead of those and
    become the first `carry` rows of the next rollout.
    """

    def __init__(
        self,
        ready: int,
        carry: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        obs_dtype: torch.dtype,
        head: ActionHead,
        device: torch.device,
    ) -> None:
        self.ready, self.carry, self.num_envs = ready, carry, num_envs
        self.rows = rows = ready + carry
        self.obs = torch.zeros((rows, num_envs, *obs_shape), dtype=obs_dtype, device=device)
        self.actions = torch.zeros(
            (rows, num_envs, *head.action_shape), dtype=head.action_dtype, device=device
        )
        self.logp = torch.zeros((rows, num_envs), dtype=torch.float32, device=device)
        self.rewards = torch.zeros((rows, num_envs), dtype=torch.float32, device=device)
        self.valid = torch.zeros((rows, num_envs), dtype=torch.bool, device=device)
        self.cut = torch.zeros((rows, num_envs), dtype=torch.bool, device=device)

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        return {
            "obs": self.obs,
            "actions": self.actions,
            "logp": self.logp,
            "rewards": self.rewards,
            "valid": self.valid,
            "cut": self.cut,
        }

    @property
    def bytes_per_step(self) -> int:
        """Bytes stored per env-step (every tensor above, per (row, sub-env) entry)."""
        return sum(t[0, 0].numel() * t.element_size() for t in self.tensors.values())

    def shift_carry(self) -> None:
        """Move the look-ahead rows of the last rollout to the front."""
        if not self.carry:
            return
        for t in self.tensors.values():
            tail = t[self.ready :]
            t[: self.carry] = tail.clone() if self.ready < self.carry else tail


class Rollout(NamedTuple):
    """What one collection produced: views of the buffer, and device statistics."""

    obs: torch.Tensor  # (ready, B, ...) the trained rows
    actions: torch.Tensor
    logp: torch.Tensor
    rewards: torch.Tensor  # (rows, B): trained rows and their look-ahead
    valid: torch.Tensor  # (rows, B) bool
    cut: torch.Tensor  # (rows, B) bool
    episodes: dict[str, torch.Tensor]  # EpisodeStats.sums() of the episodes that ended
    length_max: torch.Tensor  # () longest current episode (episodes mode: its horizon)
    stale: int  # leading trained rows played by the policy of an earlier update


def _rollout(buffer: RolloutBuffer, runner: EpisodeRunner, rows: int) -> Rollout:
    ready = min(buffer.ready, rows)
    return Rollout(
        buffer.obs[:ready],
        buffer.actions[:ready],
        buffer.logp[:ready],
        buffer.rewards[:rows],
        buffer.valid[:rows],
        buffer.cut[:rows],
        runner.stats.sums(),
        runner.lengths.max(),
        min(buffer.carry, ready),
    )


class ExplorationNoise:
    """The noise each sub-env samples its actions with, step after step. The head decides
    how one step's noise follows the last (`ActionHead.correlate`): for Gaussian heads an
    AR(1) process with `correlation` ρ, so exploration pushes one way for about 1 / (1 − ρ)
    steps, as colored-noise exploration does (Eberhard et al., 2023; Hollenstein et al.,
    2024); for categorical heads independent draws. Each step's marginal is the head's own,
    so the stored log-probs are exact."""

    def __init__(self, head: ActionHead, num_envs: int, correlation: float) -> None:
        self.head, self.num_envs, self.correlation = head, num_envs, correlation
        self.last: torch.Tensor | None = None  # what the last step drew (kept in checkpoints)

    def draw(self, generator: torch.Generator, device: torch.device) -> torch.Tensor:
        fresh = self.head.noise(self.num_envs, generator, device)
        last = self.last
        self.last = fresh if last is None else self.head.correlate(last, fresh, self.correlation)
        return self.last


class Recorder:
    """Plays the policy into the buffer: `act` stores the observation, samples an action from
    the stored (compact) value, as the update will read it, and stores action and log-prob;
    `record` stores what the step brought.

    Every operation here runs once per step, so at small batches their count is the cost:
    values are written straight into the buffer (`copy_` casts).
    """

    def __init__(
        self,
        buffer: RolloutBuffer,
        head: ActionHead,
        sample: SampleFn,
        generator: torch.Generator,
        noise: ExplorationNoise,
    ) -> None:
        self.buffer, self.head, self.sample, self.generator = buffer, head, sample, generator
        self.noise = noise

    def act(self, row: int, obs: torch.Tensor) -> torch.Tensor:
        buffer = self.buffer
        stored = buffer.obs[row]
        stored.copy_(obs)
        noise = self.noise.draw(self.generator, obs.device)
        action, logp = self.sample(stored, noise)
        buffer.actions[row].copy_(action)
        buffer.logp[row].copy_(logp)
        return self.head.to_env(action)

    def record(self, row: int, step: RunnerStep) -> None:
        buffer = self.buffer
        buffer.rewards[row].copy_(step.reward)
        buffer.valid[row].copy_(step.alive)
        buffer.cut[row].copy_(step.ended)


class WindowedRollout:
    """`ready` new steps per sub-env per update; episodes run on across updates."""

    def __init__(
        self,
        env: EnvIO,
        buffer: RolloutBuffer,
        head: ActionHead,
        restarts: Restarts,
        max_episode_steps: int | None,
        noise: ExplorationNoise,
    ) -> None:
        self.env, self.buffer, self.head, self.restarts = env, buffer, head, restarts
        self.runner = EpisodeRunner(env, max_episode_steps)
        self.noise = noise
        self.obs: torch.Tensor | None = None

    @torch.inference_mode()
    def collect(self, sample: SampleFn, generator: torch.Generator) -> Rollout:
        if self.obs is None:
            self.obs = self.restarts.start(self.runner)
        buffer, runner = self.buffer, self.runner
        recorder = Recorder(buffer, self.head, sample, generator, self.noise)
        runner.stats.reset()
        buffer.shift_carry()
        obs = self.obs
        for row in range(buffer.carry, buffer.rows):
            step = runner.step(recorder.act(row, obs))
            recorder.record(row, step)
            obs = self.restarts.after_step(row, step, runner, buffer)
        self.obs = obs
        return _rollout(buffer, runner, buffer.rows)

    def state_dict(self) -> dict[str, Any]:
        """What continues the rollout exactly: env states, observations, trackers, carry."""
        if self.obs is None:
            return {}
        runner, buffer = self.runner, self.buffer
        return {
            "env": self.env.snapshot() if self.env.restarts == "snapshot" else None,
            "obs": self.obs,
            "alive": runner.alive,
            "returns": runner.returns,
            "lengths": runner.lengths,
            "own": runner.own,
            "noise": self.noise.last,
            "carry": {k: t[buffer.ready :] for k, t in buffer.tensors.items()},
            "restarts": self.restarts.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        if state["env"] is None:
            warnings.warn(
                f"{type(self.env.envs).__name__} offers no state snapshots: after this resume "
                "every sub-env starts a new episode (the run is not an exact continuation)",
                RuntimeWarning,
                stacklevel=2,
            )
            self.buffer.valid[self.buffer.ready :] = False
            return
        device = self.env.device
        self.restarts.start(self.runner)  # an env must be reset before its state is set
        self.env.restore(state["env"])
        self.obs = state["obs"].to(device)
        runner = self.runner
        runner.alive = state["alive"].to(device)
        runner.returns = state["returns"].to(device)
        runner.lengths = state["lengths"].to(device)
        if "own" in state:  # checkpoints before branch_ended counted every episode
            runner.own = state["own"].to(device)
        if state.get("noise") is not None:
            self.noise.last = state["noise"].to(device)
        for name, t in self.buffer.tensors.items():
            t[self.buffer.ready :] = state["carry"][name].to(device)
        self.restarts.load_state_dict(state["restarts"])


class Restarts:
    """How sub-envs start again after their episodes end (one of two strategies)."""

    def start(self, runner: EpisodeRunner) -> torch.Tensor:
        raise NotImplementedError

    def after_step(
        self, row: int, step: RunnerStep, runner: EpisodeRunner, buffer: RolloutBuffer
    ) -> torch.Tensor:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class GroupRestarts(Restarts):
    """Groups start together: every `every` steps, each group whose members have all ended
    starts a new game, the same for all its members (a fresh seed shared by the group).

    With `branch_ended` (envs with state snapshots), a member whose episode ended while
    others of its group play on does not wait for them: at the next check it takes the state
    of one of them (chosen at random), and the two compare their continuations from that
    shared state. No env step is spent on a member that waits, and every such branch adds a
    comparison between identical situations; the member's own path had ended, so no return
    is cut short.

    With `branch_every`, a group that has played that many steps since it (re)started
    branches: all its members take the state one of them (chosen at random among those
    still playing) has reached, and compare their continuations from there. The rows before
    a branch are cut, so no member's return reaches into a path that is not its own.
    """

    def __init__(
        self,
        env: EnvIO,
        group_size: int,
        seeds: Callable[[int, int], list[int]],
        generator: torch.Generator,
        *,
        every: int,
        branch_every: int,
        branch_ended: bool,
    ) -> None:
        self.env, self.group_size, self.seeds = env, group_size, seeds
        self.generator, self.every, self.branch_every = generator, every, branch_every
        self.branch_ended = branch_ended
        device, n = env.device, env.num_envs
        self.leader = torch.arange(n, device=device) // group_size * group_size
        self.since = torch.zeros(n, device=device)  # steps since the group (re)started
        self.points = 0  # restart points so far: numbers the groups' seeds
        self.steps = 0

    def start(self, runner: EpisodeRunner) -> torch.Tensor:
        obs = self.env.reset_groups(self._group_seeds(), self.group_size)
        runner.revive()
        return obs

    def _group_seeds(self) -> list[int]:
        self.points += 1
        return self.seeds(self.points, self.env.num_envs // self.group_size)

    def after_step(
        self, row: int, step: RunnerStep, runner: EpisodeRunner, buffer: RolloutBuffer
    ) -> torch.Tensor:
        obs = step.env.obs
        self.steps += 1
        if self.branch_every:
            self.since += 1
        if self.steps % self.every:
            return obs
        k = self.group_size
        alive = runner.alive.view(-1, k)
        fresh = (~alive.any(1)).repeat_interleave(k)  # groups whose members all ended
        source = torch.where(fresh, self.leader, self.env.indices)
        if self.branch_ended or self.branch_every:  # a random member still playing, per group
            scores = torch.rand(alive.shape, generator=self.generator, device=alive.device)
            donor = (scores * alive).argmax(1).repeat_interleave(k) + self.leader
        if self.branch_ended:
            source = torch.where(~runner.alive & ~fresh, donor, source)
        if self.branch_every:
            due = (self.since >= self.branch_every) & ~fresh
            source = torch.where(due, donor, source)
            buffer.cut[row] |= due  # the group's paths end here; their returns stop
            self.since.masked_fill_(due | fresh, 0.0)
        seeds = self._group_seeds  # only the seeded strategy calls it (host-side)
        obs = self.env.restart(obs, fresh, source, lambda: _per_member(seeds(), k))
        runner.follow(source, fresh)
        return obs

    def state_dict(self) -> dict[str, Any]:
        return {"since": self.since, "points": self.points, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.since = state["since"].to(self.since.device)
        self.points, self.steps = int(state["points"]), int(state["steps"])


class IndependentRestarts(Restarts):
    """The env restarts each sub-env itself (its autoreset); the trainer follows.

    With NEXT_STEP autoreset the step after an end is the env's reset step (the action is
    ignored), so the sub-env counts again from the step after that; with SAME_STEP at once.
    """

    def __init__(self, env: EnvIO, group_size: int, seeds: Callable[[int, int], list[int]]):
        if env.autoreset_mode == AutoresetMode.DISABLED:
            raise ValueError(
                f"{type(env.envs).__name__} neither restarts its sub-envs (autoreset DISABLED) "
                "nor offers state snapshots or masked seeded resets: windowed rollouts cannot "
                "continue it; use rollout='episodes'"
            )
        self.env, self.group_size, self.seeds = env, group_size, seeds
        self.next_step = env.autoreset_mode == AutoresetMode.NEXT_STEP
        self.resetting = torch.zeros(env.num_envs, dtype=torch.bool, device=env.device)

    def start(self, runner: EpisodeRunner) -> torch.Tensor:
        num_groups = self.env.num_envs // self.group_size
        obs = self.env.reset_groups(self.seeds(0, num_groups), self.group_size)
        runner.revive()
        return obs

    def after_step(
        self, row: int, step: RunnerStep, runner: EpisodeRunner, buffer: RolloutBuffer
    ) -> torch.Tensor:
        if self.next_step:
            runner.revive(self.resetting)  # their reset step has just been played
            self.resetting = step.ended
        else:
            runner.revive(step.ended)
        return step.env.obs

    def state_dict(self) -> dict[str, Any]:
        return {"resetting": self.resetting}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resetting = state["resetting"].to(self.resetting.device)


def _per_member(group_seeds: list[int], group_size: int) -> list[int]:
    return [s for s in group_seeds for _ in range(group_size)]


class EpisodeRollout:
    """Every member plays one episode, at most `horizon` steps, from a fresh group reset."""

    def __init__(
        self,
        env: EnvIO,
        buffer: RolloutBuffer,
        head: ActionHead,
        group_size: int,
        noise: ExplorationNoise,
    ) -> None:
        self.env, self.buffer, self.head, self.group_size = env, buffer, head, group_size
        self.runner = EpisodeRunner(env)
        self.noise = noise

    @torch.inference_mode()
    def collect(
        self,
        sample: SampleFn,
        generator: torch.Generator,
        group_seeds: list[int],
        horizon: int,
    ) -> Rollout:
        recorder = Recorder(self.buffer, self.head, sample, generator, self.noise)
        self.runner.stats.reset()
        obs = self.env.reset_groups(group_seeds, self.group_size)
        play_until_ended(self.runner, obs, recorder.act, horizon, on_step=recorder.record)
        return _rollout(self.buffer, self.runner, horizon)


def make_rollout(
    config: GRPOConfig,
    env: EnvIO,
    head: ActionHead,
    obs_dtype: torch.dtype,
    seeds: Callable[[int, int], list[int]],
    generator: torch.Generator,
) -> WindowedRollout | EpisodeRollout:
    """The rollout a config asks for, with the restart strategy the env allows."""
    obs_shape = tuple(env.observation_space.shape or ())
    name = type(env.envs).__name__
    noise = ExplorationNoise(head, env.num_envs, config.noise_correlation)
    if config.rollout == "episodes":
        horizon = config.max_episode_steps or env.max_episode_steps()
        if horizon is None:
            raise ValueError(
                "rollout='episodes' plays whole episodes: max_episode_steps is not set and "
                "the env declares no limit; set it in the config"
            )
        buffer = RolloutBuffer(horizon, 0, env.num_envs, obs_shape, obs_dtype, head, env.device)
        return EpisodeRollout(env, buffer, head, config.group_size, noise)
    buffer = RolloutBuffer(
        config.steps_per_update,
        config.window - 1,
        env.num_envs,
        obs_shape,
        obs_dtype,
        head,
        env.device,
    )
    restarts: Restarts
    if env.restarts == "independent":
        if config.max_episode_steps is not None:
            raise ValueError(
                f"max_episode_steps: {name} restarts its sub-envs itself, so the trainer "
                "cannot end episodes early; leave max_episode_steps unset"
            )
        warnings.warn(
            f"{name} offers neither state snapshots nor masked seeded resets: its sub-envs "
            "restart on their own, so group members are compared at the same step but not "
            "in the same situation",
            RuntimeWarning,
            stacklevel=4,
        )
        restarts = IndependentRestarts(env, config.group_size, seeds)
    else:
        if config.branch_every and env.restarts != "snapshot":
            raise ValueError(
                f"branch_every: branching needs state snapshots, which {name} does not offer "
                "(docs/env.md: sub-env state snapshots)"
            )
        restarts = GroupRestarts(
            env,
            config.group_size,
            seeds,
            generator,
            every=config.restart_every,
            branch_every=config.branch_every,
            branch_ended=config.branch_ended and env.restarts == "snapshot",
        )
    return WindowedRollout(env, buffer, head, restarts, config.max_episode_steps, noise)
