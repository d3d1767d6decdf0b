"""`GRPOTrainer`: play groups, compare each step with the group, optimise, repeat.

Read `update()` top to bottom for the algorithm. The pieces it calls each live in one
module: rollouts (`rollout.py`), advantages (`advantages.py`), the loss (`objective.py`),
what ranks share (`collective.py`) and the metrics (`metrics.py`). The loop around updates,
with checkpoints, signals and logging, is `harness.py`.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import torch

from grpo_trainer.algorithm.advantages import (
    Advantages,
    episode_returns,
    group_relative,
    windowed_returns,
)
from grpo_trainer.algorithm.objective import LossTerms, grpo_loss
from grpo_trainer.algorithm.policy import Policy
from grpo_trainer.algorithm.rollout import (
    EpisodeRollout,
    Rollout,
    RolloutBuffer,
    WindowedRollout,
    make_rollout,
)
from grpo_trainer.base import checkpoint, distributed
from grpo_trainer.base.accel import (
    Compiled,
    autocast,
    compile_mode,
    make_generator,
    make_optimizer,
    resolve_amp,
    resolve_device,
    should_compile,
)
from grpo_trainer.base.config import GRPOConfig
from grpo_trainer.base.metrics import cross_rank, memory_stats, to_host
from grpo_trainer.base.schedules import lr_factor
from grpo_trainer.envs.env_io import EnvIO
from grpo_trainer.envs.episodes import summarise

log = logging.getLogger(__name__)

SEED_STRIDE = 1_000_000_007  # run seeds this far apart never share a group's seed
MIN_HORIZON = 16  # episodes mode: the shortest adapted horizon, and its rounding step
HORIZON_SLACK = (1.25, 8)  # episodes mode: next horizon = longest episode * 1.25 + 8


# The entries of `GRPOTrainer.state_dict()`, and the checkpoint's digest: what a checkpoint
# holds besides these belongs to the run (`checkpoint_extras`).
STATE_KEYS = frozenset(
    {
        *("format_version", "config", "spaces", "policy", "reference", "optimizer", "scaler"),
        *("generator", "update_index", "env_steps", "train_s", "horizon", "rollouts"),
        checkpoint.DIGEST_KEY,
    }
)


class UpdateResult(NamedTuple):
    """What one update reports, on the host."""

    metrics: dict[str, float]
    stop: bool  # some rank was asked to stop (SIGINT/SIGTERM): every rank stops after this


def storage_dtype(space: gym.Space, choice: str) -> torch.dtype:
    """How rollouts store observations; the policy reads them in this dtype, always.

    "auto" keeps integer observations (images) as they are, stores float observations with
    finite bounds within float16 range as float16, and anything else as float32. Because
    the policy sees the stored value in the rollout and in the update alike, nothing it
    used is lost.
    """
    explicit = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if choice in explicit:
        return explicit[choice]
    dtype = torch.from_numpy(space.sample().reshape(-1)[:1]).dtype if space.shape else torch.float32
    if not dtype.is_floating_point:
        return dtype
    low, high = getattr(space, "low", None), getattr(space, "high", None)
    limit = torch.finfo(torch.float16).max
    bounded = low is not None and bool((abs(low) <= limit).all() and (abs(high) <= limit).all())
    return torch.float16 if bounded else torch.float32


class GRPOTrainer:
    """GRPO on any Gymnasium vector env with `num_groups * group_size` sub-envs."""

    def __init__(self, envs: gym.vector.VectorEnv, config: GRPOConfig | None = None) -> None:
        cfg = config or GRPOConfig()
        run = cfg.run
        self.collective = distributed.collective()
        self.device = distributed.rank_device(resolve_device(run.device))
        self.amp = resolve_amp(run.amp, self.device)
        self.env = EnvIO(envs, self.device)
        # the window follows the episode limit (the trainer's own, else the env's)
        self.config = cfg = cfg.for_episode_limit(
            cfg.max_episode_steps or self.env.max_episode_steps()
        )
        if self.env.num_envs != cfg.num_envs:
            raise ValueError(
                f"the env has {self.env.num_envs} sub-envs but num_groups x group_size = "
                f"{cfg.num_groups} x {cfg.group_size} = {cfg.num_envs}"
            )
        torch.manual_seed(run.seed)
        self.policy = Policy(
            self.env.observation_space,
            self.env.action_space,
            cfg.hidden_sizes,
            cfg.activation,
            cfg.cnn_channels,
        ).to(self.device)
        self.reference = (
            copy.deepcopy(self.policy).requires_grad_(False) if cfg.kl_coef > 0 else None
        )
        self.optimizer, self.fused = make_optimizer(
            self.policy.parameters(), cfg.lr, cfg.weight_decay, run.fused_optimizer
        )
        self.scaler = torch.amp.GradScaler("cuda") if self.amp == "fp16" else None
        self.generator = make_generator(self.device, run.seed)
        self._make_rollout()
        # The hot functions, compiled where it pays (accel.should_compile): sampling one
        # action per sub-env, and one minibatch's loss (the update's forward goes through
        # DDP in a distributed run, so that gradients are averaged; the rollout's does not).
        on = should_compile(run.compile, self.device, cfg.minibatch_size)
        mode = compile_mode(run.compile_mode, self.device)
        self.sample = Compiled(self._sample, on, "policy sampling", mode)
        self.loss = Compiled(
            functools.partial(self._loss, self.collective.data_parallel(self.policy)),
            on,
            "loss",
            mode,
        )
        self.update_index = 0
        self.env_steps = 0
        self.train_s = 0.0
        # what the last train() ended on, when it ended before its budget
        self.stop_signal: str | None = None
        self.stop_reason: str | None = None
        # entries of a resumed checkpoint that the run wrote beside the trainer's (best.pt's
        # score), kept for the run to take back
        self.checkpoint_extras: dict[str, Any] = {}
        if run.resume:
            self.load(run.resume)

    def _make_rollout(self) -> None:
        cfg, env = self.config, self.env
        obs_dtype = storage_dtype(env.observation_space, cfg.obs_storage)
        self.rollout = make_rollout(
            cfg, env, self.policy.head, obs_dtype, self.group_seeds, self.generator
        )
        if isinstance(self.rollout, EpisodeRollout):
            self.max_horizon = self.horizon = self.rollout.buffer.rows
        else:
            self.horizon = cfg.steps_per_update

    @property
    def buffer(self) -> RolloutBuffer:
        return self.rollout.buffer

    # -- the algorithm -------------------------------------------------------------------------

    def update(self) -> dict[str, float]:
        """One GRPO update: play, compare each step with its group, optimise. Returns the
        update's metrics (one device-to-host copy)."""
        return self.agreed_update().metrics

    def agreed_update(self, should_stop: Callable[[], bool] = lambda: False) -> UpdateResult:
        """`update()` with the stop agreement of a distributed run: `should_stop()`, asked as
        the metrics are reduced, says whether this rank was signalled; the result says whether
        any rank was, so that all stop after the same update."""
        start = _Clock(self.device)
        rollout = self.collect()
        return self.learn(rollout, start, should_stop)

    def collect(self) -> Rollout:
        """Play: every sub-env takes `rollout_steps` steps (or plays one episode)."""
        seed = self.collective.sampling_seed(self.config.run.seed, self.update_index)
        if seed is not None:  # a distributed resume replays every rank's stream exactly
            self.generator.manual_seed(seed)
        self.policy.eval()
        if isinstance(self.rollout, EpisodeRollout):
            seeds = self.group_seeds(self.update_index, self.config.num_groups)
            return self.rollout.collect(self.sample, self.generator, seeds, self.horizon)
        return self.rollout.collect(self.sample, self.generator)

    def learn(
        self,
        rollout: Rollout,
        start: _Clock | None = None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> UpdateResult:
        """Compare each step with its group, optimise the clipped surrogate, report."""
        cfg = self.config
        rolled = _Clock(self.device)
        lr = self._follow_schedules()

        # Compare: each step's return-to-go against its group's at the same step.
        adv = self._advantages(rollout)

        # Optimise: per trust region (the whole batch, unless it holds more than
        # `anchor_samples`), epochs of shuffled minibatches of `minibatch_size` samples. Rows
        # that waited for their look-ahead were played by an earlier policy: they are
        # re-scored, so that the clipped ratio measures this update's step, as for fresh rows.
        self.policy.train()
        obs, actions = rollout.obs.flatten(0, 1), rollout.actions.flatten(0, 1)
        # The per-sample numbers as one (samples, 4) table: one gather per minibatch for all.
        valid = rollout.valid[: rollout.obs.shape[0]].to(adv.weights.dtype)
        numbers = torch.stack(
            (self._behaviour_logp(rollout), adv.advantages, adv.weights, valid), dim=-1
        ).flatten(0, 1)
        totals = torch.zeros(len(LossTerms._fields) + 2, device=self.device)
        steps = 0
        for region in self._trust_regions(obs.shape[0]):
            if region is not None:  # re-anchor: the ratio starts at 1 for the current policy
                obs_r, actions_r = obs.index_select(0, region), actions.index_select(0, region)
                numbers_r = numbers.index_select(0, region)
                numbers_r[:, 0] = self._log_prob(obs_r, actions_r)
            else:
                obs_r, actions_r, numbers_r = obs, actions, numbers
            samples = obs_r.shape[0]
            minibatches = max(1, -(-samples // cfg.minibatch_size))
            # Every sample weighs the same whatever minibatch it falls in; DDP averages
            # gradients over ranks, so the step is that of one process on the whole region.
            # Every valid sample counts in the normaliser, those of group steps without
            # spread too: as the policy converges and fewer groups disagree, steps shrink,
            # instead of a few disagreeing groups steering the whole update.
            normaliser = self.collective.sum(numbers_r[:, 3].sum()).clamp_min(1.0) / (
                minibatches * self.collective.world_size
            )
            for _ in range(cfg.epochs):
                order = torch.randperm(samples, generator=self.generator, device=self.device)
                for minibatch in order.tensor_split(minibatches):
                    self.optimizer.zero_grad(set_to_none=True)
                    terms = torch.zeros(len(LossTerms._fields), device=self.device)
                    for idx in minibatch.tensor_split(cfg.micro_batches):
                        # index_select, not x[idx]: the same rows, 3x faster on the CPU
                        old_logp, advantages, weights, _ = numbers_r.index_select(0, idx).unbind(1)
                        out = self.loss(
                            obs_r.index_select(0, idx),
                            actions_r.index_select(0, idx),
                            old_logp,
                            advantages,
                            weights,
                            normaliser,
                        )
                        self._backward(out.loss)
                        terms += torch.stack([t.detach().float() for t in out])
                    grad_norm, finite = self._apply_gradients(terms[0])
                    totals += torch.cat((terms, grad_norm[None], (~finite).float()[None]))
                    steps += 1
        done = _Clock(self.device)

        # Report: metrics of the whole batch, in one host copy.
        means = totals[:-1] / steps
        losses = dict(zip([*LossTerms._fields, "grad_norm"], means, strict=True))
        losses["skipped_steps"] = totals[-1]  # a count, not a mean
        result = self._report(rollout, adv, losses, should_stop())
        self._count(result.metrics, lr, rolled - (start or rolled), done - rolled)
        return result

    def _behaviour_logp(self, rollout: Rollout) -> torch.Tensor:
        """Stored log-probs, with the rows an earlier policy played re-scored by this one."""
        stale = rollout.stale
        if not stale:
            return rollout.logp
        rescored = self._log_prob(
            rollout.obs[:stale].flatten(0, 1), rollout.actions[:stale].flatten(0, 1)
        )
        return torch.cat((rescored.view(stale, -1), rollout.logp[stale:]))

    @torch.no_grad()
    def _log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The current policy's float32 log-probs of `actions`: the anchor of a clipped ratio."""
        with autocast(self.amp, self.device):
            logp, _ = self.policy.log_prob_entropy(obs, actions)
        return logp.float()

    def _trust_regions(self, samples: int) -> list[torch.Tensor | None]:
        """The batch's samples split at random into parts of about `anchor_samples`, each
        optimised from an anchor of its own; `[None]`: the whole batch, from one anchor.

        PPO's clip bounds how far one anchor lets the policy move, so a batch many times
        the default's would otherwise buy no more progress per update than the default:
        re-anchoring every `anchor_samples` keeps the policy's progress per sample the same
        at any batch size.
        """
        size = self.config.anchor_samples
        parts = 1 if size is None else -(-samples // size)
        if parts == 1:
            return [None]
        order = torch.randperm(samples, generator=self.generator, device=self.device)
        return list(order.tensor_split(parts))

    def _count(
        self, metrics: dict[str, float], lr: float, rollout_s: float, update_s: float
    ) -> None:
        """Advance the counters and add the host's figures to the metrics."""
        cfg = self.config
        self.update_index += 1
        played = self.horizon if cfg.rollout == "episodes" else cfg.steps_per_update
        self.env_steps += played * cfg.num_envs * self.collective.world_size
        self.train_s += rollout_s + update_s
        if cfg.rollout == "episodes":
            metrics["horizon"] = self.horizon
            self.horizon = self._next_horizon(metrics)
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

    def _follow_schedules(self) -> float:
        """Set this update's learning rate; refresh the KL reference when due."""
        cfg = self.config
        refresh = cfg.ref_update_every and self.update_index % cfg.ref_update_every == 0
        if self.reference is not None and refresh:
            self.reference.load_state_dict(self.policy.state_dict())
        lr = cfg.lr * lr_factor(
            self.env_steps / cfg.total_env_steps, cfg.lr_schedule, cfg.warmup_fraction
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _advantages(self, rollout: Rollout) -> Advantages:
        cfg = self.config
        ready = rollout.obs.shape[0]
        trained = rollout.valid[:ready]
        if cfg.advantage == "outcome":
            returns = episode_returns(rollout.rewards, rollout.valid).expand_as(trained)
            compare = torch.ones_like(trained)
        else:
            window = cfg.window if cfg.rollout == "windowed" else rollout.rewards.shape[0]
            returns = windowed_returns(
                rollout.rewards, rollout.cut, rows=ready, window=window, gamma=cfg.gamma
            )
            compare = trained
        return group_relative(
            returns,
            compare,
            trained,
            cfg.group_size,
            scale=cfg.scale,
            zero_std_eps=cfg.zero_std_eps,
            sum_over_ranks=self.collective.sum,
        )

    def _backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def _apply_gradients(self, loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Clip and apply gradients; a non-finite loss or gradient skips the step.

        Either way the skip is decided on the device, with no host sync: the fused optimizer
        takes a `found_inf` input (the mechanism GradScaler uses); foreach AdamW has none, so
        its step is taken and then undone where the loss or a gradient was not finite.
        """
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        params = [p for p in self.policy.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
        finite = self.collective.finite(grad_norm, loss)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif self.fused:
            self.optimizer.found_inf = (~finite).float()  # type: ignore[attr-defined]
            self.optimizer.step()
            del self.optimizer.found_inf  # type: ignore[attr-defined]
        else:
            self._step_where(finite)
        return torch.nan_to_num(grad_norm, nan=0.0, posinf=0.0), finite

    @torch.no_grad()
    def _step_where(self, finite: torch.Tensor) -> None:
        """An optimizer step kept only where `finite`: parameters, Adam's moments and its step
        count (which foreach AdamW keeps on the device where it can: accel.make_optimizer)."""

        def tensors() -> list[torch.Tensor]:
            out = []
            for p in self.policy.parameters():
                state = self.optimizer.state.get(p, {})
                out += [p, *(t for t in state.values() if t.device == finite.device)]
            return out

        before = {id(t): t.clone() for t in tensors()}
        self.optimizer.step()
        for t in tensors():  # state made by this first step falls back to its zero start
            old = before.get(id(t))
            t.copy_(torch.where(finite, t, torch.zeros_like(t) if old is None else old))

    def _sample(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with autocast(self.amp, self.device):
            return self.policy.sample(obs, noise)

    def _loss(
        self,
        log_prob_entropy: Any,
        obs: torch.Tensor,
        actions: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        weights: torch.Tensor,
        normaliser: torch.Tensor,
    ) -> LossTerms:
        cfg = self.config
        with autocast(self.amp, self.device):
            logp, entropy = log_prob_entropy(obs, actions)
            ref_logp = None
            if self.reference is not None:
                with torch.no_grad():
                    ref_logp, _ = self.reference.log_prob_entropy(obs, actions)
        return grpo_loss(
            logp,
            old_logp,
            advantages,
            weights,
            entropy,
            ref_logp,
            normaliser=normaliser,
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            kl_coef=cfg.kl_coef,
            entropy_coef=cfg.entropy_coef,
        )

    def _report(
        self,
        rollout: Rollout,
        adv: Advantages,
        losses: dict[str, torch.Tensor],
        stop_requested: bool,
    ) -> UpdateResult:
        """The update's metrics over all ranks, copied to the host once.

        Episode figures are reduced as sums and only then turned into means, so they are
        those of the whole batch; an update in which no episode ended reports none.
        """
        episodes = dict(rollout.episodes)
        for name in self.collective.agree_names(list(episodes)):  # fields some rank lacks
            episodes.setdefault(name, torch.zeros((), dtype=torch.float64, device=self.device))
        counts = {
            "valid_steps": rollout.valid[: rollout.obs.shape[0]].sum(),
            "zero_spread": adv.zero_spread.sum(),
            "compared": adv.compared.sum(),
        }
        stop = torch.full((), float(stop_requested), device=self.device)
        raw = {**episodes, **counts, "length_max": rollout.length_max, **losses, "stop": stop}
        reduced = self.collective.reduce(raw, {name: cross_rank(name) for name in raw})
        metrics = {
            **summarise(reduced, self.env.episode_ratios),
            **{name: reduced[name] for name in ("episodes", "return_min", "return_max")},
            "valid_steps": reduced["valid_steps"],
            "frac_zero_std_groups": reduced["zero_spread"] / reduced["compared"],
            "length_max": reduced["length_max"],
            "compared": reduced["compared"],
            **{name: reduced[name] for name in losses},
            "stop": reduced["stop"],
        }
        host = to_host(metrics)  # the update's one device-to-host copy
        stop_agreed = bool(host.pop("stop"))
        if not host["episodes"]:  # a mean over no episode is undefined: leave it out
            for name in per_episode_metrics(host, self.env.episode_ratios):
                del host[name]
        if not host.pop("compared"):  # no group step to compare (the first rows of a run)
            del host["frac_zero_std_groups"]
        return UpdateResult(host, stop_agreed)

    def group_seeds(self, point: int, num_groups: int) -> list[int]:
        """The seeds groups start from at start point `point` (episodes mode: the update;
        windowed: the n-th group start), one per group: distinct for every point and rank."""
        first = (point * self.collective.world_size + self.collective.rank) * num_groups
        return [self.config.run.seed * SEED_STRIDE + first + g for g in range(num_groups)]

    def _next_horizon(self, metrics: dict[str, float]) -> int:
        """Episodes mode: shorten the rollout when every episode ended early; grow it when
        some were cut."""
        finished = metrics.get("episodes", 0.0) / (
            self.config.num_envs * self.collective.world_size
        )
        if finished < 1.0:
            return min(self.max_horizon, self.horizon * 2)
        scale, slack = HORIZON_SLACK
        longest = int(metrics.get("length_max", self.horizon))
        rounded = -(-int(longest * scale + slack) // MIN_HORIZON) * MIN_HORIZON
        return min(self.max_horizon, max(MIN_HORIZON, rounded))

    # -- the run -------------------------------------------------------------------------------

    def train(
        self,
        callbacks: Sequence[Any] = (),
        eval_envs: gym.vector.VectorEnv | None = None,
    ) -> dict[str, float]:
        """Train until `total_env_steps`; returns the last update's metrics.

        The run around the updates (`harness.Harness`: checkpoints, evaluation, signals,
        logging) lives in the layer above this module, imported here only when called.
        `callbacks` hook into the run (`grpo_trainer.run.callbacks`). Evaluation during training
        plays on `eval_envs`, by default envs made from `config.run.env` like the training
        env. SIGINT/SIGTERM finish the current update, write a checkpoint and return (then
        `stop_signal` names the signal; `stop_reason` says why a run ended early otherwise).
        With `config.run.wandb`, rank 0 also logs to Weights & Biases (`wandb_log.py`); a
        missing wandb package raises `ImportError` before anything runs, on every rank.
        """
        from grpo_trainer.run.harness import Harness

        outcome = Harness(self, callbacks, eval_envs).run()
        self.stop_signal, self.stop_reason = outcome.stop_signal, outcome.stop_reason
        return outcome.metrics

    # -- persistence ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: weights, optimiser, RNG, counters, config,
        and a windowed rollout's episodes in play."""
        # Each rank plays its own episodes: the checkpoint holds every rank's (rank 0 writes it).
        rollout_state = self.collective.gather(
            self.rollout.state_dict() if isinstance(self.rollout, WindowedRollout) else {}
        )
        return {
            "format_version": checkpoint.FORMAT_VERSION,
            "config": json.loads(json.dumps(self.config.to_dict())),
            "spaces": self._space_signature(),
            "policy": self.policy.state_dict(),
            "reference": self.reference.state_dict() if self.reference else None,
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "generator": self.generator.get_state(),
            "update_index": self.update_index,
            "env_steps": self.env_steps,
            "train_s": self.train_s,
            "horizon": self.horizon,
            "rollouts": rollout_state,
        }

    def load(self, path: str | Path) -> Path:
        """Continue from a checkpoint file or run directory (newest usable checkpoint)."""
        payload, found = checkpoint.load_for_resume(path)
        checkpoint.check_compatible(payload, found, self._space_signature(), self.config.to_dict())
        # The optimiser's implementation is this run's choice, not the checkpoint's: a fused
        # step with `found_inf` on a foreach optimiser would fail an assertion in torch.
        implementation = [
            {k: g[k] for k in ("fused", "foreach") if k in g} for g in self.optimizer.param_groups
        ]
        try:
            copy.deepcopy(self.policy).load_state_dict(payload["policy"])  # nothing half-loaded
            self.policy.load_state_dict(payload["policy"])
            if self.reference is not None:  # a run that had no reference starts it from here
                self.reference.load_state_dict(payload["reference"] or payload["policy"])
            self.optimizer.load_state_dict(payload["optimizer"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise checkpoint.CheckpointError(
                f"checkpoint {found} does not fit this network (hidden_sizes, activation or "
                f"action head differ): {err}"
            ) from None
        for group, kept in zip(self.optimizer.param_groups, implementation, strict=True):
            group.update(kept)
        if self.scaler and payload["scaler"]:
            self.scaler.load_state_dict(payload["scaler"])
        self.generator.set_state(payload["generator"])
        self.update_index = int(payload["update_index"])
        self.env_steps = int(payload["env_steps"])
        self.train_s = float(payload.get("train_s", 0.0))
        self.checkpoint_extras = {k: v for k, v in payload.items() if k not in STATE_KEYS}
        if isinstance(self.rollout, EpisodeRollout):
            self.horizon = min(int(payload["horizon"]), self.max_horizon)
        else:
            self._load_rollout(payload, found)
        log.info(
            "resumed from %s at update %d (%d env steps)", found, self.update_index, self.env_steps
        )
        return found

    def _load_rollout(self, payload: dict[str, Any], found: Path) -> None:
        """The episodes in play continue where they were, when the checkpoint has this rank's
        (same rollout settings and world size); otherwise every sub-env starts a new one."""
        states = payload.get("rollouts") or []
        saved = payload["config"]
        same = all(
            saved.get(k) == getattr(self.config, k)
            for k in ("rollout", "rollout_steps", "window", "num_groups", "group_size")
        )
        if same and len(states) == self.collective.world_size:
            self.rollout.load_state_dict(states[self.collective.rank])
            return
        warnings.warn(
            f"checkpoint {found} was written with other rollout settings or another number of "
            "ranks: every sub-env starts a new episode (not an exact continuation)",
            RuntimeWarning,
            stacklevel=3,
        )

    def _space_signature(self) -> dict[str, str]:
        return {
            "observation_space": str(self.env.observation_space),
            "action_space": str(self.env.action_space),
        }


def per_episode_metrics(metrics: dict[str, float], ratios: dict[str, Any]) -> list[str]:
    """The metrics that are means or extremes over the update's ended episodes."""
    fixed = ("return_mean", "return_std", "return_min", "return_max", "length_mean")
    return [n for n in metrics if n in fixed or n.startswith("episode_") or n in ratios]


class _Clock:
    """Marks in time; on CUDA, events that are read after the update's host copy, so timing
    adds no sync of its own."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.mark: Any = torch.cuda.Event(enable_timing=True)
            self.mark.record()
        else:
            self.mark = time.perf_counter()

    def __sub__(self, earlier: _Clock) -> float:
        if self.cuda:
            return earlier.mark.elapsed_time(self.mark) / 1000.0
        return self.mark - earlier.mark
