"""The study harness: GRPO trained as a user trains it, on every task, beside PPO peers.

    python benchmarks/suite.py                                   # every task, seeds 0 1 2
    python benchmarks/suite.py cartpole pendulum --jobs 2        # two lanes, one core each
    python benchmarks/suite.py breakout --peers grpo,ppo_jax,sb3 # SB3 PPO as well
    python benchmarks/suite.py breakout freeway asterix space_invaders \
        --set 'gamma999={"gamma": 0.999}' --name study_gamma     # a variant beside the defaults
    python benchmarks/suite.py fruit --against 02eed59 --peers grpo --seeds 0 1 --repeats 2 \
        --eval-every 100000 --eval-episodes 1000 --stop-at-threshold --name fruit_vs_02eed59
    python benchmarks/suite.py fruit --throughput 20 --peers grpo \
        --set '4096 envs={"num_groups": 512}'                    # env-steps/s of each row
    python benchmarks/suite.py cartpole --budget 4096 --seeds 0 --peers grpo  # smoke
    python benchmarks/suite.py breakout freeway asterix space_invaders --wallclock \
        --name wallclock                                         # GRPO on PPO's seconds
    python benchmarks/suite.py breakout --wallclock --device cuda --budget 10000000 \
        --seeds 0 --name wallclock_gpu                           # the same on one GPU
    python benchmarks/suite.py --table                           # markdown for docs/trainer.md

Rows. Every task (`TASKS`: GRPO's env, budget, threshold, each peer's env: `Task.env_for`)
is trained by rows; MinAtar's GRPO rows train the kit's torch games (`fruit_env:Breakout-
MinAtar-v0`, ...), the PPO peer gymnax's, and a study whose GRPO game is not registered
stops before it starts, naming the id:

* `grpo`: the defaults, trained through the path a user takes. The config comes from the
  train command's own parser and resolution, `config_from_args(build_parser().parse_args(
  ["train", "--env", ENV, "--total-env-steps", BUDGET, "--seed", SEED, ...]))` (`--device
  cpu --no-progress --eval-every 0` besides: where it runs, not what it learns), and
  `open_run(config, device).train(callbacks=[...])` runs it (the command's way into a
  run: the env made once, the config resolved from its contract): the harness `python -m
  grpo_trainer train` runs, with one more callback that evaluates. Nothing here builds a
  `GRPOConfig` itself, so the figures are what the command line gives.
* a variant, `--set NAME=JSON` (repeatable): config fields as the train command takes them,
  `{"gamma": 0.999, "hidden_sizes": [32, 32], "env_kwargs": {...}, "compile": false}`,
  turned into its flags (`variant_flags`) after the task's; `{"env": "gymnax:CartPole-v1"}`
  trains the task on another env family; `{"config": "file.json"}` passes `--config`.
* `--against REV`: every GRPO row again, trained by the tree at git revision REV (exported
  with `git archive`, first on the worker's `sys.path`), named `ROW@REV`; within a lane it
  runs right after the same row of this tree, seed by seed, so that both see the same load.
* the peers (`--peers`): `ppo_jax`, our PureJaxRL-style PPO compiled with XLA
  (`benchmarks/ppo_jax.py`) with its published preset, where gymnax has the env (its compile
  time apart from its training time); `sb3`, Stable-Baselines3 PPO with RL-Zoo's settings
  (MinAtar: SB3's defaults, `MlpPolicy` on the flattened planes of the `minatar` package).

What is measured. The greedy policy (most likely action, Gaussian mean) and the sampled one
(actions drawn as in training) each play `--eval-episodes` episodes (100, the same games) on
envs of their own every tenth of the budget (or every `--eval-every` env steps), at the first
update past each mark, and at the end; evaluation is timed apart from training. Per run: the
curve (env steps, training seconds, `elapsed_s` with the peer's compile added, greedy and
sampled value), the env steps and training seconds at the first evaluation at or above the
threshold (None if none), the final greedy and sampled values, the training seconds and env
steps per second. The value is the mean return, or Fruit Catcher's catch rate. GRPO's
training seconds are the wall time since `train()` was called up to each update,
evaluations taken out (the first update included: on a
gymnax env it holds the JIT compile of the env's step, `first_update_s` shows it); the JAX
peer's compile is reported apart (`compile_s`). MinAtar's threshold is the PPO peer's median
final greedy return in the same study (so "reached" reads "as good as PPO's typical final
policy"), else a named constant (none for Asterix and SpaceInvaders, whose rows then only
report returns). A median "to threshold" over runs counts a run that never got there as
infinitely late: it is None unless more than half of the runs got there.
`--wallclock` (`benchmarks/suite_wallclock.py`) runs the PPO peer first for each (task,
seed) and gives every GRPO row of that seed its `elapsed_s` (compile, set-up and training)
as a time budget on the same core: a calibration run sets the env steps the budget buys
(its updates' size, and the learning-rate schedule anneals over them; with
`--trainer-clock` the train command also gets the seconds as `--time-budget-s`, and the
schedule anneals by the clock), and the run stops when its training has taken the budget
(its `stop_reason` names it); per seed the JSON's `versus_peer_wallclock` sets
both side by side, with the time each took to reach the peer's final greedy return.
`--stop-at-threshold` ends each GRPO run after the evaluation that reaches a fixed threshold
(a time-to-target study; its final value is then that evaluation's). `--throughput N` trains
each GRPO row for N timed updates after one untimed one, no evaluation, and reports the
median env-steps/s of those updates.

Why one process per run. Every (task, row, seed, repeat) runs in a fresh process
(`benchmarks/suite_runs.py`), pinned to one CPU (`os.sched_setaffinity`), with one torch thread and
XLA's one-thread flags set before JAX is imported: no run inherits another's caches,
compiled functions, allocator or thread pools, and each trainer gets one core. A run records
the CPUs it was allowed at its end (`cpus_allowed`); if something outside the suite moved it
off its CPU, its line says MOVED, and its seconds are not a clean measurement. Runs go in
lanes: within a lane the rows alternate per seed (grpo s0, grpo@REV s0, variant s0, ppo_jax
s0, grpo s1, ...); `--jobs 2` runs two lanes at once, one per core (`--cpu` picks the cores),
which halves a study's wall time but lets the lanes share caches and memory bandwidth;
`--jobs 1` is the quiet measurement. JAX's compiled gymnax steps come from the trainer's
persistent cache as a user's do; `--jax-cache cold` gives every GRPO run an empty one (a
machine's first run).

Results: one JSON per task, `benchmarks/results/<name>_<task>.json` (`--name`, default
`suite`, or `suite_throughput` with `--throughput`; `--results DIR` or `SUITE_RESULTS` for
another folder), rewritten after every finished run (`complete` says whether all of the
study's runs are in). Each holds the command, timestamp, machine, library versions and git
revisions, the rows (their fields and flags), the runs per row and a summary per row. The
extras: `pip install -c constraints.txt -e '.[jax,gymnax,sb3,box2d,minatar]'`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from suite_table import render_table  # noqa: E402
from suite_tasks import (  # noqa: E402
    EVAL_EPISODES,
    FALLBACK_SOURCE,
    PEER,
    TASKS,
    TRAINERS,
    Task,
    eval_marks,
    missing_env,
    skip_reason,
)
from suite_wallclock import (  # noqa: E402
    CALIBRATION_UPDATES,
    HEADROOM,
    run_wallclock,
    side_by_side,
)

WORKER = HERE / "suite_runs.py"  # one run, in a fresh process
KINDS = ("grpo", "ppo_jax", "sb3")  # what --peers may name


@dataclasses.dataclass(frozen=True)
class Row:
    """One trainer row of a study: what trains the tasks, and the name its runs go under."""

    name: str  # grpo, a variant's NAME, ROW@REV, ppo_jax or sb3
    kind: str  # "grpo" (trained through the train command's path), "ppo_jax" or "sb3"
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)  # a variant's JSON
    flags: tuple[str, ...] = ()  # the train flags the fields become
    against: str | None = None  # the git revision whose tree trains it (None: this tree)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "fields": self.fields,
            "flags": list(self.flags),
            "tree": self.against or "this",
        }


# ---------------------------------------------------------------- variants: fields to flags


def _train_parser() -> argparse.ArgumentParser:
    from grpo_trainer.tools.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["train"]


def variant_flags(fields: dict[str, Any]) -> list[str]:
    """A variant's config fields as the train command's flags, checked by parsing them back.

    `{"gamma": 0.999, "hidden_sizes": [32, 32], "env_kwargs": {"a": 1}, "compile": false}`
    -> `--gamma 0.999 --hidden-sizes 32,32 --env-kwargs '{"a": 1}' --no-compile`: each flag
    is written in the form its parser action reads (a comma list for a tuple, JSON for a
    dict, `--x`/`--no-x` for a bool), and the parsed values must equal the JSON's, so a
    variant runs with exactly the values it names. `RunConfig` fields are flags too (they
    may also be nested under "run"); `"config": PATH` passes `--config PATH`. Raises
    `ValueError` naming the field for a field that is not a flag or a value it cannot take.
    """
    if not isinstance(fields, dict):
        raise ValueError(f"a variant is a JSON object of config fields, got {fields!r}")
    flat = {k: v for k, v in fields.items() if k != "run"}
    run = fields.get("run", {})
    if not isinstance(run, dict):
        raise ValueError(f'"run" must be a JSON object of RunConfig fields, got {run!r}')
    twice = sorted(set(flat) & set(run))
    if twice:
        raise ValueError(f"{', '.join(twice)} given both at the top level and under run")
    flat.update(run)
    parser = _train_parser()
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
    flags: list[str] = []
    for name, value in flat.items():
        action = actions.get(name)
        if action is None:
            raise ValueError(f"{name} is not a flag of the train command (see grpo train --help)")
        flag = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            if not isinstance(value, bool):
                raise ValueError(f"{name} is true or false, got {value!r}")
            flags.append(flag if value else "--no-" + flag[2:])
        elif value is None:  # a field that allows None takes "none"; any other refuses it
            flags += [flag, "none"]
        elif isinstance(value, bool):
            raise ValueError(f"{name} is not a true/false field, got {value!r}")
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        elif isinstance(value, list | tuple):
            flags += [flag, ",".join(str(item) for item in value)]
        else:
            flags += [flag, str(value)]
    parsed = _parse_quietly(parser, flags)
    for name, value in flat.items():
        got = getattr(parsed, name)
        want = tuple(value) if isinstance(value, list) else value
        if name == "config":
            got, want = str(got), str(value)
        if got != want:
            raise ValueError(f"{name}: {value!r} reads back as {got!r} from {shlex.join(flags)}")
    return flags


def _parse_quietly(parser: argparse.ArgumentParser, flags: list[str]) -> argparse.Namespace:
    """`parser.parse_args(flags)`, its usage error as a `ValueError` rather than an exit."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(flags)
    except SystemExit:
        message = err.getvalue().strip().splitlines()
        raise ValueError(message[-1] if message else f"cannot parse {flags}") from None


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """`NAME=JSON` -> (NAME, the JSON object)."""
    name, sep, body = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"--set takes NAME=JSON, got {text!r}")
    if name in TRAINERS or "@" in name:
        raise ValueError(f"--set {name}: the name is taken (or has '@'); choose another")
    try:
        fields = json.loads(body)
    except json.JSONDecodeError as err:
        raise ValueError(f"--set {name}: not JSON ({err}): {body!r}") from None
    if not isinstance(fields, dict):
        raise ValueError(f"--set {name}: expected a JSON object of config fields, got {body!r}")
    return name, fields


# ---------------------------------------------------------------- the study (the parent)


def reached_at(curve: list[dict[str, Any]], threshold: float | None) -> dict[str, Any] | None:
    """The first evaluation at or above `threshold`: its env steps and training seconds."""
    if threshold is None:
        return None
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


def resolve_threshold(
    task: Task, runs: dict[str, list[dict[str, Any]]]
) -> tuple[float | None, str]:
    """The task's threshold and where it comes from (for PEER: the peer's runs, if any)."""
    if task.threshold != PEER:
        return float(task.threshold), "fixed"
    finals = [r["final_eval"] for r in runs.get(PEER, []) if r.get("final_eval") is not None]
    if finals:
        return statistics.median(finals), f"{PEER}: median final greedy return, this study"
    if task.fallback is None:
        return None, f"none: {PEER} did not run and no constant is known"
    return task.fallback, FALLBACK_SOURCE


def summarise(runs: list[dict[str, Any]], threshold: float | None) -> dict[str, Any]:
    """Per row: runs reaching the threshold, medians to it, final greedy spread."""
    ok = [r for r in runs if "error" not in r]
    hits = [reached_at(r["curve"], threshold) for r in ok] + [None] * (len(runs) - len(ok))
    finals = [r["final_eval"] for r in ok if r.get("final_eval") is not None]
    sampled = [r["final_eval_sampled"] for r in ok if r.get("final_eval_sampled") is not None]

    def median_of(key: str) -> float | None:
        values = [r[key] for r in ok if r.get(key) is not None]
        return statistics.median(values) if values else None

    return {
        "runs": len(runs),
        "failed": len(runs) - len(ok),
        "reached": None if threshold is None else sum(h is not None for h in hits),
        "median_env_steps_to_threshold": median_to_threshold([h and h["env_steps"] for h in hits]),
        "median_train_s_to_threshold": median_to_threshold([h and h["train_s"] for h in hits]),
        "final_eval": spread(finals),
        "final_eval_sampled": spread(sampled),
        "median_train_s": median_of("train_s"),
        "median_elapsed_s": median_of("elapsed_s"),
        "median_env_steps_per_s": median_of("env_steps_per_s"),
        "median_compile_s": median_of("compile_s"),
        "update_env_steps_per_s": spread(
            [
                r["median_update_env_steps_per_s"]
                for r in ok
                if r.get("median_update_env_steps_per_s")
            ]
        ),
    }


def versus_peer(summary: dict[str, Any], threshold_source: str) -> dict[str, Any] | None:
    """MinAtar: GRPO's wall time to the peer's median final return, against the peer's own
    training time, and whether GRPO's final greedy return is at least the peer's."""
    grpo, peer = summary.get("grpo"), summary.get(PEER)
    if not grpo or not peer or not peer["final_eval"] or not threshold_source.startswith(PEER):
        return None
    grpo_final = grpo["final_eval"]["mean"] if grpo["final_eval"] else None
    sampled = {
        f"{name}_final_sampled_mean": row["final_eval_sampled"]["mean"]
        if row.get("final_eval_sampled")
        else None
        for name, row in (("grpo", grpo), ("peer", peer))
    }
    return {
        **sampled,
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


def versus_against(summary: dict[str, Any], rev: str | None) -> dict[str, Any] | None:
    """Each GRPO row against the same row trained by revision `rev`: medians and the ratios
    REV / this (above 1: this tree is faster)."""
    if rev is None:
        return None
    out = {}
    for name, this in summary.items():
        other = summary.get(f"{name}@{rev}")
        if other is None:
            continue

        def ratio(key: str, a: dict[str, Any] = this, b: dict[str, Any] = other) -> float | None:
            x, y = a.get(key), b.get(key)
            return round(y / x, 4) if x and y else None

        rates = this.get("update_env_steps_per_s"), other.get("update_env_steps_per_s")
        out[name] = {
            "this_median_train_s_to_threshold": this["median_train_s_to_threshold"],
            "against_median_train_s_to_threshold": other["median_train_s_to_threshold"],
            "this_median_env_steps_to_threshold": this["median_env_steps_to_threshold"],
            "against_median_env_steps_to_threshold": other["median_env_steps_to_threshold"],
            "against_over_this_train_s_to_threshold": ratio("median_train_s_to_threshold"),
            "against_over_this_env_steps_to_threshold": ratio("median_env_steps_to_threshold"),
            "this_over_against_update_env_steps_per_s": round(
                rates[0]["median"] / rates[1]["median"], 4
            )
            if all(rates)
            else None,
        }
    return out


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


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise ValueError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def this_tree() -> dict[str, Any]:
    """The commit this tree is at, and whether it has changes on top (what `this` ran)."""
    try:
        return {"head": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain"))}
    except (ValueError, OSError):
        return {"head": None, "dirty": None}


def export_tree(rev: str, into: Path) -> tuple[Path, str]:
    """The tree at `rev` (`git archive`, extracted under `into`) and its full commit hash."""
    commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    archive = into / "tree.tar"
    with archive.open("wb") as out:
        done = subprocess.run(
            ["git", "archive", commit], cwd=ROOT, stdout=out, stderr=subprocess.PIPE
        )
    if done.returncode:
        raise ValueError(f"git archive {rev}: {done.stderr.decode().strip()}")
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    return tree, commit


def study_rows(args: argparse.Namespace) -> list[Row]:
    """The rows in the order a lane runs them per seed: each GRPO row then its @REV twin,
    then the peers; with `--wallclock` the PPO peer first, whose time is the GRPO rows'."""
    grpo = [Row("grpo", "grpo")] if "grpo" in args.peers else []
    grpo += [Row(name, "grpo", fields, tuple(flags)) for name, fields, flags in args.variants]
    rows: list[Row] = []
    for row in grpo:
        rows.append(row)
        if args.against:
            rows.append(
                dataclasses.replace(row, name=f"{row.name}@{args.against}", against=args.against)
            )
    peers = [Row(p, p) for p in args.peers if p != "grpo"]
    if args.wallclock:
        return [p for p in peers if p.kind == PEER] + rows + [p for p in peers if p.kind != PEER]
    return rows + peers


class Study:
    """The runs of one invocation, per task; each task's JSON is rewritten after every run."""

    def __init__(
        self,
        args: argparse.Namespace,
        folder: Path,
        budgets: dict[str, int],
        against: dict[str, Any] | None = None,
    ) -> None:
        from _common import machine_info

        self.args, self.folder, self.budgets = args, folder, budgets
        self.against = against  # {"rev", "commit", "path"} with --against
        self.lock = threading.Lock()
        self.machine = machine_info()  # this process's; each run records its own threads
        self.machine.pop("torch_threads")
        self.machine["threads_per_run"] = 1
        self.software = versions()
        self.tree = this_tree()
        self.rows = study_rows(args)
        throughput = args.throughput is not None
        self.runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            name: {
                r.name: [] for r in self.rows if not skip_reason(TASKS[name], r.kind, throughput)
            }
            for name in args.tasks
        }
        self.failed = 0

    def add(self, name: str, record: dict[str, Any]) -> Path:
        with self.lock:
            self.runs[name][record["trainer"]].append(record)
            self.runs[name][record["trainer"]].sort(key=lambda r: (r["seed"], r.get("repeat", 0)))
            self.failed += "error" in record
            return self.write(name)

    def payload(self, name: str) -> dict[str, Any]:
        task, runs, args = TASKS[name], self.runs[name], self.args
        threshold, source = resolve_threshold(task, runs)
        for row_runs in runs.values():
            for r in row_runs:
                r["reached"] = None if "error" in r else reached_at(r["curve"], threshold)
        summary = {t: summarise(rs, threshold) for t, rs in runs.items()}
        expected = len(args.seeds) * args.repeats * len(runs)
        throughput = args.throughput is not None
        skipped = {
            r.name: skip_reason(task, r.kind, throughput) for r in self.rows if r.name not in runs
        }
        return {
            "task": name,
            "mode": "throughput" if throughput else "learning",
            "env": task.env,
            "gymnax_env": task.gymnax,
            "sb3_env": task.sb3.env if task.sb3 else None,
            "envs": {r.kind: task.env_for(r.kind) for r in self.rows},
            "metric": task.metric,
            "budget": self.budgets[name],
            "threshold": threshold,
            "threshold_source": source,
            "eval_marks": [] if throughput else eval_marks(self.budgets[name], args.eval_every),
            "eval_episodes": args.eval_episodes,
            "stop_at_threshold": args.stop_at_threshold,
            "wallclock": args.wallclock,
            "calibration_updates": args.calibrate if args.wallclock else None,
            "trainer_clock": args.trainer_clock,
            "wallclock_headroom": HEADROOM if args.wallclock else None,
            "timed_updates": args.throughput,
            "seeds": args.seeds,
            "repeats": args.repeats,
            "peers": [r.name for r in self.rows],
            "rows": {r.name: r.describe() for r in self.rows},
            "tree": self.tree,
            "against": None
            if self.against is None
            else {k: v for k, v in self.against.items() if k != "path"},
            "jax_cache": args.jax_cache,
            "skipped": skipped,
            "jobs": args.jobs,
            "cpus": args.cpu,
            "complete": sum(len(rs) for rs in runs.values()) == expected,
            "machine": {**self.machine, "load_average_now": os.getloadavg()},
            "software": self.software,
            "summary": summary,
            "versus_peer": versus_peer(summary, source),
            "versus_against": versus_against(summary, args.against),
            "versus_peer_wallclock": side_by_side(runs, PEER) if args.wallclock else None,
            "runs": runs,
        }

    def write(self, name: str) -> Path:
        from _common import write_result

        return write_result(f"{self.args.name}_{name}", self.payload(name), self.folder)

    def job(
        self,
        name: str,
        row: Row,
        seed: int,
        repeat: int,
        cpu: int,
        time_budget_s: float | None = None,
    ) -> dict[str, Any]:
        """What a worker needs to run one (task, row, seed, repeat); a time budget stops a
        GRPO run when its training has taken that long."""
        task, args = TASKS[name], self.args
        stop_at = None
        if args.stop_at_threshold and row.kind == "grpo" and task.threshold != PEER:
            stop_at = float(task.threshold)
        return {
            "task": name,
            "row": row.name,
            "kind": row.kind,
            "seed": seed,
            "repeat": repeat,
            "cpu": cpu,
            "device": args.device,
            "budget": self.budgets[name],
            "flags": list(row.flags),
            "tree_path": self.against["path"] if row.against and self.against else None,
            "eval_every": args.eval_every,
            "eval_episodes": args.eval_episodes,
            "stop_at": stop_at,
            "throughput": args.throughput,
            "cold_cache": args.jax_cache == "cold" and row.kind == "grpo",
            "time_budget_s": time_budget_s,
            "trainer_clock": args.trainer_clock,
        }


def run_job(job: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """One run in a fresh worker process (with the tree it names first on its path); a
    failure becomes a record with `error`."""
    stem = f"{job['task']}_{job['row']}_{job['seed']}_{job['repeat']}".replace("@", "_at_")
    out = tmp / f"{stem.replace(' ', '_').replace('/', '_')}.json"
    command = [sys.executable, str(WORKER), json.dumps({**job, "out": str(out)})]
    tree = job.get("tree_path") or str(ROOT)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")])),
    }
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="suite-cache-") as cache:
        if job.get("cold_cache"):
            env["GRPO_TRAINER_CACHE_DIR"] = cache
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    wall_s = round(time.perf_counter() - start, 2)
    base = {
        "trainer": job["row"],
        "seed": job["seed"],
        "repeat": job["repeat"],
        "cpu": job["cpu"],
        "wall_s": wall_s,
    }
    if done.returncode != 0 or not out.exists():
        return {**base, "error": (done.stderr.strip() or done.stdout.strip())[-3000:]}
    return {**json.loads(out.read_text()), "wall_s": wall_s}


def run_study(study: Study) -> None:
    """Units of (task, seed, repeat) go to lanes as they free up; a lane runs a unit's rows
    in turn (`study.rows`' order), each in a fresh process pinned to the lane's CPU."""
    args = study.args
    units = deque(
        (name, seed, repeat)
        for name in args.tasks
        for seed in args.seeds
        for repeat in range(args.repeats)
    )
    take = threading.Lock()

    def lane(cpu: int) -> None:
        with tempfile.TemporaryDirectory(prefix="suite-") as tmp:
            while True:
                with take:
                    if not units:
                        return
                    name, seed, repeat = units.popleft()
                budget_s = None  # with --wallclock: the PPO peer's seconds for this seed
                for row in study.rows:
                    if row.name not in study.runs[name]:
                        continue
                    job = study.job(name, row, seed, repeat, cpu)
                    if args.wallclock and row.kind == "grpo":
                        record = run_wallclock(
                            job, budget_s, args.calibrate, lambda j: run_job(j, Path(tmp))
                        )
                    else:
                        record = run_job(job, Path(tmp))
                    if row.kind == PEER and "error" not in record:
                        budget_s = record["elapsed_s"]
                    path = study.add(name, record)
                    print(_line(name, record, path), flush=True)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for future in [pool.submit(lane, cpu) for cpu in args.cpu[: args.jobs]]:
            future.result()


def _line(name: str, record: dict[str, Any], path: Path) -> str:
    head = f"{name} {record['trainer']} seed {record['seed']} (cpu {record['cpu']}):"
    allowed = record.get("cpus_allowed")
    if allowed is not None and allowed != [record["cpu"]]:
        # something outside the suite changed the worker's affinity: its seconds shared a core
        head += f" MOVED (it ended allowed on CPUs {allowed}: its seconds are not clean)"
    if "error" in record:
        return f"{head} FAILED: {record['error'].splitlines()[-1] if record['error'] else '?'}"
    if "timed_updates" in record:
        rate = record["median_update_env_steps_per_s"] or 0
        return (
            f"{head} {rate:,.0f} env-steps/s over {record['timed_updates']} updates -> {path.name}"
        )
    if record.get("time_budget_s") is not None:
        stop = record.get("stop_reason") or "its env steps ran out first"
        return (
            f"{head} final greedy {record['final_eval']:.3g}, sampled "
            f"{record['final_eval_sampled']:.3g}; {record['env_steps']:,} steps (estimated "
            f"{record['estimated_env_steps']:,}) in {record['elapsed_s']:.1f} s of "
            f"{record['time_budget_s']:.1f} s: {stop} -> {path.name}"
        )
    hit = record.get("reached")
    to = (
        f"threshold at {hit['env_steps']:,} steps, {hit['train_s']:.1f} s" if hit else "not reached"
    )
    final = record["final_eval"]
    shown = "-" if final is None else f"{final:.3g}"
    sampled = record.get("final_eval_sampled")
    compiled = f", {record['elapsed_s']:.1f} s with compile" if record.get("compile_s") else ""
    return (
        f"{head} final greedy {shown}, sampled {'-' if sampled is None else f'{sampled:.3g}'}, "
        f"{to}; {record['env_steps']:,} steps in {record['train_s']:.1f} s{compiled} "
        f"({record['env_steps_per_s'] or 0:,.0f}/s) -> {path.name}"
    )


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="*", metavar="TASK", help=f"of {', '.join(TASKS)}")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--peers", default="grpo,ppo_jax", help=f"trainers, comma-separated, of {','.join(KINDS)}"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=JSON",
        dest="variants",
        help="a GRPO variant row: config fields as the train command takes them, e.g. "
        "gamma999='{\"gamma\": 0.999}' (repeatable)",
    )
    parser.add_argument(
        "--against", metavar="REV", help="also train every GRPO row with REV's tree"
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs per seed and row")
    parser.add_argument(
        "--eval-every",
        type=int,
        help="env steps between evaluations (default: a tenth of the budget)",
    )
    parser.add_argument(
        "--eval-episodes", type=int, default=EVAL_EPISODES, help="greedy episodes per evaluation"
    )
    parser.add_argument(
        "--stop-at-threshold",
        action="store_true",
        help="end a GRPO run at its first evaluation at the (fixed) threshold",
    )
    parser.add_argument(
        "--throughput",
        type=int,
        metavar="UPDATES",
        help="only env-steps/s over UPDATES timed updates",
    )
    parser.add_argument(
        "--wallclock",
        action="store_true",
        help=f"give each GRPO run the seconds the {PEER} run of its seed took (compile "
        "included) on the same core, at the env steps they buy",
    )
    parser.add_argument(
        "--trainer-clock",
        action="store_true",
        help="--wallclock: also give the train command the seconds (--time-budget-s), so "
        "that GRPO's learning rate anneals by the clock; off: over the estimated env steps",
    )
    parser.add_argument(
        "--calibrate",
        type=int,
        default=CALIBRATION_UPDATES,
        metavar="UPDATES",
        help="--wallclock: timed updates of the run that sets GRPO's env steps",
    )
    parser.add_argument(
        "--jax-cache",
        choices=["user", "cold"],
        default="user",
        help="cold: every GRPO run compiles JAX anew",
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where GRPO and the JAX peer train (cuda: side by side on the one GPU; SB3 "
        "stays on the CPU); every run still gets one CPU",
    )
    parser.add_argument("--jobs", type=int, default=1, help="lanes run at once, one CPU each")
    parser.add_argument("--cpu", type=int, nargs="+", help="the lanes' CPUs (default: the first)")
    parser.add_argument("--budget", type=int, help="env steps per run, for every task (smoke)")
    parser.add_argument("--results", type=Path, help="folder of the JSON files (SUITE_RESULTS)")
    parser.add_argument("--name", help="results file stem (default: suite, or suite_throughput)")
    parser.add_argument("--table", action="store_true", help="print the markdown table")
    args = parser.parse_args(argv)
    unknown = [t for t in args.tasks if t not in TASKS]
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}; tasks: {', '.join(TASKS)}")
    args.tasks = args.tasks or list(TASKS)
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    if any(p not in KINDS for p in args.peers):
        parser.error(f"--peers takes a comma-separated list of {', '.join(KINDS)}")
    variants = []
    for text in args.variants:
        try:
            name, fields = parse_variant(text)
            flags = variant_flags(fields)
        except ValueError as err:
            parser.error(str(err))
        if name in {v[0] for v in variants}:
            parser.error(f"--set {name} given twice")
        variants.append((name, fields, flags))
    args.variants = variants
    if not args.peers and not variants:
        parser.error("nothing to run: --peers is empty and no --set variant is given")
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    args.cpu = args.cpu or usable[: args.jobs]
    if args.jobs < 1 or len(args.cpu) < args.jobs:
        parser.error(f"--jobs {args.jobs} needs as many CPUs (--cpu; usable: {usable})")
    for flag in ("budget", "eval_every", "throughput", "calibrate"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            parser.error(f"--{flag.replace('_', '-')} must be positive")
    if args.repeats < 1 or args.eval_episodes < 1:
        parser.error("--repeats and --eval-episodes must be positive")
    if args.stop_at_threshold:
        peer_set = [t for t in args.tasks if TASKS[t].threshold == PEER]
        if peer_set:
            parser.error(
                f"--stop-at-threshold needs a fixed threshold; {', '.join(peer_set)} take theirs "
                f"from the {PEER} runs, known only at the end"
            )
    if args.wallclock:
        _check_wallclock(parser, args)
    elif args.trainer_clock:
        parser.error("--trainer-clock gives the train command --wallclock's seconds: add it")
    if not args.table and ("grpo" in args.peers or any("env" not in v[1] for v in variants)):
        missing = [m for m in (missing_env(TASKS[t].env) for t in args.tasks) if m]
        if missing:
            parser.error("GRPO's env cannot be made: " + "; ".join(missing))
    if args.against:
        if "@" in args.against:
            parser.error("--against takes a git revision without '@'")
        try:
            _git("rev-parse", "--verify", f"{args.against}^{{commit}}")
        except (ValueError, OSError) as err:
            parser.error(f"--against {args.against}: not a commit of this repository ({err})")
    args.name = args.name or ("suite_throughput" if args.throughput else "suite")
    folder = args.results or os.environ.get("SUITE_RESULTS")
    args.results = Path(folder) if folder else HERE / "results"
    return args


def _check_wallclock(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--wallclock needs the PPO peer on every task, and a budget the clock sets."""
    if PEER not in args.peers:
        parser.error(f"--wallclock takes its time budgets from the {PEER} peer: add it to --peers")
    without = [t for t in args.tasks if skip_reason(TASKS[t], PEER)]
    if without:
        parser.error(f"--wallclock: {', '.join(without)} have no {PEER} run to take a time from")
    if args.throughput is not None or args.stop_at_threshold:
        parser.error(
            "--wallclock trains to a time budget: not with --throughput or --stop-at-threshold"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table:
        print(render_table(args.results, args.name))
        return 0
    budgets = {name: args.budget or TASKS[name].budget for name in args.tasks}
    with tempfile.TemporaryDirectory(prefix="suite-against-") as tmp:
        against = None
        if args.against:
            tree, commit = export_tree(args.against, Path(tmp))
            against = {"rev": args.against, "commit": commit, "path": str(tree)}
        study = Study(args, args.results, budgets, against)
        run_study(study)
        for name in args.tasks:
            print(f"wrote {study.write(name)}")
    return 1 if study.failed else 0


if __name__ == "__main__":
    sys.exit(main())
