"""One run of a suite study, in a fresh worker process: `python benchmarks/suite_runs.py JOB`.

`benchmarks/suite.py` starts it with the job as JSON and the tree to train first on
`PYTHONPATH`; the run pins itself to one CPU with one torch thread (and XLA's one-thread
flags) before torch or JAX are imported, trains, and writes its record to `job["out"]`.
A GRPO run trains as the train command does: its config from the command's own parser and
resolution, `GRPOTrainer(...).train(callbacks=[...])`, with the modules taken from wherever
the tree being run keeps them.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import Any

# Only the standard library above: the run pins itself to its CPU before torch or JAX start.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite_tasks import (
    EVAL_POINTS,
    EVAL_SEED,
    MAX_EVAL_ENVS,
    SB3,
    TASKS,
    Task,
    eval_marks,
    grpo_argv,
)

# ppo_jax.THREAD_FLAGS (not imported: importing ppo_jax imports JAX); tests check they agree
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def pin_worker(cpu: int, device: str = "cpu") -> None:
    """One CPU, one thread, and JAX on the study's device (on a GPU machine it would take the
    GPU unasked): called before torch or JAX are imported."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = "1"
    flags = os.environ.get("XLA_FLAGS", "")
    if XLA_ONE_THREAD not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {XLA_ONE_THREAD}".strip()
    os.environ["JAX_PLATFORMS"] = device
    if device == "cuda":  # JAX takes the memory it uses, not 75% of the GPU at start
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _first_module(*names: str) -> Any:
    """The first of `names` that imports: where the tree being run keeps it (an older
    revision kept the trainer's modules in one flat package)."""
    for name in names:
        try:
            return import_module(name)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(f"none of {', '.join(names)} in this tree")


class _Enough(Exception):
    """Ends a run whose tree's callbacks cannot ask the harness to stop."""


TIME_BUDGET = "the time budget"  # how a wall-clock run's stop reason begins


def _probe_class(base: type) -> type:
    """The suite's callback on the tree's own `Callback` class: after every update it notes
    the wall time, at each mark it evaluates the policy (greedy and sampled), timed apart,
    and with a time budget it asks the run to stop so that its last update ends there."""

    class Probe(base):  # type: ignore[misc, valid-type]
        def __init__(
            self,
            trainer: Any,
            score: Callable[[], tuple[float, float]],
            marks: list[int],
            stop_at: float | None,
            timed_updates: int | None,
            time_budget_s: float | None = None,
        ) -> None:
            self.trainer, self.score, self.marks = trainer, score, deque(marks)
            self.stop_at, self.timed_updates = stop_at, timed_updates
            self.time_budget_s = time_budget_s
            self.curve: list[dict[str, Any]] = []
            self.update_s: list[float] = []
            self.env_steps: list[int] = []
            self.train_s = self.eval_s = 0.0
            self.stopping: str | None = None  # why this probe asked the run to stop
            self.raised = False  # it ended the run itself (a tree without request_stop)
            self.start = self.last = time.perf_counter()
            self.lr: float | None = None  # the latest update's learning rate

        def begin(self) -> None:
            """Called just before `train()`: its whole wall time counts, compile included."""
            self.start = self.last = time.perf_counter()

        def on_update(self, state: Any, metrics: dict[str, float]) -> None:
            now = time.perf_counter()
            self.lr = metrics.get("lr")
            steps = int(self.trainer.env_steps)
            self.update_s.append(now - self.last)
            self.env_steps.append(steps)
            self.train_s = now - self.start - self.eval_s
            reason = None
            if self.timed_updates is not None and len(self.update_s) > self.timed_updates:
                reason = "the study has what it measures"
            # request_stop ends the run after one more update: ask when that one would end
            # at or past the budget, so that the run's last update ends at about the budget
            budget = self.time_budget_s
            if budget is not None and self.train_s + self.update_s[-1] >= budget:
                reason = f"{TIME_BUDGET} ({budget:.2f} s of training) is spent"
            # the update after the budget's stop request ends the run, or the train
            # command's own time budget does: evaluated as its last
            outcome = getattr(state, "outcome", None)
            why = getattr(outcome, "stop_reason", None) or self.stopping or ""
            last = getattr(outcome, "ended", False) and why.startswith(TIME_BUDGET)
            if (self.marks and steps >= self.marks[0]) or last:
                while self.marks and steps >= self.marks[0]:
                    self.marks.popleft()
                greedy, sampled = self._evaluate()
                self.curve.append(_point(steps, self.train_s, greedy, sampled))
                if self.stop_at is not None and greedy >= self.stop_at:
                    reason = reason or "the study has what it measures"
            self.last = time.perf_counter()
            if reason and self.stopping is None:
                self._stop(state, reason)

        def _stop(self, state: Any, reason: str) -> None:
            self.stopping = reason
            request = getattr(state, "request_stop", None)
            if request is None:  # an older tree: stop now, evaluated as the run ends
                if self.time_budget_s is not None and (
                    not self.curve or self.curve[-1]["env_steps"] != self.env_steps[-1]
                ):
                    self.curve.append(_point(self.env_steps[-1], self.train_s, *self._evaluate()))
                self.raised = True
                raise _Enough
            request(reason)

        def _evaluate(self) -> tuple[float, float]:
            policy = self.trainer.policy
            was_training = policy.training
            policy.eval()
            t0 = time.perf_counter()
            try:
                return self.score()
            finally:
                self.eval_s += time.perf_counter() - t0
                policy.train(was_training)

    return Probe


def run_grpo(task: Task, job: dict[str, Any]) -> dict[str, Any]:
    """One GRPO row: the config from the train command's parser, trained by `train()`."""
    import torch

    cli = _first_module("grpo_trainer.tools.cli", "grpo_trainer.cli")
    envs_module = _first_module("grpo_trainer.envs", "grpo_trainer.evaluation")
    evaluation = _first_module("grpo_trainer.run.evaluation", "grpo_trainer.evaluation")
    callbacks = _first_module("grpo_trainer.run.callbacks", "grpo_trainer.callbacks")
    trainer_module = _first_module("grpo_trainer.run.trainer", "grpo_trainer.trainer")
    accel = _first_module("grpo_trainer.base.accel", "grpo_trainer.accel")
    argv = grpo_argv(task, job["budget"], job["seed"], job["flags"], job.get("device", "cpu"))
    time_budget_s = job.get("time_budget_s")
    config_class = _first_module("grpo_trainer.base.config", "grpo_trainer.config").GRPOConfig
    # --trainer-clock: the train command's own time budget, so that the schedule anneals by
    # the clock (a tree from before it, --against, anneals over the env steps alone)
    if job.get("trainer_clock") and "time_budget_s" in config_class.__dataclass_fields__:
        argv += ["--time-budget-s", str(time_budget_s)]
    config = cli.config_from_args(cli.build_parser().parse_args(argv))
    device = accel.resolve_device(config.run.device)
    torch.set_float32_matmul_precision("high")  # as the train command sets it
    start = time.perf_counter()
    if hasattr(trainer_module, "open_run"):  # the train command's way into a run
        trainer = trainer_module.open_run(config, device)
    else:  # a revision from before it (--against)
        envs = envs_module.make_envs(config, config.num_envs, device)
        trainer = trainer_module.GRPOTrainer(envs, config)
    throughput = job.get("throughput")
    episodes = job["eval_episodes"]
    eval_envs = (
        None
        if throughput
        else envs_module.make_envs(trainer.config, min(episodes, MAX_EVAL_ENVS), device)
    )
    setup_s = time.perf_counter() - start

    def score() -> tuple[float, float]:
        """The trainer's own evaluation, the same games played greedily and sampled."""
        key = task.metric if task.metric != "return" else "return_mean"
        values = [
            evaluation.evaluate(
                trainer.policy,
                eval_envs,
                episodes,
                greedy=greedy,
                seed=EVAL_SEED + 1000 * job["seed"],
                max_episode_steps=trainer.config.max_episode_steps,
            )[key]
            for greedy in (True, False)
        ]
        return values[0], values[1]

    budget = trainer.config.total_env_steps
    marks = [] if throughput else eval_marks(budget, job.get("eval_every"))
    probe = _probe_class(callbacks.Callback)(
        trainer, score, marks, job.get("stop_at"), throughput, time_budget_s
    )
    probe.begin()
    with contextlib.suppress(_Enough):
        trainer.train(callbacks=[probe])
    for env in (trainer.env.envs, eval_envs):
        if env is not None:
            env.close()
    import grpo_trainer

    record = {
        "argv": argv,
        "config": trainer.config.to_dict(),
        "grpo_trainer": str(Path(grpo_trainer.__file__).parent),
        "updates": len(probe.update_s),
        "first_update_s": round(probe.update_s[0], 4) if probe.update_s else None,
        "setup_s": round(setup_s, 4),
        "eval_s": round(probe.eval_s, 4),
        "time_budget_s": time_budget_s,
        "final_lr": probe.lr,  # the last update's learning rate, where the schedule ended
        # the trainer's own training seconds (rollouts and updates: what its schedule reads)
        "trainer_train_s": getattr(trainer, "train_s", None),
        # why the run ended before its env steps, as the trainer recorded it (a request made
        # at the update that used up the env steps ends nothing: None)
        "stop_reason": probe.stopping if probe.raised else getattr(trainer, "stop_reason", None),
        **_totals(trainer.env_steps, probe.train_s, probe.curve),
    }
    if throughput:  # the first update, then `throughput` timed ones (a stop adds one more)
        record.update(_throughput(probe.update_s[: throughput + 1], probe.env_steps))
    return record


def _throughput(update_s: list[float], env_steps: list[int]) -> dict[str, Any]:
    """Env-steps/s of every update after the first (the warm-up), their median, and the pace
    of them all together (their env steps over their seconds), which also counts the work a
    config does only every few updates (a median would skip those updates)."""
    timed = [i for i in range(1, len(update_s)) if update_s[i] > 0]
    rates = [(env_steps[i] - env_steps[i - 1]) / update_s[i] for i in timed]
    seconds = sum(update_s[i] for i in timed)
    played = sum(env_steps[i] - env_steps[i - 1] for i in timed)
    return {
        "timed_updates": len(rates),
        "update_env_steps_per_s": [round(r, 1) for r in rates],
        "median_update_env_steps_per_s": round(statistics.median(rates), 1) if rates else None,
        "pace_env_steps_per_s": round(played / seconds, 1) if seconds else None,
    }


def _point(
    env_steps: int, train_s: float, greedy: float, sampled: float | None, compile_s: float = 0.0
) -> dict[str, Any]:
    """One evaluation: the greedy and the sampled value after `train_s` of training, and
    `elapsed_s`, the same with the time spent compiling before training began (the JAX
    peer's; GRPO's compiles inside its timed updates)."""
    return {
        "env_steps": int(env_steps),
        "train_s": round(train_s, 4),
        "elapsed_s": round(train_s + compile_s, 4),
        "eval": round(float(greedy), 4),
        "eval_sampled": None if sampled is None else round(float(sampled), 4),
    }


def _totals(
    env_steps: int, train_s: float, curve: list[dict[str, Any]], compile_s: float = 0.0
) -> dict[str, Any]:
    return {
        "env_steps": int(env_steps),
        "train_s": round(train_s, 4),
        "elapsed_s": round(train_s + compile_s, 4),
        "env_steps_per_s": round(env_steps / train_s, 1) if train_s > 0 else None,
        "final_eval": curve[-1]["eval"] if curve else None,
        "final_eval_sampled": curve[-1]["eval_sampled"] if curve else None,
        "curve": curve,
    }


def run_ppo_jax(task: Task, job: dict[str, Any]) -> dict[str, Any]:
    """`ppo_jax.train` with its preset for the env, evaluated by its own evaluation (greedy
    and sampled). Its `elapsed_s` counts the compile and the first state's set-up too."""
    if task.gymnax is None:
        raise ValueError(f"gymnax has no {task.env}: no PPO (JAX) run")
    import ppo_jax

    budget = job["budget"]
    every = job.get("eval_every") or max(1, budget // EVAL_POINTS)
    out = ppo_jax.train(
        task.gymnax, job["seed"], budget, eval_every=every, eval_episodes=job["eval_episodes"]
    )
    before = out["compile_s"] + out["setup_s"]  # the time before its first update
    curve = [
        _point(
            row["env_steps"], row["train_s"], row["eval_return"], row["eval_return_sampled"], before
        )
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
        **_totals(out["env_steps"], out["train_s"], curve, before),
    }


def run_sb3(task: Task, job: dict[str, Any]) -> dict[str, Any]:
    """SB3 PPO, its policy evaluated (greedy and sampled) at the first rollout start past
    each mark."""
    if task.sb3 is None:
        raise ValueError(f"no RL-Zoo settings for {task.env}: no SB3 PPO run")
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback

    spec, seed, budget = task.sb3, job["seed"], job["budget"]
    hyper = dict(spec.hyper)
    venv = _sb3_env(spec, hyper.pop("n_envs"), seed, spec.normalize)
    model = PPO("MlpPolicy", venv, seed=seed, device="cpu", verbose=0, **hyper)
    eval_envs = _sb3_eval_envs(spec, job["eval_episodes"])
    clock = {"start": 0.0, "eval_s": 0.0}
    marks: deque[int] = deque(eval_marks(budget, job.get("eval_every")))
    curve: list[dict[str, Any]] = []

    def evaluate_now() -> None:
        t0 = time.perf_counter()
        values = [
            _sb3_play(model, eval_envs, spec.normalize, EVAL_SEED + 1000 * seed, greedy)
            for greedy in (True, False)
        ]
        train_s = t0 - clock["start"] - clock["eval_s"]
        curve.append(_point(model.num_timesteps, train_s, *values))
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
        "hyperparameters": {k: str(v) for k, v in spec.hyper.items()},
        "n_envs": venv.num_envs,
        "normalize": spec.normalize,
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


def _sb3_eval_envs(spec: SB3, episodes: int) -> Any:
    import gymnasium as gym

    wrappers = [gym.wrappers.FlattenObservation] if spec.minatar else []
    return gym.make_vec(spec.env, num_envs=episodes, vectorization_mode="sync", wrappers=wrappers)


def _sb3_play(model: Any, envs: Any, normalize: bool, seed: int, greedy: bool) -> float:
    """Mean return of one episode per sub-env, greedy or sampled (MinAtar's have no limit:
    capped as grpo_trainer's evaluate caps them)."""
    import numpy as np

    from grpo_trainer.run.evaluation import EVAL_HORIZON

    obs, _ = envs.reset(seed=[seed + i for i in range(envs.num_envs)])
    returns, alive = np.zeros(envs.num_envs), np.ones(envs.num_envs, dtype=bool)
    for _ in range(EVAL_HORIZON):
        if not alive.any():
            break
        seen = model.get_env().normalize_obs(obs) if normalize else obs
        action, _ = model.predict(seen, deterministic=greedy)
        obs, reward, terminated, truncated, _ = envs.step(action)
        returns += reward * alive
        alive &= ~(terminated | truncated)
    return float(returns.mean())


RUNNERS = {"grpo": run_grpo, "ppo_jax": run_ppo_jax, "sb3": run_sb3}


def worker(job: dict[str, Any]) -> int:
    """One run in this fresh process: pin, train, write the record to `job["out"]`."""
    device = job.get("device", "cpu")
    pin_worker(job["cpu"], device)
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    task = TASKS[job["task"]]
    record = RUNNERS[job["kind"]](task, job)
    record.update(
        trainer=job["row"],
        seed=job["seed"],
        repeat=job["repeat"],
        cpu=job["cpu"],
        cpus_allowed=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        torch_threads=torch.get_num_threads(),
        device=device,  # the study's machine, GPU included, is in its JSON (`machine`)
    )
    Path(job["out"]).write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(worker(json.loads(sys.argv[1])))
