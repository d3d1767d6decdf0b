"""Would a weight-averaged policy make a greedy final steadier? A probe, not a feature.

A greedy evaluation of SpaceInvaders replays one start, so its score is one game, and late in
a run it swings (docs/trainer.md, "Time limits bootstrapped by the critic"). Averaging the
weights of the last updates (Polyak averaging; Izmailov et al. 2018, "Averaging Weights Leads
to Wider Optima", and Nikishin et al. 2018 for RL) might land on a policy whose greedy game is
less fragile. This trains the defaults through the train command's config and `train()`,
keeps exponential averages of the policy's weights beside it (updated after every update,
never trained), and at each evaluation mark plays the live policy and every average on the
suite's games, greedy, then sampled at the end, with the games' mean length. Env steps, not
seconds, bound the runs, so the comparison is the same on any machine load: the averages
cost one foreach lerp per update.

    python benchmarks/weight_average.py --seeds 0 1 2 3 4 5 --cpu 0 1 \\
        --env SpaceInvaders-MinAtar-v0 --total-env-steps 2000000 --name NAME
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import machine_info, train_command_trainer, write_result  # noqa: E402
from suite_tasks import EVAL_SEED, MAX_EVAL_ENVS  # noqa: E402  (both: standard library only)

DECAYS = (0.8, 0.9, 0.95)  # horizons of about 5, 10 and 20 updates


def update_averages(averages: dict[float, Any], live: Any) -> None:
    """Each average moves `1 - decay` of the way to the live policy's weights, in place."""
    import torch

    with torch.no_grad():
        params = [p.detach() for p in live.parameters()]
        for decay, policy in averages.items():
            torch._foreach_lerp_(list(policy.parameters()), params, 1.0 - decay)


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    """One seed, in this (pinned) process: the live policy and its averages at every mark."""
    import torch

    torch.set_float32_matmul_precision("high")  # as the train command sets it
    with tempfile.TemporaryDirectory(prefix="weight-average-") as run_dir:
        flags = ["--seed", str(job["seed"])]
        return _averaged_run(job, train_command_trainer(job["env"], job["steps"], run_dir, flags))


def _averaged_run(job: dict[str, Any], trainer: Any) -> dict[str, Any]:
    """`trainer`'s run, with the averages beside it and every policy scored at each mark."""
    import copy

    import torch

    from grpo_trainer.envs import make_envs
    from grpo_trainer.run.callbacks import Callback
    from grpo_trainer.run.evaluation import evaluate

    episodes = job["episodes"]
    eval_envs = make_envs(trainer.config, min(episodes, MAX_EVAL_ENVS), trainer.device)
    live = trainer.policy
    averages = {decay: copy.deepcopy(live).eval() for decay in DECAYS}

    def score(policy: Any, greedy: bool) -> tuple[float, float]:
        """The mean return and length of the suite's evaluation games."""
        with torch.no_grad():
            out = evaluate(
                policy,
                eval_envs,
                episodes,
                greedy=greedy,
                seed=EVAL_SEED + 1000 * job["seed"],
                max_episode_steps=trainer.config.max_episode_steps,
            )
        return out["return_mean"], out["length_mean"]

    def scores(greedy: bool) -> dict[str, dict[str, float]]:
        """Each policy's mean return under `greedy` or `sampled`, and its mean length."""
        was = live.training
        live.eval()
        try:
            named = {"live": live, **{f"ema{d:g}": p for d, p in averages.items()}}
            played = {name: score(policy, greedy) for name, policy in named.items()}
        finally:
            live.train(was)
        kind = "greedy" if greedy else "sampled"
        return {
            kind: {name: ret for name, (ret, _) in played.items()},
            f"{kind}_length": {name: length for name, (_, length) in played.items()},
        }

    marks = list(range(job["first_mark"], job["steps"] + 1, job["every"]))
    curve: list[dict[str, Any]] = []
    start = time.perf_counter()

    class Average(Callback):
        def on_update(self, state: Any, metrics: dict[str, float]) -> None:
            update_averages(averages, live)
            steps = int(trainer.env_steps)
            if marks and steps >= marks[0]:
                while marks and steps >= marks[0]:
                    marks.pop(0)
                curve.append({"env_steps": steps, **scores(True)})

    trainer.train(callbacks=[Average()])
    final = {"env_steps": int(trainer.env_steps), **scores(True), **scores(False)}
    eval_envs.close()
    trainer.env.envs.close()
    return {
        "seed": job["seed"],
        "config": trainer.config.to_dict(),
        "wall_s": round(time.perf_counter() - start, 1),
        "curve": curve,
        "final": final,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="SpaceInvaders-MinAtar-v0", help="a fruit_env game")
    parser.add_argument("--total-env-steps", type=int, default=2_000_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cpu", type=int, nargs="+", default=[0])
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--every", type=int, default=250_000, help="env steps between marks")
    parser.add_argument("--first-mark", type=int, default=1_000_000)
    parser.add_argument("--name", default="weight_average")
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--job", help=argparse.SUPPRESS)  # a worker's job, as JSON
    args = parser.parse_args(argv)
    if args.job:
        job = json.loads(args.job)
        from suite_runs import pin_worker

        pin_worker(job["cpu"])
        Path(job["out"]).write_text(json.dumps(run_one(job)))
        return

    def lane(cpu: int, seeds: list[int]) -> list[dict[str, Any]]:
        records = []
        for seed in seeds:
            out = args.results / f".{args.name}_{seed}.json"  # the worker's record
            job = {
                "env": args.env,
                "steps": args.total_env_steps,
                "seed": seed,
                "cpu": cpu,
                "episodes": args.episodes,
                "every": args.every,
                "first_mark": args.first_mark,
                "out": str(out),
            }
            command = [sys.executable, __file__, "--job", json.dumps(job)]
            subprocess.run(command, check=True)
            record = json.loads(out.read_text())
            out.unlink()
            print(seed, json.dumps(record["final"]), flush=True)
            records.append(record)
        return records

    lanes = {cpu: args.seeds[i :: len(args.cpu)] for i, cpu in enumerate(args.cpu)}
    with ThreadPoolExecutor(max_workers=len(lanes)) as pool:
        futures = [pool.submit(lane, cpu, seeds) for cpu, seeds in lanes.items()]
        runs = sorted((r for f in futures for r in f.result()), key=lambda r: r["seed"])
    payload = {
        "command": " ".join(sys.argv),
        "decays": DECAYS,
        "machine": machine_info(),
        "runs": runs,
    }
    print(write_result(args.name, payload, args.results))


if __name__ == "__main__":
    main()
