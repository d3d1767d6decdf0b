"""The suite's tasks: each env, its budget and threshold, and how the peers run it.

`benchmarks/suite.py` runs studies over them; `benchmarks/suite_runs.py` runs one of them in a
worker process. Only the standard library at import: a worker pins itself before torch or
JAX start (`missing_env`, which the parent calls, imports Gymnasium when called).
"""

from __future__ import annotations

import dataclasses
from typing import Any

PEER = "ppo_jax"  # MinAtar's threshold: this trainer's median final greedy return
TRAINERS = {"grpo": "GRPO", "ppo_jax": "PPO (JAX)", "sb3": "SB3 PPO"}
EVAL_EPISODES = 100
EVAL_POINTS = 10  # greedy evaluations per run: every tenth of the budget
EVAL_SEED = 100_000  # seed + 1000 * run seed: the games every evaluation of a run plays
MAX_EVAL_ENVS = 1024  # sub-envs of an eval env; more episodes are played in rounds
# The PPO peer's median final greedy return at 1M env steps, seeds 0-2, 32 greedy games
# (`python benchmarks/ppo_jax.py --env Breakout-MinAtar --steps 1000000 --seeds 0 1 2
# --eval-every 250000`, 2026-11-25): the threshold when a study did not run the peer.
BREAKOUT_PEER_RETURN = 25.19
FREEWAY_PEER_RETURN = 22.56
FALLBACK_SOURCE = f"constant: {PEER}'s median final greedy return at 1M steps, 2026-11-25"
# Where the run goes, not what it learns: every GRPO row's flags start with `--device`
# (the study's, "cpu" by default) and these.
RUN_FLAGS = ("--no-progress", "--eval-every", "0")


@dataclasses.dataclass(frozen=True)
class Linear:
    """RL-Zoo's `lin_X`: a value that falls linearly from `start` to 0 over training (SB3
    calls it with the progress remaining, 1 to 0)."""

    start: float

    def __call__(self, progress_remaining: float) -> float:
        return progress_remaining * self.start


@dataclasses.dataclass(frozen=True)
class SB3:
    """How SB3 PPO runs a task: RL-Zoo's hyper-parameters (hyperparams/ppo.yml)."""

    env: str
    hyper: dict[str, Any] = dataclasses.field(default_factory=dict)  # with n_envs
    normalize: bool = False  # RL-Zoo's `normalize: true` (VecNormalize)
    minatar: bool = False  # a MinAtar game: register it, flatten its planes


@dataclasses.dataclass(frozen=True)
class Task:
    """One suite task: GRPO's env, the budget and threshold every trainer gets, the peers'."""

    env: str  # GRPO's env (--env): the JAX peer's own where gymnax has the task (_classic)
    budget: int  # env steps per run
    threshold: float | str  # a value, or PEER
    metric: str = "return"  # or "catch_rate"
    gymnax: str | None = None  # the PPO peer's env, where gymnax has it
    sb3: SB3 | None = None
    fallback: float | None = None  # the threshold when it is PEER and the peer did not run

    def env_for(self, kind: str) -> str | None:
        """The env id a trainer of `kind` (grpo, ppo_jax, sb3) runs; None: it has none."""
        envs = {"grpo": self.env, "ppo_jax": self.gymnax, "sb3": self.sb3 and self.sb3.env}
        return envs[kind]


# RL-Zoo's hyper-parameters. MountainCarContinuous: RL-Zoo trains it for 20k steps (one env,
# 8 steps per rollout, 10 epochs), so SB3 plays about 100 env steps/s here and the suite's 1M
# takes hours per seed.
ZOO = {
    "cartpole": dict(
        n_envs=8,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=Linear(1e-3),
        clip_range=Linear(0.2),
    ),
    "acrobot": dict(n_envs=16, n_steps=256, gae_lambda=0.94, gamma=0.99, n_epochs=4, ent_coef=0.0),
    "pendulum": dict(
        n_envs=4,
        n_steps=1024,
        gae_lambda=0.95,
        gamma=0.9,
        n_epochs=10,
        ent_coef=0.0,
        learning_rate=1e-3,
        clip_range=0.2,
        use_sde=True,
        sde_sample_freq=4,
    ),
    "lunarlander": dict(
        n_envs=16,
        n_steps=1024,
        batch_size=64,
        gae_lambda=0.98,
        gamma=0.999,
        n_epochs=4,
        ent_coef=0.01,
    ),
    "mountaincar": dict(
        n_envs=1,
        batch_size=256,
        n_steps=8,
        gamma=0.9999,
        learning_rate=7.77e-05,
        ent_coef=0.00429,
        clip_range=0.1,
        n_epochs=10,
        gae_lambda=0.9,
        max_grad_norm=5,
        vf_coef=0.19,
        use_sde=True,
        policy_kwargs=dict(log_std_init=-3.29, ortho_init=False),
    ),
}


def _classic(env_id: str, budget: int, threshold: float, sb3: SB3) -> Task:
    """A classic-control task that gymnax has: GRPO plays gymnax's jitted env, as the JAX
    peer does, so that on equal seconds the two learners meet on one implementation of the
    game. Gymnasium's Python envs gave GRPO a fraction of the peer's env steps in the same
    seconds (Acrobot: 3.5k/s, docs/trainer.md, "Every suite task with the defaults"); SB3
    keeps them, as its own package does."""
    return Task(f"gymnax:{env_id}", budget, threshold, gymnax=env_id, sb3=sb3)


def _minatar(game: str, fallback: float | None = None) -> Task:
    """A MinAtar game: the kit's torch game (gymnax's rules, `import fruit_env` registers
    it) for GRPO, gymnax's for the JAX peer, the minatar package's for SB3."""
    return Task(
        f"fruit_env:{game}-MinAtar-v0",
        1_000_000,
        PEER,
        gymnax=f"{game}-MinAtar",
        sb3=SB3(f"MinAtar/{game}-v1", {"n_envs": 8}, minatar=True),
        fallback=fallback,
    )


# fmt: off
TASKS: dict[str, Task] = {
    # name:        GRPO's env, budget, threshold, ...
    "fruit":       Task("fruit_env:FruitCatcher-v0", 2_500_000, 0.70, metric="catch_rate"),
    "cartpole":    _classic("CartPole-v1", 500_000, 475.0, SB3("CartPole-v1", ZOO["cartpole"])),
    "acrobot":     _classic("Acrobot-v1", 300_000, -100.0,
                            SB3("Acrobot-v1", ZOO["acrobot"], normalize=True)),
    "pendulum":    _classic("Pendulum-v1", 1_000_000, -200.0,
                            SB3("Pendulum-v1", ZOO["pendulum"])),
    "lunarlander": Task("LunarLander-v3", 2_000_000, 200.0,
                        sb3=SB3("LunarLander-v3", ZOO["lunarlander"])),
    # a deceptive reward: doing nothing (0) beats failing to reach the flag (a cost per push)
    "mountaincar": _classic("MountainCarContinuous-v0", 1_000_000, 90.0,
                            SB3("MountainCarContinuous-v0", ZOO["mountaincar"], normalize=True)),
    "breakout":    _minatar("Breakout", BREAKOUT_PEER_RETURN),
    "freeway":     _minatar("Freeway", FREEWAY_PEER_RETURN),
    # outside the set the defaults were chosen on: do they transfer?
    "asterix":     _minatar("Asterix"),
    "space_invaders": _minatar("SpaceInvaders"),
}
# fmt: on


def eval_marks(budget: int, every: int | None = None) -> list[int]:
    """The env steps after which the greedy policy is evaluated (the first update at or past
    each is evaluated; the last mark is the budget): every tenth of it, or every `every`."""
    if every:
        return [*range(every, budget, every), budget]
    return [max(1, round(budget * k / EVAL_POINTS)) for k in range(1, EVAL_POINTS + 1)]


def grpo_argv(
    task: Task,
    budget: int,
    seed: int,
    flags: tuple[str, ...] | list[str],
    device: str = "cpu",
) -> list[str]:
    """The train command a GRPO row runs: the task's env, budget, seed and the study's
    device, then the row's flags (which may override any of them)."""
    head = ["train", "--env", task.env, "--total-env-steps", str(budget), "--seed", str(seed)]
    return [*head, "--device", device, *RUN_FLAGS, *flags]


def missing_env(env_id: str) -> str | None:
    """Why GRPO cannot make `env_id`, a `module:EnvId` Gymnasium id (None: it can, or the id
    is another kind, which the train command checks itself): its module does not import, or
    importing it registers no such id. Checked before a study starts, so that a game not yet
    written stops the study with its name rather than failing every run."""
    module, _, name = env_id.rpartition(":")
    if not module or module in {"gymnax", "envpool", "minatar"}:  # grpo_trainer's factories
        return None
    import importlib

    import gymnasium as gym

    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        return f"{env_id}: module {module!r} does not import ({err})"
    if name not in gym.registry:
        return f"{env_id}: importing {module} registers no {name!r}"
    return None


def skip_reason(task: Task, kind: str, throughput: bool = False) -> str | None:
    """Why a row of `kind` does not run `task` (None: it does)."""
    if throughput and kind != "grpo":
        return "--throughput measures the GRPO rows"
    if kind == "ppo_jax" and task.gymnax is None:
        return f"gymnax has no {task.env}"
    if kind == "sb3" and task.sb3 is None:
        return "no RL-Zoo settings"
    return None
