"""Why GRPO's greedy Freeway policy falls below its sampled one: evaluate and trace checkpoints.

For each run directory (written by `python -m grpo_trainer train --run-dir DIR ...`) this
reports, at its final checkpoint (`last.pt`):

* the greedy and the sampled return over the suite's 100 evaluation episodes (the trainer's
  own `evaluate`, the games `benchmarks/suite_tasks.py` plays for that seed);
* a trace of greedy play: the share of greedy actions per chicken row, the policy's
  probabilities on the bottom row (where a chicken that never presses up stays), how often
  the most likely action there is not "up" and by how much (a near-tie, or a clear choice),
  and how many episodes end with the chicken stalled there;
* the entropy of the run's updates at every tenth of its budget (`metrics.jsonl`), its env
  steps and training seconds.

    python benchmarks/freeway_greedy.py /tmp/runs/base-s0 /tmp/runs/base-s1 \
        --label base --out benchmarks/results/freeway_greedy_2026-11-26.json

Each call appends its rows to `--out` (a JSON file of rows, created if absent), with the
machine, versions and each run's train command.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info
from suite_tasks import EVAL_EPISODES, EVAL_SEED

from grpo_trainer.envs import make_envs
from grpo_trainer.run.evaluation import evaluate, load_policy

NOOP, UP, DOWN = 0, 1, 2  # gymnax's minimal action set, as Freeway-MinAtar-v0 takes it
BOTTOM = 9  # the chicken's start row
STALL_STEPS = 500  # an episode whose chicken spent its last this many steps on row 9 stalled
# Car speeds change only when the chicken scores, so a deterministic policy that stops
# scoring meets the same traffic again and again: an episode without a crossing in its last
# this many steps is stuck in such a cycle.
STUCK_STEPS = 1000


def chicken_row(obs: torch.Tensor) -> torch.Tensor:
    """The chicken's row per game, from plane 0 of gymnax's (10, 10, 7) observation."""
    return obs[..., 0].sum(-1).argmax(-1)


@torch.inference_mode()
def trace(policy: Any, config: Any, episodes: int, seed: int) -> dict[str, Any]:
    """Play `episodes` whole greedy games (2500 steps each) and tally what the policy does."""
    envs = make_envs(config, episodes, torch.device("cpu"))
    obs, _ = envs.reset(seed=seed)
    limit = 2500
    rows_seen = torch.zeros(10, 3)  # greedy actions per row
    bottom_probs, bottom_argmax, margins = [], [], []
    since_left_bottom = torch.zeros(episodes, dtype=torch.long)
    since_scored = torch.zeros(episodes, dtype=torch.long)
    returns = torch.zeros(episodes)
    for _ in range(limit):
        logits = policy(obs)
        probs = logits.softmax(-1)
        action = logits.argmax(-1)
        row = chicken_row(obs)
        rows_seen.index_put_((row, action), torch.ones(episodes), accumulate=True)
        at_bottom = row == BOTTOM
        bottom_probs.append(probs[at_bottom])
        bottom_argmax.append(action[at_bottom])
        not_up = at_bottom & (action != UP)
        margins.append((logits.max(-1).values - logits[:, UP])[not_up])
        obs, reward, _, _, _ = envs.step(action)
        returns += reward
        since_scored = torch.where(reward > 0, 0, since_scored + 1)
        since_left_bottom = torch.where(chicken_row(obs) == BOTTOM, since_left_bottom + 1, 0)
    envs.close()
    probs = torch.cat(bottom_probs)
    argmax = torch.cat(bottom_argmax)
    margin = torch.cat(margins)
    shares = rows_seen / rows_seen.sum(1, keepdim=True).clamp_min(1)
    return {
        "episodes": episodes,
        "greedy_return_trace": returns.tolist(),
        "stalled_episodes": int((since_left_bottom >= STALL_STEPS).sum()),
        "stuck_episodes": int((since_scored >= STUCK_STEPS).sum()),
        "greedy_action_share_by_row": {
            str(r): [round(v, 3) for v in shares[r].tolist()]
            for r in range(10)
            if rows_seen[r].sum() > 0
        },
        "steps_by_row": {str(r): int(rows_seen[r].sum()) for r in range(10)},
        "bottom_steps": int(argmax.numel()),
        "bottom_mean_probs_noop_up_down": [round(v, 3) for v in probs.mean(0).tolist()],
        "bottom_share_argmax_not_up": float((argmax != UP).float().mean()),
        "bottom_not_up_logit_margin_quantiles_10_50_90": (
            [round(v, 3) for v in margin.quantile(torch.tensor([0.1, 0.5, 0.9])).tolist()]
            if margin.numel()
            else None
        ),
        "bottom_not_up_p_up_median": (
            float(probs[argmax != UP][:, UP].median()) if margin.numel() else None
        ),
    }


@torch.inference_mode()
def stuck_when_sampled(policy: Any, config: Any, episodes: int, seed: int) -> int:
    """The same games played with sampled actions: how many end stuck (`STUCK_STEPS`)."""
    envs = make_envs(config, episodes, torch.device("cpu"))
    obs, _ = envs.reset(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    since_scored = torch.zeros(episodes, dtype=torch.long)
    for _ in range(2500):
        obs, reward, _, _, _ = envs.step(policy.act(obs, greedy=False, generator=generator))
        since_scored = torch.where(reward > 0, 0, since_scored + 1)
    envs.close()
    return int((since_scored >= STUCK_STEPS).sum())


def entropy_curve(run: Path) -> list[list[float]]:
    """(env steps, entropy) of the update at or past every tenth of the run's last env steps."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "entropy" in r and "env_steps" in r]
    last = rows[-1]["env_steps"]
    marks = [last * k / 10 for k in range(1, 11)]
    return [
        [
            next(r["env_steps"] for r in rows if r["env_steps"] >= m),
            round(next(r["entropy"] for r in rows if r["env_steps"] >= m), 4),
        ]
        for m in marks
    ]


def study(run: Path, label: str, trace_episodes: int) -> dict[str, Any]:
    """One run's row: its command, cost, greedy and sampled returns, and the greedy trace."""
    policy, config, _ = load_policy(run / "checkpoints" / "last.pt", torch.device("cpu"))
    seed = config.run.seed
    envs = make_envs(config, EVAL_EPISODES, torch.device("cpu"))
    eval_seed = EVAL_SEED + 1000 * seed
    greedy = evaluate(policy, envs, EVAL_EPISODES, greedy=True, seed=eval_seed)
    sampled = evaluate(policy, envs, EVAL_EPISODES, greedy=False, seed=eval_seed)
    envs.close()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [m for m in metrics if "train_s" in m][-1]
    cfg = (run / "config.json").read_text()
    return {
        "label": label,
        "run": str(run),
        "seed": seed,
        "config": json.loads(cfg),
        "env_steps": last["env_steps"],
        "train_s": round(last["train_s"], 1),
        "greedy_return": round(greedy["return_mean"], 2),
        "sampled_return": round(sampled["return_mean"], 2),
        "entropy_by_tenth": entropy_curve(run),
        "greedy_trace": trace(policy, config, trace_episodes, eval_seed),
        "sampled_stuck_episodes": stuck_when_sampled(policy, config, trace_episodes, eval_seed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of train --run-dir")
    parser.add_argument("--label", required=True, help="the variant these runs trained")
    parser.add_argument("--command", default="", help="the train command, as run")
    parser.add_argument("--trace-episodes", type=int, default=32)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [study(run, args.label, args.trace_episodes) for run in args.runs]
    for row in rows:
        row["command"] = args.command
        t = row["greedy_trace"]
        print(
            f"{row['label']} seed {row['seed']}: greedy {row['greedy_return']}, sampled "
            f"{row['sampled_return']}, {row['env_steps']} env steps, {row['train_s']} s; "
            f"stalled {t['stalled_episodes']}, stuck {t['stuck_episodes']} of {t['episodes']} "
            f"(sampled: {row['sampled_stuck_episodes']}), "
            f"bottom argmax not up "
            f"{t['bottom_share_argmax_not_up']:.2f}, bottom p(noop, up, down) "
            f"{t['bottom_mean_probs_noop_up_down']}, margin q10/50/90 "
            f"{t['bottom_not_up_logit_margin_quantiles_10_50_90']}, entropy "
            f"{[e for _, e in row['entropy_by_tenth']]}"
        )
    old = json.loads(args.out.read_text()) if args.out.exists() else {"rows": []}
    old["machine"] = machine_info()
    old["rows"] = [*old["rows"], *rows]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(old, indent=1) + "\n")


if __name__ == "__main__":
    main()
