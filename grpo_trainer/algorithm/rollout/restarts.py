"""When and how groups start again (docs/trainer.md, "Groups"): `GroupRestarts` (the trainer
restarts whole groups alike, by snapshots or seeded resets, and may branch them) or
`IndependentRestarts` (the env's own autoreset restarts each sub-env; the trainer follows).
"""

from __future__ import annotations

from typing import Any

import torch
from gymnasium.vector import AutoresetMode

from grpo_trainer.algorithm.rollout.buffer import RolloutBuffer
from grpo_trainer.envs.env_io import EnvIO
from grpo_trainer.envs.episodes import EpisodeRunner, RunnerStep

SEED_STRIDE = 1_000_000_007  # run seeds this far apart never share a group's seed


class GroupSeeds:
    """The seeds groups start from at the `draw`-th draw (whole episodes: one per update;
    windowed: one per restart check), one per group: distinct for every draw, rank and run
    seed."""

    def __init__(self, run_seed: int, rank: int, world_size: int, num_groups: int) -> None:
        self.run_seed, self.rank, self.world_size = run_seed, rank, world_size
        self.num_groups = num_groups

    def __call__(self, draw: int) -> list[int]:
        first = (draw * self.world_size + self.rank) * self.num_groups
        return [self.run_seed * SEED_STRIDE + first + g for g in range(self.num_groups)]


class RestartPolicy:
    """How sub-envs start again after their episodes end (one of two policies)."""

    def start(self, runner: EpisodeRunner) -> torch.Tensor:
        raise NotImplementedError

    def after_step(
        self, row: int, step: RunnerStep, runner: EpisodeRunner, buffer: RolloutBuffer
    ) -> torch.Tensor:
        raise NotImplementedError

    def branches_after_next_step(self) -> bool:
        """Whether every group branches after the next step (`GroupRestarts`, aligned)."""
        return False

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class GroupRestarts(RestartPolicy):
    """Groups start together: every `every` steps, each group whose members have all ended
    starts a new game, the same for all its members. With state snapshots, a member that
    ended takes the state of one still playing (`branch_ended`), and a group branches from
    one member's state every `branch_every` steps, its rows before the branch cut
    (docs/trainer.md, "Groups that stay in step")."""

    def __init__(
        self,
        env: EnvIO,
        group_size: int,
        seeds: GroupSeeds,
        generator: torch.Generator,
        *,
        every: int,
        branch_every: int,
        branch_ended: bool,
        aligned: bool = False,
    ) -> None:
        self.env, self.group_size, self.seeds = env, group_size, seeds
        self.generator, self.every, self.branch_every = generator, every, branch_every
        self.branch_ended, self.aligned = branch_ended, aligned
        device, n = env.device, env.num_envs
        self.leader = torch.arange(n, device=device) // group_size * group_size
        self.steps_since_branch = torch.zeros(n, device=device)  # since it (re)started or branched
        self.seed_draws = 0  # group seeds drawn so far: numbers the next draw
        self.steps = 0

    def start(self, runner: EpisodeRunner) -> torch.Tensor:
        obs = self.env.reset_groups(self._group_seeds(), self.group_size)
        runner.begin_episodes()
        return obs

    def _group_seeds(self) -> list[int]:
        self.seed_draws += 1
        return self.seeds(self.seed_draws)

    def after_step(
        self, row: int, step: RunnerStep, runner: EpisodeRunner, buffer: RolloutBuffer
    ) -> torch.Tensor:
        obs = step.env.obs
        self.steps += 1
        if self.branch_every:
            self.steps_since_branch += 1
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
            if self.aligned:  # every group at once: one completion rollout serves them all
                due = ~fresh if self.steps % self.branch_every == 0 else torch.zeros_like(fresh)
            else:
                due = (self.steps_since_branch >= self.branch_every) & ~fresh
            source = torch.where(due, donor, source)
            buffer.cut[row] |= due  # the group's paths end here; their returns stop
            self.steps_since_branch.masked_fill_(due | fresh, 0.0)
        seeds = self._group_seeds  # only the seeded strategy calls it (host-side)
        obs = self.env.restart(obs, fresh, source, lambda: [s for s in seeds() for _ in range(k)])
        runner.branch_from(source, fresh)
        buffer.bootstrap[row] &= (source == self.env.indices) & ~fresh  # the obs it kept
        return obs

    def branches_after_next_step(self) -> bool:
        """Whether the check after the next step branches every group (`aligned`; the config
        makes `branch_every` a multiple of the checks' `every`)."""
        return self.aligned and (self.steps + 1) % self.branch_every == 0

    def state_dict(self) -> dict[str, Any]:
        # the checkpoint's key names are the file format's
        return {"since": self.steps_since_branch, "points": self.seed_draws, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_since_branch = state["since"].to(self.steps_since_branch.device)
        self.seed_draws, self.steps = int(state["points"]), int(state["steps"])


class IndependentRestarts(RestartPolicy):
    """The env restarts each sub-env itself; the trainer follows. With NEXT_STEP the step
    after an end is a reset step, so the sub-env counts again after it; with SAME_STEP at once."""

    def __init__(self, env: EnvIO, group_size: int, seeds: GroupSeeds):
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
        obs = self.env.reset_groups(self.seeds(0), self.group_size)
        runner.begin_episodes()
        return obs

    def after_step(
        self, row: int, step: RunnerStep, runner: EpisodeRunner, buffer: RolloutBuffer
    ) -> torch.Tensor:
        if self.next_step:
            runner.begin_episodes(self.resetting)  # their reset step has just been played
            self.resetting = step.ended
        else:
            runner.begin_episodes(step.ended)
        return step.env.obs

    def state_dict(self) -> dict[str, Any]:
        return {"resetting": self.resetting}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resetting = state["resetting"].to(self.resetting.device)
