"""Episode bookkeeping shared by training rollouts, evaluation and recording: one runner, one
reducer of what ended episodes report (on the device, so reading them is one host copy), and
one "play until every sub-env has ended an episode" loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import torch
from gymnasium.vector import AutoresetMode

from grpo_trainer.envs.env_io import EnvIO, EnvStep

# Per-episode quantities the runner itself tracks, in the order of EpisodeStats' rows.
_CORE = ("return", "return_sq", "length")


class EpisodeStats:
    """Sums over ended episodes, per sub-env and added up in float64 when read, so long runs
    lose no precision. Return and length mean what the reference,
    `fruit_env.interop.wrappers.TorchEpisodeStatistics`, records (tests/test_shared_concepts.py)."""

    def __init__(self, num_envs: int, device: torch.device) -> None:
        self.num_envs, self.device = num_envs, device
        self.info_names: list[str] = []
        self.reset()

    def reset(self) -> None:
        """Forget everything summed so far (field names stay)."""
        zeros = torch.zeros
        self._core = zeros((len(_CORE), self.num_envs), device=self.device)
        self._ended = zeros(self.num_envs, device=self.device)
        self._info = zeros((len(self.info_names), self.num_envs), device=self.device)
        self._reported = zeros(self.num_envs, device=self.device)
        self._min = torch.full((self.num_envs,), torch.inf, device=self.device)
        self._max = torch.full((self.num_envs,), -torch.inf, device=self.device)

    def add(
        self,
        ended: torch.Tensor,
        returns: torch.Tensor,
        lengths: torch.Tensor,
        info: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        """Count the episodes that `ended`, with their return, length and `info` fields."""
        weight = ended.to(torch.float32)
        self._core += torch.stack((returns, returns * returns, lengths)) * weight
        self._ended += weight
        self._min = torch.minimum(self._min, returns.masked_fill(~ended, torch.inf))
        self._max = torch.maximum(self._max, returns.masked_fill(~ended, -torch.inf))
        if not info:
            return
        names = list(info)
        if names != self.info_names:  # a field seen for the first time (host-side, rare)
            self._grow([n for n in names if n not in self.info_names])
            if names != self.info_names:  # a subset, in another order: one field at a time
                for name, (values, mask) in info.items():
                    row = self.info_names.index(name)
                    self._info[row] += values * (ended & mask)
                return
        mask = next(iter(info.values()))[1]  # Gymnasium's `_episode`: shared by every field
        taken = (ended & mask).to(torch.float32)
        self._info += torch.stack([values for values, _ in info.values()]) * taken
        self._reported += taken

    def _grow(self, names: list[str]) -> None:
        self.info_names += names
        extra = torch.zeros((len(names), self.num_envs), device=self.device)
        self._info = torch.cat((self._info, extra))

    def sums(self) -> dict[str, torch.Tensor]:
        """Device scalars to reduce across ranks and then `summarise`: `episodes`,
        `return_sum`, `return_sq_sum`, `length_sum`, `return_min`, `return_max`,
        `episode_reports` and one `episode_sum_<field>` per info field (float64)."""
        core = self._core.double().sum(1)
        out = {
            "episodes": self._ended.double().sum(),
            "return_sum": core[0],
            "return_sq_sum": core[1],
            "length_sum": core[2],
            "return_min": self._min.min().double(),
            "return_max": self._max.max().double(),
            "episode_reports": self._reported.double().sum(),
        }
        for name, total in zip(self.info_names, self._info.double().sum(1), strict=True):
            out[f"episode_sum_{name}"] = total
        return out


def summarise(
    sums: Mapping[str, torch.Tensor], ratios: Mapping[str, tuple[str, str]] | None = None
) -> dict[str, torch.Tensor]:
    """Means of `EpisodeStats.sums()` (possibly summed over ranks): `return_mean/std`,
    `length_mean`, one `episode_<field>` per info field, and each declared success ratio
    `hits / (hits + misses)` (Fruit Catcher's `catch_rate`). A mean over no episode is NaN;
    callers leave such metrics out."""
    count = sums["episodes"]
    mean = sums["return_sum"] / count
    out = {
        "return_mean": mean,
        "return_std": (sums["return_sq_sum"] / count - mean * mean).clamp_min(0.0).sqrt(),
        "length_mean": sums["length_sum"] / count,
    }
    fields = {
        k.removeprefix("episode_sum_"): v for k, v in sums.items() if k.startswith("episode_sum_")
    }
    for name, total in fields.items():
        out[f"episode_{name}"] = total / sums["episode_reports"]
    for name, (hits, misses) in (ratios or {}).items():
        if hits in fields and misses in fields:
            out[name] = fields[hits] / (fields[hits] + fields[misses])
    return out


class EpisodeRunner:
    """Steps an env and tracks each sub-env's current episode (who plays, return, length).

    A sub-env is *alive* while its episode counts; an ended one is added to `stats` and stays
    out until started again. A branched one (`branch_from`) plays on mid-episode, so its end is
    not counted: the statistics are of episodes played from their start, once.
    """

    def __init__(self, env: EnvIO, max_episode_steps: int | None = None) -> None:
        self.env, self.limit = env, max_episode_steps
        # SAME_STEP returns the next episode's first observation where one ended, so an end
        # by a time limit leaves nothing to value there
        self.last_obs_returned = env.autoreset_mode != AutoresetMode.SAME_STEP
        device, n = env.device, env.num_envs
        self.stats = EpisodeStats(n, device)
        self.alive = torch.zeros(n, dtype=torch.bool, device=device)
        self.returns = torch.zeros(n, device=device)
        self.lengths = torch.zeros(n, device=device)
        self.from_start = torch.ones(n, dtype=torch.bool, device=device)

    def begin_episodes(self, mask: torch.Tensor | None = None) -> None:
        """Sub-envs in `mask` (all when None) start counting a new episode."""
        if mask is None:
            mask = torch.ones_like(self.alive)
        self.alive |= mask
        self.from_start |= mask
        self.returns.masked_fill_(mask, 0.0)
        self.lengths.masked_fill_(mask, 0.0)

    def branch_from(self, source: torch.Tensor, fresh: torch.Tensor) -> None:
        """Sub-env `b` now plays `source[b]`'s episode (a branch), or a new one where `fresh`."""
        self.alive = self.alive.index_select(0, source) | fresh
        self.from_start = (self.from_start & (source == self.env.indices)) | fresh
        self.returns = self.returns.index_select(0, source).masked_fill_(fresh, 0.0)
        self.lengths = self.lengths.index_select(0, source).masked_fill_(fresh, 0.0)

    def step(self, action: torch.Tensor) -> RunnerStep:
        """One env step for every sub-env; rewards of sub-envs not alive count as 0."""
        step = self.env.step(action)
        alive = self.alive
        reward = step.reward * alive
        self.returns += reward
        self.lengths += alive
        done = step.done
        if self.limit is not None:
            done = done | (self.lengths >= self.limit)
        ended = alive & done
        timed_out = ended & ~step.terminated
        if not self.last_obs_returned:
            timed_out = timed_out & ~step.done
        self.stats.add(ended & self.from_start, self.returns, self.lengths, step.episode)
        self.alive = alive & ~done
        return RunnerStep(step, reward, alive, ended, timed_out)


class RunnerStep(NamedTuple):
    """One step as the runner saw it."""

    env: EnvStep
    reward: torch.Tensor  # (B,) float32, 0 where the sub-env was not alive
    alive: torch.Tensor  # (B,) bool: the sub-env's episode counted at this step
    ended: torch.Tensor  # (B,) bool: ...and ended at it
    # (B,) bool: ...by a time limit (the env's truncation or the runner's), with `env.obs` the
    # episode's last observation: the game could have gone on from there
    timed_out: torch.Tensor


def play_until_ended(
    runner: EpisodeRunner,
    obs: torch.Tensor,
    act: Callable[[int, torch.Tensor], torch.Tensor],
    steps: int,
    *,
    counted: torch.Tensor | None = None,
    on_step: Callable[[int, RunnerStep], None] | None = None,
    stop: Callable[[EpisodeRunner], bool] | None = None,
) -> int:
    """Play from `obs` with `act(t, obs)` until every `counted` sub-env (default all) has
    ended one episode, or for `steps` steps; returns the steps played. Without `stop` it never
    waits on the device (a rollout); `stop(runner)` may read it to end early (evaluation)."""
    runner.alive.fill_(False)
    runner.begin_episodes(counted)
    for t in range(steps):
        step = runner.step(act(t, obs))
        if on_step is not None:
            on_step(t, step)
        obs = step.env.obs
        if stop is not None and stop(runner):
            return t + 1
    return steps
