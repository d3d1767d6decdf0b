"""`GRPO`: play groups, compare each step with the group, optimise, repeat.

Read `update()` top to bottom for the algorithm; each piece it calls lives in a module of its
own beside this one (docs/architecture.md). The run around updates (budget, checkpoints,
evaluation, logging, reading checkpoint files) is the layer above: `GRPOTrainer`.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import torch

from grpo_trainer.algorithm.advantages import Advantages, make_estimator
from grpo_trainer.algorithm.objective import LossTerms
from grpo_trainer.algorithm.optimizer_step import LossTotals, OptimizerStep, Samples, trust_regions
from grpo_trainer.algorithm.policy import AutocastPolicy, build_policy
from grpo_trainer.algorithm.rollout import (
    GroupSeeds,
    Rollout,
    RolloutBuffer,
    RolloutCheckpoint,
    make_rollout,
)
from grpo_trainer.algorithm.scoring import RowScores
from grpo_trainer.base import checkpoint, distributed
from grpo_trainer.base.accel import (
    Compiled,
    compile_mode,
    make_generator,
    resolve_amp,
    resolve_device,
    should_compile,
)
from grpo_trainer.base.collective import Collective
from grpo_trainer.base.config import GRPOConfig, has_critic
from grpo_trainer.base.metrics import Clock, cross_rank, memory_stats, to_host
from grpo_trainer.base.schedules import budget_spent, lr_factor
from grpo_trainer.envs.contract import is_spatial, read_contract
from grpo_trainer.envs.env_io import EnvIO
from grpo_trainer.envs.episodes import summarise

# The entries of `GRPO.state_dict()`, and the checkpoint's digest: what a checkpoint holds
# besides these belongs to the run (`GRPOTrainer.checkpoint_extras`).
STATE_KEYS = frozenset(
    {
        *("format_version", "config", "spaces", "policy", "reference", "optimizer", "scaler"),
        *("generator", "update_index", "env_steps", "train_s", "horizon", "rollouts"),
        checkpoint.DIGEST_KEY,
    }
)


class GRPO:
    """GRPO on any Gymnasium vector env with `num_groups * group_size` sub-envs."""

    def __init__(self, envs: gym.vector.VectorEnv, config: GRPOConfig | None = None) -> None:
        cfg = config or GRPOConfig()
        run = cfg.run
        self.collective = distributed.collective()
        # 'auto' follows the env where it declares a device (its contract), else cuda if any
        own = read_contract(envs).device if run.device == "auto" else None
        self.device = distributed.rank_device(own or resolve_device(run.device))
        self.amp = resolve_amp(run.amp, self.device)
        self.env = EnvIO(envs, self.device)
        spatial = is_spatial(self.env.observation_space)  # open_run's config is resolved already
        self.config = cfg = cfg.resolve(self.env.max_episode_steps(), spatial=spatial)
        if self.env.num_envs != cfg.num_envs:
            raise ValueError(
                f"the env has {self.env.num_envs} sub-envs but num_groups x group_size = "
                f"{cfg.num_groups} x {cfg.group_size} = {cfg.num_envs}"
            )
        torch.manual_seed(run.seed)
        spaces = (self.env.observation_space, self.env.action_space)
        self.policy = build_policy(cfg, *spaces).to(self.device)
        self.reference = (
            copy.deepcopy(self.policy).requires_grad_(False) if cfg.kl_coef > 0 else None
        )
        self.optimizer_step = OptimizerStep(self.policy, cfg, self.amp, self.collective)
        self.optimizer = self.optimizer_step.optimizer  # torch's AdamW, for inspection
        self.generator = make_generator(self.device, run.seed)
        seeds = GroupSeeds(
            run.seed, self.collective.rank, self.collective.world_size, cfg.num_groups
        )
        self.rollout = make_rollout(cfg, self.env, self.policy.head, seeds, self.generator)
        self.estimate = make_estimator(cfg, self.collective.sum)
        # The hot functions, compiled where it pays (accel.should_compile): sampling one
        # action per sub-env, and one minibatch's loss (the update's forward goes through
        # DDP in a distributed run, so that gradients are averaged; the rollout's does not).
        calls = AutocastPolicy(self.policy, self.reference, cfg, self.amp, self.device)
        on = should_compile(run.compile, self.device, cfg.minibatch_size)
        mode = compile_mode(run.compile_mode, self.device)
        self.sample = Compiled(calls.sample, on, "policy sampling", mode)
        forward = self.collective.data_parallel(self.policy)
        self.loss = Compiled(functools.partial(calls.loss, forward), on, "loss", mode)
        self.log_prob = calls.log_prob
        self.scores = RowScores(calls, self.rollout, has_critic(cfg))
        # On the CPU the passes cost what they compute, and most rows of a sparse reward's
        # early updates weigh 0 (docs/performance.md, "Rows that weigh nothing"). Finding
        # them reads a count, a host sync on a GPU, where the passes are launch-bound: there
        # every row is kept, and the update's shapes stay fixed.
        self.drop_flat_rows = self.device.type == "cpu"
        bounded = cfg.mean_bound_coef > 0 and self.policy.head.bounded
        self.penalised = bounded or has_critic(cfg)  # rows_to_train: they learn every row
        self.update_index, self.env_steps, self.train_s = 0, 0, 0.0

    @property
    def buffer(self) -> RolloutBuffer:
        return self.rollout.buffer

    # -- the algorithm -------------------------------------------------------------------------

    def update(self) -> dict[str, float]:
        """One GRPO update: play, compare each step with its group, optimise. Returns the
        update's metrics (one device-to-host copy)."""
        return self.update_and_agree_on_stop().metrics

    def update_and_agree_on_stop(
        self, stop_requested: Callable[[], bool] = lambda: False
    ) -> UpdateResult:
        """`update()`, and the stop agreement of a distributed run: `stop_requested()`, asked
        as the metrics are reduced, says whether this rank was asked to stop; the result says
        whether any rank was, so that all stop after the same update."""
        collect_start = Clock(self.device)
        rollout = self.collect()
        return self.learn(rollout, collect_start, stop_requested)

    def collect(self) -> Rollout:
        """Play: every sub-env takes `rollout_steps` steps (or plays one episode)."""
        seed = self.collective.sampling_seed(self.config.run.seed, self.update_index)
        if seed is not None:  # a distributed resume replays every rank's stream exactly
            self.generator.manual_seed(seed)
        self.policy.eval()
        return self.rollout.collect(self.sample, self.generator)

    def learn(
        self,
        rollout: Rollout,
        collect_start: Clock | None = None,
        stop_requested: Callable[[], bool] = lambda: False,
    ) -> UpdateResult:
        """Compare each step with its group, optimise the clipped surrogate, report."""
        learn_start = Clock(self.device)
        lr = self._follow_schedules()

        # Score the rows with this update's policy (`scoring.py`), then compare: each
        # step's return (with a critic, its GAE) against its group's.
        values, rescored = self.scores.both(rollout)
        adv = self.estimate(rollout, values)

        # Optimise: per trust region (the whole batch, unless it holds more than
        # `anchor_samples`), epochs of shuffled minibatches of `minibatch_size` samples.
        self.policy.train()
        samples = self.trained_samples(rollout, adv, rescored)
        totals = LossTotals(self.device)
        regions = trust_regions(
            samples.size, self.config.anchor_samples, self.generator, self.device
        )
        for region in regions:
            part = samples if region is None else samples.rows(region).anchored(self.log_prob)
            self._optimise(part, totals)
        learn_end = Clock(self.device)

        # Report: metrics of the whole batch, in one host copy.
        result = update_report(
            rollout, adv, totals.means(), stop_requested(), self.collective, self.env.episode_ratios
        )
        rollout_s = learn_start - (collect_start or learn_start)
        self._advance(result.metrics, lr, rollout_s, learn_end - learn_start)
        return result

    def _optimise(self, part: Samples, totals: LossTotals) -> None:
        """`epochs` passes of shuffled minibatches over one trust region's samples."""
        cfg = self.config
        minibatches = max(1, -(-part.size // cfg.minibatch_size))
        # Every sample weighs the same whatever minibatch it falls in; DDP averages gradients
        # over ranks, so the step is that of one process on the whole region. Every valid
        # sample counts in the normaliser, those of group steps without spread too: as the
        # policy converges and fewer groups disagree, steps shrink, instead of a few
        # disagreeing groups steering the whole update.
        normaliser = self.collective.sum(part.valid.sum()).clamp_min(1.0) / (
            minibatches * self.collective.world_size
        )
        contributes = part.rows_to_train(self.penalised) if self.drop_flat_rows else None
        for _ in range(cfg.epochs):
            order = torch.randperm(part.size, generator=self.generator, device=self.device)
            for minibatch in order.tensor_split(minibatches):
                if contributes is not None:
                    minibatch = minibatch[contributes.index_select(0, minibatch)]
                totals.add(*self._minibatch_step(part, minibatch, normaliser))

    def _minibatch_step(
        self, part: Samples, minibatch: torch.Tensor, normaliser: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One optimiser step on `minibatch`, in `micro_batches` backward passes. Returns the
        summed loss terms, the gradient norm and whether the step was applied."""
        step = self.optimizer_step
        step.zero_grad()
        loss_terms = torch.zeros(len(LossTerms._fields), device=self.device)
        for index in minibatch.tensor_split(self.config.micro_batches):
            rows = part.rows(index)
            out = self.loss(
                *(rows.obs, rows.actions, rows.old_logp, rows.advantages, rows.weights),
                *(rows.valid, normaliser, rows.value_targets, rows.value_weights),
            )
            step.backward(out.loss)
            loss_terms += torch.stack([t.detach().float() for t in out])
        grad_norm, finite = step.apply(LossTerms(*loss_terms.unbind()).loss)
        return loss_terms, grad_norm, finite

    def advantages(self, rollout: Rollout) -> Advantages:
        """Each step's return (with a critic, its GAE) against its group's at the same step.
        The critic values every played row anew, so that each GAE sum holds one critic's."""
        return self.estimate(rollout, self.scores.values(rollout))

    def trained_samples(
        self, rollout: Rollout, adv: Advantages, rescored: torch.Tensor | None = None
    ) -> Samples:
        """What an update trains on. Rows that waited for their look-ahead were played by an
        earlier policy: they are re-scored (`rescored`, `RowScores`), so that the
        clipped ratio measures this update's step, as for fresh rows, and
        (`deferred_weights="truncated"`) weighed by their truncated importance
        (`Samples.importance_weighted`)."""
        if rescored is None:
            rescored = self.scores.rescored(rollout)
        earlier = rollout.earlier_policy_rows
        old_logp = (
            rollout.logp if rescored is None else torch.cat((rescored, rollout.logp[earlier:]))
        )
        samples = Samples.of(rollout, old_logp, adv)
        if self.config.deferred_weights == "truncated":
            samples = samples.importance_weighted(old_logp, rollout.logp)
        return samples

    def _follow_schedules(self) -> float:
        """Set this update's learning rate."""
        cfg = self.config
        lr = cfg.lr * lr_factor(budget_spent(cfg, self.env_steps, self.train_s), cfg.lr_schedule)
        self.optimizer_step.set_lr(lr)
        return lr

    def _advance(
        self, metrics: dict[str, float], lr: float, rollout_s: float, update_s: float
    ) -> None:
        """Advance the counters; add the host's figures and the rollout's to the metrics."""
        cfg, played = self.config, self.rollout.steps_played
        self.update_index += 1
        self.env_steps += played * cfg.num_envs * self.collective.world_size
        # the slowest rank's seconds: a time budget sets one learning rate and one end on all
        self.train_s = self.collective.slowest(self.train_s + rollout_s + update_s)
        self.rollout.after_update(metrics)
        metrics.update(
            update=self.update_index,
            env_steps=self.env_steps,
            lr=lr,
            rollout_s=rollout_s,
            update_s=update_s,
            steps_per_s=played * cfg.num_envs / max(rollout_s + update_s, 1e-9),
            train_s=self.train_s,
            **memory_stats(self.device),
        )

    # -- persistence ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: weights, optimiser, RNG, counters, config,
        and the rollout's episodes in play (each rank's: rank 0 writes the checkpoint)."""
        return {
            "format_version": checkpoint.FORMAT_VERSION,
            "config": json.loads(json.dumps(self.config.to_dict())),
            "spaces": checkpoint.space_signature(self.env.observation_space, self.env.action_space),
            "policy": self.policy.state_dict(),
            "reference": self.reference.state_dict() if self.reference else None,
            **self.optimizer_step.state_dict(),
            "generator": self.generator.get_state(),
            "update_index": self.update_index,
            "env_steps": self.env_steps,
            "train_s": self.train_s,
            "horizon": self.rollout.horizon,
            "rollouts": self.collective.gather(self.rollout.state_dict()),
        }

    def load_state_dict(self, state: dict[str, Any], source: str = "the state") -> None:
        """Continue from `state_dict()`'s entries (those of a checkpoint the run has read and
        checked: `GRPOTrainer.load`); `source` names it in errors and warnings."""
        try:
            copy.deepcopy(self.policy).load_state_dict(state["policy"])  # nothing half-loaded
            self.policy.load_state_dict(state["policy"])
            if self.reference is not None:  # a run that had no reference starts it from here
                self.reference.load_state_dict(state["reference"] or state["policy"])
            self.optimizer_step.load_state_dict(state["optimizer"], state["scaler"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise checkpoint.CheckpointError(
                f"checkpoint {source} does not fit this network (hidden_sizes, activation or "
                f"action head differ): {err}"
            ) from None
        self.generator.set_state(state["generator"])
        self.update_index = int(state["update_index"])
        self.env_steps = int(state["env_steps"])
        self.train_s = float(state["train_s"])
        self.rollout.resume(RolloutCheckpoint.for_rank(state, self.config, self.collective, source))


# -- the report --------------------------------------------------------------------------------


class UpdateResult(NamedTuple):
    """What one update reports, on the host."""

    metrics: dict[str, float]
    stop: bool  # some rank was asked to stop (SIGINT/SIGTERM): every rank stops after this


def update_report(
    rollout: Rollout,
    adv: Advantages,
    losses: Mapping[str, torch.Tensor],
    stop_requested: bool,
    collective: Collective,
    ratios: Mapping[str, Any],
) -> UpdateResult:
    """The update's metrics over all ranks, copied to the host once (the design's one
    device-to-host copy per update).

    Episode figures are reduced as sums and only then turned into means, so they are those of
    the whole batch; an update in which no episode ended reports none.
    """
    device = rollout.rewards.device
    episodes = dict(rollout.episodes)
    for name in collective.agree_names(list(episodes)):  # fields some rank lacks
        episodes.setdefault(name, torch.zeros((), dtype=torch.float64, device=device))
    counts = {
        "valid_steps": rollout.valid[: rollout.obs.shape[0]].sum(),
        "zero_spread": adv.zero_spread.sum(),
        "compared": adv.compared.sum(),
    }
    stop = torch.full((), float(stop_requested), device=device)
    raw = {**episodes, **counts, "length_max": rollout.length_max, **losses, "stop": stop}
    reduced = collective.reduce(raw, {name: cross_rank(name) for name in raw})
    metrics = {
        **summarise(reduced, ratios),
        **{name: reduced[name] for name in ("episodes", "return_min", "return_max")},
        "valid_steps": reduced["valid_steps"],
        "frac_zero_std_groups": reduced["zero_spread"] / reduced["compared"],
        "length_max": reduced["length_max"],
        "compared": reduced["compared"],
        **{name: reduced[name] for name in losses},
        "stop": reduced["stop"],
    }
    host = to_host(metrics)
    stop_agreed = bool(host.pop("stop"))
    if not host["episodes"]:  # a mean over no episode is undefined: leave it out
        for name in per_episode_metrics(host, ratios):
            del host[name]
    if not host.pop("compared"):  # no group step to compare (the first rows of a run)
        del host["frac_zero_std_groups"]
    return UpdateResult(host, stop_agreed)


def per_episode_metrics(metrics: Mapping[str, float], ratios: Mapping[str, Any]) -> list[str]:
    """The metrics that are means or extremes over the update's ended episodes."""
    fixed = ("return_mean", "return_std", "return_min", "return_max", "length_mean")
    return [n for n in metrics if n in fixed or n.startswith("episode_") or n in ratios]
