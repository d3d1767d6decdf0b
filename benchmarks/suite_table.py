"""The suite's markdown tables (for docs/trainer.md), from the JSON files of its studies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from suite_tasks import PEER, TASKS, TRAINERS


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


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def label(row: str) -> str:
    """A row's name in tables: GRPO, PPO (JAX), a variant's NAME, `GRPO @REV`."""
    base, _, rev = row.partition("@")
    text = TRAINERS.get(base, base)
    return f"{text} @{rev}" if rev else text


def _threshold(result: dict[str, Any]) -> str:
    if result["threshold"] is None:
        return "none"
    text = f"{result['threshold']:.4g}"
    if result["metric"] == "catch_rate":
        return f"catch rate {text}"
    source = result["threshold_source"]
    if source.startswith(PEER):
        return f"{text} ({TRAINERS[PEER]} median final)"
    return f"{text} (constant)" if source.startswith("constant") else text


def _spread(spread: dict[str, float] | None, metric: str) -> str:
    if spread is None:
        return "-"
    low, high = _value(spread["min"], metric), _value(spread["max"], metric)
    return f"{_value(spread['mean'], metric)} ({low} to {high})"


def _row_cells(result: dict[str, Any], row: str) -> list[str]:
    summary = result["summary"].get(row)
    if summary is None:
        return ["n/a", "", "", ""]
    failed = f" ({summary['failed']} failed)" if summary["failed"] else ""
    reached = "-" if summary["reached"] is None else str(summary["reached"])
    steps, seconds = (
        summary["median_env_steps_to_threshold"],
        summary["median_train_s_to_threshold"],
    )
    to = "-" if steps is None else f"{_steps(steps)}, {_seconds(seconds)}"
    metric = result["metric"]
    greedy = _spread(summary["final_eval"], metric)
    sampled = _spread(summary.get("final_eval_sampled"), metric)
    return [f"{reached}/{summary['runs']}{failed}", to, greedy, sampled]


def load_results(folder: Path, stem: str = "suite") -> list[dict[str, Any]]:
    """Every `<stem>_<task>.json` in `folder`, in `TASKS` order."""
    paths = [folder / f"{stem}_{name}.json" for name in TASKS]
    return [json.loads(p.read_text()) for p in paths if p.exists()]


def render_table(folder: Path, stem: str = "suite") -> str:
    """The markdown for docs/trainer.md: one line per task and row (reached, median to the
    threshold, final greedy value); then GRPO against the PPO peer where the peer sets the
    threshold (MinAtar), and each row against its @REV twin. Throughput studies: env-steps/s."""
    results = load_results(folder, stem)
    if not results:
        return f"no {stem}_<task>.json in {folder}"
    if all(r.get("mode") == "throughput" for r in results):
        return _throughput_table(results, stem)
    head = ["task", "budget", "threshold", "trainer", "reached", "to threshold (median)"]
    head += ["final greedy, mean (min to max)", "final sampled, mean (min to max)"]
    lines = [_row(head), _row(["---"] * len(head))]
    for r in results:
        name = r["task"] + ("" if r.get("complete") else " (incomplete)")
        env = r["env"].rpartition(":")[2]
        first = [f"{name} ({env})", _steps(r["budget"]), _threshold(r)]
        for i, row in enumerate(r.get("peers", list(r["summary"]))):
            lead = first if i == 0 else ["", "", ""]
            lines.append(_row([*lead, label(row), *_row_cells(r, row)]))
    versus = [r for r in results if r.get("versus_peer")]
    if versus:
        lines += ["", _versus_table(versus)]
    wallclock = [r for r in results if r.get("versus_peer_wallclock")]
    if wallclock:
        lines += ["", _wallclock_table(wallclock)]
    against = [r for r in results if r.get("versus_against")]
    if against:
        lines += ["", _against_table(against)]
    lines += ["", "Files: " + "; ".join(_source(r, stem) for r in results) + "."]
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


def _wallclock_table(results: list[dict[str, Any]]) -> str:
    """Equal wall-clock: per seed, the PPO peer's run and each GRPO row's on its time."""
    head = ["task", "seed", "trainer", "time (compile included)", "env steps", "final greedy"]
    head += ["final sampled", f"time to {TRAINERS[PEER]}'s final greedy return", "stopped by"]
    lines = [_row(head), _row(["---"] * len(head))]
    for r in results:
        metric = r["metric"]
        for row, v in r["versus_peer_wallclock"].items():
            for s in v["seeds"]:
                for name, side in ((PEER, s["peer"]), (row, s["grpo"])):
                    hit = side["to_ppo_final_s"]
                    to = (
                        "-"
                        if hit is None
                        else f"{_seconds(hit)} ({_steps(side['to_ppo_final_env_steps'])})"
                    )
                    stop = (
                        "-"
                        if name == PEER
                        else "the clock"
                        if side["stop_reason"]
                        else "its env steps"
                    )
                    lines.append(
                        _row(
                            [
                                r["task"],
                                str(s["seed"]),
                                label(name),
                                _seconds(side["elapsed_s"]),
                                _steps(side["env_steps"]),
                                _value(side["final_greedy"], metric),
                                _value(side["final_sampled"], metric),
                                to,
                                stop,
                            ]
                        )
                    )
            lines.append(
                f"\n{r['task']} {label(row)}: greedy at least {TRAINERS[PEER]}'s on "
                f"{v['greedy_at_least_peer']} of {v['of']} seeds; mean greedy "
                f"{_value(v['grpo_greedy_mean'], metric)} against "
                f"{_value(v['peer_greedy_mean'], metric)}, sampled "
                f"{_value(v['grpo_sampled_mean'], metric)} against "
                f"{_value(v['peer_sampled_mean'], metric)}\n"
            )
    return "\n".join(lines).rstrip()


def _against_table(results: list[dict[str, Any]]) -> str:
    rev = results[0]["against"]["rev"]
    head = ["task", "trainer", "this tree: to threshold (median)", f"{rev}: to threshold (median)"]
    head += [f"{rev} / this: train time", f"{rev} / this: env steps"]
    lines = [_row(head), _row(["---"] * len(head))]
    for r in results:
        for row, v in r["versus_against"].items():
            this = v["this_median_env_steps_to_threshold"], v["this_median_train_s_to_threshold"]
            other = (
                v["against_median_env_steps_to_threshold"],
                v["against_median_train_s_to_threshold"],
            )
            cells = [r["task"], label(row)]
            for steps, seconds in (this, other):
                cells.append("-" if steps is None else f"{_steps(steps)}, {_seconds(seconds)}")
            cells += [
                _ratio(v["against_over_this_train_s_to_threshold"]),
                _ratio(v["against_over_this_env_steps_to_threshold"]),
            ]
            lines.append(_row(cells))
    return "\n".join(lines)


def _throughput_table(results: list[dict[str, Any]], stem: str) -> str:
    head = ["task", "trainer", "sub-envs", "env-steps/s per update (median of runs; min to max)"]
    head.append("runs")
    lines = [_row(head), _row(["---"] * len(head))]
    for r in results:
        for row, s in r["summary"].items():
            rate = s.get("update_env_steps_per_s")
            shown = (
                "-"
                if not rate
                else f"{rate['median']:,.0f} ({rate['min']:,.0f} to {rate['max']:,.0f})"
            )
            runs = [x for x in r["runs"][row] if "error" not in x]
            envs = sorted({x["config"]["num_groups"] * x["config"]["group_size"] for x in runs})
            failed = f" ({s['failed']} failed)" if s["failed"] else ""
            lines.append(
                _row(
                    [
                        r["task"],
                        label(row),
                        ", ".join(map(str, envs)),
                        shown,
                        f"{s['runs']}{failed}",
                    ]
                )
            )
    for r in results:
        for row, v in (r.get("versus_against") or {}).items():
            ratio = v["this_over_against_update_env_steps_per_s"]
            rev = r["against"]["rev"]
            lines.append(f"\n{r['task']} {label(row)}: {_ratio(ratio)} the env-steps/s of @{rev}")
    lines += ["", "Files: " + "; ".join(_source(r, stem) for r in results) + "."]
    return "\n".join(lines)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _source(result: dict[str, Any], stem: str) -> str:
    return f"`{stem}_{result['task']}.json` ({result.get('timestamp', '?')[:10]})"
