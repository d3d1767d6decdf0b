"""The learning suite: GRPO's defaults on every task, beside a PPO peer, on one core each.

    python benchmarks/suite.py                                   # every task, seeds 0 1 2
    python benchmarks/suite.py cartpole pendulum --jobs 2        # two lanes, one core each
    python benchmarks/suite.py breakout --peers grpo,ppo_jax,sb3 # SB3 PPO as well
    python benchmarks/suite.py cartpole --budget 4096 --seeds 0 --peers grpo --jobs 1  # smoke
    python benchmarks/suite.py --table                           # markdown for docs/trainer.md

What runs. Per task (`TASKS`, one table of env, budget and threshold) and seed:

* `grpo`: `GRPOConfig` with its defaults; only `total_env_steps` (the budget) and `run`
  (env, seed, CPU, no progress, no evaluation during training) are set. `trainer.update()`
  runs until the budget is spent.
* `ppo_jax`: `benchmarks/ppo_jax.py`, our PureJaxRL-style PPO compiled with XLA, with its
  published preset for the env (gymnax's version of it; tasks gymnax lacks have none).
  Its compile time is reported apart from its training time.
* `sb3` (optional): Stable-Baselines3 PPO with RL-Zoo's hyper-parameters (MinAtar: SB3's
  defaults, `MlpPolicy` on the flattened planes of the `minatar` package's game).

What is measured. The greedy policy (most likely action, Gaussian mean) plays
`EVAL_EPISODES` episodes on separate envs every tenth of the budget, rounded to the
trainer's updates, and at the end; evaluation is timed apart from training. Per run: the
curve (env steps, training seconds, greedy value), the env steps and training seconds at
the first evaluation at or above the threshold (None if none), the final greedy value, the
training seconds and env steps per second. The value is the mean return, or Fruit Catcher's
catch rate. GRPO's training time is all its updates take, the first included (on a gymnax
env that holds the JIT compile of the env's step: `first_update_s` shows it); the JAX
peer's compile is reported apart (`compile_s`). MinAtar's threshold is the PPO peer's
median final greedy return in the same study (so "reached" there reads "as good as PPO's
typical final policy", and the seconds to it are GRPO's wall time to PPO's final return),
else a named constant. A median "to threshold" over seeds counts a seed that never got
there as infinitely late: it is None unless more than half of the seeds got there.

Why one process per run. Every (task, trainer, seed) runs in a fresh process of this script
(`--worker`), pinned to one CPU (`os.sched_setaffinity`), with one torch thread and XLA's
one-thread flags set in its environment before JAX is imported: no run inherits another's
caches, compiled functions, allocator or thread pools, and each trainer gets one core, as
the issue's comparisons ask. Runs go in lanes: within a lane the trainers alternate per
seed (grpo s0, ppo_jax s0, grpo s1, ...), so that a change of machine load hits both alike;
`--jobs 2` runs two lanes at once, one per core (`--cpu` picks the cores), which halves the
wall time of a study but lets the two lanes share caches and memory bandwidth; `--jobs 1`
is the quiet measurement.

Results: one JSON per task, `benchmarks/results/suite_<task>.json` (`--results DIR` or
`SUITE_RESULTS` to write elsewhere), rewritten after every finished run (`complete` says
whether all of the study's runs are in). Each holds the command, timestamp, machine and
library versions, the runs per trainer and a summary per trainer. The extras: `pip install
-c constraints.txt -e '.[jax,gymnax,sb3,box2d,minatar]'`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# Only the standard library above: a worker pins itself to its CPU before torch or JAX start.
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

PEER = "ppo_jax"  # MinAtar's threshold: this trainer's median final greedy return
TRAINERS = {"grpo": "GRPO", "ppo_jax": "PPO (JAX)", "sb3": "SB3 PPO"}
EVAL_EPISODES = 100
EVAL_POINTS = 10  # greedy evaluations per run: every tenth of the budget
EVAL_SEED = 100_000  # seed + 1000 * run seed: the games every evaluation of a run plays
# ppo_jax.THREAD_FLAGS (not imported: importing ppo_jax imports JAX); tests check they agree
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
# The PPO peer's median final greedy return at 1M env steps, seeds 0-2, 32 greedy games
# (`python benchmarks/ppo_jax.py --env Breakout-MinAtar --steps 1000000 --seeds 0 1 2
# --eval-every 250000`, 2026-11-25): the threshold when a study did not run the peer.
BREAKOUT_PEER_RETURN = 25.19
FREEWAY_PEER_RETURN = 22.56
FALLBACK_SOURCE = f"constant: {PEER}'s median final greedy return at 1M steps, 2026-11-25"


@dataclasses.dataclass(frozen=True)
class SB3:
    """How SB3 PPO runs a task: RL-Zoo's settings, or learning.py's copy of them."""

    env: str
    hyper: dict[str, Any] = dataclasses.field(default_factory=dict)  # with n_envs
    learning_task: str | None = None  # take benchmarks/learning.py's TASKS[...] instead
    normalize: bool = False  # RL-Zoo's `normalize: true` (VecNormalize)
    minatar: bool = False  # a MinAtar game: register it, flatten its planes


@dataclasses.dataclass(frozen=True)
class Task:
    """One suite task: GRPO's env, the budget and threshold every trainer gets, the peers'."""

    env: str  # GRPO's env (RunConfig.env)
    budget: int  # env steps per run
    threshold: float | str  # a value, or PEER
    metric: str = "return"  # or "catch_rate"
    gymnax: str | None = None  # the PPO peer's env, where gymnax has it
    sb3: SB3 | None = None
    fallback: float | None = None  # the threshold when it is PEER and the peer did not run


# RL-Zoo's hyper-parameters (hyperparams/ppo.yml) for MountainCarContinuous-v0, which
# benchmarks/learning.py does not have (its copies of RL-Zoo's are used for the others).
# RL-Zoo trains it for 20k steps: one env, 8 steps per rollout, 10 epochs, so SB3 plays about
# 100 env steps/s here and the suite's 1M takes hours per seed.
ZOO_MOUNTAINCAR = dict(
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
)

# fmt: off
TASKS: dict[str, Task] = {
    # name:        GRPO's env, budget, threshold, ...
    "fruit":       Task("fruit_env:FruitCatcher-v0", 2_500_000, 0.70, metric="catch_rate"),
    "cartpole":    Task("CartPole-v1", 500_000, 475.0, gymnax="CartPole-v1",
                        sb3=SB3("CartPole-v1", learning_task="cartpole")),
    "acrobot":     Task("Acrobot-v1", 300_000, -100.0, gymnax="Acrobot-v1",
                        sb3=SB3("Acrobot-v1", learning_task="acrobot")),
    "pendulum":    Task("Pendulum-v1", 1_000_000, -200.0, gymnax="Pendulum-v1",
                        sb3=SB3("Pendulum-v1", learning_task="pendulum")),
    "lunarlander": Task("LunarLander-v3", 2_000_000, 200.0,
                        sb3=SB3("LunarLander-v3", learning_task="lunarlander")),
    # a deceptive reward: doing nothing (0) beats failing to reach the flag (a cost per push)
    "mountaincar": Task("MountainCarContinuous-v0", 1_000_000, 90.0,
                        gymnax="MountainCarContinuous-v0",
                        sb3=SB3("MountainCarContinuous-v0", ZOO_MOUNTAINCAR, normalize=True)),
    "breakout":    Task("gymnax:Breakout-MinAtar", 1_000_000, PEER, gymnax="Breakout-MinAtar",
                        sb3=SB3("MinAtar/Breakout-v1", {"n_envs": 8}, minatar=True),
                        fallback=BREAKOUT_PEER_RETURN),
    "freeway":     Task("gymnax:Freeway-MinAtar", 1_000_000, PEER, gymnax="Freeway-MinAtar",
                        sb3=SB3("MinAtar/Freeway-v1", {"n_envs": 8}, minatar=True),
                        fallback=FREEWAY_PEER_RETURN),
}
# fmt: on


def eval_marks(budget: int) -> list[int]:
    """The env steps after which the greedy policy is evaluated (the first update at or past
    each is evaluated; the last mark is the budget)."""
    return [max(1, round(budget * k / EVAL_POINTS)) for k in range(1, EVAL_POINTS + 1)]


# ---------------------------------------------------------------- the runs (in a worker)


def pin_worker(cpu: int) -> None:
    """One CPU, one thread: called before torch or JAX are imported."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = "1"
    flags = os.environ.get("XLA_FLAGS", "")
    if XLA_ONE_THREAD not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {XLA_ONE_THREAD}".strip()


def run_grpo(task: Task, seed: int, budget: int) -> dict[str, Any]:
    """GRPO with the defaults, trained update by update, evaluated at `eval_marks`."""
    import torch

    from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
    from grpo_trainer.envs import make_envs
    from grpo_trainer.run.evaluation import evaluate

    cpu = torch.device("cpu")
    run = RunConfig(env=task.env, seed=seed, device="cpu", progress=False, eval_every=0)
    config = GRPOConfig(total_env_steps=budget, run=run)
    start = time.perf_counter()
    trainer = GRPOTrainer(make_envs(config, config.num_envs, cpu), config)
    eval_envs = make_envs(config, EVAL_EPISODES, cpu)
    setup_s = time.perf_counter() - start

    def greedy() -> float:
        out = evaluate(trainer.policy, eval_envs, EVAL_EPISODES, seed=EVAL_SEED + 1000 * seed)
        return out[task.metric if task.metric != "return" else "return_mean"]

    marks, curve, updates = deque(eval_marks(budget)), [], []
    train_s = eval_s = 0.0
    while trainer.env_steps < budget:
        t0 = time.perf_counter()
        trainer.update()
        updates.append(time.perf_counter() - t0)
        train_s += updates[-1]
        if marks and trainer.env_steps >= marks[0]:
            while marks and trainer.env_steps >= marks[0]:
                marks.popleft()
            t0 = time.perf_counter()
            curve.append(_point(trainer.env_steps, train_s, greedy()))
            eval_s += time.perf_counter() - t0
    return {
        "config": config.to_dict(),
        "updates": len(updates),
        "first_update_s": round(updates[0], 4) if updates else None,
        "setup_s": round(setup_s, 4),
        "eval_s": round(eval_s, 4),
        **_totals(trainer.env_steps, train_s, curve),
    }


def _point(env_steps: int, train_s: float, value: float) -> dict[str, Any]:
    return {
        "env_steps": int(env_steps),
        "train_s": round(train_s, 4),
        "eval": round(float(value), 4),
    }


def _totals(env_steps: int, train_s: float, curve: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "env_steps": int(env_steps),
        "train_s": round(train_s, 4),
        "env_steps_per_s": round(env_steps / train_s, 1) if train_s > 0 else None,
        "final_eval": curve[-1]["eval"] if curve else None,
        "curve": curve,
    }


def run_ppo_jax(task: Task, seed: int, budget: int) -> dict[str, Any]:
    """`ppo_jax.train` with its preset for the env, evaluated by its own greedy evaluation."""
    if task.gymnax is None:
        raise ValueError(f"gymnax has no {task.env}: no PPO (JAX) run")
    import ppo_jax

    every = max(1, budget // EVAL_POINTS)
    out = ppo_jax.train(task.gymnax, seed, budget, eval_every=every, eval_episodes=EVAL_EPISODES)
    curve = [
        _point(row["env_steps"], row["train_s"], row["eval_return"])
        for row in out["curve"]
        if row.get("eval_return") is not None
    ]
    keep = ("preset", "config", "updates", "final_train_return", "setup_s", "compile_s")
    return {
        **{key: out[key] for key in keep},
        "eval_compile_s": out["eval_compile_s"],
        "eval_s": out["eval_s"],
        "train_cpu_s": out["train_cpu_s"],
        "jax": {"xla_flags": os.environ.get("XLA_FLAGS", ""), **ppo_jax._software()},
        **_totals(out["env_steps"], out["train_s"], curve),
    }


def sb3_settings(spec: SB3) -> tuple[dict[str, Any], bool]:
    """The PPO keyword arguments (with n_envs) and whether to normalise (VecNormalize)."""
    if spec.learning_task is None:
        return dict(spec.hyper), spec.normalize
    import learning

    entry = learning.TASKS[spec.learning_task]
    return dict(entry["ppo"]), bool(entry.get("ppo_normalize", spec.normalize))


def run_sb3(task: Task, seed: int, budget: int) -> dict[str, Any]:
    """SB3 PPO, its greedy policy evaluated at the first rollout start past each mark."""
    if task.sb3 is None:
        raise ValueError(f"no RL-Zoo settings for {task.env}: no SB3 PPO run")
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback

    spec = task.sb3
    hyper, normalize = sb3_settings(spec)
    venv = _sb3_env(spec, hyper.pop("n_envs"), seed, normalize)
    model = PPO("MlpPolicy", venv, seed=seed, device="cpu", verbose=0, **hyper)
    eval_envs = _sb3_eval_envs(spec)
    clock = {"start": 0.0, "eval_s": 0.0}
    marks: deque[int] = deque(eval_marks(budget))
    curve: list[dict[str, Any]] = []

    def evaluate_now() -> None:
        t0 = time.perf_counter()
        value = _sb3_greedy(model, eval_envs, normalize, EVAL_SEED + 1000 * seed)
        train_s = t0 - clock["start"] - clock["eval_s"]
        curve.append(_point(model.num_timesteps, train_s, value))
        clock["eval_s"] += time.perf_counter() - t0

    class EvalAtMarks(BaseCallback):
        def _on_rollout_start(self) -> None:  # after the previous rollout's training
            if marks and model.num_timesteps >= marks[0]:
                while marks and model.num_timesteps >= marks[0]:
                    marks.popleft()
                evaluate_now()

        def _on_step(self) -> bool:
            return True

    clock["start"] = time.perf_counter()
    model.learn(total_timesteps=budget, callback=EvalAtMarks())
    if not curve or curve[-1]["env_steps"] != model.num_timesteps:
        evaluate_now()
    train_s = curve[-1]["train_s"]
    return {
        "sb3_env": spec.env,
        "hyperparameters": {k: str(v) for k, v in hyper.items()},
        "n_envs": venv.num_envs,
        "normalize": normalize,
        "eval_s": round(clock["eval_s"], 4),
        "torch_threads": torch.get_num_threads(),
        **_totals(model.num_timesteps, train_s, curve),
    }


def _sb3_env(spec: SB3, n_envs: int, seed: int, normalize: bool) -> Any:
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    wrapper = None
    if spec.minatar:
        import gymnasium as gym
        import minatar.gym

        minatar.gym.register_envs()
        wrapper = gym.wrappers.FlattenObservation
    venv = make_vec_env(spec.env, n_envs=n_envs, seed=seed, wrapper_class=wrapper)
    return VecNormalize(venv) if normalize else venv


def _sb3_eval_envs(spec: SB3) -> Any:
    import gymnasium as gym

    wrappers = [gym.wrappers.FlattenObservation] if spec.minatar else []
    return gym.make_vec(
        spec.env, num_envs=EVAL_EPISODES, vectorization_mode="sync", wrappers=wrappers
    )


def _sb3_greedy(model: Any, envs: Any, normalize: bool, seed: int) -> float:
    """Mean return of one greedy episode per sub-env (MinAtar's have no limit: capped as
    grpo_trainer's evaluate caps them)."""
    import numpy as np

    from grpo_trainer.run.evaluation import EVAL_HORIZON

    obs, _ = envs.reset(seed=[seed + i for i in range(envs.num_envs)])
    returns, alive = np.zeros(envs.num_envs), np.ones(envs.num_envs, dtype=bool)
    for _ in range(EVAL_HORIZON):
        if not alive.any():
            break
        seen = model.get_env().normalize_obs(obs) if normalize else obs
        action, _ = model.predict(seen, deterministic=True)
        obs, reward, terminated, truncated, _ = envs.step(action)
        returns += reward * alive
        alive &= ~(terminated | truncated)
    return float(returns.mean())


RUNNERS = {"grpo": run_grpo, "ppo_jax": run_ppo_jax, "sb3": run_sb3}


def skip_reason(task: Task, trainer: str) -> str | None:
    """Why `trainer` does not run `task` (None: it does)."""
    if trainer == "ppo_jax" and task.gymnax is None:
        return f"gymnax has no {task.env}"
    if trainer == "sb3" and task.sb3 is None:
        return "no RL-Zoo settings"
    return None


def worker(job: dict[str, Any]) -> int:
    """One run in this fresh process: pin, train, write the record to `job["out"]`."""
    pin_worker(job["cpu"])
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    task = TASKS[job["task"]]
    record = RUNNERS[job["trainer"]](task, job["seed"], job["budget"])
    record.update(
        trainer=job["trainer"],
        seed=job["seed"],
        cpu=job["cpu"],
        cpus_allowed=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        torch_threads=torch.get_num_threads(),
    )
    Path(job["out"]).write_text(json.dumps(record))
    return 0


# ---------------------------------------------------------------- the study (the parent)


def reached_at(curve: list[dict[str, Any]], threshold: float) -> dict[str, Any] | None:
    """The first evaluation at or above `threshold`: its env steps and training seconds."""
    for point in curve:
        if point["eval"] >= threshold:
            return {"env_steps": point["env_steps"], "train_s": point["train_s"]}
    return None


def median_to_threshold(values: list[float | None]) -> float | None:
    """The median over all runs, a run that never got there counting as infinitely late:
    None unless more than half of the runs got there."""
    if not values:
        return None
    middle = statistics.median(math.inf if v is None else v for v in values)
    return None if math.isinf(middle) else middle


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def resolve_threshold(task: Task, runs: dict[str, list[dict[str, Any]]]) -> tuple[float, str]:
    """The task's threshold and where it comes from (for PEER: the peer's runs, if any)."""
    if task.threshold != PEER:
        return float(task.threshold), "fixed"
    finals = [r["final_eval"] for r in runs.get(PEER, []) if r.get("final_eval") is not None]
    if finals:
        return statistics.median(finals), f"{PEER}: median final greedy return, this study"
    assert task.fallback is not None
    return task.fallback, FALLBACK_SOURCE


def summarise(runs: list[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """Per trainer: seeds reaching the threshold, medians to it, final greedy spread."""
    ok = [r for r in runs if "error" not in r]
    hits = [reached_at(r["curve"], threshold) for r in ok] + [None] * (len(runs) - len(ok))
    finals = [r["final_eval"] for r in ok if r.get("final_eval") is not None]

    def median_of(key: str) -> float | None:
        values = [r[key] for r in ok if r.get(key) is not None]
        return statistics.median(values) if values else None

    return {
        "runs": len(runs),
        "failed": len(runs) - len(ok),
        "reached": sum(h is not None for h in hits),
        "median_env_steps_to_threshold": median_to_threshold([h and h["env_steps"] for h in hits]),
        "median_train_s_to_threshold": median_to_threshold([h and h["train_s"] for h in hits]),
        "final_eval": spread(finals),
        "median_train_s": median_of("train_s"),
        "median_env_steps_per_s": median_of("env_steps_per_s"),
        "median_compile_s": median_of("compile_s"),
    }


def versus_peer(summary: dict[str, Any], threshold_source: str) -> dict[str, Any] | None:
    """MinAtar: GRPO's wall time to the peer's median final return, against the peer's own
    training time, and whether GRPO's final greedy return is at least the peer's."""
    grpo, peer = summary.get("grpo"), summary.get(PEER)
    if not grpo or not peer or not peer["final_eval"] or not threshold_source.startswith(PEER):
        return None
    grpo_final = grpo["final_eval"]["mean"] if grpo["final_eval"] else None
    return {
        "peer_final_median": peer["final_eval"]["median"],
        "peer_final_mean": peer["final_eval"]["mean"],
        "peer_median_train_s": peer["median_train_s"],
        "peer_median_compile_s": peer["median_compile_s"],
        "grpo_median_train_s_to_peer_final": grpo["median_train_s_to_threshold"],
        "grpo_median_env_steps_to_peer_final": grpo["median_env_steps_to_threshold"],
        "grpo_final_mean": grpo_final,
        "grpo_final_at_least_peer": None
        if grpo_final is None
        else grpo_final >= peer["final_eval"]["mean"],
    }


def versions() -> dict[str, str | None]:
    """Installed versions of what the runs may use (without importing them)."""
    out: dict[str, str | None] = {}
    for name in ("torch", "gymnasium", "numpy", "jax", "jaxlib", "optax", "gymnax"):
        out[name] = _version(name)
    for name in ("stable_baselines3", "box2d", "minatar"):
        out[name] = _version(name)
    return out


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


class Study:
    """The runs of one invocation, per task; each task's JSON is rewritten after every run."""

    def __init__(self, args: argparse.Namespace, folder: Path, budgets: dict[str, int]) -> None:
        from _common import machine_info

        self.args, self.folder, self.budgets = args, folder, budgets
        self.lock = threading.Lock()
        self.machine = machine_info()  # this process's; each run records its own threads
        self.machine.pop("torch_threads")
        self.machine["threads_per_run"] = 1
        self.software = versions()
        self.runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            name: {t: [] for t in args.peers if not skip_reason(TASKS[name], t)}
            for name in args.tasks
        }
        self.failed = 0

    def add(self, name: str, record: dict[str, Any]) -> Path:
        with self.lock:
            self.runs[name][record["trainer"]].append(record)
            self.runs[name][record["trainer"]].sort(key=lambda r: r["seed"])
            self.failed += "error" in record
            return self.write(name)

    def payload(self, name: str) -> dict[str, Any]:
        task, runs = TASKS[name], self.runs[name]
        threshold, source = resolve_threshold(task, runs)
        for trainer_runs in runs.values():
            for r in trainer_runs:
                r["reached"] = None if "error" in r else reached_at(r["curve"], threshold)
        summary = {t: summarise(rs, threshold) for t, rs in runs.items()}
        expected = len(self.args.seeds) * len(runs)
        skipped = {t: skip_reason(task, t) for t in self.args.peers if t not in runs}
        return {
            "task": name,
            "env": task.env,
            "gymnax_env": task.gymnax,
            "sb3_env": task.sb3.env if task.sb3 else None,
            "metric": task.metric,
            "budget": self.budgets[name],
            "threshold": threshold,
            "threshold_source": source,
            "eval_marks": eval_marks(self.budgets[name]),
            "eval_episodes": EVAL_EPISODES,
            "seeds": self.args.seeds,
            "peers": self.args.peers,
            "skipped": skipped,
            "jobs": self.args.jobs,
            "cpus": self.args.cpu,
            "complete": sum(len(rs) for rs in runs.values()) == expected,
            "machine": {**self.machine, "load_average_now": os.getloadavg()},
            "software": self.software,
            "summary": summary,
            "versus_peer": versus_peer(summary, source),
            "runs": runs,
        }

    def write(self, name: str) -> Path:
        from _common import write_result

        return write_result(f"suite_{name}", self.payload(name), self.folder)


def run_job(job: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """One run in a fresh worker process; a failure becomes a record with `error`."""
    out = tmp / f"{job['task']}_{job['trainer']}_{job['seed']}.json"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        json.dumps({**job, "out": str(out)}),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    wall_s = round(time.perf_counter() - start, 2)
    base = {"trainer": job["trainer"], "seed": job["seed"], "cpu": job["cpu"], "wall_s": wall_s}
    if done.returncode != 0 or not out.exists():
        return {**base, "error": (done.stderr.strip() or done.stdout.strip())[-3000:]}
    return {**json.loads(out.read_text()), "wall_s": wall_s}


def run_study(study: Study, budgets: dict[str, int]) -> None:
    """Units of (task, seed) go to lanes as they free up; a lane runs a unit's trainers in
    turn (grpo, then the peers), each in a fresh process pinned to the lane's CPU."""
    args = study.args
    units = deque((name, seed) for name in args.tasks for seed in args.seeds)
    take = threading.Lock()

    def lane(cpu: int) -> None:
        with tempfile.TemporaryDirectory(prefix="suite-") as tmp:
            while True:
                with take:
                    if not units:
                        return
                    name, seed = units.popleft()
                for trainer in study.runs[name]:
                    job = {"task": name, "trainer": trainer, "seed": seed, "cpu": cpu}
                    record = run_job({**job, "budget": budgets[name]}, Path(tmp))
                    path = study.add(name, record)
                    print(_line(name, record, path), flush=True)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for future in [pool.submit(lane, cpu) for cpu in args.cpu[: args.jobs]]:
            future.result()


def _line(name: str, record: dict[str, Any], path: Path) -> str:
    head = f"{name} {record['trainer']} seed {record['seed']} (cpu {record['cpu']}):"
    if "error" in record:
        return f"{head} FAILED: {record['error'].splitlines()[-1] if record['error'] else '?'}"
    hit = record.get("reached")
    to = (
        f"threshold at {hit['env_steps']:,} steps, {hit['train_s']:.1f} s" if hit else "not reached"
    )
    return (
        f"{head} final greedy {record['final_eval']:.3g}, {to}; {record['env_steps']:,} steps "
        f"in {record['train_s']:.1f} s ({record['env_steps_per_s'] or 0:,.0f}/s) -> {path.name}"
    )


# ---------------------------------------------------------------- the table


def _steps(n: float | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k" if n >= 1e3 else f"{n:.0f}"


def _seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.0f} s" if s >= 100 else f"{s:.1f} s"


def _value(v: float | None, metric: str) -> str:
    if v is None:
        return "-"
    if metric == "catch_rate":
        return f"{v:.3f}"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def _threshold(result: dict[str, Any]) -> str:
    text = f"{result['threshold']:.4g}"
    if result["metric"] == "catch_rate":
        return f"catch rate {text}"
    source = result["threshold_source"]
    if source.startswith(PEER):
        return f"{text} ({TRAINERS[PEER]} median final)"
    return f"{text} (constant)" if source.startswith("constant") else text


def _trainer_cells(result: dict[str, Any], trainer: str) -> list[str]:
    summary = result["summary"].get(trainer)
    if summary is None:
        return ["n/a" if trainer in result.get("skipped", {}) else "", "", ""]
    failed = f" ({summary['failed']} failed)" if summary["failed"] else ""
    steps, seconds = (
        summary["median_env_steps_to_threshold"],
        summary["median_train_s_to_threshold"],
    )
    to = "-" if steps is None else f"{_steps(steps)}, {_seconds(seconds)}"
    final = summary["final_eval"]
    metric = result["metric"]
    shown = (
        "-"
        if final is None
        else (
            f"{_value(final['mean'], metric)} ({_value(final['min'], metric)} to "
            f"{_value(final['max'], metric)})"
        )
    )
    return [f"{summary['reached']}/{summary['runs']}{failed}", to, shown]


def load_results(folder: Path) -> list[dict[str, Any]]:
    """Every suite_<task>.json in `folder`, in `TASKS` order (unknown tasks last)."""
    order = {name: i for i, name in enumerate(TASKS)}
    results = [json.loads(p.read_text()) for p in sorted(folder.glob("suite_*.json"))]
    return sorted(results, key=lambda r: (order.get(r["task"], len(order)), r["task"]))


def render_table(folder: Path) -> str:
    """The markdown for docs/trainer.md: one row per task, three cells per trainer; then,
    for the tasks judged against the PPO peer (MinAtar), GRPO's time to the peer's return."""
    results = load_results(folder)
    if not results:
        return f"no suite_*.json in {folder}"
    trainers = [t for t in TRAINERS if any(t in r.get("peers", r["summary"]) for r in results)]
    head = ["task", "budget", "threshold"]
    for t in trainers:
        label = TRAINERS[t]
        head += [f"{label}: reached", f"{label}: to threshold (median)", f"{label}: final greedy"]
    lines = [_row(head), _row(["---"] * len(head))]
    for r in results:
        name = r["task"] + ("" if r.get("complete") else " (incomplete)")
        env = r["env"].rpartition(":")[2]
        cells = [f"{name} ({env})", _steps(r["budget"]), _threshold(r)]
        for t in trainers:
            cells += _trainer_cells(r, t)
        lines.append(_row(cells))
    versus = [r for r in results if r.get("versus_peer")]
    if versus:
        lines += ["", _versus_table(versus)]
    lines += ["", "Files: " + "; ".join(_source(r) for r in results) + "."]
    return "\n".join(lines)


def _versus_table(results: list[dict[str, Any]]) -> str:
    peer = TRAINERS[PEER]
    head = [
        "task",
        f"{peer}: final greedy (median)",
        f"{peer}: train time (median; + compile)",
        "GRPO: train time to that return (median)",
        "GRPO: final greedy (mean)",
        f"{peer}: final greedy (mean)",
    ]
    lines = [_row(head), _row(["---"] * len(head))]
    for r in results:
        v = r["versus_peer"]
        compile_s = v["peer_median_compile_s"]
        peer_time = _seconds(v["peer_median_train_s"])
        if compile_s is not None:
            peer_time += f"; + {_seconds(compile_s)}"
        lines.append(
            _row(
                [
                    r["task"],
                    _value(v["peer_final_median"], r["metric"]),
                    peer_time,
                    _seconds(v["grpo_median_train_s_to_peer_final"]),
                    _value(v["grpo_final_mean"], r["metric"]),
                    _value(v["peer_final_mean"], r["metric"]),
                ]
            )
        )
    return "\n".join(lines)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _source(result: dict[str, Any]) -> str:
    return f"`suite_{result['task']}.json` ({result.get('timestamp', '?')[:10]})"


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="*", metavar="TASK", help=f"of {', '.join(TASKS)}")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--peers", default="grpo,ppo_jax", help=f"trainers, comma-separated, of {','.join(RUNNERS)}"
    )
    parser.add_argument("--jobs", type=int, default=1, help="lanes run at once, one CPU each")
    parser.add_argument("--cpu", type=int, nargs="+", help="the lanes' CPUs (default: the first)")
    parser.add_argument("--budget", type=int, help="env steps per run, for every task (smoke)")
    parser.add_argument("--results", type=Path, help="folder of the JSON files (SUITE_RESULTS)")
    parser.add_argument("--table", action="store_true", help="print the markdown table")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [t for t in args.tasks if t not in TASKS]
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}; tasks: {', '.join(TASKS)}")
    args.tasks = args.tasks or list(TASKS)
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    if not args.peers or any(p not in RUNNERS for p in args.peers):
        parser.error(f"--peers takes a comma-separated list of {', '.join(RUNNERS)}")
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    args.cpu = args.cpu or usable[: args.jobs]
    if args.jobs < 1 or len(args.cpu) < args.jobs:
        parser.error(f"--jobs {args.jobs} needs as many CPUs (--cpu; usable: {usable})")
    if args.budget is not None and args.budget < 1:
        parser.error("--budget must be positive")
    folder = args.results or os.environ.get("SUITE_RESULTS")
    args.results = Path(folder) if folder else HERE / "results"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    if args.table:
        print(render_table(args.results))
        return 0
    budgets = {name: args.budget or TASKS[name].budget for name in args.tasks}
    study = Study(args, args.results, budgets)
    run_study(study, budgets)
    for name in args.tasks:
        print(f"wrote {study.write(name)}")
    return 1 if study.failed else 0


if __name__ == "__main__":
    sys.exit(main())
