"""Policies derived from Gymnasium spaces: an encoder for the observation, a head for the action.

Every head has `ActionHead`'s interface, so the rollout and the loss never branch on the
action type. `AutocastPolicy` is the policy as the trainer runs it: sampling, scoring, loss.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Generator, Tensor, nn

from grpo_trainer.algorithm.objective import LossTerms, grpo_loss
from grpo_trainer.base.accel import autocast
from grpo_trainer.base.collective import Terms
from grpo_trainer.base.config import GRPOConfig, has_critic


class ActionHead(nn.Module):
    """Base class: maps features to distribution parameters and defines the distribution."""

    param_dim: int
    action_shape: tuple[int, ...]
    action_dtype: torch.dtype  # dtype the rollout stores actions in
    bounded = False  # whether `bound_penalty` can be nonzero (a constant of the space)

    def noise(self, batch: int, generator: Generator | None, device: torch.device) -> Tensor:
        """The randomness of `batch` samples, drawn outside compiled code."""
        raise NotImplementedError

    def sample(self, params: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """An action per row of `params`, from `noise`, and its log-prob."""
        raise NotImplementedError

    def greedy(self, params: Tensor) -> Tensor:
        """The most likely action per row (evaluation)."""
        raise NotImplementedError

    def log_prob_entropy(self, params: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """The log-prob of stored actions, and the distribution's entropy, per row."""
        raise NotImplementedError

    def bound_penalty(self, params: Tensor) -> Tensor:
        """Per row, how far the distribution's centre lies past the action bounds (0 here:
        a categorical's actions are all inside)."""
        return torch.zeros(params.shape[:-1], device=params.device)

    def to_env(self, action: Tensor) -> Tensor:
        """A stored action as the env takes it (e.g. clipped to its bounds)."""
        return action

    # The step-to-step correlation of the exploration noise (`ExplorationNoise` reads it
    # here): none for a categorical, whose noise is uniform (no mix of uniforms stays uniform).
    noise_correlation = 0.0

    def shift(self, action: Tensor, carried: Tensor) -> Tensor:
        """`action` moved by the noise carried over from earlier steps (heads that correlate)."""
        raise NotImplementedError


def _index_dtype(n: int) -> torch.dtype:
    return torch.uint8 if n <= 256 else torch.int32


def capped_logits(params: Tensor, cap: float | None) -> Tensor:
    """float32 logits, softly capped at ±cap by `cap · tanh(params / cap)` (None: raw).

    The cap bounds how far one action's log-prob can fall below another's (2 · cap), so a
    sharpening policy cannot drive a stored action's log-prob, and with it a clipped ratio,
    down by tens of nats in one update (docs/trainer.md, "MinAtar on a GPU"). Near 0 it is
    the identity; its order is the raw logits', so the greedy action reads the raw ones."""
    logits = params.float()
    return logits if cap is None else _SigmoidTanh.apply(logits / cap) * cap


class CategoricalHead(ActionHead):
    """`Discrete(n)`: logits, sampled with the Gumbel-max trick."""

    def __init__(self, n: int, start: int = 0, logit_cap: float | None = None) -> None:
        super().__init__()
        self.n, self.start, self.logit_cap = n, start, logit_cap
        self.param_dim, self.action_shape = n, ()
        self.action_dtype = _index_dtype(n)

    def noise(self, batch: int, generator: Generator | None, device: torch.device) -> Tensor:
        return torch.rand((batch, self.n), generator=generator, device=device)

    def sample(self, params: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        logp_all = torch.log_softmax(capped_logits(params, self.logit_cap), -1)
        gumbel = -torch.log(-torch.log(noise.clamp(1e-20, 1.0 - 1e-7)))
        action = torch.argmax(logp_all + gumbel, -1)
        return action, logp_all.gather(-1, action[..., None]).squeeze(-1)

    def greedy(self, params: Tensor) -> Tensor:
        return torch.argmax(params, -1)

    def log_prob_entropy(self, params: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        logp_all = torch.log_softmax(capped_logits(params, self.logit_cap), -1)
        logp = logp_all.gather(-1, action.long()[..., None]).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy

    def to_env(self, action: Tensor) -> Tensor:
        action = action.long()
        return action + self.start if self.start else action  # one op fewer per rollout step


class MultiCategoricalHead(ActionHead):
    """`MultiDiscrete(nvec)`: independent categoricals, padded to one `(D, max_n)` block."""

    def __init__(self, nvec: np.ndarray, start: np.ndarray, logit_cap: float | None = None) -> None:
        super().__init__()
        self.logit_cap = logit_cap
        nvec = np.asarray(nvec).reshape(-1)
        self.dims, self.width = len(nvec), int(nvec.max())
        self.param_dim, self.action_shape = self.dims * self.width, (self.dims,)
        self.action_dtype = _index_dtype(self.width)
        invalid = torch.arange(self.width)[None, :] >= torch.as_tensor(nvec)[:, None]
        self.register_buffer("invalid", invalid, persistent=False)
        self.register_buffer("start", torch.as_tensor(start).reshape(-1).long(), persistent=False)

    def _logp_all(self, params: Tensor, cap: bool = True) -> Tensor:
        logits = capped_logits(params, self.logit_cap if cap else None)
        logits = logits.unflatten(-1, (self.dims, self.width))
        return torch.log_softmax(logits.masked_fill(self.invalid, -1e9), -1)

    def noise(self, batch: int, generator: Generator | None, device: torch.device) -> Tensor:
        return torch.rand((batch, self.dims, self.width), generator=generator, device=device)

    def sample(self, params: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        logp_all = self._logp_all(params)
        gumbel = -torch.log(-torch.log(noise.clamp(1e-20, 1.0 - 1e-7)))
        action = torch.argmax(logp_all + gumbel, -1)
        return action, logp_all.gather(-1, action[..., None]).squeeze(-1).sum(-1)

    def greedy(self, params: Tensor) -> Tensor:
        return torch.argmax(self._logp_all(params, cap=False), -1)  # raw: no saturated ties

    def log_prob_entropy(self, params: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        logp_all = self._logp_all(params)
        logp = logp_all.gather(-1, action.long()[..., None]).squeeze(-1).sum(-1)
        entropy = -(logp_all.exp() * logp_all).sum((-1, -2))
        return logp, entropy

    def to_env(self, action: Tensor) -> Tensor:
        return action.long() + self.start


class GaussianHead(ActionHead):
    """`Box` actions: diagonal Gaussian with a learned, state-independent log-std.

    Unclipped samples are stored (their log-prob is exact); the env gets them clipped. The
    mean is the raw network output, and nothing in the surrogate stops it drifting past a
    bound: once every member of a group is clipped alike, the group has no spread and no
    gradient. `bound_penalty` pulls it back softly (the loss adds it, times
    `mean_bound_coef`); a mean clamped or squashed into the bounds could put mass on a bound
    only by shrinking the noise, and learned worse (docs/trainer.md, "The tanh-squashed
    mean, tried and reverted").
    """

    def __init__(self, space: gym.spaces.Box, noise_correlation: float = 0.0) -> None:
        super().__init__()
        self.noise_correlation = noise_correlation
        # With correlated noise a step samples only the innovation, sqrt(1 - rho^2) of the
        # std (`ExplorationNoise`); its log-probs and entropy are that innovation's.
        self.log_innovation = 0.5 * math.log1p(-noise_correlation * noise_correlation)
        self.action_shape = tuple(space.shape)
        size = int(np.prod(self.action_shape))
        self.param_dim, self.action_dtype = size, torch.float32
        self.log_std = nn.Parameter(torch.zeros(size))
        for name, bound in (("low", space.low), ("high", space.high)):
            tensor = torch.as_tensor(bound, dtype=torch.float32)
            self.register_buffer(name, tensor, persistent=False)
        # Dims with two finite, distinct bounds: their centre and 1 / half-range; 0 elsewhere,
        # so that other dims add relu(-1) = 0 to the penalty.
        low, high = self.low.flatten(), self.high.flatten()
        finite = torch.isfinite(low) & torch.isfinite(high) & (high > low)
        centre = torch.where(finite, (low + high) / 2, torch.zeros_like(low))
        inv_half = torch.where(finite, 2.0 / (high - low), torch.zeros_like(low))
        self.register_buffer("centre", centre, persistent=False)
        self.register_buffer("inv_half", inv_half, persistent=False)
        # The widest std worth having, half the range: past it the env gets mostly clipped,
        # bang-bang actions, and log-probs hardly depend on the mean, which stops learning.
        # The surrogate likes bang-bang (clipped samples far out do as well as any), and left
        # free MountainCarContinuous' log-std grew past 10 (docs/trainer.md, "Policies");
        # `bound_penalty` pulls it back as it does the mean.
        max_log_std = torch.where(finite, torch.log((high - low) / 2), torch.inf)
        self.register_buffer("max_log_std", max_log_std, persistent=False)
        self.bounded = bool(finite.any())
        self.bounded_dims = max(1, int(finite.sum()))

    def noise(self, batch: int, generator: Generator | None, device: torch.device) -> Tensor:
        return torch.randn((batch, self.param_dim), generator=generator, device=device)

    def _sampled_log_std(self) -> Tensor:
        """The log-std a step samples with: the innovation's, under correlated noise."""
        return self.log_std + self.log_innovation if self.log_innovation else self.log_std

    def _logp(self, mean: Tensor, flat_action: Tensor) -> Tensor:
        log_std = self._sampled_log_std()
        z = (flat_action - mean) * torch.exp(-log_std)
        return (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def sample(self, params: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        mean = params.float()
        flat = mean + torch.exp(self.log_std) * noise
        return flat.unflatten(-1, self.action_shape), self._logp(mean, flat)

    def greedy(self, params: Tensor) -> Tensor:
        return params.float().unflatten(-1, self.action_shape)

    def log_prob_entropy(self, params: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        logp = self._logp(params.float(), action.float().flatten(-len(self.action_shape)))
        log_std = self._sampled_log_std()
        entropy = (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum().expand_as(logp)
        return logp, entropy

    def bound_penalty(self, params: Tensor) -> Tensor:
        """`relu(|mean − centre| / half_range − 1)² + relu(log_std − log half_range)²`
        averaged over the dims with finite bounds: 0 for a mean inside them and a std up to
        half their range, quadratic past (the gradient grows with the distance). Sampling and
        log-probs keep the raw mean and std."""
        excess = torch.relu((params.float() - self.centre).abs() * self.inv_half - 1.0)
        wide = torch.relu(self.log_std - self.max_log_std)
        return ((excess * excess).sum(-1) + (wide * wide).sum()) / self.bounded_dims

    def to_env(self, action: Tensor) -> Tensor:
        return torch.maximum(torch.minimum(action, self.high), self.low)

    def shift(self, action: Tensor, carried: Tensor) -> Tensor:
        return action + torch.exp(self.log_std.detach()) * carried.unflatten(-1, self.action_shape)


class _SigmoidTanh(torch.autograd.Function):
    """tanh(x) as 2 sigmoid(2x) - 1, with tanh's own backward: on x86 CPUs ATen's float32
    `tanh` costs several times its `sigmoid` (docs/performance.md, "Figures the code relies
    on"). In float32 it stays within a few ulps of `torch.tanh`, inside [-1, 1]."""

    @staticmethod
    def forward(x: Tensor) -> Tensor:  # type: ignore[override]
        y = (x * 2.0).sigmoid_()  # a fresh tensor: the in-place ops touch nothing else
        return y.mul_(2.0).sub_(1.0)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # type: ignore[override]
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


class Tanh(nn.Module):
    """Drop-in for `nn.Tanh` (checkpoints are unchanged), faster on the CPU: `_SigmoidTanh`."""

    def forward(self, x: Tensor) -> Tensor:
        return _SigmoidTanh.apply(x)


def make_head(
    space: gym.Space, noise_correlation: float = 0.0, logit_cap: float | None = None
) -> ActionHead:
    """The action head for a single sub-env's action space (`noise_correlation`: see
    `ExplorationNoise`; only a Gaussian head's log-probs depend on it; `logit_cap`:
    `capped_logits`, for the categorical heads)."""
    if isinstance(space, gym.spaces.Discrete):
        return CategoricalHead(int(space.n), int(space.start), logit_cap)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return MultiCategoricalHead(space.nvec, space.start, logit_cap)
    if isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating):
        return GaussianHead(space, noise_correlation)
    raise ValueError(
        f"unsupported action space {space}: use Discrete, MultiDiscrete or a float Box"
    )


def is_image_space(space: gym.Space) -> bool:
    """A 3-D uint8 or bool Box (an image or a stack of binary planes): encoded by the CNN."""
    return (
        isinstance(space, gym.spaces.Box)
        and space.dtype in (np.uint8, np.bool_)
        and len(space.shape) == 3
    )


def channels_last(shape: tuple[int, ...]) -> bool:
    """Images are (C, H, W) unless their last axis is the shortest, e.g. MinAtar's (10, 10, 4)."""
    return shape[-1] < min(shape[:-1])


class _ChannelsFirst(nn.Module):
    """(N, H, W, C) -> (N, C, H, W)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.permute(0, 3, 1, 2)


def _fresh_copy(layers: list[nn.Module]) -> nn.Sequential:
    """`layers` again with weights of their own, initialised as the policy's encoder is."""
    encoder = copy.deepcopy(nn.Sequential(*layers))
    for layer in encoder.modules():
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, math.sqrt(2))
            nn.init.zeros_(layer.bias)
        elif isinstance(layer, nn.Conv2d):
            layer.reset_parameters()
    return encoder


class Policy(nn.Module):
    """Encoder (MLP, or a small CNN for images) followed by an action head. No dropout."""

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        hidden_sizes: tuple[int, ...] = (64, 64),
        activation: str = "tanh",
        cnn_channels: tuple[int, ...] = (16, 32),
        noise_correlation: float = 0.0,
        logit_cap: float | None = None,
        critic: str | None = None,
    ) -> None:
        super().__init__()
        act = {"tanh": Tanh, "relu": functools.partial(nn.ReLU, inplace=True)}[activation]
        self.head = make_head(action_space, noise_correlation, logit_cap)
        if is_image_space(observation_space):
            last = channels_last(observation_space.shape)
            channels = observation_space.shape[-1 if last else 0]
            self.scale = 1.0 / 255.0 if observation_space.dtype == np.uint8 else 1.0
            convs: list[nn.Module] = [_ChannelsFirst()] if last else []
            for i, width in enumerate(cnn_channels):  # 3x3; stride 2 after the first
                convs += [nn.Conv2d(channels, width, 3, stride=1 if i == 0 else 2, padding=1)]
                convs += [nn.ReLU()]
                channels = width
            conv = nn.Sequential(*convs, nn.Flatten())
            with torch.no_grad():
                in_dim = conv(torch.zeros(1, *observation_space.shape)).shape[1]
            layers: list[nn.Module] = [conv]
        elif isinstance(observation_space, gym.spaces.Box):
            self.scale = 1.0
            in_dim = int(np.prod(observation_space.shape))
            layers = [nn.Flatten()]
        else:
            raise ValueError(
                f"unsupported observation space {observation_space}: use a Box "
                "(flat features, or uint8/bool images shaped (C, H, W) or (H, W, C))"
            )
        for size in hidden_sizes:
            linear = nn.Linear(in_dim, size)
            nn.init.orthogonal_(linear.weight, math.sqrt(2))
            nn.init.zeros_(linear.bias)
            layers += [linear, act()]
            in_dim = size
        out = nn.Linear(in_dim, self.head.param_dim)
        nn.init.orthogonal_(out.weight, 0.01)  # near-uniform initial policy
        nn.init.zeros_(out.bias)
        self.body = nn.Sequential(*layers, out)
        # The critic (GRPOConfig.value_coef > 0): a value per observation, from an encoder of
        # its own ("separate", as PureJaxRL's PPO) or from the policy's ("shared").
        self.critic: nn.Sequential | None = None
        self.value_out: nn.Linear | None = None
        if critic is not None:
            value_out = nn.Linear(in_dim, 1)
            nn.init.orthogonal_(value_out.weight, 1.0)
            nn.init.zeros_(value_out.bias)
            if critic == "separate":
                self.critic = _fresh_copy(layers)
            self.value_out = value_out

    def _inputs(self, obs: Tensor) -> Tensor:
        x = obs.to(torch.float32)
        return x * self.scale if self.scale != 1.0 else x

    def _features(self, x: Tensor) -> Tensor:
        """The policy's encoder: every layer of `body` but the last."""
        for layer in self.body[:-1]:
            x = layer(x)
        return x

    def forward(self, obs: Tensor) -> Tensor:
        """Distribution parameters for a batch of observations (any stored dtype)."""
        return self.body[-1](self._features(self._inputs(obs)))

    def values(self, obs: Tensor) -> Tensor:
        """The critic's value of each observation (GRPOConfig.value_coef > 0)."""
        return self._value(self._inputs(obs), None)

    def _value(self, x: Tensor, features: Tensor | None) -> Tensor:
        """The value from the inputs `x`, or from the policy's `features` where shared."""
        if self.value_out is None:
            raise RuntimeError("this policy has no critic (GRPOConfig.value_coef is 0)")
        if self.critic is not None:
            features = self.critic(x)
        elif features is None:
            features = self._features(x)
        return self.value_out(features).squeeze(-1)

    def sample(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        return self.head.sample(self(obs), noise)

    @torch.no_grad()
    def act(
        self, obs: Tensor, *, greedy: bool = True, generator: Generator | None = None
    ) -> Tensor:
        """Env actions (Stable-Baselines3's `predict`): the most likely, or sampled."""
        params = self(obs)
        if greedy:
            return self.head.to_env(self.head.greedy(params))
        noise = self.head.noise(obs.shape[0], generator, params.device)
        return self.head.to_env(self.head.sample(params, noise)[0])

    def log_prob_entropy(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        return self.head.log_prob_entropy(self(obs), action)

    def log_prob_and_value(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """The log-prob of stored actions and the critic's value, with one pass of the
        policy's encoder (a shared critic's features are the policy's)."""
        x = self._inputs(obs)
        features = self._features(x)
        logp, _ = self.head.log_prob_entropy(self.body[-1](features), action)
        return logp, self._value(x, features)

    def update_terms(self, obs: Tensor, action: Tensor) -> Terms:
        """The update's forward: log-probs, entropies, bound penalties (None for a head
        without finite bounds, whose penalty is always 0) and values (None without a critic),
        from one pass."""
        x = self._inputs(obs)
        features = self._features(x)
        params = self.body[-1](features)
        logp, entropy = self.head.log_prob_entropy(params, action)
        penalty = self.head.bound_penalty(params) if self.head.bounded else None
        value = None if self.value_out is None else self._value(x, features)
        return logp, entropy, penalty, value


def build_policy(
    config: GRPOConfig, observation_space: gym.Space, action_space: gym.Space
) -> Policy:
    """The network a config describes: the one definition the trainer and readers share."""
    return Policy(
        observation_space,
        action_space,
        config.hidden_sizes,
        config.activation,
        config.cnn_channels,
        config.noise_correlation,
        config.logit_cap,
        config.critic if has_critic(config) else None,
    )


# Rows per slice of a no-grad pass over a whole rollout on the CPU (`AutocastPolicy`): a
# slice's float32 inputs and activations fit in cache, the whole pass's do not
# (docs/performance.md, "Figures the code relies on").
CPU_PASS_ROWS = 4096


class AutocastPolicy:
    """`policy` (and the KL `reference`, if any) under the run's autocast, as the rollout and
    the update call it: sampling, scoring stored actions, and one minibatch's loss."""

    def __init__(
        self,
        policy: Policy,
        reference: Policy | None,
        config: GRPOConfig,
        amp: str,
        device: torch.device,
    ) -> None:
        self.policy, self.reference, self.config = policy, reference, config
        self.amp, self.device = amp, device
        # A GPU takes a pass over all rows in a few launches; on the CPU the same pass goes
        # faster in slices whose inputs and activations stay in cache (`CPU_PASS_ROWS`).
        self.pass_rows = CPU_PASS_ROWS if device.type == "cpu" else None

    def _by_rows(self, fn: Callable[..., Tensor], *inputs: Tensor) -> Tensor:
        """`fn(*inputs)`, a float32 value per row, computed `pass_rows` rows at a time: the
        rows are independent, so the slices give the whole pass's values."""
        if self.pass_rows is None:
            return fn(*inputs).float()
        slices = zip(*(t.split(self.pass_rows) for t in inputs), strict=True)
        return torch.cat([fn(*part).float() for part in slices])

    def sample(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """One action per observation and its log-prob, from the given noise."""
        with autocast(self.amp, self.device):
            return self.policy.sample(obs, noise)

    @torch.no_grad()
    def values(self, rows: Tensor) -> Tensor:
        """The critic's float32 values of `(rows, B, ...)` observations, `(rows, B)`."""
        with autocast(self.amp, self.device):
            values = self._by_rows(self.policy.values, rows.flatten(0, 1))
        return values.view(rows.shape[:2])

    @torch.no_grad()
    def log_prob(self, obs: Tensor, actions: Tensor) -> Tensor:
        """The current policy's float32 log-probs of `actions`: the anchor of a clipped ratio."""
        with autocast(self.amp, self.device):
            return self._by_rows(lambda o, a: self.policy.log_prob_entropy(o, a)[0], obs, actions)

    @torch.no_grad()
    def log_prob_and_values(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """`log_prob` and the critic's values of the same rows, from one pass: a shared
        critic reads the policy's encoder, which then runs once for both, not twice."""

        def both(o: Tensor, a: Tensor) -> Tensor:
            return torch.stack([t.float() for t in self.policy.log_prob_and_value(o, a)], -1)

        with autocast(self.amp, self.device):
            logp, values = self._by_rows(both, obs, actions).unbind(-1)
        return logp, values

    def loss(
        self,
        update_terms: Any,
        obs: Tensor,
        actions: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        weights: Tensor,
        valid: Tensor,
        normaliser: Tensor,
        value_target: Tensor | None = None,
        value_weight: Tensor | None = None,
    ) -> LossTerms:
        """One minibatch's loss terms; `update_terms` is `Policy.update_terms` (DDP's, if
        any)."""
        cfg = self.config
        with autocast(self.amp, self.device):
            logp, entropy, bound_penalty, value = update_terms(obs, actions)
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
            dual_clip=cfg.dual_clip,
            kl_coef=cfg.kl_coef,
            entropy_coef=cfg.entropy_coef,
            bound_penalty=bound_penalty,
            valid=valid,
            bound_coef=cfg.mean_bound_coef,
            value=value,
            value_target=value_target,
            value_weight=value_weight,
            value_coef=cfg.value_coef,
        )
