"""Equal wall-clock studies (`benchmarks/suite.py --wallclock`): GRPO gets the seconds the PPO
peer took, compile included, on the same core, and trains as many env steps as they buy.

Per (task, seed) a lane runs the PPO peer first; its `elapsed_s` (compile, the first state's
set-up and training, evaluation apart) becomes the time budget of every GRPO row of that seed.
A GRPO row then runs in fresh processes on the same core:

1. a calibration: the train command's config trains `CALIBRATION_UPDATES` updates after the
   first (`--throughput`'s measurement), giving the first update's seconds (where compiling
   happens) and the env-steps/s of the others;
2. the run: `--total-env-steps` set to what the budget buys at that pace, with 10% headroom
   (`estimate_env_steps`, `HEADROOM`), and the suite's clock stops it when its wall time
   since `train()` was called (compile included, evaluation apart) reaches the PPO peer's.
   With `--trainer-clock` the train command also gets those seconds as `--time-budget-s`,
   so that its learning rate anneals by the clock.

Why calibrate: the defaults size an update from `total_env_steps` (`samples_per_update`), so
a huge step budget would train another config, and they anneal the learning rate over
`total_env_steps`, so a run cut by the clock would stop at a high learning rate. With
the estimate, the env steps end near the budget: a run that goes faster than calibrated ends
at its env steps a little early (its `stop_reason` is then None), a slower one is cut by the
clock (`stop_reason` names the time budget), its learning rate a little above its floor
(at the floor with `--trainer-clock`; `final_lr` records it). The headroom makes the
second the usual case: unused seconds would count against GRPO. Calibrating from a run's first
updates can still misjudge a whole run, either way. Three Breakout smokes on our loaded 2-core
VM ran 10-34% faster than calibrated, steadily over the run (the first updates are slower, or
the load changed). Freeway's first updates ran about twice as fast as its whole run (on the
CPU an update skips rows that weigh nothing, most of an early sparse-reward batch), so the
clock cut its run at 56% of the estimate, with its learning rate at 44% of its start. So a
run that ended at its env steps with more than 5% of its seconds unused, or that the clock
stopped before `SHORT` of its estimated env steps, is set aside and run again at the env
steps its own pace buys; the set-aside run's figures stay in the record (`set_aside`), and
the choice depends only on the seconds and env steps used, never on the returns. Both
outcomes are recorded, with the estimate, so a reader sees which happened.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from suite_tasks import PEER

CALIBRATION_UPDATES = 16  # timed updates of the calibration run (after an untimed first)
# The estimate buys this much more than the calibrated pace: a pace the calibration
# underestimated by up to 10% (one core's load drifts) still ends at the clock, using the
# whole budget, while at the calibrated pace the clock stops the run with 9% of the
# schedule left (the learning rate at 9% of its start) rather than leaving seconds unused.
HEADROOM = 1.1
CALIBRATIONS = 3  # at most: the last at a budget whose update size its estimate keeps


def run_wallclock(
    job: dict[str, Any],
    budget_s: float | None,
    updates: int,
    run: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """A GRPO run given `budget_s` seconds (the PPO peer's, compile included): calibration
    runs of `updates` timed updates, then the run with the env steps the budget buys at their
    pace and the time budget; `run` runs a job in a fresh process on the job's CPU.

    The defaults size an update from the env-step budget (`samples_per_update`), so the pace
    depends on the budget: the first calibration trains at the task's budget, and while the
    estimate implies another update size, the next calibrates at the estimate."""
    from grpo_trainer.base.config import samples_per_update

    base = {"trainer": job["row"], "seed": job["seed"], "repeat": job["repeat"], "cpu": job["cpu"]}
    if budget_s is None:
        return {**base, "error": f"no time budget: the {PEER} run of this seed failed"}
    steps, calibrations = job["budget"], []
    for _ in range(CALIBRATIONS):
        calibration = run({**job, "budget": steps, "throughput": updates, "row": job["row"] + "~"})
        keep = ("first_update_s", "pace_env_steps_per_s", "updates", "env_steps")
        calibrations.append({"budget": steps, **{k: calibration.get(k) for k in keep}})
        try:
            estimate = estimate_env_steps(calibration, budget_s)
        except ValueError as err:
            return {**base, "error": str(err), "calibrations": calibrations}
        settled = samples_per_update(estimate) == samples_per_update(steps)
        steps = estimate
        if settled:
            break
    record = run({**job, "budget": steps, "time_budget_s": budget_s})
    attempts = []
    if _unused(record, budget_s) or _cut_short(record, steps):  # once more, at its own pace
        attempts.append({"estimated_env_steps": steps, **{k: record.get(k) for k in ATTEMPT}})
        pace = _run_pace(record)
        steps = estimate_env_steps(pace, budget_s) if pace else steps
        record = run({**job, "budget": steps, "time_budget_s": budget_s})
    return {
        **record,
        "estimated_env_steps": steps,
        "calibrations": calibrations,
        "set_aside": attempts,
    }


ATTEMPT = ("env_steps", "elapsed_s", "stop_reason", "final_eval", "final_eval_sampled")
USED = 0.95  # a run that ended at its env steps before this share of its budget is run again
# A run the clock stopped before this share of its estimated env steps is run again: at the
# calibrated pace the headroom stops it at 91% (the learning rate at 9% of its start); here
# its learning rate was still above a fifth of its start.
SHORT = 0.8


def _cut_short(record: dict[str, Any], estimated_env_steps: int) -> bool:
    """Whether the clock stopped a run before `SHORT` of the env steps it was estimated."""
    if "error" in record or not record.get("stop_reason") or record.get("env_steps") is None:
        return False
    return record["env_steps"] < SHORT * estimated_env_steps


def _unused(record: dict[str, Any], budget_s: float) -> bool:
    """Whether a run ended at its env steps with more than 5% of its seconds unused."""
    if "error" in record or record.get("stop_reason") or record.get("elapsed_s") is None:
        return False
    return record["elapsed_s"] < USED * budget_s


def _run_pace(record: dict[str, Any]) -> dict[str, Any] | None:
    """A finished run's own timing in the calibration's form: its first update, then the
    mean env-steps/s of all the others (the pace of a whole run, which a calibration's
    first updates may misjudge)."""
    updates, first_s = record.get("updates"), record.get("first_update_s")
    if not updates or updates < 2 or first_s is None:
        return None
    per_update = record["env_steps"] // updates
    seconds = record["train_s"] - first_s
    if seconds <= 0:
        return None
    rate = (record["env_steps"] - per_update) / seconds
    return {
        "first_update_s": first_s,
        "pace_env_steps_per_s": rate,
        "updates": updates,
        "env_steps": record["env_steps"],
    }


def estimate_env_steps(calibration: dict[str, Any], budget_s: float) -> int:
    """The env steps `budget_s` seconds buy: the first update (compiling included) as the
    calibration timed it, then whole updates at the pace of its timed updates together (so
    a config whose extra work comes every few updates is timed with it) times `HEADROOM`; at
    least one update. Raises `ValueError` for a calibration that timed no update."""
    rate = calibration.get("pace_env_steps_per_s")
    first_s, updates = calibration.get("first_update_s"), calibration.get("updates")
    if not rate or first_s is None or not updates:
        raise ValueError(f"the calibration timed no update: {calibration.get('error', '?')}")
    per_update = calibration["env_steps"] // updates
    more = max(0.0, budget_s - first_s) * rate * HEADROOM
    return per_update * (1 + math.floor(more / per_update))


def time_to(curve: list[dict[str, Any]], value: float | None) -> dict[str, Any] | None:
    """The first evaluation whose greedy value is at least `value`: its env steps and
    elapsed seconds (compile included)."""
    if value is None:
        return None
    for point in curve:
        if point["eval"] >= value:
            return {"env_steps": point["env_steps"], "elapsed_s": point["elapsed_s"]}
    return None


def _side(run: dict[str, Any], ppo_final: float | None) -> dict[str, Any]:
    hit = time_to(run["curve"], ppo_final)
    return {
        "final_greedy": run.get("final_eval"),
        "final_sampled": run.get("final_eval_sampled"),
        "env_steps": run["env_steps"],
        "elapsed_s": run.get("elapsed_s"),
        "to_ppo_final_s": hit and hit["elapsed_s"],
        "to_ppo_final_env_steps": hit and hit["env_steps"],
    }


def side_by_side(runs: dict[str, list[dict[str, Any]]], peer: str) -> dict[str, Any] | None:
    """Per GRPO row and seed (and repeat), beside the peer's run that timed it: the time
    budget, the env steps each used, the greedy and the sampled return at the end, and the
    time each took to reach the peer's final greedy return of that seed. Then per row: the
    seeds where GRPO's greedy return is at least the peer's, and the medians (a run that
    never got there counting as infinitely late)."""
    peer_runs = {(r["seed"], r.get("repeat", 0)): r for r in runs.get(peer, []) if "error" not in r}
    if not peer_runs:
        return None
    out: dict[str, Any] = {}
    for row, row_runs in runs.items():
        if row == peer:
            continue
        seeds = []
        for run in row_runs:
            ppo = peer_runs.get((run["seed"], run.get("repeat", 0)))  # the run it was timed by
            if ppo is None or "error" in run:
                continue
            final = ppo.get("final_eval")
            grpo = _side(run, final)
            grpo |= {
                "stop_reason": run.get("stop_reason"),
                "estimated_env_steps": run.get("estimated_env_steps"),
            }
            seeds.append(
                {
                    "seed": run["seed"],
                    "repeat": run.get("repeat", 0),
                    "budget_s": run.get("time_budget_s"),
                    "peer": _side(ppo, final),
                    "grpo": grpo,
                    "greedy_at_least_peer": None
                    if final is None or grpo["final_greedy"] is None
                    else grpo["final_greedy"] >= final,
                }
            )
        out[row] = {"seeds": seeds, **_row_summary(seeds)}
    return out


def _row_summary(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    def median_time(side: str) -> float | None:
        values = [s[side]["to_ppo_final_s"] for s in seeds]
        if not values:
            return None
        middle = statistics.median(math.inf if v is None else v for v in values)
        return None if math.isinf(middle) else middle

    def mean(side: str, key: str) -> float | None:
        values = [s[side][key] for s in seeds if s[side][key] is not None]
        return statistics.fmean(values) if values else None

    return {
        "greedy_at_least_peer": sum(bool(s["greedy_at_least_peer"]) for s in seeds),
        "of": len(seeds),
        "grpo_greedy_mean": mean("grpo", "final_greedy"),
        "peer_greedy_mean": mean("peer", "final_greedy"),
        "grpo_sampled_mean": mean("grpo", "final_sampled"),
        "peer_sampled_mean": mean("peer", "final_sampled"),
        "grpo_median_to_peer_final_s": median_time("grpo"),
        "peer_median_to_peer_final_s": median_time("peer"),
    }
