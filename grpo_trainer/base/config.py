"""Configuration: what the algorithm does (`GRPOConfig`) and how a run executes (`RunConfig`).

Both are plain dataclasses, validated on construction (a bad value raises `ValueError`
naming the field), printable, and saved as JSON with every checkpoint. Every field carries a
one-line description (`describe`), which feeds `--help`, the tables in docs/trainer.md and
the `_help` entry of the `config.json` every run directory holds.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import types
import typing
import warnings
from collections.abc import Callable
from typing import Any, Literal, get_args, get_origin

# The batch a run gets by default follows its budget (docs/trainer.md, "Defaults that
# transfer"): about UPDATES_PER_RUN updates, each a power of two of samples between
# MIN_SAMPLES and the device's most (`DeviceDefaults.max_samples`), cut into MINIBATCHES
# minibatches. Below FULL_BUDGET env steps a run makes more, smaller updates (the batch
# shrinks with the budget squared): a sparse signal takes hold only over many updates. On
# the CPU, 300k steps get 1024 samples per update (293 updates); 500k, 2048 (244); 1M, 8192
# (122); 2.5M and more, 32768.
UPDATES_PER_RUN, FULL_BUDGET = 128, 1_000_000
MIN_SAMPLES, MAX_SAMPLES = 1_024, 32_768
MINIBATCHES = 8
SAMPLES_PER_UPDATE = MAX_SAMPLES  # the most a default CPU update holds: one trust region
# The window follows the env's episode limit L: about L / 5 steps, a power of two between
# MIN_WINDOW and MAX_WINDOW (MAX_WINDOW without a limit).
MIN_WINDOW, MAX_WINDOW, WINDOW_FRACTION = 32, 128, 5
# Adam's learning rate grows with the square root of the minibatch (Malladi et al., 2022),
# up to the device's ceiling.
LR_AT_REFERENCE, REFERENCE_MINIBATCH = 1e-2, 4_096
# Passes over an update's samples: MAX_EPOCHS when its rows waited one update for their
# look-ahead, fewer the longer they waited (epochs_for).
MAX_EPOCHS = 8
# A critic (value_coef > 0) bootstraps past the look-ahead, so its window need only cover
# GAE's reach (its weight (gamma lambda)^k is 0.17 at k = 31); the passes are then those of
# PureJaxRL's MinAtar PPO, not the window's, and the discount 0.995, which values staying in
# the game over twice PPO's horizon (docs/trainer.md, "A longer discount for the critic").
# Observations with two or more axes (a grid's planes, an image) get a critic by default, flat
# ones none (docs/trainer.md, "A critic for grids").
CRITIC_WINDOW, CRITIC_GAMMA, CRITIC_EPOCHS, SPATIAL_VALUE_COEF = 32, 0.995, 4, 0.5


@dataclasses.dataclass(frozen=True)
class DeviceDefaults:
    """What the derived defaults take from the device a run trains on.

    A GPU's update costs little more at 8x the samples, so there a run takes 8x larger
    updates, as many of them as the CPU's run, and as many gradient steps each: Fruit
    Catcher's greedy 0.70 after 16-20 updates instead of about 46 (docs/trainer.md,
    "Defaults for the device")."""

    total_env_steps: int  # the budget when none is given
    max_samples: int  # the most samples a derived update holds, and one trust region's
    # The ceiling of the square-root learning-rate rule. The GPU's 5e-3: at 1e-2 the GPU's
    # MinAtar runs sharpened their policies until losses overflowed (docs/trainer.md,
    # "MinAtar on a GPU"), and Fruit Catcher reaches 0.70 as soon at 5e-3.
    max_lr: float


DEVICE_DEFAULTS = {
    "cpu": DeviceDefaults(total_env_steps=2_500_000, max_samples=MAX_SAMPLES, max_lr=math.inf),
    "cuda": DeviceDefaults(total_env_steps=20_000_000, max_samples=262_144, max_lr=5e-3),
}


def device_defaults(device: str) -> DeviceDefaults:
    """The row of `DEVICE_DEFAULTS` for a `RunConfig.device`: the CPU's for "cpu" (and for
    "auto" without CUDA), the GPU's for every other device ("meta" stands in for a GPU in
    tests)."""
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return DEVICE_DEFAULTS["cpu" if device == "cpu" else "cuda"]


# The fields whose None means "derive me": from the device (total_env_steps, and the
# largest update and trust region: anchor_samples), the budget (num_groups), the batch
# (minibatch_size, then lr), the env's observations (value_coef) or its episode limit and
# the critic (window, then gamma and epochs).
DERIVED_FIELDS = (
    "total_env_steps",
    "num_groups",
    "anchor_samples",
    "minibatch_size",
    "lr",
    "value_coef",
    "window",
    "gamma",
    "epochs",
)


def samples_per_update(total_env_steps: int, max_samples: int = MAX_SAMPLES) -> int:
    """The default update size for a budget: `total_env_steps / UPDATES_PER_RUN`, scaled by
    `total_env_steps / FULL_BUDGET` below FULL_BUDGET, rounded up to a power of two (so a run
    of FULL_BUDGET or more makes between half of UPDATES_PER_RUN and all of them), within
    [MIN_SAMPLES, max_samples]."""
    short = min(1.0, total_env_steps / FULL_BUDGET)
    target = max(total_env_steps / UPDATES_PER_RUN * short, 1.0)
    return min(max(2 ** math.ceil(math.log2(target)), MIN_SAMPLES), max_samples)


# Evaluation during training: every EVAL_EVERY env steps by default, and no closer than
# EVAL_MIN_UPDATES updates. On an H100 an evaluation of 1000 Fruit Catcher games took
# 0.26-0.51 s, more than an update of the GPU's 262,144 samples (0.20-0.29 s), so after every
# update it took most of `make train`'s time (docs/performance.md, "On a GPU").
EVAL_EVERY, EVAL_MIN_UPDATES = 250_000, 4


def window_for(episode_limit: int | None, critic: bool = False) -> int:
    """The default window for an env with this episode limit (None: none declared); with a
    critic, CRITIC_WINDOW."""
    if critic:
        return CRITIC_WINDOW
    if episode_limit is None:
        return MAX_WINDOW
    steps = 2 ** round(math.log2(max(episode_limit / WINDOW_FRACTION, 1.0)))
    return min(max(steps, MIN_WINDOW), MAX_WINDOW)


def epochs_for(rollout_steps: int, window: int, critic: bool = False) -> int:
    """The default passes over an update's samples: MAX_EPOCHS while a row waits one update
    for its look-ahead, fewer (by the square root) as the data it trains on gets older; with
    a critic, CRITIC_EPOCHS."""
    if critic:
        return CRITIC_EPOCHS
    return max(1, min(MAX_EPOCHS, round(MAX_EPOCHS * math.sqrt(rollout_steps / window))))


def gamma_for(window: int, critic: bool = False) -> float:
    """The default discount: the window's horizon, 1 - 1 / window; with a critic,
    CRITIC_GAMMA (its values carry returns past the window)."""
    return CRITIC_GAMMA if critic else 1.0 - 1.0 / window


def value_coef_for(spatial: bool, advantage: str) -> float:
    """The default critic: SPATIAL_VALUE_COEF for observations with two or more axes compared
    per step, else none (0)."""
    return SPATIAL_VALUE_COEF if spatial and advantage == "per_step" else 0.0


def has_critic(config: GRPOConfig) -> bool:
    """Whether the config trains a critic (value_coef > 0). An unresolved config, whose
    value_coef is still None (derived from the env), has none yet."""
    return (config.value_coef or 0.0) > 0


def lr_for(minibatch_size: int, max_lr: float = math.inf) -> float:
    """The default learning rate for a minibatch size (square-root scaling, up to `max_lr`)."""
    return min(LR_AT_REFERENCE * math.sqrt(minibatch_size / REFERENCE_MINIBATCH), max_lr)


RolloutMode = Literal["windowed", "episodes"]
AdvantageMode = Literal["per_step", "outcome"]
ScaleMode = Literal["group_std", "batch_std", "none"]
CriticMode = Literal["separate", "shared"]
DeferredWeights = Literal["none", "truncated"]
Schedule = Literal["constant", "linear", "cosine"]
Activation = Literal["tanh", "relu"]
AmpMode = Literal["off", "bf16", "fp16"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune"]
ObsStorage = Literal["auto", "float32", "float16", "bfloat16"]
WandbMode = Literal["online", "offline", "disabled"]


def _field(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with its one-line description (mutable defaults are copied)."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=default.copy, metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help}, **kwargs)


def describe(cls: type, name: str) -> str:
    """The one-line description of a config field."""
    return next(f.metadata["help"] for f in dataclasses.fields(cls) if f.name == name)


def field_type(hint: Any) -> tuple[Any, bool]:
    """A config field's annotation without `| None`, and whether it allows None (the CLI
    and the sweep's search space both type a field's values by it)."""
    args = get_args(hint)
    if get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return hint, False


def markdown_table(cls: type) -> str:
    """The configuration table of docs/trainer.md for `GRPOConfig` or `RunConfig`."""
    lines = ["| field | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.name == "run":
            continue
        default = f.default_factory() if callable(f.default_factory) else f.default
        shown = ", ".join(map(str, default)) if isinstance(default, tuple) else default
        shown = f"{shown:_}".replace("_", ",") if isinstance(shown, int) and shown > 9999 else shown
        lines.append(f"| `{f.name}` | {shown!s} | {f.metadata['help'].replace('|', '/')} |")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Where and how a run executes; nothing here changes the maths of the algorithm."""

    env: str = _field(
        "fruit_env:FruitCatcher-v0", "Gymnasium id; 'module:Id' imports the module first"
    )
    env_kwargs: dict[str, Any] = _field({}, "keyword arguments for gymnasium.make_vec")
    device: str = _field(
        "auto",
        "'auto' (cuda when available, else cpu), 'cpu', 'cuda', 'cuda:N'; 'meta' in tests",
    )
    compile: bool | None = _field(
        None,
        "torch.compile the policy step and the loss; None: on the CPU from "
        "accel.CPU_COMPILE_MIN_SAMPLES samples per minibatch, never on a GPU (its compile "
        "was not won back within make train's run)",
    )
    compile_mode: CompileMode = _field(
        "default", "torch.compile mode; 'reduce-overhead' adds CUDA graphs (CUDA only)"
    )
    amp: AmpMode = _field("off", "mixed precision: off, bf16 or fp16 (fp16 needs CUDA)")
    fused_optimizer: bool = _field(True, "fused AdamW where the device supports it")
    seed: int = _field(0, "seeds the network, the sampling and the groups' starts")
    run_dir: str | None = _field(
        None, "where config, metrics and checkpoints go; None writes nothing"
    )
    resume: str | None = _field(None, "a checkpoint file or a run directory to continue from")
    overwrite: bool = _field(
        False, "a fresh run into a run_dir that holds a run replaces it (else refused)"
    )
    checkpoint_every: int = _field(0, "updates between periodic checkpoints (0: only at the end)")
    keep_checkpoints: int = _field(3, "numbered checkpoints kept (last.pt and best.pt besides)")
    progress: bool = _field(True, "live progress line and a summary table")
    tensorboard: bool = _field(False, "also log metrics to TensorBoard (the tensorboard extra)")
    max_consecutive_skips: int = _field(
        5, "updates in a row with a non-finite gradient before training stops"
    )
    eval_every: int | None = _field(
        None,
        "env steps between evaluations during training, on separate envs (0: none); None: "
        "250,000, and at least 4 updates apart",
    )
    eval_episodes: int = _field(1000, "episodes per evaluation, played with greedy actions")
    target: str | None = _field(
        None,
        "stop when an evaluation reaches NAME=VALUE, NAME 'return' or a ratio the env "
        "declares (catch_rate=0.70); unset: the env's declared goal is only recorded",
    )
    wandb: bool = _field(False, "also log the run to Weights & Biases (the wandb extra)")
    wandb_project: str = _field("grpo-trainer", "W&B project the run is logged to")
    wandb_entity: str | None = _field(None, "W&B entity (user or team); None: your default")
    wandb_name: str | None = _field(
        None, "W&B run name; None: the run directory's name, else one W&B picks"
    )
    wandb_mode: WandbMode = _field(
        "online", "W&B mode: online, offline (upload later with wandb sync) or disabled"
    )

    def __post_init__(self) -> None:
        _check_annotated(self)
        _check_int(self, "seed", minimum=0)
        if self.seed >= 2**63:
            raise ValueError(f"seed must be below 2**63, got {self.seed}")
        for name in ("run_dir", "resume"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))
            elif value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be a path or None, got {value!r}")
        for name in ("wandb_entity", "wandb_name"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string or None, got {value!r}")
        if not isinstance(self.wandb_project, str) or not self.wandb_project:
            raise ValueError(
                f"wandb_project must be a non-empty string, got {self.wandb_project!r}"
            )
        _check_int(self, "checkpoint_every", minimum=0)
        _check_int(self, "keep_checkpoints", minimum=1)
        _check_int(self, "max_consecutive_skips", minimum=1)
        _check_int(self, "eval_every", minimum=0, optional=True)
        _check_int(self, "eval_episodes", minimum=1)
        if self.target is not None:
            parse_target(self.target)
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


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """The GRPO algorithm. The defaults are the fast path, chosen by the seed study in
    docs/trainer.md: FruitCatcher-v0 past a 0.70 catch rate on every seed studied.

    A frozen record: the fields left None are derived on construction from the device and
    the budget, and by `resolve` from the env (the window, then gamma and epochs); `derived`
    names them. The resolved config is what `GRPO` trains with, config.json and checkpoints."""

    # -- batch and rollout --
    num_groups: int | None = _field(
        None,
        "groups per rank (the env has num_groups x group_size sub-envs); None: enough for "
        "samples_per_update(total_env_steps) samples per update",
    )
    group_size: int = _field(8, "members per group; they start alike and are compared")
    total_env_steps: int | None = _field(
        None,
        "sub-env steps to train for, over all ranks (every step simulated counts); None: the "
        "device's (2,500,000 on the CPU, 20,000,000 on a GPU: DEVICE_DEFAULTS)",
    )
    time_budget_s: float | None = _field(
        None,
        "seconds of training to stop at (rollouts and updates, compiling included; evaluation "
        "and checkpoints apart), where it ends before the env steps, and the schedule with "
        "it; None: env steps alone",
    )
    rollout: RolloutMode = _field(
        "windowed",
        "'windowed': rollout_steps per update, episodes run on across updates; "
        "'episodes': every member plays one whole episode per update",
    )
    rollout_steps: int = _field(32, "windowed: steps every sub-env takes per update")
    window: int | None = _field(
        None,
        "windowed: look-ahead of the returns-to-go compared within a group (steps); None: "
        "from the env's episode limit L, about L / 5 within [32, 128] (window_for)",
    )
    restart_every: int = _field(
        8, "windowed: steps between the checks that restart groups whose members all ended"
    )
    branch_every: int = _field(
        0,
        "windowed, envs with state snapshots: a group re-branches from one member's state "
        "after this many steps (0: never)",
    )
    branch_complete: bool = _field(
        False,
        "windowed, with branch_every: every group branches at the same rows, and the path each "
        "member leaves plays window - 1 more steps as inference only (not counted in "
        "total_env_steps); their discounted return completes the rows before the branch "
        "instead of cutting them",
    )
    branch_ended: bool = _field(
        True,
        "windowed, envs with state snapshots: a member whose episode ended takes the state of "
        "a member of its group still playing, instead of waiting for the group to end",
    )
    max_episode_steps: int | None = _field(
        None,
        "episode limit the trainer applies; None: the env's own (episodes mode needs one)",
    )
    noise_correlation: float = _field(
        0.95,
        "Box actions: correlation of a sub-env's exploration noise from one step to the next "
        "(an AR(1) process, so it pushes one way for about 1 / (1 - rho) steps; each step is "
        "credited with its own innovation only; 0: independent)",
    )
    # -- advantages --
    advantage: AdvantageMode = _field(
        "per_step",
        "'per_step': returns-to-go vs the group at the same step; 'outcome' (episodes "
        "mode): whole-episode returns",
    )
    scale: ScaleMode = _field(
        "batch_std", "advantage scale: 'group_std' (GRPO), 'batch_std' (REINFORCE++), 'none'"
    )
    gamma: float | None = _field(
        None, "discount of the returns-to-go; None: 0.995 with a critic, else 1 - 1 / window"
    )
    zero_std_eps: float = _field(
        1e-6, "a group step whose returns spread no more than this carries no signal (weight 0)"
    )
    value_coef: float | None = _field(
        None,
        "weight of a critic's squared error; > 0 adds a critic, whose GAE the group compares; "
        "None: 0.5 for observations with two or more axes (grids, images), 0 (no critic) for "
        "flat ones",
    )
    gae_lambda: float = _field(0.95, "value_coef > 0: GAE's lambda (1: Monte Carlo returns)")
    critic: CriticMode = _field(
        "shared", "value_coef > 0: 'shared' (the policy's encoder) or 'separate' (one of its own)"
    )
    # -- loss and optimiser --
    clip_low: float = _field(0.2, "ratio clip below: 1 - clip_low")
    clip_high: float = _field(0.28, "ratio clip above: 1 + clip_high (DAPO's clip-higher)")
    dual_clip: float | None = _field(
        None, "a negative advantage A costs at most dual_clip x |A| (dual-clip PPO, 3); None: off"
    )
    deferred_weights: DeferredWeights = _field(
        "truncated",
        "rows an earlier policy played: 'truncated' weighs each by min(1, pi(a|s) / "
        "pi_played(a|s)), the truncated importance weight; 'none': 1",
    )
    epochs: int | None = _field(
        None,
        "passes over each update's samples; None: 8 when rows wait one update for their "
        "look-ahead (window <= rollout_steps), fewer as they wait longer: "
        "8 x sqrt(rollout_steps / window), 4 at a window of 4 rollouts",
    )
    anchor_samples: int | None = _field(
        None,
        "samples per trust region (per rank): a larger batch is split at random into parts "
        "of this size, each re-anchoring the clipped ratio at the current policy; None: the "
        "device's largest derived update (32,768 on the CPU, 262,144 on a GPU)",
    )
    minibatch_size: int | None = _field(
        None,
        "samples per gradient step (the step count grows with the batch); None: an update's "
        "samples / MINIBATCHES (8)",
    )
    micro_batches: int = _field(1, "gradient accumulation inside each minibatch")
    kl_coef: float = _field(0.0, "weight of the k3 KL to a frozen reference policy")
    entropy_coef: float = _field(0.01, "weight of the entropy bonus")
    mean_bound_coef: float = _field(
        1.0, "Box: weight of the penalty on a mean past the bounds, a std past half them (0: off)"
    )
    max_grad_norm: float = _field(1.0, "clip the global gradient norm to this")
    lr: float | None = _field(
        None, "AdamW learning rate; None: 1e-2 x sqrt(minibatch_size / 4096) (lr_for)"
    )
    lr_schedule: Schedule = _field(
        "linear", "learning-rate schedule over the budget (budget_spent): constant, linear, cosine"
    )
    # -- policy network --
    hidden_sizes: tuple[int, ...] = _field((64, 64), "widths of the MLP's hidden layers")
    activation: Activation = _field("relu", "activation of the hidden layers: relu or tanh")
    cnn_channels: tuple[int, ...] = _field(
        (16, 32), "image observations: channels of the conv layers (3x3; stride 2 after the first)"
    )
    logit_cap: float | None = _field(None, "discrete actions: cap x tanh(logits / cap); None: raw")
    obs_storage: ObsStorage = _field(
        "auto",
        "rollout observation dtype: auto (compact where lossless), float32, float16, bfloat16",
    )
    run: RunConfig = dataclasses.field(
        default_factory=RunConfig, metadata={"help": "how the run executes (RunConfig)"}
    )

    def __post_init__(self) -> None:
        if isinstance(self.run, dict):
            object.__setattr__(self, "run", RunConfig(**self.run))
        # `derived`: the fields this config derives rather than was given (they are None);
        # `inputs()` leaves them unset, so that another budget or env derives them again.
        derived = tuple(n for n in DERIVED_FIELDS if getattr(self, n) is None)
        object.__setattr__(self, "derived", derived)
        for name in ("hidden_sizes", "cnn_channels"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        device = device_defaults(self.run.device if isinstance(self.run, RunConfig) else "cpu")
        derive = functools.partial(_derive, self)
        derive("total_env_steps", lambda: device.total_env_steps)
        derive("anchor_samples", lambda: device.max_samples)
        _check_int(self, "group_size", minimum=2)
        _check_int(self, "total_env_steps", minimum=1)
        _check_int(self, "rollout_steps", minimum=1)
        _check_int(self, "window", minimum=1, optional=True)
        samples = samples_per_update(self.total_env_steps, device.max_samples)  # the budget's
        derive("num_groups", lambda: max(1, samples // (self.rollout_steps * self.group_size)))
        _check_int(self, "num_groups", minimum=1)
        derive("minibatch_size", lambda: max(1, self.num_envs * self.rollout_steps // MINIBATCHES))
        _check_int(self, "anchor_samples", minimum=1)
        _check_read_by_derivation(self)
        _clamp_minibatch(self, self.max_episode_steps)
        derive("lr", lambda: lr_for(self.minibatch_size, device.max_lr))
        if self.window is not None and self.value_coef is not None:  # else resolve's (the env)
            critic = has_critic(self)
            derive("gamma", lambda: gamma_for(self.window, critic))
            derive("epochs", lambda: epochs_for(self.rollout_steps, self.window, critic))
        _check_int(self, "restart_every", minimum=1)
        _check_branching(self)
        for name in ("minibatch_size", "micro_batches"):
            _check_int(self, name, minimum=1)
        _check_int(self, "epochs", minimum=1, optional=True)
        _check_annotated(self)
        _check_floats(self)
        _check_layer_sizes(self)
        _check_advantage(self)
        if not isinstance(self.run, RunConfig):
            raise ValueError(f"run must be a RunConfig, got {self.run!r}")

    @property
    def num_envs(self) -> int:
        assert self.num_groups is not None  # resolved in __post_init__
        return self.num_groups * self.group_size

    def resolve(
        self, episode_limit: int | None, kept: dict[str, Any] | None = None, spatial: bool = False
    ) -> GRPOConfig:
        """The config a run trains with: what was asked, the values a resumed run keeps
        (`kept`: what it derived before; a new budget extends a run, it does not reshape it),
        and the rest derived once: the critic from the observations (`spatial`: they have two
        or more axes), the window from the episode limit (the trainer's `max_episode_steps`, else
        the env's `episode_limit`) and the critic. `derived` still names every derived field,
        as config.json will."""
        kept = kept or {}
        if not set(kept) <= set(self.derived):
            raise ValueError(f"not derived by this config: {sorted(set(kept) - set(self.derived))}")
        limit = self.max_episode_steps or episode_limit
        if self.window is not None and self.value_coef is not None and not kept:
            return self
        asked = {**self.inputs(), **kept}
        if asked["value_coef"] is None:
            asked["value_coef"] = value_coef_for(spatial, self.advantage)
        asked["window"] = asked["window"] or window_for(limit, asked["value_coef"] > 0)
        resolved = GRPOConfig.from_dict(asked)
        object.__setattr__(resolved, "derived", self.derived)
        if "minibatch_size" not in kept:  # episodes mode: an update is num_envs x the limit
            _clamp_minibatch(resolved, limit)
        if "lr" in self.derived and "lr" not in kept:
            lr = lr_for(resolved.minibatch_size, device_defaults(self.run.device).max_lr)
            object.__setattr__(resolved, "lr", lr)
        return resolved

    def to_dict(self) -> dict[str, Any]:
        """Every field with its resolved value (what checkpoints and reports record)."""
        return dataclasses.asdict(self)

    def to_file_dict(self) -> dict[str, Any]:
        """What a config file holds (a run's `config.json`, a sweep's `best_config.json`):
        `to_dict()` and, in `_derived`, the fields it derived, which `from_dict` derives again."""
        return {"_derived": list(self.derived), **self.to_dict()}

    def inputs(self) -> dict[str, Any]:
        """`to_dict()` with the derived fields unset: what was asked for. Building a config
        from it, changed or not, resolves every derived field once, from the final values
        (a new budget gets its own batch and learning rate)."""
        return {**self.to_dict(), **dict.fromkeys(self.derived)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GRPOConfig:
        """Rebuild from `to_dict()` or `inputs()` output, or a `config.json`; fields it lacks
        take their defaults, unknown fields raise `ValueError`. A `config.json` names the
        fields its run derived (`_derived`): they are derived again here rather than taken
        as given."""
        data = without_derived(data)
        run = dict(data.pop("run", {}))
        _reject_unknown(cls, data)
        _reject_unknown(RunConfig, run)
        return cls(**data, run=RunConfig(**run))


def eval_interval(config: GRPOConfig, world_size: int = 1) -> int:
    """The env steps between evaluations: `run.eval_every` when given (0: none), else
    EVAL_EVERY, stretched to EVAL_MIN_UPDATES windowed updates (of every rank's steps) where
    updates are larger."""
    if config.run.eval_every is not None:
        return config.run.eval_every
    per_update = config.num_envs * config.rollout_steps * world_size
    return max(EVAL_EVERY, EVAL_MIN_UPDATES * per_update)


def _clamp_minibatch(config: GRPOConfig, episode_limit: int | None) -> None:
    """A minibatch larger than the update (or a trust region) holds is the update: clamp it,
    with a warning, so that the learning rate follows the minibatch that is used."""
    _check_int(config, "minibatch_size", minimum=1)
    steps = config.rollout_steps if config.rollout == "windowed" else episode_limit
    most = [config.num_envs * steps] if steps else []
    most += [config.anchor_samples] if config.anchor_samples else []
    if most and config.minibatch_size > min(most):
        warnings.warn(
            f"minibatch_size {config.minibatch_size} is more than an update's {min(most)} "
            f"samples: using {min(most)} (the learning rate follows it)",
            stacklevel=5,
        )
        object.__setattr__(config, "minibatch_size", min(most))


def without_derived(data: dict[str, Any]) -> dict[str, Any]:
    """A config dict (a `config.json`'s data) without its descriptions (`_help`) and without
    the values its run derived (named in `_derived`), which are derived again from the rest."""
    derived = data.get("_derived", [])
    if not isinstance(derived, list) or not set(derived) <= set(DERIVED_FIELDS):
        raise ValueError(f"_derived must list fields among {list(DERIVED_FIELDS)}, got {derived!r}")
    return {k: v for k, v in data.items() if k not in ("_help", "_derived", *derived)}


def parse_target(text: str) -> tuple[str, float]:
    """`'catch_rate=0.70'` -> `('catch_rate', 0.7)`; a malformed target raises `ValueError`."""
    name, sep, value = text.partition("=") if isinstance(text, str) else ("", "", "")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not sep or not name.strip() or not math.isfinite(number):
        raise ValueError(
            f"target must be NAME=VALUE with a finite VALUE, e.g. catch_rate=0.70 or "
            f"return=475, got {text!r}"
        )
    return name.strip(), number


def _derive(config: GRPOConfig, name: str, value: Callable[[], Any]) -> None:
    """Set a derived field left None to its default (`value()`, from the fields before it)."""
    if getattr(config, name) is None:
        object.__setattr__(config, name, value())


def _reject_unknown(cls: type, data: dict[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")


def _check_int(obj: object, name: str, *, minimum: int, optional: bool = False) -> None:
    """`name` is an int of at least `minimum` (or None, where `optional`)."""
    value = getattr(obj, name)
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")


def _check_read_by_derivation(config: GRPOConfig) -> None:
    """The given fields that the derived ones are computed from, checked first, so that a
    bad one is named instead of failing a comparison inside a rule."""
    _check_int(config, "max_episode_steps", minimum=1, optional=True)
    _check_float(config, "value_coef", 0.0, math.inf, optional=True)


def _check_floats(config: GRPOConfig) -> None:
    """The algorithm's numbers: finite, in their ranges, stored as floats."""
    _check_float(config, "gamma", 0.0, 1.0, optional=True)
    _check_float(config, "noise_correlation", 0.0, 1.0, high_open=True)
    _check_float(config, "clip_low", 0.0, 1.0, low_open=True, high_open=True)
    _check_float(config, "clip_high", 0.0, math.inf, low_open=True)
    _check_float(config, "dual_clip", 1.0, math.inf, low_open=True, optional=True)
    for name in ("zero_std_eps", "kl_coef", "entropy_coef", "mean_bound_coef"):
        _check_float(config, name, 0.0, math.inf)
    _check_float(config, "logit_cap", 0.0, math.inf, low_open=True, optional=True)
    _check_float(config, "max_grad_norm", 0.0, math.inf, low_open=True)
    _check_float(config, "lr", 0.0, math.inf, low_open=True)
    _check_float(config, "time_budget_s", 0.0, math.inf, low_open=True, optional=True)


def _check_branching(config: GRPOConfig) -> None:
    """Complete branches happen at restart checks."""
    _check_int(config, "branch_every", minimum=0)
    every, restart = config.branch_every, config.restart_every
    if config.branch_complete and (not every or every % restart):
        raise ValueError(
            "branch_complete needs branch_every > 0, a multiple of restart_every (groups "
            f"branch at a restart check), got {every} and {restart}"
        )


def _check_advantage(config: GRPOConfig) -> None:
    """What a sample's advantage compares fits the rollout and the critic."""
    _check_float(config, "gae_lambda", 0.0, 1.0)
    if config.advantage == "outcome" and config.rollout == "windowed":
        raise ValueError(
            "advantage='outcome' compares whole-episode returns: it needs "
            "rollout='episodes' (windowed rollouts compare returns-to-go per step)"
        )
    if has_critic(config) and config.advantage == "outcome":
        raise ValueError(
            "value_coef > 0 compares per-step GAE advantages: it needs advantage='per_step'"
        )


def _check_float(
    obj: object,
    name: str,
    low: float,
    high: float,
    *,
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
) -> None:
    """`name` is a finite number in the range, stored as a float (or None, where `optional`)."""
    value = getattr(obj, name)
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        raise ValueError(f"{name} must be in {left}{low}, {high}{right}, got {value}")
    object.__setattr__(obj, name, float(value))


def _check_layer_sizes(config: GRPOConfig) -> None:
    """The network's widths: positive ints, and at least one conv layer."""
    for name in ("hidden_sizes", "cnn_channels"):
        value = getattr(config, name)
        if not isinstance(value, tuple) or not all(
            isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in value
        ):
            raise ValueError(f"{name} must be positive ints, got {value!r}")
    if not config.cnn_channels:
        raise ValueError("cnn_channels must name at least one conv layer")


def _check_annotated(obj: object) -> None:
    """The checks a field's annotation implies: a `Literal` field holds one of its values, a
    `bool` field a bool."""
    for name, hint in typing.get_type_hints(type(obj)).items():
        value = getattr(obj, name)
        if get_origin(hint) is Literal and value not in get_args(hint):
            raise ValueError(f"{name} must be one of {list(get_args(hint))}, got {value!r}")
        if hint is bool and not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
