"""Evaluation during training: the score that picks `best.pt` and decides the target
(docs/trainer.md, "Evaluation during training, targets and callbacks"). Greedy episodes on
envs of its own, as the training return mixes several policies and exploration noise; each
rank plays its share and the sums are added, so every rank takes the same decision.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from grpo_trainer.base.config import eval_interval
from grpo_trainer.base.metrics import cross_rank
from grpo_trainer.envs import make_envs
from grpo_trainer.run.callbacks import Callback, RunState, resolve_target
from grpo_trainer.run.evaluation import EVAL_SEED, MAX_EVAL_ENVS, evaluate

if TYPE_CHECKING:
    from grpo_trainer.algorithm.grpo import GRPO

RANK_SEED_STRIDE = 1_000_003  # ranks' eval seeds are this far apart: no game is played twice


class Evaluation(Callback):
    """Evaluation during training as a service of the run: after an update that passed the
    next `eval_every` env steps, its `eval_*` metrics join the update's, every callback hears
    of them (`on_eval`), and a `--target` reached ends the run after this update (every rank
    evaluated the same summed episodes, so every rank stops alike)."""

    def __init__(
        self,
        trainer: GRPO,
        envs: gym.vector.VectorEnv | None,
        announce: Callable[[str, dict[str, float]], None],
        elapsed_s: Callable[[], float],
    ) -> None:
        self.trainer, self.announce, self.elapsed_s = trainer, announce, elapsed_s
        run, world = trainer.config.run, trainer.collective.world_size
        self.every = eval_interval(trainer.config, world)
        ratios = trainer.env.episode_ratios
        self.score_metric = f"eval_{next(iter(ratios))}" if ratios else "eval_return_mean"
        self.target = resolve_target(run.target, ratios, trainer.env.episode_goals)
        self.reached_at: dict[str, float] = {}  # target_reached_s and _env_steps, once known
        self.total_s = 0.0
        self.episodes = -(-run.eval_episodes // world)  # this rank's share
        self._envs = envs
        self._own_envs = envs is None
        self._next = (trainer.env_steps // self.every + 1) * self.every if self.every else 0

    def due(self) -> bool:
        """Whether training has passed the next multiple of `eval_every` env steps."""
        return self.every > 0 and self.trainer.env_steps >= self._next

    def run(self, elapsed_s: float) -> dict[str, float]:
        """Evaluate now: the `eval_*` metrics, `eval_score`, timings and, when first reached,
        `target_reached_*`. `elapsed_s` is the run's wall time so far."""
        trainer = self.trainer
        start = time.perf_counter()
        envs = self._eval_envs()
        seed = EVAL_SEED + trainer.collective.rank * RANK_SEED_STRIDE
        policy = trainer.policy
        was_training = policy.training
        policy.eval()
        try:
            result = evaluate(
                policy,
                envs,
                self.episodes,
                greedy=True,
                seed=seed,
                max_episode_steps=trainer.config.max_episode_steps,
                sum_over_ranks=self._sum_over_ranks,
            )
            out = {f"eval_{name}": value for name, value in result.items()}
        finally:
            policy.train(was_training)
        out["eval_score"] = out.get(self.score_metric, math.nan)
        self._next = (trainer.env_steps // self.every + 1) * self.every
        eval_s = time.perf_counter() - start
        self.total_s += eval_s
        out["eval_s"], out["eval_total_s"] = eval_s, self.total_s
        if self.target and not self.reached_at and self.reached(out):
            self.reached_at = {
                "target_reached_s": elapsed_s + eval_s,
                "target_reached_env_steps": float(trainer.env_steps),
            }
            out.update(self.reached_at)
        return out

    def reached(self, metrics: dict[str, float]) -> bool:
        """Whether these eval metrics meet the target."""
        value = metrics.get(self.target.metric) if self.target else None
        return value is not None and value >= self.target.value  # type: ignore[union-attr]

    def on_update(self, state: RunState, metrics: dict[str, float]) -> None:
        if not self.due():
            return
        out = self.run(elapsed_s=self.elapsed_s())
        metrics.update(out)
        self.announce("on_eval", out)
        if self.target and self.target.stops and self.reached(out):
            state.end(stop_reason=f"the evaluation reached the target {self.target}")

    def on_train_end(self, state: RunState, metrics: dict[str, float]) -> None:
        self.close()

    def on_train_error(self, state: RunState, error: BaseException) -> None:
        self.close()

    def close(self) -> None:
        if self._envs is not None and self._own_envs:
            self._envs.close()
        self._envs = None

    def _eval_envs(self) -> gym.vector.VectorEnv:
        """The eval env: given, or made from the config's env id like the training env, and
        checked to have the training env's spaces (a policy cannot play another game)."""
        if self._envs is None:
            trainer = self.trainer
            num_envs = min(self.episodes, MAX_EVAL_ENVS)
            self._envs = make_envs(trainer.config, num_envs, trainer.device)
        own = (str(self._envs.single_observation_space), str(self._envs.single_action_space))
        train_env = self.trainer.env
        theirs = (str(train_env.observation_space), str(train_env.action_space))
        if own != theirs:
            raise ValueError(
                f"eval_every: the eval env's spaces {own} differ from the training env's "
                f"{theirs}; the trainer was given an env that config.run.env "
                f"({self.trainer.config.run.env!r}) does not make: pass eval_envs= to "
                "train(), or set eval_every=0"
            )
        return self._envs

    def _sum_over_ranks(self, sums: dict[str, Any]) -> dict[str, Any]:
        """Every rank's episode sums combined as an update's are (return_min by min, ...)."""
        return self.trainer.collective.reduce(sums, {name: cross_rank(name) for name in sums})
