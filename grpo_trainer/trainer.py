"""`GRPOTrainer`: rollout groups, compute group-relative advantages, optimise, repeat.

Read `update()` top to bottom for the algorithm; everything else is bookkeeping: metrics
(one host copy per update), checkpoints, and a clean stop on SIGINT/SIGTERM.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from grpo_trainer import checkpoint, distributed
from grpo_trainer.accel import (
    Compiled,
    autocast,
    check_amp,
    make_optimizer,
    resolve_device,
    should_compile,
)
from grpo_trainer.config import GRPOConfig
from grpo_trainer.env_io import EnvIO
from grpo_trainer.metrics import MetricsWriter, memory_stats, to_host
from grpo_trainer.objective import LossTerms, group_advantages, grpo_loss
from grpo_trainer.policy import Policy
from grpo_trainer.progress import ProgressDisplay
from grpo_trainer.rollout import RolloutBuffer, collect

log = logging.getLogger(__name__)


class TrainingStopped(RuntimeError):
    """Training could not go on (e.g. too many non-finite updates in a row)."""


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
    bounded = low is not None and bool((abs(low) <= 65504).all() and (abs(high) <= 65504).all())
    return torch.float16 if bounded else torch.float32


def lr_factor(progress: float, schedule: str, warmup: float) -> float:
    """Learning-rate multiplier at `progress` in [0, 1] of the env-step budget."""
    if warmup > 0 and progress < warmup:
        return max(progress / warmup, 1e-3)
    rest = min(max((progress - warmup) / max(1.0 - warmup, 1e-8), 0.0), 1.0)
    if schedule == "linear":
        return max(1.0 - rest, 0.02)
    if schedule == "cosine":
        return max(0.5 * (1.0 + math.cos(math.pi * rest)), 0.02)
    return 1.0


class GRPOTrainer:
    """GRPO on any Gymnasium vector env with `num_groups * group_size` sub-envs."""

    def __init__(self, envs: gym.vector.VectorEnv, config: GRPOConfig | None = None) -> None:
        self.config = cfg = config or GRPOConfig()
        run = cfg.run
        self.device = distributed.rank_device(resolve_device(run.device))
        check_amp(run.amp, self.device)
        self.env = EnvIO(envs, self.device)
        if self.env.num_envs != cfg.num_envs:
            raise ValueError(
                f"the env has {self.env.num_envs} sub-envs but num_groups x group_size = "
                f"{cfg.num_groups} x {cfg.group_size} = {cfg.num_envs}"
            )
        self.max_horizon = cfg.max_episode_steps or self.env.max_episode_steps()
        if self.max_horizon is None:
            raise ValueError(
                "max_episode_steps is not set and the env's spec has no limit; set it in the config"
            )
        self.rank, self.world_size = distributed.rank_and_world()

        torch.manual_seed(run.seed)
        self.policy = Policy(
            self.env.observation_space, self.env.action_space, cfg.hidden_sizes, cfg.activation
        ).to(self.device)
        self.reference = (
            copy.deepcopy(self.policy).requires_grad_(False) if cfg.kl_coef > 0 else None
        )
        self.optimizer, self.fused = make_optimizer(
            self.policy.parameters(), cfg.lr, cfg.weight_decay, run.fused_optimizer
        )
        self.scaler = torch.amp.GradScaler("cuda") if run.amp == "fp16" else None
        # The update's forward goes through DDP (gradients averaged); the rollout does not.
        self._log_prob_entropy = (
            distributed.data_parallel(self.policy)
            if self.world_size > 1
            else self.policy.log_prob_entropy
        )
        compile_on = should_compile(run.compile, self.device)
        self._sample = Compiled(self._sample_eager, compile_on, "policy sampling")
        self._loss = Compiled(self._loss_eager, compile_on, "loss")

        obs_shape = tuple(self.env.observation_space.shape or ())
        self.buffer = RolloutBuffer(
            self.max_horizon,
            cfg.num_envs,
            obs_shape,
            storage_dtype(self.env.observation_space, cfg.obs_storage),
            self.policy.head,
            self.device,
        )
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(run.seed)
        self.update_index = 0
        self.env_steps = 0
        self.horizon = self.max_horizon
        self.best_return = -math.inf
        self.run_dir = Path(run.run_dir) if run.run_dir else None
        self._stop_signal: str | None = None
        self._checkpoint_due = False  # a periodic checkpoint waits for a clean update
        self._last_checkpoint: Path | None = None
        self._pending_signal: str | None = None  # distributed: acted on once all ranks agree
        if run.resume:
            self.load(run.resume)

    # -- the algorithm -------------------------------------------------------------------------

    def update(self) -> dict[str, float]:
        """One GRPO iteration: a rollout of every group, then epochs x minibatches of steps."""
        cfg, horizon = self.config, self.horizon
        if (
            cfg.kl_coef > 0
            and cfg.ref_update_every
            and self.update_index % cfg.ref_update_every == 0
        ):
            self.reference.load_state_dict(self.policy.state_dict())  # type: ignore[union-attr]
        progress = self.env_steps / cfg.total_env_steps
        lr = cfg.lr * lr_factor(progress, cfg.lr_schedule, cfg.warmup_fraction)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

        if self.world_size > 1:  # a resume on the same world size replays it exactly
            self.generator.manual_seed(
                distributed.rank_seed(cfg.run.seed, self.update_index, self.rank)
            )
        clock = _Clock(self.device)
        obs = self.env.reset_groups(self._group_seeds(), cfg.group_size)
        self.policy.eval()
        stats = collect(
            self.env, obs, self._sample, self.policy.head, self.buffer, horizon, self.generator
        )
        clock.lap("rollout")
        valid = self.buffer.valid(horizon)
        global_std = self.world_size > 1 and cfg.scale == "batch_std"  # over all ranks
        adv = group_advantages(
            self.buffer.rewards[:horizon],
            valid,
            cfg.group_size,
            mode=cfg.advantage,
            scale="none" if global_std else cfg.scale,
            gamma=cfg.gamma,
            zero_std_eps=cfg.zero_std_eps,
        )
        if global_std:
            scaled = distributed.scale_by_global_std(adv.advantages, adv.weights)
            adv = adv._replace(advantages=scaled)
        self.policy.train()
        losses = self._optimise(horizon, adv.advantages, adv.weights)
        clock.lap("update")

        lengths = self.buffer.lengths
        grouped = adv.returns.unflatten(0, (-1, cfg.group_size))
        device_metrics: dict[str, Any] = {
            "valid_steps": lengths.sum(),
            "return_mean": adv.returns.mean(),
            "return_std": adv.returns.std(correction=0),
            "return_min": adv.returns.min(),
            "return_max": adv.returns.max(),
            "group_return_std": grouped.std(-1, correction=0).mean(),
            "frac_zero_std_groups": adv.zero_std_groups.float().mean(),
            "length_mean": lengths.float().mean(),
            "length_max": lengths.max(),
            "frac_finished": stats.finished.float().mean(),
            **losses,
        }
        for name, total in stats.info_sums.items():
            count = stats.info_counts[name]
            device_metrics[f"episode_{name}"] = total / count.clamp_min(1)
            device_metrics[distributed.EPISODE_COUNT + name] = count  # rides the same copy
        if self.world_size > 1:  # figures of the whole batch, the same on every rank
            device_metrics = distributed.reduce_metrics(
                device_metrics,
                {f"episode_{name}": count for name, count in stats.info_counts.items()},
                stop=self._pending_signal is not None,
            )
        m = to_host(device_metrics)  # the update's one device-to-host copy
        for key in [k for k in m if k.startswith(distributed.EPISODE_COUNT)]:
            if not m.pop(key):  # a mean over no episode is undefined: leave it out
                m.pop("episode_" + key.removeprefix(distributed.EPISODE_COUNT), None)
        if m.pop(distributed.STOP, 0.0):  # some rank was signalled: every rank stops here
            self._stop_signal = self._pending_signal or "a signal to another rank"
        durations = clock.durations()

        self.update_index += 1
        self.env_steps += int(m["valid_steps"])
        self.horizon = self._next_horizon(int(m["length_max"]), m["frac_finished"])
        m.update(
            update=self.update_index,
            env_steps=self.env_steps,
            simulated_steps=horizon * cfg.num_envs * self.world_size,
            horizon=horizon,
            lr=lr,
            rollout_s=durations["rollout"],
            update_s=durations["update"],
            steps_per_s=m["valid_steps"] / max(sum(durations.values()), 1e-9),
            **memory_stats(self.device),
        )
        return m

    def _optimise(
        self, horizon: int, advantages: torch.Tensor, weights: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Epochs of shuffled minibatches over every stored step; metrics stay on the device."""
        cfg = self.config
        obs = self.buffer.obs[:horizon].flatten(0, 1)
        actions = self.buffer.actions[:horizon].flatten(0, 1)
        old_logp = self.buffer.logp[:horizon].flatten()
        advantages, weights = advantages.flatten(), weights.flatten()
        # DDP averages gradients over ranks, so each rank divides by the global count over
        # world_size: the step is that of one process on the concatenated batch.
        valid = distributed.sum_over_ranks(weights.sum()) if self.world_size > 1 else weights.sum()
        normaliser = valid.clamp_min(1.0) / (cfg.minibatches * self.world_size)
        totals = torch.zeros(len(LossTerms._fields) + 2, device=self.device)
        steps = cfg.epochs * cfg.minibatches
        for _ in range(cfg.epochs):
            order = torch.randperm(obs.shape[0], generator=self.generator, device=self.device)
            for minibatch in order.tensor_split(cfg.minibatches):
                self.optimizer.zero_grad(set_to_none=True)
                terms = torch.zeros(len(LossTerms._fields), device=self.device)
                for idx in minibatch.tensor_split(cfg.micro_batches):
                    # index_select, not x[idx]: the same rows, 3x faster on the CPU
                    out = self._loss(
                        obs.index_select(0, idx),
                        actions.index_select(0, idx),
                        old_logp.index_select(0, idx),
                        advantages.index_select(0, idx),
                        weights.index_select(0, idx),
                        normaliser,
                    )
                    self._backward(out.loss)
                    terms += torch.stack([t.detach().float() for t in out])
                grad_norm, finite = self._step(terms[0])
                totals += torch.cat((terms, grad_norm[None], (~finite).float()[None]))
        names = [*LossTerms._fields, "grad_norm", "skipped_steps"]
        means = totals / steps
        means[-1] = totals[-1]  # skipped steps: a count, not a mean
        return dict(zip(names, means.unbind(), strict=True))

    def _backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def _step(self, loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Clip and apply gradients; a non-finite loss or gradient skips the step.

        With the fused optimizer the skip happens on the device (its `found_inf` input, the
        mechanism GradScaler uses); otherwise deciding costs one host sync.
        """
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        params = [p for p in self.policy.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
        finite = torch.isfinite(grad_norm)
        if self.world_size == 1:  # across ranks only the all-reduced gradient is a shared verdict
            finite = finite & torch.isfinite(loss)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif self.fused:
            self.optimizer.found_inf = (~finite).float()  # type: ignore[attr-defined]
            self.optimizer.step()
            del self.optimizer.found_inf  # type: ignore[attr-defined]
        elif bool(finite):
            self.optimizer.step()
        return torch.nan_to_num(grad_norm, nan=0.0, posinf=0.0), finite

    def _sample_eager(
        self, obs: torch.Tensor, noise: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with autocast(self.config.run.amp, self.device):
            return self.policy.sample(obs, noise)

    def _loss_eager(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        weights: torch.Tensor,
        normaliser: torch.Tensor,
    ) -> LossTerms:
        cfg = self.config
        with autocast(cfg.run.amp, self.device):
            logp, entropy = self._log_prob_entropy(obs, actions)
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

    def _group_seeds(self) -> list[int]:
        """Distinct per update and per rank, identical within a group."""
        n = self.config.num_groups
        first = (self.update_index * self.world_size + self.rank) * n
        return [self.config.run.seed * 1_000_000_007 + first + g for g in range(n)]

    def _next_horizon(self, longest: int, frac_finished: float) -> int:
        """Shorten the rollout when every episode ended early; grow it when some were cut."""
        if frac_finished < 1.0:
            return min(self.max_horizon, self.horizon * 2)
        return min(self.max_horizon, max(16, -(-int(longest * 1.25 + 8) // 16) * 16))

    # -- the run -------------------------------------------------------------------------------

    def train(self) -> dict[str, float]:
        """Train until `total_env_steps`; returns the last update's metrics.

        SIGINT/SIGTERM finish the current update, write a checkpoint and return.
        """
        cfg, run = self.config, self.config.run
        is_main = self.rank == 0
        if self.run_dir and is_main:
            self._prepare_run_dir()
        writer = MetricsWriter(self.run_dir if is_main else None, run.tensorboard and is_main)
        display = ProgressDisplay(cfg.total_env_steps, enabled=run.progress and is_main)
        metrics: dict[str, float] = {}
        first_update_s: float | None = None
        consecutive_skips = 0
        try:
            with self._signals(), display:
                display.advance(self.env_steps, {})
                while self.env_steps < cfg.total_env_steps and self._stop_signal is None:
                    metrics = self.update()
                    if first_update_s is None:
                        first_update_s = metrics["rollout_s"] + metrics["update_s"]
                    metrics["warmup_s"] = first_update_s
                    writer.write(metrics)
                    display.advance(self.env_steps, metrics)
                    clean = not metrics["skipped_steps"]
                    consecutive_skips = 0 if clean else consecutive_skips + 1
                    if not clean:
                        log.warning(
                            "update %d: %d optimiser step(s) skipped for a non-finite loss or "
                            "gradient (%d update(s) in a row; training stops at %d)",
                            self.update_index,
                            int(metrics["skipped_steps"]),
                            consecutive_skips,
                            run.max_consecutive_skips,
                        )
                    if consecutive_skips >= run.max_consecutive_skips:
                        raise TrainingStopped(
                            f"{consecutive_skips} updates in a row had a non-finite loss or "
                            f"gradient; stopping. Last good checkpoint: {self._last_checkpoint}"
                        )
                    self._after_update(metrics, clean)
            if self._stop_signal is None or self.update_index > 0:
                self._checkpoint(metrics)
        finally:
            writer.close()
        if self._stop_signal and is_main:
            log.warning("stopped by %s after update %d; %s", *self._resume_hint())
        if is_main:
            display.summary(metrics)
            if self.run_dir:
                _learning_curve(self.run_dir)
        return metrics

    @property
    def stop_signal(self) -> str | None:
        """The signal that ended the last `train()` early (after its final checkpoint), or None."""
        return self._stop_signal

    def _resume_hint(self) -> tuple[str, int, str]:
        """What stopped the run, where, and the command that continues it."""
        if not self.run_dir:
            hint = "nothing was saved (no run_dir)"
        else:
            hint = (
                f"saved {self._last_checkpoint}; resume with: python -m grpo_trainer train "
                f"--config {self.run_dir / 'config.json'} --resume {self.run_dir}"
            )
        return str(self._stop_signal), self.update_index, hint

    def _after_update(self, metrics: dict[str, float], clean: bool = True) -> None:
        """Periodic checkpoints are written only after a clean update (no skipped step): one
        due during a run of skipped updates waits, so the newest checkpoint is always good."""
        if metrics["return_mean"] > self.best_return:  # first, so checkpoints below record it
            self.best_return = metrics["return_mean"]
            if self.run_dir and self.rank == 0:
                checkpoint.atomic_save(self.state_dict(), self.run_dir / "checkpoints" / "best.pt")
        every = self.config.run.checkpoint_every
        if every and self.update_index % every == 0:
            self._checkpoint_due = True
        if self._checkpoint_due and clean:
            self._checkpoint(metrics)

    def _checkpoint(self, metrics: dict[str, float]) -> None:
        self._checkpoint_due = False
        if self.run_dir and self.rank == 0:
            self._last_checkpoint = checkpoint.save_rotating(
                self.state_dict(),
                self.run_dir / "checkpoints",
                self.update_index,
                self.config.run.keep_checkpoints,
            )

    def _prepare_run_dir(self) -> None:
        assert self.run_dir is not None
        try:
            checkpoint.prepare_folder(self.run_dir / "checkpoints")
            config_path = self.run_dir / "config.json"
            checkpoint_tmp = config_path.with_suffix(".json.tmp")
            checkpoint_tmp.write_text(json.dumps(self.config.to_dict(), indent=2))
            checkpoint_tmp.replace(config_path)
        except OSError as err:
            raise OSError(f"run directory {self.run_dir} is not writable: {err}") from err

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """Turn SIGINT/SIGTERM into a request to stop after the current update."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def request_stop(signum: int, _frame: Any) -> None:
            name = signal.Signals(signum).name
            if self._stop_signal or self._pending_signal:  # asked twice: the user means now
                raise KeyboardInterrupt(f"second {name}: aborted without a final checkpoint")
            log.warning(
                "%s: stopping after the current update with a checkpoint (again: abort now)", name
            )
            if self.world_size > 1:  # ranks must agree on the last update: see update()
                self._pending_signal = signal.Signals(signum).name
            else:
                self._stop_signal = signal.Signals(signum).name

        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    # -- persistence ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: weights, optimiser, RNG, counters, config."""
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
            "horizon": self.horizon,
            "best_return": self.best_return,
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
        self.horizon = min(int(payload["horizon"]), self.max_horizon)
        self.best_return = float(payload["best_return"])
        log.info(
            "resumed from %s at update %d (%d env steps)", found, self.update_index, self.env_steps
        )
        return found

    def _space_signature(self) -> dict[str, str]:
        return {
            "observation_space": str(self.env.observation_space),
            "action_space": str(self.env.action_space),
        }


class _Clock:
    """Wall time of consecutive phases; on CUDA, events avoid syncing between phases."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, Any]] = [("start", self._now())]

    def _now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def lap(self, name: str) -> None:
        self.marks.append((name, self._now()))

    def durations(self) -> dict[str, float]:
        out = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:], strict=False):
            out[name] = a.elapsed_time(b) / 1000.0 if self.cuda else b - a
        return out


def _learning_curve(run_dir: Path) -> None:
    """`learning_curve.png` from metrics.jsonl, when matplotlib is installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line torn by a kill -9
            rows.append(json.loads(line))
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["env_steps"] for r in rows], [r["return_mean"] for r in rows])
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean episode return")
    fig.tight_layout()
    fig.savefig(run_dir / "learning_curve.png", dpi=100)
    plt.close(fig)
