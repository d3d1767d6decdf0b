"""The two rollout modes. `WindowedRollout`: `rollout_steps` new steps per sub-env per update,
episodes running on; returns look `window` steps ahead, so the last `window - 1` rows wait for
the next rollout. `EpisodeRollout`: one episode per member per update, at most `horizon` steps,
the horizon following the episodes."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from grpo_trainer.algorithm.policy import ActionHead
from grpo_trainer.algorithm.rollout.buffer import (
    NEWER_BUFFER_TENSORS,
    ExplorationNoise,
    Recorder,
    Rollout,
    RolloutBuffer,
    RolloutCheckpoint,
    SampleFn,
    rollout_view,
)
from grpo_trainer.algorithm.rollout.restarts import GroupSeeds, RestartPolicy
from grpo_trainer.base.checkpoint import CheckpointError
from grpo_trainer.envs.env_io import EnvIO
from grpo_trainer.envs.episodes import EpisodeRunner, play_until_ended

MIN_HORIZON = 16  # the shortest adapted horizon, and its rounding step
HORIZON_SLACK = (1.25, 8)  # next horizon = longest episode * 1.25 + 8
# The entries of `WindowedRollout.state_dict()` (its checkpoint's key names are the file
# format's: "own" holds `EpisodeRunner.from_start`).
STATE_KEYS = frozenset(
    ("env", "obs", "alive", "returns", "lengths", "own", "noise", "carry", "restarts")
)


class BranchCompletion:
    """What a path left at a branch would have brought (`branch_complete`): from the state
    every sub-env has reached, the policy plays `window - 1` more steps as inference only
    (nothing stored, nothing trained), and the env is put back. The discounted return of
    those steps, `γ Σ_j γ^j r[j]`, is added to the reward of the branch row, so the rows
    before the branch are credited with their own path's future instead of being cut there.
    One such rollout serves every group, so groups branch at the same rows (`aligned`).

    The rows before a branch see up to `2 window - 2` steps, the rest `window`: within a
    group all members branch at the same row, so the comparison stays like for like."""

    def __init__(
        self,
        env: EnvIO,
        head: ActionHead,
        noise: ExplorationNoise,
        window: int,
        gamma: float,
        stored_obs: torch.Tensor,
    ) -> None:
        self.env, self.head, self.noise = env, head, noise
        self.steps, self.gamma = window - 1, gamma
        # the policy reads observations as the buffer stores them (its dtype), so they go
        # through a row of their own, allocated once
        self.scratch = torch.empty_like(stored_obs)
        self.env_steps = 0  # inference-only steps played so far, over all sub-envs

    def __call__(
        self,
        obs: torch.Tensor,
        playing: torch.Tensor,
        sample: SampleFn,
        generator: torch.Generator,
    ) -> torch.Tensor:
        envs, index = self.env.envs, self.env.indices
        saved, last_noise = envs.snapshot_state(index), self.noise.last
        total = torch.zeros_like(playing, dtype=torch.float32)
        going = playing.to(torch.float32)
        discount = self.gamma
        for _ in range(self.steps):
            self.scratch.copy_(obs)
            noise, carried = self.noise.draw(generator, obs.device)
            action, _ = sample(self.scratch, noise)
            if carried is not None:
                action = self.head.shift(action, carried)
            step = self.env.step(self.head.to_env(action))
            total += discount * step.reward * going
            going = going * ~step.done
            discount *= self.gamma
            obs = step.obs
        envs.restore_state(index, saved)
        self.noise.last = last_noise
        self.env_steps += self.steps * len(playing)
        return total


class WindowedRollout:
    """`trained_rows` new steps per sub-env per update; episodes run on across updates."""

    def __init__(
        self,
        env: EnvIO,
        buffer: RolloutBuffer,
        head: ActionHead,
        restarts: RestartPolicy,
        max_episode_steps: int | None,
        noise: ExplorationNoise,
        window: int,
        completion: BranchCompletion | None = None,
    ) -> None:
        self.env, self.buffer, self.head, self.restarts = env, buffer, head, restarts
        self.completion = completion
        self.runner = EpisodeRunner(env, max_episode_steps)
        self.noise, self.window = noise, window
        self.horizon = buffer.trained_rows  # new steps per sub-env in every collect
        self.obs: torch.Tensor | None = None

    @property
    def steps_played(self) -> int:
        """Steps each sub-env played in the last collect."""
        return self.horizon

    @torch.inference_mode()
    def collect(self, sample: SampleFn, generator: torch.Generator) -> Rollout:
        if self.obs is None:
            self.obs = self.restarts.start(self.runner)
        buffer, runner = self.buffer, self.runner
        recorder = Recorder(buffer, self.head, sample, generator, self.noise)
        runner.stats.reset()
        buffer.shift_lookahead()
        obs = self.obs
        for row in range(buffer.lookahead_rows, buffer.rows):
            step = runner.step(recorder.act(row, obs))
            recorder.record(row, step)
            if self.completion is not None and self.restarts.branches_after_next_step():
                buffer.rewards[row] += self.completion(
                    step.env.obs, runner.alive, sample, generator
                )
            obs = self.restarts.after_step(row, step, runner, buffer)
        self.obs = obs
        return rollout_view(buffer, runner, buffer.rows, self.window)

    def after_update(self, metrics: dict[str, float]) -> None:
        """Nothing to adapt: every update plays the same number of steps."""

    def state_dict(self) -> dict[str, Any]:
        """What continues the rollout exactly: env states, observations, trackers, look-ahead."""
        if self.obs is None:
            return {}
        runner, buffer = self.runner, self.buffer
        return {
            "env": self.env.snapshot(),
            "obs": self.obs,
            "alive": runner.alive,
            "returns": runner.returns,
            "lengths": runner.lengths,
            "own": runner.from_start,
            "noise": self.noise.last,
            "carry": {k: t[buffer.trained_rows :] for k, t in buffer.tensors.items()},
            "restarts": self.restarts.state_dict(),
        }

    def resume(self, saved: RolloutCheckpoint) -> None:
        """Continue the checkpoint's episodes where it holds them for this rank, else restart."""
        if saved.state is None:
            warnings.warn(
                f"checkpoint {saved.source} was written with other rollout settings or another "
                "number of ranks: every sub-env starts a new episode (not an exact continuation)",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        self.load_state_dict(saved.state, saved.source)

    def load_state_dict(self, state: dict[str, Any], source: str = "the state") -> None:
        if not state:
            return
        missing = sorted(STATE_KEYS - set(state))
        if missing:
            raise CheckpointError(
                f"{source}: its rollout state lacks {', '.join(missing)} (written by another "
                "version of grpo_trainer?), so its episodes cannot be continued"
            )
        if state["env"] is None:
            warnings.warn(
                f"{type(self.env.envs).__name__} offers no state snapshots: after this resume "
                "every sub-env starts a new episode (the run is not an exact continuation)",
                RuntimeWarning,
                stacklevel=2,
            )
            self.buffer.valid[self.buffer.trained_rows :] = False
            return
        device = self.env.device
        self.restarts.start(self.runner)  # an env must be reset before its state is set
        self.env.restore(state["env"])
        self.obs = state["obs"].to(device)
        runner = self.runner
        runner.alive = state["alive"].to(device)
        runner.returns = state["returns"].to(device)
        runner.lengths = state["lengths"].to(device)
        runner.from_start = state["own"].to(device)
        if state["noise"] is not None:
            self.noise.last = state["noise"].to(device)
        carry = state["carry"]
        for name, t in self.buffer.tensors.items():
            if name in NEWER_BUFFER_TENSORS and name not in carry:
                t[self.buffer.trained_rows :] = False
            else:
                t[self.buffer.trained_rows :] = carry[name].to(device)
        self.restarts.load_state_dict(state["restarts"])


class EpisodeRollout:
    """Every member plays one episode, at most `horizon` steps, from a fresh group reset."""

    def __init__(
        self,
        env: EnvIO,
        buffer: RolloutBuffer,
        head: ActionHead,
        group_size: int,
        noise: ExplorationNoise,
        seeds: GroupSeeds,
    ) -> None:
        self.env, self.buffer, self.head, self.group_size = env, buffer, head, group_size
        self.runner = EpisodeRunner(env)
        self.noise, self.seeds = noise, seeds
        self.max_horizon = self.horizon = buffer.rows  # steps the next collect may play
        self.steps_played = 0  # steps each sub-env played in the last collect (the ended idle)
        self.collects = 0  # numbers the groups' seed draws: one per update

    @torch.inference_mode()
    def collect(self, sample: SampleFn, generator: torch.Generator) -> Rollout:
        recorder = Recorder(self.buffer, self.head, sample, generator, self.noise)
        self.runner.stats.reset()
        obs = self.env.reset_groups(self.seeds(self.collects), self.group_size)
        self.collects += 1
        play_until_ended(self.runner, obs, recorder.act, self.horizon, on_step=recorder.record)
        self.steps_played = self.horizon
        return rollout_view(self.buffer, self.runner, self.horizon, self.horizon)

    def after_update(self, metrics: dict[str, float]) -> None:
        """Record the horizon; shorten it when every episode ended early, grow it when cut."""
        metrics["horizon"] = self.horizon
        everyone = self.env.num_envs * self.seeds.world_size
        if metrics.get("episodes", 0.0) / everyone < 1.0:
            self.horizon = min(self.max_horizon, self.horizon * 2)
            return
        scale, slack = HORIZON_SLACK
        longest = int(metrics.get("length_max", self.horizon))
        rounded = -(-int(longest * scale + slack) // MIN_HORIZON) * MIN_HORIZON
        self.horizon = min(self.max_horizon, max(MIN_HORIZON, rounded))

    def state_dict(self) -> dict[str, Any]:
        """Nothing beyond the horizon and the update count, which the checkpoint holds."""
        return {}

    def resume(self, saved: RolloutCheckpoint) -> None:
        self.horizon = min(saved.horizon, self.max_horizon)
        self.collects = saved.updates
