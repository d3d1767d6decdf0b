"""Hyper-parameter sweeps with Optuna: `python -m grpo_trainer sweep --space SPACE.json`.

Each trial draws values for the space's fields (`search_space.py`), sets them on the base
config and trains in this process into `SWEEP_DIR/trial_NNNN/`, reporting every evaluation
to Optuna's pruner. The objectives, the resumable study and its outputs: docs/trainer.md,
"Sweeps with Optuna".
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import logging
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from grpo_trainer.base.checkpoint import atomic_write_text
from grpo_trainer.base.config import GRPOConfig, eval_interval
from grpo_trainer.run.callbacks import Callback, RunState
from grpo_trainer.tools.search_space import Param, apply, check_against, parse_space

log = logging.getLogger(__name__)

OBJECTIVES = {"eval_score": "maximize", "time_to_target": "minimize"}
PRUNERS = ("median", "none")
MEDIAN_STARTUP_TRIALS = 5  # the median pruner prunes nothing until this many trials finished
NOT_REACHED = math.inf  # time_to_target of a trial that never reached the target
FINISHED = ("COMPLETE", "PRUNED")  # the trial states that count toward --trials


def import_optuna() -> Any:
    """The `optuna` module, or an `ImportError` that says how to get it."""
    try:
        import optuna
    except ImportError:
        raise ImportError(
            "sweep needs the optuna package: pip install 'fruit-grpo[sweep]' "
            "(from a checkout: pip install -e '.[sweep]')",
            name="optuna",
        ) from None
    return optuna


class TrialReporter(Callback):
    """Reports each evaluation to an Optuna trial and stops the run when the pruner says so
    (or, for `time_to_target`, once the target is reached)."""

    def __init__(self, trial: Any, objective: str) -> None:
        self.trial = trial
        self.objective = objective
        self.best_score = -math.inf
        self.evaluations = 0
        self.reached_s: float | None = None
        self.pruned_at: int | None = None
        self.target: Any = None

    def on_train_start(self, state: RunState) -> None:
        self.target = state.target
        if self.objective == "time_to_target" and self.target is None:
            raise ValueError(
                "objective time_to_target needs a target: set run.target in the base config "
                '("target": "return=475" under "run"), or sweep an env that declares a goal; '
                "or use --objective eval_score"
            )

    def on_eval(self, state: RunState, metrics: dict[str, float]) -> None:
        if self.pruned_at is not None:  # stopping: the update it waits for evaluated too
            return
        self.evaluations += 1
        score = metrics.get("eval_score", math.nan)
        if math.isfinite(score):
            self.best_score = max(self.best_score, score)
        if "target_reached_s" in metrics:
            self.reached_s = metrics["target_reached_s"]
        if self.objective == "time_to_target":
            if self.reached_s is not None:
                state.request_stop("the trial reached the target")
                return
            value = self.target.value - metrics.get(self.target.metric, math.nan)
        else:
            value = score
        if not math.isfinite(value):
            return
        step = state.env_steps
        self.trial.report(value, step)
        if self.trial.should_prune():
            self.pruned_at = step
            state.request_stop(f"pruned by the sweep at {step} env steps")


@dataclasses.dataclass
class Sweep:
    """One sweep: the space, the base config and where it all goes."""

    params: list[Param]
    base: dict[str, Any]
    sweep_dir: Path
    objective: str = "eval_score"

    @classmethod
    def starting_from(
        cls, base: GRPOConfig, params: list[Param], sweep_dir: str | Path, objective: str
    ) -> Sweep:
        """A sweep whose trials start from what `base` asked for, not what it derived: a
        trial that draws another budget or batch derives its own minibatch and learning rate."""
        return cls(params, json.loads(json.dumps(base.inputs())), Path(sweep_dir), objective)

    def trial_config(self, values: dict[str, Any], number: int) -> GRPOConfig:
        """The config trial `number` trains with: the base's inputs with the trial's draws,
        resolved once from them (a drawn budget derives its own batch and learning rate)."""
        data = apply(self.base, values)
        data["run"]["run_dir"] = str(self.sweep_dir / f"trial_{number:04d}")
        data["run"]["resume"] = None
        return GRPOConfig.from_dict(data)

    def run_trial(self, trial: Any) -> float:
        """Optuna's objective: train one trial's config and score it."""
        optuna = import_optuna()
        from grpo_trainer.run.trainer import open_run

        config = self.trial_config({p.name: p.suggest(trial) for p in self.params}, trial.number)
        check_evaluates(config)
        trial.set_user_attr("config", json.loads(json.dumps(config.to_file_dict())))
        reporter = TrialReporter(trial, self.objective)
        start = time.perf_counter()
        trainer = open_run(config)
        try:
            try:
                trainer.train(callbacks=[reporter])
            finally:
                trial.set_user_attr("env_steps", trainer.env_steps)
                if math.isfinite(reporter.best_score):
                    trial.set_user_attr("best_eval_score", reporter.best_score)
                trial.set_user_attr("wall_s", round(time.perf_counter() - start, 3))
        finally:
            trainer.env.envs.close()
        if trainer.stop_signal:  # Ctrl-C: the trial is unfinished, and so is the sweep
            raise KeyboardInterrupt(f"trial {trial.number} stopped by {trainer.stop_signal}")
        if reporter.pruned_at is not None:
            raise optuna.TrialPruned(f"pruned at {reporter.pruned_at} env steps")
        if self.objective == "time_to_target":
            return reporter.reached_s if reporter.reached_s is not None else NOT_REACHED
        if not math.isfinite(reporter.best_score):
            raise ValueError(f"trial {trial.number}: no evaluation gave a score")
        return reporter.best_score

    def write_outputs(self, study: Any, _trial: Any = None) -> None:
        """`results.csv` and `best_config.json`, rewritten (atomically) after every trial."""
        names = [p.name for p in self.params]
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["number", "state", "value", "env_steps", "wall_s", *names])
        for t in study.trials:
            params = [t.params.get(n, "") for n in names]
            attrs = t.user_attrs
            row = [t.number, t.state.name, "" if t.value is None else t.value]
            writer.writerow([*row, attrs.get("env_steps", ""), attrs.get("wall_s", ""), *params])
        atomic_write_text(out.getvalue(), self.sweep_dir / "results.csv")
        best = best_trial(study)
        if best is not None:
            config = json.loads(json.dumps(best.user_attrs["config"]))
            config["run"]["run_dir"] = None  # train --config: write where its flags say
            text = json.dumps(config, indent=2) + "\n"
            atomic_write_text(text, self.sweep_dir / "best_config.json")
        if _trial is not None:
            value = "" if _trial.value is None else f" {self.objective} {_trial.value:.4g}"
            shown = f", best trial {best.number} ({best.value:.4g})" if best else ""
            log.info(
                "sweep: trial %d %s%s %s%s",
                _trial.number,
                _trial.state.name.lower(),
                value,
                _trial.params,
                shown,
            )


def run_sweep(
    space: Sequence[Param] | dict[str, Any],
    base: GRPOConfig | dict[str, Any],
    trials: int,
    sweep_dir: str | Path,
    *,
    objective: str = "eval_score",
    pruner: str | Any = "median",
    seed: int = 0,
    study_name: str = "sweep",
) -> Any:
    """Run (or continue) a sweep until `trials` trials finished; returns the Optuna study.

    `space` is a list of `Param` or the space file's JSON data; `base` the config every trial
    starts from. `pruner` is "median" (`MedianPruner(n_startup_trials=5)`), "none", or any
    Optuna pruner object. Bad arguments raise `ValueError`.
    """
    optuna = import_optuna()
    params = list(space) if not isinstance(space, dict) else parse_space(space)
    config = base if isinstance(base, GRPOConfig) else GRPOConfig.from_dict(base)
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {list(OBJECTIVES)}, got {objective!r}")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials!r}")
    if isinstance(pruner, str) and pruner not in PRUNERS:
        raise ValueError(f"pruner must be one of {list(PRUNERS)}, got {pruner!r}")
    check_evaluates(config)
    sweep = Sweep.starting_from(config, params, sweep_dir, objective)
    check_against(params, sweep.base)
    sweep.sweep_dir.mkdir(parents=True, exist_ok=True)
    with locked_sweep_dir(sweep.sweep_dir):
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep logs each trial
        study = optuna.create_study(
            storage=f"sqlite:///{(sweep.sweep_dir / 'study.db').resolve()}",
            study_name=study_name,
            direction=OBJECTIVES[objective],
            pruner=_pruner(optuna, pruner),
            load_if_exists=True,
        )
        _same_sweep(study, sweep, study_name)
        for t in study.trials:  # left running by a crash or Ctrl-C: failed, and replaced
            if t.state.name == "RUNNING":
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        done = sum(t.state.name in FINISHED for t in study.trials)
        # a continued sweep must not draw the first trials' values again
        study.sampler = optuna.samplers.TPESampler(seed=seed + len(study.trials))
        try:
            if done < trials:
                study.optimize(
                    sweep.run_trial, n_trials=trials - done, callbacks=[sweep.write_outputs]
                )
        finally:  # a trial that raised is in the study too (failed)
            sweep.write_outputs(study)
    return study


def best_trial(study: Any) -> Any:
    """The best complete trial, or None before the first. Equal values (`time_to_target`'s
    `inf` for trials that never reached the target) go to the best evaluation score, so that
    with no trial at the target `best_config.json` is the one that came closest."""
    complete = [t for t in study.trials if t.state.name == "COMPLETE" and t.value is not None]
    if not complete:
        return None
    sign = 1.0 if study.direction.name == "MAXIMIZE" else -1.0
    return max(
        complete,
        key=lambda t: (sign * t.value, t.user_attrs.get("best_eval_score", -math.inf)),
    )


def check_evaluates(config: GRPOConfig) -> None:
    """Trials are scored by evaluation during training: at least one must happen."""
    every, total = eval_interval(config), config.total_env_steps
    if not 1 <= every <= total:
        raise ValueError(
            f"eval_every must be between 1 and total_env_steps ({total}) in a sweep, whose "
            f"trials are scored by evaluation during training; got {every}"
        )


def _pruner(optuna: Any, pruner: str | Any) -> Any:
    if pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=MEDIAN_STARTUP_TRIALS)
    if pruner == "none":
        return optuna.pruners.NopPruner()
    return pruner


def _same_sweep(study: Any, sweep: Sweep, study_name: str) -> None:
    """A continued study must be the same sweep: same space, base config and objective."""
    spec = {
        "space": [dataclasses.asdict(p) for p in sweep.params],
        "base": sweep.base,
        "objective": sweep.objective,
    }
    spec = json.loads(json.dumps(spec))
    stored = study.user_attrs.get("sweep")
    if stored is None:
        study.set_user_attr("sweep", spec)
    elif stored != spec:
        differ = ", ".join(k for k in spec if spec[k] != stored.get(k))
        raise ValueError(
            f"{sweep.sweep_dir} holds the study {study_name!r} of another sweep (a different "
            f"{differ}): rerun it as it was, or choose another --sweep-dir or --study-name"
        )


@contextlib.contextmanager
def locked_sweep_dir(folder: Path) -> Iterator[None]:
    """Hold `folder/sweep.lock` (POSIX) while a sweep runs there: a second process refuses,
    naming the folder, instead of racing the first on its study and files."""
    try:
        import fcntl
    except ImportError:  # no fcntl (Windows): no lock
        yield
        return
    with open(folder / "sweep.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ValueError(
                f"another process is running the sweep in {folder}; wait for it, or choose "
                "another --sweep-dir"
            ) from None
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
