"""Run `grpo_trainer.tools.checker.check_vector_env` on third-party vector envs that are
installed and print one markdown table of the findings (docs/integrations.md, "Checking any
vector env").

    python scripts/check_third_party.py [--steps 64] [--json]

Each third-party env is built by the trainer's own factory (`grpo_trainer.envs.FACTORIES`);
one that needs a package which is not installed is listed as skipped, with the missing
package.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch

from grpo_trainer.envs import FACTORIES
from grpo_trainer.tools.checker import CHECKS, CheckReport, check_vector_env

NUM_ENVS = 4


def _cartpole_vector(n: int) -> Any:
    return gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")


def _sync(env_id: str, *needs: str) -> Callable[[int], Any]:
    def make(n: int) -> Any:
        for module in needs:
            __import__(module)
        return gym.make_vec(env_id, num_envs=n, vectorization_mode="sync")

    return make


def _factory(env_id: str) -> Callable[[int], Any]:
    """The trainer's factory for a `library:Name` id (`grpo_trainer.envs.FACTORIES`)."""

    def make(n: int) -> Any:
        library, _, name = env_id.partition(":")
        return FACTORIES[library](name, n, torch.device("cpu"), 0, {})

    return make


ENVS: dict[str, Callable[[int], Any]] = {
    "Gymnasium CartPoleVectorEnv": _cartpole_vector,
    "SyncVectorEnv(CartPole-v1)": _sync("CartPole-v1"),
    "SyncVectorEnv(LunarLander-v3)": _sync("LunarLander-v3", "Box2D", "pygame"),
    "EnvPool CartPole-v1": _factory("envpool:CartPole-v1"),
    "gymnax CartPole-v1 + JaxToTorch": _factory("gymnax:CartPole-v1"),
    "MinAtar Breakout (SyncVectorEnv)": _factory("minatar:Breakout-v1"),
}


def check_all(steps: int = 64) -> dict[str, CheckReport | str]:
    """{env name: report, or why it was skipped}."""
    results: dict[str, CheckReport | str] = {}
    for name, make in ENVS.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                env = make(NUM_ENVS)
        except ImportError as err:
            results[name] = f"not installed ({err.name or err})"
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                results[name] = check_vector_env(env, steps=steps, make_env=make)
            finally:
                env.close()
    return results


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(results: dict[str, CheckReport | str]) -> str:
    """One row per env: each check's status, then the evidence of what did not pass."""
    lines = [
        "| env | " + " | ".join(CHECKS) + " | evidence (not passed) |",
        "|---" * (len(CHECKS) + 2) + "|",
    ]
    for name, report in results.items():
        if isinstance(report, str):
            lines.append(f"| {name} | " + " | ".join("—" for _ in CHECKS) + f" | {report} |")
            continue
        statuses = report.statuses()
        notes = [
            f"**{c.name}**: {c.evidence}"
            for c in report.checks
            if c.status in ("warn", "fail") or (c.status == "skip" and c.name == "autoreset")
        ]
        row = " | ".join(statuses.get(check, "—") for check in CHECKS)
        lines.append(f"| {name} | {row} | {_cell('<br>'.join(notes))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = check_all(args.steps)
    if args.json:
        print(
            json.dumps(
                {k: v if isinstance(v, str) else v.to_dict() for k, v in results.items()},
                indent=2,
            )
        )
    else:
        print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
