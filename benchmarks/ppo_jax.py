"""PPO in JAX with the whole training loop compiled: the benchmark peer of our torch trainer.

It follows PureJaxRL (Chris Lu et al., https://github.com/luchris429/purejaxrl: `ppo.py`,
`ppo_continuous_action.py` and the MinAtar config of `examples/brax_minatar.ipynb`), the
usual reference for "how fast can PPO be when env and learner are one XLA program": the
rollout is a `jax.lax.scan` over a `vmap`ped gymnax env, then GAE (a reverse scan), then
epochs x shuffled minibatches of clipped-PPO updates (Schulman et al. 2017, arXiv
1707.06347), all inside one compiled function whose state is a plain pytree. Written anew
for this repository in plain JAX + optax (the network is a dict of arrays). Like PureJaxRL,
an episode's end (terminated or truncated) is treated as terminal in GAE (no bootstrapping
at a time limit), and gymnax's `env.step` resets finished games itself.

    python benchmarks/ppo_jax.py --env Breakout-MinAtar --steps 1000000 --seeds 0 1 2 \
        --name ppo_jax_breakout            # -> benchmarks/results/ppo_jax_breakout.json
    python benchmarks/ppo_jax.py --env CartPole-v1 --steps 500000 --set lr=1e-3

    from ppo_jax import train
    result = train("CartPole-v1", seed=0, total_env_steps=500_000, eval_every=100_000)

Presets, chosen by env name (`overrides` / `--set field=value` change any field):

* `classic` (discrete gymnax envs that are not MinAtar: CartPole-v1, Acrobot-v1, ...):
  `ppo.py`'s CartPole config: 4 envs x 128 steps, lr 2.5e-4 annealed, 4 epochs x 4
  minibatches, tanh, 64 units. PureJaxRL published it for CartPole only; the other
  classic envs get it unchanged.
* `minatar` (`*-MinAtar`): the notebook's config, "briefly tuned on Gymnax's MinAtar
  environments" (its example env is SpaceInvaders-MinAtar): 64 envs x 128 steps, lr 5e-3
  annealed, 4 epochs x 8 minibatches, relu, 64 units, the same MLP on the flattened
  (10, 10, C) image (PureJaxRL uses no CNN there either).
* `continuous` (Box action spaces: Pendulum-v1, MountainCarContinuous-v0):
  `ppo_continuous_action.py`'s config: 2048 envs x 10 steps, lr 3e-4 constant, 4 epochs
  x 32 minibatches, ent_coef 0, tanh, 256 units, running observation and reward
  normalisation, a Gaussian with a state-independent log-std, actions clipped to the
  space's bounds when stepping. PureJaxRL published it for Brax (hopper), not for gymnax's
  continuous envs; it is the only continuous setting PureJaxRL publishes, so it is used
  unchanged rather than a setting of our own invention.

All presets share gamma 0.99, GAE lambda 0.95, clip 0.2, vf_coef 0.5, max grad norm 0.5,
Adam eps 1e-5, orthogonal init (sqrt 2 hidden, 0.01 policy head, 1.0 value head).

Timing is honest: training runs as a compiled function doing `chunk` updates, called
repeatedly; compile time (ahead of time, `jit(...).lower(...).compile()`) is reported apart
from `train_s`, the wall time of the chunk calls alone, and evaluation (greedy, and by
sampling the policy) is timed apart too. The PRNG key lives in the state, so a seed gives
bit-identical results whatever the chunk size. `--threads 1` (the default) sets XLA_FLAGS
before jax is imported, so XLA runs on one core, as our torch benchmarks run with one torch
thread.
"""

from __future__ import annotations

import os
import sys

THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def _threads_from_argv(argv: list[str]) -> int:
    """`--threads N` read before argparse runs, because XLA reads its flags once, at start."""
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--threads=") else None
        if arg == "--threads" and i + 1 < len(argv):
            value = argv[i + 1]
        if value is not None:
            return int(value) if value.lstrip("-").isdigit() else 1  # argparse reports it
    return 1


if __name__ == "__main__" and _threads_from_argv(sys.argv[1:]) == 1:
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {THREAD_FLAGS}".strip()

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from importlib.metadata import version  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, NamedTuple  # noqa: E402

import gymnax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from gymnax.environments import spaces  # noqa: E402

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """PPO's hyper-parameters, named as PureJaxRL names them (lower case)."""

    num_envs: int
    num_steps: int
    lr: float
    anneal_lr: bool
    update_epochs: int
    num_minibatches: int
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    activation: str = "tanh"
    hidden: int = 64
    normalize_env: bool = False

    @property
    def batch(self) -> int:
        """Env steps per update."""
        return self.num_envs * self.num_steps


PRESETS: dict[str, PPOConfig] = {
    "classic": PPOConfig(
        num_envs=4, num_steps=128, lr=2.5e-4, anneal_lr=True, update_epochs=4, num_minibatches=4
    ),
    "minatar": PPOConfig(
        num_envs=64,
        num_steps=128,
        lr=5e-3,
        anneal_lr=True,
        update_epochs=4,
        num_minibatches=8,
        activation="relu",
    ),
    "continuous": PPOConfig(
        num_envs=2048,
        num_steps=10,
        lr=3e-4,
        anneal_lr=False,
        update_epochs=4,
        num_minibatches=32,
        ent_coef=0.0,
        hidden=256,
        normalize_env=True,
    ),
}


def make_env(env_name: str) -> tuple[Any, Any]:
    """gymnax's env and default params, or a ValueError naming the envs there are."""
    if env_name not in gymnax.registered_envs:
        known = ", ".join(gymnax.registered_envs)
        raise ValueError(f"unknown gymnax env {env_name!r}; known: {known}")
    return gymnax.make(env_name)


def preset_name(env_name: str) -> str:
    """Which preset an env gets: MinAtar by name, continuous by its action space."""
    env, env_params = make_env(env_name)
    if env_name.endswith("-MinAtar"):
        return "minatar"
    if isinstance(env.action_space(env_params), spaces.Box):
        return "continuous"
    return "classic"


def make_config(env_name: str, overrides: dict[str, Any] | None = None) -> PPOConfig:
    """The env's preset with `overrides` applied; unknown fields and bad values raise."""
    config = PRESETS[preset_name(env_name)]
    fields = {f.name: f for f in dataclasses.fields(PPOConfig)}
    changes: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        name = key.lower()
        if name not in fields:
            raise ValueError(f"unknown PPO field {key!r}; fields: {', '.join(fields)}")
        changes[name] = _coerce(name, value, type(getattr(config, name)))
    config = dataclasses.replace(config, **changes)
    _check(config)
    return config


def _coerce(name: str, value: Any, kind: type) -> Any:
    """`value` as the field's type; strings (from the command line) are parsed."""
    if isinstance(value, str):
        if kind is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{name} must be true or false, not {value!r}")
            return value.lower() in ("true", "1")
        try:
            return kind(value)
        except ValueError:
            raise ValueError(f"{name} must be a {kind.__name__}, not {value!r}") from None
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise ValueError(f"{name} must be a {kind.__name__}, not {value!r}")
    return value


def _check(config: PPOConfig) -> None:
    for name in ("num_envs", "num_steps", "update_epochs", "num_minibatches", "hidden"):
        if getattr(config, name) <= 0:
            raise ValueError(f"{name} must be positive, not {getattr(config, name)}")
    if config.batch % config.num_minibatches:
        raise ValueError(
            f"num_envs * num_steps ({config.batch}) must divide into "
            f"num_minibatches ({config.num_minibatches})"
        )
    if config.activation not in ("tanh", "relu"):
        raise ValueError(f"activation must be tanh or relu, not {config.activation!r}")
    if not config.lr > 0:
        raise ValueError(f"lr must be positive, not {config.lr}")


# ---------------------------------------------------------------- the compiled program


class Spec(NamedTuple):
    """What the program needs to know of the env (static: it shapes the compiled code)."""

    env: Any
    env_params: Any
    obs_dim: int
    discrete: bool
    act_dim: int  # actions (discrete) or action components (continuous)
    low: Any
    high: Any


def make_spec(env_name: str) -> Spec:
    env, env_params = make_env(env_name)
    space = env.action_space(env_params)
    obs_dim = math.prod(env.observation_space(env_params).shape)
    if isinstance(space, spaces.Discrete):
        return Spec(env, env_params, obs_dim, True, int(space.n), None, None)
    if isinstance(space, spaces.Box):
        low = np.broadcast_to(np.asarray(space.low, np.float32), space.shape)
        high = np.broadcast_to(np.asarray(space.high, np.float32), space.shape)
        return Spec(env, env_params, obs_dim, False, math.prod(space.shape), low, high)
    raise ValueError(f"{env_name}: action space {type(space).__name__} is not supported")


class Norm(NamedTuple):
    """Running statistics for observation and reward normalisation (`normalize_env`)."""

    obs_mean: jax.Array
    obs_var: jax.Array
    obs_count: jax.Array
    ret: jax.Array  # each env's discounted return so far, whose spread scales rewards
    ret_var: jax.Array
    ret_mean: jax.Array
    ret_count: jax.Array


class Runner(NamedTuple):
    """Everything that changes during training, one pytree carried through the chunks."""

    params: Params
    opt_state: Any
    env_state: Any
    obs: jax.Array  # what the policy sees (normalised when normalize_env)
    ep_return: jax.Array  # each env's undiscounted return of the running episode
    last_return: jax.Array  # each env's last finished episode's return (NaN before one)
    norm: Norm
    key: jax.Array


class Transition(NamedTuple):
    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    done: jax.Array


def _merge_stats(
    mean: jax.Array, var: jax.Array, count: jax.Array, batch: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Running mean and variance updated with a batch (Chan et al.'s parallel formula)."""
    n = batch.shape[0]
    b_mean, b_var = batch.mean(0), batch.var(0)
    delta = b_mean - mean
    total = count + n
    new_var = (var * count + b_var * n + delta**2 * count * n / total) / total
    return mean + delta * n / total, new_var, total


def _init_params(key: jax.Array, spec: Spec, config: PPOConfig) -> Params:
    """Separate actor and critic MLPs, two hidden layers, PureJaxRL's orthogonal init."""

    def mlp(key: jax.Array, sizes: list[int], head_scale: float) -> list[dict[str, jax.Array]]:
        layers = []
        keys = jax.random.split(key, len(sizes) - 1)
        for i, (k, n_in, n_out) in enumerate(zip(keys, sizes[:-1], sizes[1:], strict=True)):
            scale = head_scale if i == len(sizes) - 2 else math.sqrt(2.0)
            w = jax.nn.initializers.orthogonal(scale)(k, (n_in, n_out), jnp.float32)
            layers.append({"w": w, "b": jnp.zeros(n_out, jnp.float32)})
        return layers

    k_actor, k_critic = jax.random.split(key)
    h = config.hidden
    params: Params = {
        "actor": mlp(k_actor, [spec.obs_dim, h, h, spec.act_dim], 0.01),
        "critic": mlp(k_critic, [spec.obs_dim, h, h, 1], 1.0),
    }
    if not spec.discrete:
        params["log_std"] = jnp.zeros(spec.act_dim, jnp.float32)
    return params


def _forward(params: Params, obs: jax.Array, activation: str) -> tuple[jax.Array, jax.Array]:
    """Policy output (logits or Gaussian mean) and value for a batch of observations."""
    act = jnp.tanh if activation == "tanh" else jax.nn.relu

    def mlp(layers: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
        for layer in layers[:-1]:
            x = act(x @ layer["w"] + layer["b"])
        return x @ layers[-1]["w"] + layers[-1]["b"]

    return mlp(params["actor"], obs), mlp(params["critic"], obs)[..., 0]


def _log_prob(spec: Spec, params: Params, out: jax.Array, action: jax.Array) -> jax.Array:
    if spec.discrete:
        logp = jax.nn.log_softmax(out)
        return jnp.take_along_axis(logp, action[..., None], axis=-1)[..., 0]
    log_std = params["log_std"]
    z = (action - out) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi), axis=-1)


def _entropy(spec: Spec, params: Params, out: jax.Array) -> jax.Array:
    if spec.discrete:
        logp = jax.nn.log_softmax(out)
        return -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    per_dim = params["log_std"] + 0.5 * math.log(2 * math.pi * math.e)
    return jnp.broadcast_to(jnp.sum(per_dim), out.shape[:-1])


def _sample(spec: Spec, params: Params, out: jax.Array, key: jax.Array) -> jax.Array:
    if spec.discrete:
        return jax.random.categorical(key, out)
    return out + jnp.exp(params["log_std"]) * jax.random.normal(key, out.shape)


def _greedy(spec: Spec, out: jax.Array) -> jax.Array:
    return jnp.argmax(out, axis=-1) if spec.discrete else out


def _env_action(spec: Spec, action: jax.Array) -> jax.Array:
    """The action the env gets: Gaussian samples are clipped to the space's bounds."""
    return action if spec.discrete else jnp.clip(action, spec.low, spec.high)


def _flat(spec: Spec, obs: jax.Array) -> jax.Array:
    return obs.reshape(obs.shape[0], spec.obs_dim).astype(jnp.float32)


class Program(NamedTuple):
    """The pure functions of one (env, config, budget): compiled once, called per seed."""

    init: Callable[[jax.Array], Runner]
    chunk: Callable[[Runner, int], tuple[Runner, tuple[jax.Array, jax.Array]]]
    evaluate: Callable[[Params, Norm, jax.Array, int, bool], jax.Array]


def make_program(spec: Spec, config: PPOConfig, num_updates: int) -> Program:
    """Build init, chunk (`n` whole PPO updates) and evaluation for one setting."""
    env, env_params = spec.env, spec.env_params
    n_envs, n_mb = config.num_envs, config.num_minibatches
    v_reset = jax.vmap(env.reset, in_axes=(0, None))
    v_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def schedule(count: jax.Array) -> jax.Array:
        # PureJaxRL's linear anneal: constant within an update, to 0 after the last one
        done_updates = count // (n_mb * config.update_epochs)
        return config.lr * (1.0 - done_updates / num_updates)

    optimizer = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adam(schedule if config.anneal_lr else config.lr, eps=1e-5),
    )

    def observe(norm: Norm, raw: jax.Array) -> tuple[Norm, jax.Array]:
        """Update the observation statistics with a batch and normalise it (if enabled)."""
        if not config.normalize_env:
            return norm, raw
        mean, var, count = _merge_stats(norm.obs_mean, norm.obs_var, norm.obs_count, raw)
        norm = norm._replace(obs_mean=mean, obs_var=var, obs_count=count)
        return norm, (raw - mean) / jnp.sqrt(var + 1e-8)

    def scale_reward(norm: Norm, reward: jax.Array, done: jax.Array) -> tuple[Norm, jax.Array]:
        """Divide rewards by the running spread of discounted returns (if enabled)."""
        if not config.normalize_env:
            return norm, reward
        ret = norm.ret * config.gamma + reward
        mean, var, count = _merge_stats(norm.ret_mean, norm.ret_var, norm.ret_count, ret)
        norm = norm._replace(ret=jnp.where(done, 0.0, ret), ret_mean=mean, ret_var=var)
        return norm._replace(ret_count=count), reward / jnp.sqrt(var + 1e-8)

    def init(key: jax.Array) -> Runner:
        k_params, k_reset, key = jax.random.split(key, 3)
        params = _init_params(k_params, spec, config)
        raw, env_state = v_reset(jax.random.split(k_reset, n_envs), env_params)
        one = jnp.ones((), jnp.float32)
        norm = Norm(
            obs_mean=jnp.zeros(spec.obs_dim),
            obs_var=jnp.ones(spec.obs_dim),
            obs_count=1e-4 * one,
            ret=jnp.zeros(n_envs),
            ret_var=one,
            ret_mean=0.0 * one,
            ret_count=1e-4 * one,
        )
        norm, obs = observe(norm, _flat(spec, raw))
        zeros = jnp.zeros(n_envs, jnp.float32)
        return Runner(
            params, optimizer.init(params), env_state, obs, zeros, zeros + jnp.nan, norm, key
        )

    def env_step(runner: Runner, _: None) -> tuple[Runner, tuple[Transition, jax.Array, jax.Array]]:
        key, k_act, k_env = jax.random.split(runner.key, 3)
        out, value = _forward(runner.params, runner.obs, config.activation)
        action = _sample(spec, runner.params, out, k_act)
        log_prob = _log_prob(spec, runner.params, out, action)
        keys = jax.random.split(k_env, n_envs)
        raw, env_state, reward, terminated, truncated, _ = v_step(
            keys, runner.env_state, _env_action(spec, action), env_params
        )
        done = jnp.logical_or(terminated, truncated)
        ep_return = runner.ep_return + reward
        finished_sum = jnp.sum(jnp.where(done, ep_return, 0.0))
        last_return = jnp.where(done, ep_return, runner.last_return)
        norm, obs = observe(runner.norm, _flat(spec, raw))
        norm, train_reward = scale_reward(norm, reward, done)
        step = Transition(runner.obs, action, log_prob, value, train_reward, done)
        runner = Runner(
            runner.params,
            runner.opt_state,
            env_state,
            obs,
            jnp.where(done, 0.0, ep_return),
            last_return,
            norm,
            key,
        )
        return runner, (step, finished_sum, jnp.sum(done))

    def gae(traj: Transition, last_value: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Generalised advantage estimates and value targets, by a reverse scan."""

        def back(
            carry: tuple[jax.Array, jax.Array], t: Transition
        ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
            adv, next_value = carry
            alive = 1.0 - t.done
            delta = t.reward + config.gamma * next_value * alive - t.value
            adv = delta + config.gamma * config.gae_lambda * alive * adv
            return (adv, t.value), adv

        start = (jnp.zeros_like(last_value), last_value)
        _, advantages = jax.lax.scan(back, start, traj, reverse=True)
        return advantages, advantages + traj.value

    def loss_fn(params: Params, batch: tuple[Transition, jax.Array, jax.Array]) -> jax.Array:
        traj, advantages, targets = batch
        out, value = _forward(params, traj.obs, config.activation)
        log_prob = _log_prob(spec, params, out, traj.action)
        clipped_value = traj.value + jnp.clip(value - traj.value, -config.clip_eps, config.clip_eps)
        value_loss = 0.5 * jnp.mean(
            jnp.maximum((value - targets) ** 2, (clipped_value - targets) ** 2)
        )
        adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        ratio = jnp.exp(log_prob - traj.log_prob)
        clipped_ratio = jnp.clip(ratio, 1.0 - config.clip_eps, 1.0 + config.clip_eps)
        policy_loss = -jnp.mean(jnp.minimum(ratio * adv, clipped_ratio * adv))
        entropy = jnp.mean(_entropy(spec, params, out))
        return policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy

    def minibatch_step(
        state: tuple[Params, Any], batch: tuple[Transition, jax.Array, jax.Array]
    ) -> tuple[tuple[Params, Any], None]:
        params, opt_state = state
        grads = jax.grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), None

    def update(runner: Runner, _: None) -> tuple[Runner, tuple[jax.Array, jax.Array]]:
        runner, (traj, ep_sums, ep_counts) = jax.lax.scan(env_step, runner, None, config.num_steps)
        _, last_value = _forward(runner.params, runner.obs, config.activation)
        advantages, targets = gae(traj, last_value)
        flat = jax.tree.map(
            lambda x: x.reshape(config.batch, *x.shape[2:]), (traj, advantages, targets)
        )

        def epoch(
            carry: tuple[Params, Any, jax.Array], _: None
        ) -> tuple[tuple[Params, Any, jax.Array], None]:
            params, opt_state, key = carry
            key, k_perm = jax.random.split(key)
            order = jax.random.permutation(k_perm, config.batch)
            minibatches = jax.tree.map(
                lambda x: x[order].reshape(n_mb, config.batch // n_mb, *x.shape[1:]), flat
            )
            (params, opt_state), _ = jax.lax.scan(minibatch_step, (params, opt_state), minibatches)
            return (params, opt_state, key), None

        carry = (runner.params, runner.opt_state, runner.key)
        (params, opt_state, key), _ = jax.lax.scan(epoch, carry, None, config.update_epochs)
        runner = runner._replace(params=params, opt_state=opt_state, key=key)
        return runner, (ep_sums.sum(), ep_counts.sum())

    def chunk(runner: Runner, n: int) -> tuple[Runner, tuple[jax.Array, jax.Array]]:
        """`n` PPO updates; per update, the sum and count of finished episodes' returns."""
        return jax.lax.scan(update, runner, None, n)

    def evaluate(
        params: Params, norm: Norm, key: jax.Array, episodes: int, greedy: bool = True
    ) -> jax.Array:
        """Undiscounted return of `episodes` games in parallel, each counted up to its first
        end, played greedily (argmax / Gaussian mean) or by sampling the policy as it trains
        (`greedy=False`); observation statistics are frozen."""
        k_reset, key = jax.random.split(key)
        raw, env_state = v_reset(jax.random.split(k_reset, episodes), env_params)
        zeros = jnp.zeros(episodes, jnp.float32)
        ended = jnp.zeros(episodes, bool)

        def normalise(raw: jax.Array) -> jax.Array:
            obs = _flat(spec, raw)
            if config.normalize_env:
                obs = (obs - norm.obs_mean) / jnp.sqrt(norm.obs_var + 1e-8)
            return obs

        def running(carry: tuple[Any, ...]) -> jax.Array:
            return jnp.logical_not(jnp.all(carry[3]))

        def body(carry: tuple[Any, ...]) -> tuple[Any, ...]:
            env_state, obs, total, ended, key = carry
            key, k_env = jax.random.split(key)  # the greedy games as before sampling came
            out, _ = _forward(params, obs, config.activation)
            if greedy:
                chosen = _greedy(spec, out)
            else:
                chosen = _sample(spec, params, out, jax.random.fold_in(k_env, 1))
            action = _env_action(spec, chosen)
            raw, env_state, reward, terminated, truncated, _ = v_step(
                jax.random.split(k_env, episodes), env_state, action, env_params
            )
            total = total + jnp.where(ended, 0.0, reward)
            ended = ended | terminated | truncated
            return env_state, normalise(raw), total, ended, key

        carry = (env_state, normalise(raw), zeros, ended, key)
        return jax.lax.while_loop(running, body, carry)[2]

    return Program(init, chunk, evaluate)


# ---------------------------------------------------------------- the timed driver

_COMPILED: dict[tuple[Any, ...], Any] = {}


def _compiled(cache_key: tuple[Any, ...], fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """`fn` compiled ahead of time for `args` (once per process), and the seconds it took."""
    if cache_key in _COMPILED:
        return _COMPILED[cache_key], 0.0
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    _COMPILED[cache_key] = compiled
    return compiled, time.perf_counter() - t0


def train(
    env_name: str,
    seed: int,
    total_env_steps: int,
    *,
    eval_every: int | None = None,
    eval_episodes: int = 32,
    overrides: dict[str, Any] | None = None,
    chunk_env_steps: int | None = None,
) -> dict[str, Any]:
    """Train PPO on a gymnax env for `total_env_steps` (rounded down to whole updates).

    Returns the config, a curve with one row per chunk (env steps, training seconds so far,
    mean return of the training episodes finished in that chunk, and a greedy and a sampled
    evaluation where one was due), `final_train_return` (the mean over envs of each env's
    last finished training episode, PureJaxRL's `returned_episode_returns` at the end),
    `final_eval_return` (greedy, `eval_episodes` games; None when 0) and
    `final_eval_sampled_return` (the same games, actions sampled), `compile_s`, `train_s`,
    `eval_s` and env steps per second of training. Chunks default to `eval_every` env
    steps, else about a twentieth of the budget. Functions compiled in this process are
    reused (compile_s 0).
    """
    if isinstance(total_env_steps, bool) or not isinstance(total_env_steps, int):
        raise ValueError(f"total_env_steps must be an int, not {total_env_steps!r}")
    if total_env_steps <= 0:
        raise ValueError(f"total_env_steps must be positive, not {total_env_steps}")
    for name, value in (("eval_every", eval_every), ("chunk_env_steps", chunk_env_steps)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be positive or None, not {value}")
    if eval_episodes < 0:
        raise ValueError(f"eval_episodes must be 0 or more, not {eval_episodes}")
    config = make_config(env_name, overrides)
    num_updates = total_env_steps // config.batch
    if num_updates == 0:
        raise ValueError(
            f"total_env_steps {total_env_steps} is less than one update "
            f"(num_envs * num_steps = {config.batch})"
        )
    spec = make_spec(env_name)
    per_chunk = chunk_env_steps or eval_every or max(config.batch, total_env_steps // 20)
    chunk_updates = min(num_updates, max(1, round(per_chunk / config.batch)))
    program = make_program(spec, config, num_updates)
    base = (env_name, config, num_updates)

    root = jax.random.key(seed)
    train_key = jax.random.fold_in(root, 0)
    init, compile_s = _compiled((*base, "init"), jax.jit(program.init), train_key)
    t0 = time.perf_counter()
    runner = jax.block_until_ready(init(train_key))
    setup_s = time.perf_counter() - t0
    sizes = {chunk_updates, num_updates % chunk_updates} - {0}
    chunks: dict[int, Any] = {}
    for n in sorted(sizes):
        fn = jax.jit(program.chunk, static_argnums=1)
        chunks[n], seconds = _compiled((*base, "chunk", n), fn, runner, n)
        compile_s += seconds
    eval_key = jax.random.fold_in(root, 1)
    evaluators: dict[bool, Any] = {}  # greedy (True) and sampled (False) play
    eval_compile_s = 0.0
    for greedy in (True, False) if eval_episodes else ():
        fn = jax.jit(program.evaluate, static_argnums=(3, 4))
        args = (runner.params, runner.norm, eval_key, eval_episodes, greedy)
        evaluators[greedy], seconds = _compiled((*base, "eval", eval_episodes, greedy), fn, *args)
        eval_compile_s += seconds
    evaluate = evaluators.get(True)

    def returns() -> tuple[float, float, float]:
        """The greedy and the sampled mean return, and the seconds both took."""
        t = time.perf_counter()
        means = [
            float(np.asarray(evaluators[g](runner.params, runner.norm, eval_key)).mean())
            for g in (True, False)
        ]
        return means[0], means[1], time.perf_counter() - t

    curve: list[dict[str, Any]] = []
    train_s = train_cpu_s = eval_s = 0.0
    done_updates = 0
    eval_mark = 0
    while done_updates < num_updates:
        n = min(chunk_updates, num_updates - done_updates)
        w0, c0 = time.perf_counter(), time.process_time()
        runner, (sums, counts) = chunks[n](runner)
        sums, counts = jax.device_get((sums, counts))  # waits for the chunk to finish
        train_s += time.perf_counter() - w0
        train_cpu_s += time.process_time() - c0
        done_updates += n
        steps = done_updates * config.batch
        episodes = int(counts.sum())
        row: dict[str, Any] = {
            "env_steps": steps,
            "train_s": round(train_s, 4),
            "episodes": episodes,
            "train_return": float(sums.sum() / episodes) if episodes else None,
        }
        last = done_updates == num_updates
        if evaluate is not None and eval_every and (steps // eval_every > eval_mark or last):
            eval_mark = steps // eval_every
            row["eval_return"], row["eval_return_sampled"], seconds = returns()
            eval_s += seconds
        curve.append(row)

    final_eval = curve[-1].get("eval_return")
    final_sampled = curve[-1].get("eval_return_sampled")
    if evaluate is not None and final_eval is None:
        final_eval, final_sampled, seconds = returns()
        eval_s += seconds
    last_returns = np.asarray(runner.last_return)
    finished = ~np.isnan(last_returns)
    env_steps = num_updates * config.batch
    return {
        "env": env_name,
        "seed": seed,
        "preset": preset_name(env_name),
        "config": dataclasses.asdict(config),
        "env_steps": env_steps,
        "updates": num_updates,
        "chunk_updates": chunk_updates,
        "curve": curve,
        "final_train_return": float(last_returns[finished].mean()) if finished.any() else None,
        "final_eval_return": final_eval,
        "final_eval_sampled_return": final_sampled,
        "eval_episodes": eval_episodes,
        "setup_s": round(setup_s, 4),
        "compile_s": round(compile_s, 4),
        "eval_compile_s": round(eval_compile_s, 4),
        "train_s": round(train_s, 4),
        "train_cpu_s": round(train_cpu_s, 4),
        "eval_s": round(eval_s, 4),
        "env_steps_per_s": round(env_steps / train_s, 1),
    }


# ---------------------------------------------------------------- command line


def _software() -> dict[str, Any]:
    return {
        "jax": jax.__version__,
        "jaxlib": version("jaxlib"),
        "optax": optax.__version__,
        "gymnax": version("gymnax"),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "jax_devices": [str(d) for d in jax.devices()],
    }


def _parse_sets(items: list[str]) -> dict[str, str]:
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set wants field=value, not {item!r}")
        overrides[key] = value
    return overrides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1", help="a gymnax env name")
    parser.add_argument("--steps", type=int, default=500_000, help="env steps per seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--name", default=None, help="results/<name>.json (default: none)")
    parser.add_argument("--eval-every", type=int, default=None, help="env steps")
    parser.add_argument("--eval-episodes", type=int, default=32)
    parser.add_argument("--chunk-steps", type=int, default=None, help="env steps per chunk")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument(
        "--threads", type=int, default=1, choices=[0, 1], help="1: one core; 0: XLA's default"
    )
    args = parser.parse_args(argv)
    overrides = _parse_sets(args.set)
    try:
        make_config(args.env, overrides)
    except ValueError as error:
        parser.error(str(error))
    runs = []
    for seed in args.seeds:
        run = train(
            args.env,
            seed,
            args.steps,
            eval_every=args.eval_every,
            eval_episodes=args.eval_episodes,
            overrides=overrides,
            chunk_env_steps=args.chunk_steps,
        )
        runs.append(run)
        print(
            f"{args.env} seed {seed}: {run['env_steps']:,} env steps, "
            f"train return {_fmt(run['final_train_return'])}, "
            f"greedy {_fmt(run['final_eval_return'])}, "
            f"sampled {_fmt(run['final_eval_sampled_return'])}, train {run['train_s']:.1f} s "
            f"({run['env_steps_per_s']:,.0f} steps/s), compile {run['compile_s']:.1f} s"
        )
    if args.name:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _common import machine_info, write_result

        summary = {
            key: _spread([r[key] for r in runs])
            for key in (
                "final_train_return",
                "final_eval_return",
                "final_eval_sampled_return",
                "train_s",
                "compile_s",
            )
        }
        payload = {
            "machine": {**machine_info(), **_software(), "threads": args.threads},
            "env": args.env,
            "steps": args.steps,
            "seeds": args.seeds,
            "overrides": overrides,
            "summary": summary,
            "runs": runs,
        }
        print(f"wrote {write_result(args.name, payload)}")
    return 0


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _spread(values: list[float | None]) -> dict[str, float] | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    return {
        "mean": statistics.fmean(known),
        "median": statistics.median(known),
        "min": min(known),
        "max": max(known),
    }


if __name__ == "__main__":
    raise SystemExit(main())
