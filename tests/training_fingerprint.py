"""Train a few updates of several configs and print a digest of everything they produced.

    PYTHONPATH=<a tree> python tests/training_fingerprint.py

Run against two trees (this one, and an export of an earlier revision), equal digests mean
the two train bit for bit alike: weights, optimiser state, each update's metrics and the
checkpoint's state. It uses only the public API that both trees share (`GRPOConfig`,
`RunConfig`, `GRPOTrainer`, `make_envs`, `update`, `state_dict`), so it runs on either.
tests/test_bit_identical.py compares them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings
from typing import Any

import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.envs import make_envs

# Each config drives another path: the default windowed rollout with snapshots and ended
# members branching (Fruit Catcher), whole episodes, Gymnasium's numpy CartPole with periodic
# branching, a KL reference (frozen: its refresh, ref_update_every, was removed), micro-batches,
# several trust regions and the foreach optimiser's undo, a Gaussian head (independent noise:
# see CHANGED) with outcome advantages, and a gymnax env.
CASES: dict[str, dict[str, Any]] = {
    "fruit_defaults": {"env": "FruitCatcher-v0", "num_groups": 8, "total_env_steps": 40_000},
    "fruit_episodes": {
        "env": "FruitCatcher-v0",
        "num_groups": 4,
        "rollout": "episodes",
        "epochs": 2,
        "minibatch_size": 512,
        "total_env_steps": 40_000,
    },
    "cartpole_branches": {
        "env": "CartPole-v1",
        "num_groups": 4,
        "window": 16,
        "branch_every": 16,
        "kl_coef": 0.1,
        "micro_batches": 2,
        "anchor_samples": 256,
        "fused_optimizer": False,
        "lr_schedule": "cosine",
        "total_env_steps": 20_000,
    },
    "pendulum_outcome": {
        "env": "Pendulum-v1",
        "num_groups": 4,
        "noise_correlation": 0.0,  # see CHANGED
        "advantage": "outcome",
        "rollout": "episodes",
        "total_env_steps": 20_000,
    },
    "gymnax_cartpole": {
        "env": "gymnax:CartPole-v1",
        "num_groups": 4,
        "window": 32,
        "total_env_steps": 20_000,
    },
}
UPDATES = 4
RUN_FIELDS = {"env", "fused_optimizer"}
# Config fields removed since the reference revision (docs/trainer.md, "Flags decided by
# measurement"), with the value that does what the code without them does. The configs above
# leave them there, so an older tree records them at that value (checked): both trees'
# checkpoint states are digested without them.
REMOVED = {"warmup_fraction": 0.0, "weight_decay": 0.0, "ref_update_every": 0}
REMOVED_RUN = {"eval_sampled": False}
# A kit env's snapshot in the rollout state has carried a fourth tensor since the reference:
# the rules it was taken under (uint8 bytes, fruit_env/kit/snapshots.py); it is digested
# without it, as the reference records the other three.
# A rollout's carried rows have held a `bootstrap` flag since (an end by a time limit): only a
# critic reads it, and no case here trains one, so it is dropped before the state is digested.
# Run fields added since, which change no training (how a run dir is treated): dropped from
# the newer tree's checkpoint state before it is digested.
ADDED_RUN = ("overwrite",)
# Run fields whose default has changed since, in ways that change no training here (the
# fingerprint never evaluates): the newer tree's default is recorded as the reference's value.
# eval_every: None (250,000, and at least 4 updates apart) where the reference had 250,000.
CHANGED_RUN = {"eval_every": (None, 250_000)}
# Algorithm fields added since, at the value that does what the reference did (checked):
# dropped from the newer tree's checkpoint state before it is digested.
# mean_bound_coef's penalty on a Gaussian mean past the action bounds adds exact zeros and no
# gradient to a discrete head's loss, and to Pendulum's here, whose mean stays inside its
# bounds over these updates: its default does what the reference did. dual_clip is off by
# default, and the log-ratio cap binds only past e^20, which no case here reaches. logit_cap
# is off by default: a head without it computes its logits as before. value_coef is 0 by
# default: no critic, so the network, the advantages and the loss are the reference's
# (gae_lambda and critic then shape nothing). time_budget_s is None by default: the env
# steps alone end the run and set the schedule, as in the reference.
ADDED = {
    "branch_complete": False,
    "mean_bound_coef": 1.0,
    "dual_clip": None,
    "logit_cap": None,
    "deferred_weights": "none",
    "value_coef": 0.0,
    "gae_lambda": 0.95,
    "critic": "shared",
    "time_budget_s": None,
}
# Algorithm fields added since whose default changes training: the newer tree is given the
# value that does what the reference did. deferred_weights="truncated" (the default since
# it was added) weighs rows an earlier policy played by their truncated importance weight;
# the reference weighed them 1 ("none"). tests/test_deferred_weights.py checks the weights.
ADDED_AS_REFERENCE = {"deferred_weights": "none"}
# Algorithm fields whose default has changed since, in ways that change no training for the
# cases that leave them at it: recorded as the reference's value. noise_correlation 0.95 (Box
# actions explore with correlated noise since 342f3fa): the cases that leave it at its default
# have discrete heads, whose noise ignores it. Since that commit a correlated Gaussian credits
# each step with its own innovation, which no earlier tree does, so the Pendulum case, which
# had 0.5, now runs its Gaussian head on independent noise (trained as before);
# tests/test_policy.py checks the correlated noise's draws, log-probs and shift.
CHANGED = {"noise_correlation": (0.95, 0.0)}
# Metrics added since (the bound penalty's mean, the critic's error): dropped from the newer
# tree's rows.
ADDED_METRICS = ("mean_bound", "value_loss")


def _digest(value: Any) -> str:
    """The checkpoints' own digest (`payload_digest`: keys, numbers, and tensors' dtype,
    shape and bytes), from wherever the tree being measured keeps it."""
    try:
        from grpo_trainer.base.checkpoint import payload_digest
    except ImportError:  # a tree from before the layers
        from grpo_trainer.checkpoint import payload_digest  # type: ignore[no-redef]
    return payload_digest({"value": value})


def fingerprint(case: dict[str, Any]) -> dict[str, Any]:
    fields = {k: v for k, v in case.items() if k not in RUN_FIELDS}
    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    fields.update({k: v for k, v in ADDED_AS_REFERENCE.items() if k in known})
    run = {k: v for k, v in case.items() if k in RUN_FIELDS}
    config = GRPOConfig(
        **fields, run=RunConfig(**run, device="cpu", compile=False, progress=False, seed=3)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
        # Rows of weight 0 have been left out of the CPU's passes since the reference, which
        # changes the sums' rounding only (tests/test_flat_rows.py): the reference trained
        # every row, and so does this tree here. An older tree ignores the attribute.
        trainer.drop_flat_rows = False
        rows = [trainer.update() for _ in range(UPDATES)]
    measured = {"rollout_s", "update_s", "steps_per_s", "train_s"}  # and mem_*: the machine's
    rows = [
        {
            k: v
            for k, v in row.items()
            if k not in measured and k not in ADDED_METRICS and not k.startswith("mem_")
        }
        for row in rows
    ]
    state = trainer.state_dict()
    state.pop("train_s")
    for fields, removed in ((state["config"], REMOVED), (state["config"]["run"], REMOVED_RUN)):
        for name, value in removed.items():
            if name in fields:
                assert fields.pop(name) == value, name
    for rollout in state.get("rollouts", ()):
        env = rollout.get("env")
        if isinstance(env, list) and len(env) == 4:  # the kit's snapshot and its rules tag
            assert env[3].dtype == torch.uint8 and env[3].dim() == 1
            rollout["env"] = env[:3]  # what the reference records: its training is the same
        rollout.get("carry", {}).pop("bootstrap", None)
    for name in ADDED_RUN:
        state["config"]["run"].pop(name, None)
    for name, (new, old) in CHANGED_RUN.items():
        if state["config"]["run"].get(name, old) == new:
            state["config"]["run"][name] = old
    for name, (new, old) in CHANGED.items():
        if state["config"].get(name, old) == new:
            state["config"][name] = old
    for name, value in ADDED.items():
        if name in state["config"]:
            assert state["config"].pop(name) == value, name
    return {
        "policy": _digest(trainer.policy.state_dict()),
        "optimizer": _digest(trainer.optimizer.state_dict()),
        "state": _digest(state),
        "metrics": rows,
    }


def main() -> None:
    torch.set_num_threads(1)
    names = sys.argv[1:] or list(CASES)
    print(json.dumps({name: fingerprint(CASES[name]) for name in names}))


if __name__ == "__main__":
    main()
