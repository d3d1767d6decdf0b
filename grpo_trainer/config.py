"""Configuration: what the algorithm does (`GRPOConfig`) and how a run executes (`RunConfig`).

Both are plain dataclasses, validated on construction (a bad value raises `ValueError`
naming the field), printable, and saved as JSON with every checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Literal, get_args

AdvantageMode = Literal["per_step", "outcome"]
ScaleMode = Literal["group_std", "batch_std", "none"]
Schedule = Literal["constant", "linear", "cosine"]
Activation = Literal["tanh", "relu"]
AmpMode = Literal["off", "bf16", "fp16"]
ObsStorage = Literal["auto", "float32", "float16", "bfloat16"]


@dataclasses.dataclass
class RunConfig:
    """Where and how a run executes; nothing here changes the maths of the algorithm."""

    env: str = "fruit_env:FruitCatcher-v0"  # any Gymnasium id; "module:Id" imports module first
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    device: str = "auto"  # "auto" picks cuda when available, else cpu
    compile: bool | None = None  # None: compile on CUDA only (compile time does not pay on CPU)
    amp: AmpMode = "off"
    fused_optimizer: bool = True  # fused AdamW where the device supports it
    seed: int = 0
    run_dir: str | None = None  # where config, metrics and checkpoints go; None writes nothing
    resume: str | None = None  # a checkpoint file or a run directory to continue from
    checkpoint_every: int = 0  # updates between periodic checkpoints (0: only at the end)
    keep_checkpoints: int = 3
    progress: bool = True  # rich progress bar and summary table
    tensorboard: bool = False
    max_consecutive_skips: int = 5  # non-finite updates in a row before training stops

    def __post_init__(self) -> None:
        _check_choice(self, "amp", AmpMode)
        _check_int(self, "seed", minimum=0)
        if self.seed >= 2**63:
            raise ValueError(f"seed must be below 2**63, got {self.seed}")
        for name in ("fused_optimizer", "progress", "tensorboard"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("run_dir", "resume"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                setattr(self, name, os.fspath(value))
            elif value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be a path or None, got {value!r}")
        _check_int(self, "checkpoint_every", minimum=0)
        _check_int(self, "keep_checkpoints", minimum=1)
        _check_int(self, "max_consecutive_skips", minimum=1)
        if not isinstance(self.env, str) or not self.env:
            raise ValueError(f"env must be a Gymnasium id string, got {self.env!r}")
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs must be a dict, got {self.env_kwargs!r}")
        try:  # checkpoints store the config as JSON
            json.dumps(self.env_kwargs)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"env_kwargs must be JSON data (strings, numbers, ...): {err}"
            ) from None
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(
                f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}"
            )
        if self.compile is not None and not isinstance(self.compile, bool):
            raise ValueError(f"compile must be true, false or null, got {self.compile!r}")


@dataclasses.dataclass
class GRPOConfig:
    """The GRPO algorithm. Defaults train FruitCatcher-v0 to a 0.7+ catch rate on 2 CPU cores."""

    # Batch: num_groups x group_size sub-envs; each member plays one episode per update.
    num_groups: int = 16
    group_size: int = 8
    total_env_steps: int = 4_000_000  # valid (in-episode) steps to train for
    max_episode_steps: int | None = None  # rollout horizon; None: the env's own limit
    # Advantages.
    advantage: AdvantageMode = "per_step"
    scale: ScaleMode = "batch_std"
    gamma: float = 0.97
    zero_std_eps: float = 1e-6  # groups whose return spread is below this are dropped
    # Loss.
    clip_low: float = 0.2
    clip_high: float = 0.28  # DAPO's clip-higher
    epochs: int = 8  # 4 or 6 stalled below 0.70 on some seeds: docs/trainer.md
    minibatches: int = 8
    micro_batches: int = 1  # gradient accumulation inside each minibatch
    kl_coef: float = 0.0
    ref_update_every: int = 0  # refresh the KL reference every K updates (0: never)
    entropy_coef: float = 0.01
    max_grad_norm: float = 1.0
    lr: float = 1e-2
    lr_schedule: Schedule = "linear"
    warmup_fraction: float = 0.0
    weight_decay: float = 0.0
    # Policy network.
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: Activation = "tanh"
    obs_storage: ObsStorage = "auto"
    run: RunConfig = dataclasses.field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        if isinstance(self.run, dict):
            self.run = RunConfig(**self.run)
        if isinstance(self.hidden_sizes, list):
            self.hidden_sizes = tuple(self.hidden_sizes)
        _check_int(self, "num_groups", minimum=1)
        _check_int(self, "group_size", minimum=2)
        _check_int(self, "total_env_steps", minimum=1)
        if self.max_episode_steps is not None:
            _check_int(self, "max_episode_steps", minimum=1)
        for name in ("epochs", "minibatches", "micro_batches"):
            _check_int(self, name, minimum=1)
        _check_int(self, "ref_update_every", minimum=0)
        _check_choice(self, "advantage", AdvantageMode)
        _check_choice(self, "scale", ScaleMode)
        _check_choice(self, "lr_schedule", Schedule)
        _check_choice(self, "activation", Activation)
        _check_choice(self, "obs_storage", ObsStorage)
        _check_float(self, "gamma", 0.0, 1.0)
        _check_float(self, "zero_std_eps", 0.0, math.inf)
        _check_float(self, "clip_low", 0.0, 1.0, low_open=True, high_open=True)
        _check_float(self, "clip_high", 0.0, math.inf, low_open=True)
        _check_float(self, "kl_coef", 0.0, math.inf)
        _check_float(self, "entropy_coef", 0.0, math.inf)
        _check_float(self, "max_grad_norm", 0.0, math.inf, low_open=True)
        _check_float(self, "lr", 0.0, math.inf, low_open=True)
        _check_float(self, "warmup_fraction", 0.0, 1.0, high_open=True)
        _check_float(self, "weight_decay", 0.0, math.inf)
        if not isinstance(self.hidden_sizes, tuple) or not all(
            isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in self.hidden_sizes
        ):
            raise ValueError(f"hidden_sizes must be positive ints, got {self.hidden_sizes!r}")
        if not isinstance(self.run, RunConfig):
            raise ValueError(f"run must be a RunConfig, got {self.run!r}")

    @property
    def num_envs(self) -> int:
        return self.num_groups * self.group_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GRPOConfig:
        """Rebuild from `to_dict()` output; unknown fields raise `ValueError`."""
        data = dict(data)
        run = data.pop("run", {})
        _reject_unknown(cls, data)
        _reject_unknown(RunConfig, run)
        return cls(**data, run=RunConfig(**run))


def _reject_unknown(cls: type, data: dict[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")


def _check_int(obj: object, name: str, *, minimum: int) -> None:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")


def _check_float(
    obj: object,
    name: str,
    low: float,
    high: float,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        raise ValueError(f"{name} must be in {left}{low}, {high}{right}, got {value}")
    setattr(obj, name, float(value))


def _check_choice(obj: object, name: str, choices: Any) -> None:
    value = getattr(obj, name)
    allowed = get_args(choices)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
