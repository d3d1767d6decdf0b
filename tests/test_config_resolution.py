"""One resolution of the config: the command line, a `--config` file, a run's own
`config.json`, a sweep trial and `GRPOConfig(...)` give the same resolved config for the same
inputs, at every budget and for every env, because derived fields are resolved once, from
the final values."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from grpo_trainer import GRPOConfig, GRPOTrainer
from grpo_trainer.base.config import DERIVED_FIELDS, RunConfig
from grpo_trainer.envs import make_envs
from grpo_trainer.run.trainer import open_run
from grpo_trainer.tools.cli import build_parser, config_from_args
from grpo_trainer.tools.search_space import parse_space
from grpo_trainer.tools.sweep import Sweep

BUDGETS = (100_000, 300_000, 1_000_000, 2_500_000, 10_000_000)
BUDGET_GIVEN = tuple(n for n in DERIVED_FIELDS if n != "total_env_steps")  # what is derived
ENVS = ("fruit_env:FruitCatcher-v0", "CartPole-v1", "Acrobot-v1", "Pendulum-v1")


def _cli(*flags: str) -> GRPOConfig:
    return config_from_args(build_parser().parse_args(["train", *flags]))


def _episode_limit(env: str) -> int | None:
    """What `GRPO` reads from the env to derive the window."""
    if env.startswith("fruit_env:"):
        import fruit_env  # noqa: F401  registers FruitCatcher-v0

        env = env.split(":", 1)[1]
    return gym.spec(env).max_episode_steps


@pytest.fixture(scope="module")
def written_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The config.json a real run wrote, at a budget none of the tests asks for."""
    run_dir = tmp_path_factory.mktemp("run")
    config = _cli(
        "--env", "CartPole-v1", "--total-env-steps", "4096", "--run-dir", str(run_dir),
        "--device", "cpu", "--eval-every", "0", "--no-progress",
    )  # fmt: skip
    GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config).train()
    return run_dir / "config.json"


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("budget", BUDGETS)
def test_every_path_resolves_the_same_config(
    env: str, budget: int, written_config: Path, tmp_path: Path
) -> None:
    library = GRPOConfig(total_env_steps=budget, run=RunConfig(env=env))
    flags = _cli("--env", env, "--total-env-steps", str(budget))
    file = tmp_path / "inputs.json"
    file.write_text(json.dumps({"total_env_steps": budget, "run": {"env": env}}))
    from_file = _cli("--config", str(file))
    # a run's config.json at another budget and env, with this budget and env as flags
    rerun = _cli("--config", str(written_config), "--env", env, "--total-env-steps", str(budget))
    space = parse_space({"total_env_steps": {"choices": [budget]}, "run.env": {"choices": [env]}})
    sweep = Sweep.starting_from(GRPOConfig(), space, tmp_path / "sweep", "eval_score")
    trial = sweep.trial_config({"total_env_steps": budget, "run.env": env}, 0)

    limit = _episode_limit(env)

    def algorithm(config: GRPOConfig) -> dict:
        """The resolved config but its run (the written run's and the trial's run_dir,
        device and eval settings are not at issue)."""
        return {**config.resolve(limit).to_dict(), "run": None}

    expected = algorithm(library)
    for name, config in [("flags", flags), ("--config", from_file), ("config.json", rerun),
                         ("sweep trial", trial)]:  # fmt: skip
        assert algorithm(config) == expected, name
        assert config.derived == BUDGET_GIVEN, name


def test_the_budget_sets_the_batch_and_learning_rate_through_the_cli() -> None:
    """The case that had gone wrong: a budget given as a flag derives its own batch."""
    small, default = _cli("--total-env-steps", "1000000"), _cli()
    assert (small.num_envs, small.minibatch_size) == (256, 1024)
    assert small.lr == pytest.approx(1e-2 * (1024 / 4096) ** 0.5)
    assert (default.num_envs, default.minibatch_size, default.lr) == (1024, 4096, 1e-2)


def test_given_values_are_kept_and_only_the_rest_derived(tmp_path: Path) -> None:
    config = _cli("--total-env-steps", "1000000", "--num-groups", "64", "--lr", "0.002")
    assert (config.num_groups, config.lr) == (64, 0.002)
    assert config.minibatch_size == 64 * 8 * 32 // 8  # from the given batch
    assert config.derived == (
        "anchor_samples", "minibatch_size", "value_coef", "window", "gamma", "epochs"
    )  # fmt: skip
    inputs = config.inputs()
    assert {n: inputs[n] for n in DERIVED_FIELDS} == {
        "total_env_steps": 1_000_000, "num_groups": 64, "anchor_samples": None, "lr": 0.002,
        "minibatch_size": None, "value_coef": None, "window": None, "gamma": None,
        "epochs": None,
    }  # fmt: skip
    assert GRPOConfig.from_dict(inputs) == config


def test_config_json_names_what_was_derived(written_config: Path) -> None:
    data = json.loads(written_config.read_text())
    assert data["_derived"] == list(BUDGET_GIVEN)
    resolved = GRPOConfig(total_env_steps=4096).num_groups
    assert data["window"] == 128 and data["num_groups"] == resolved  # the values it resolved
    rebudgeted = GRPOConfig.from_dict({**data, "total_env_steps": 2_500_000})
    assert rebudgeted.num_groups == GRPOConfig().num_groups == 128  # derived anew


def test_a_bad_derived_list_names_the_problem(tmp_path: Path) -> None:
    file = tmp_path / "bad.json"
    file.write_text(json.dumps({"_derived": ["clip_low"]}))
    with pytest.raises(ValueError, match=r"--config .*_derived must list fields among"):
        _cli("--config", str(file))


def test_a_resumed_run_keeps_what_it_derived(written_config: Path) -> None:
    """A longer budget on --resume extends the run: same batch, learning rate and window."""
    run_dir = written_config.parent
    saved = json.loads(written_config.read_text())
    resumed = open_run(_cli("--config", str(written_config), "--resume", str(run_dir),
                            "--total-env-steps", "10000000")).config  # fmt: skip
    assert resumed.total_env_steps == 10_000_000
    kept = {n: getattr(resumed, n) for n in BUDGET_GIVEN}
    assert kept == {n: saved[n] for n in BUDGET_GIVEN}
    assert resumed.derived == BUDGET_GIVEN  # still derived, as its config.json will say
    fresh = _cli("--config", str(written_config), "--total-env-steps", "10000000")
    assert fresh.num_groups == 128  # without --resume, the new budget's batch
