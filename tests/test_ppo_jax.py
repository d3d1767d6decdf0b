"""benchmarks/ppo_jax.py, the compiled JAX PPO peer: its result's shape, reproducibility,
input errors, and that it learns CartPole (so a broken loss or GAE fails here)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from loading import load_module

pytest.importorskip("jax")
pytest.importorskip("optax")
pytest.importorskip("gymnax")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ppo_jax.py"
TIMES = ("setup_s", "compile_s", "eval_compile_s", "train_s", "train_cpu_s", "eval_s")


@pytest.fixture(scope="module")
def ppo() -> Any:
    return load_module(SCRIPT, "ppo_jax_benchmark")


def timeless(result: dict[str, Any]) -> dict[str, Any]:
    """A result without its wall-clock figures, which differ between identical runs."""
    out = {k: v for k, v in result.items() if k not in (*TIMES, "env_steps_per_s")}
    out["curve"] = [{k: v for k, v in row.items() if k != "train_s"} for row in result["curve"]]
    return out


def test_tiny_cartpole_result_has_the_documented_structure_and_repeats_exactly(ppo: Any) -> None:
    kwargs: dict[str, Any] = {"eval_every": 1024, "eval_episodes": 4}
    first = ppo.train("CartPole-v1", 3, 2048, **kwargs)
    assert first["preset"] == "classic" and first["config"]["num_envs"] == 4
    assert first["env_steps"] == 2048 and first["updates"] == 4
    assert [row["env_steps"] for row in first["curve"]] == [1024, 2048]
    for row in first["curve"]:
        assert row["episodes"] > 0 and math.isfinite(row["train_return"])
        assert row["eval_return"] >= 1 and row["eval_return_sampled"] >= 1 and row["train_s"] >= 0
    assert math.isfinite(first["final_train_return"]) and first["final_eval_return"] >= 1
    assert first["final_eval_sampled_return"] == first["curve"][-1]["eval_return_sampled"]
    for key in (*TIMES, "env_steps_per_s"):
        assert math.isfinite(first[key]) and first[key] >= 0, key
    second = ppo.train("CartPole-v1", 3, 2048, **kwargs)
    assert timeless(second) == timeless(first)
    other = ppo.train("CartPole-v1", 4, 2048, **kwargs)
    assert timeless(other)["curve"] != timeless(first)["curve"]


def test_the_sampled_evaluation_samples_where_the_greedy_one_takes_the_argmax(ppo: Any) -> None:
    """A policy with all-equal logits: greedy play pushes the cart one way every step and
    CartPole falls within about 10 steps; sampled play is a fair coin and lasts longer."""
    import jax

    spec = ppo.make_spec("CartPole-v1")
    config = ppo.make_config("CartPole-v1")
    program = ppo.make_program(spec, config, num_updates=1)
    runner = program.init(jax.random.key(0))
    params = jax.tree.map(lambda x: x * 0, runner.params)  # every logit 0
    key = jax.random.key(1)
    greedy = program.evaluate(params, runner.norm, key, 64, True)
    sampled = program.evaluate(params, runner.norm, key, 64, False)
    assert float(greedy.max()) <= 11
    assert float(sampled.mean()) > float(greedy.mean()) + 5


def test_continuous_actions_run_with_the_gaussian_policy(ppo: Any) -> None:
    small = {"num_envs": 8, "num_steps": 16, "num_minibatches": 2, "hidden": 16}
    result = ppo.train("Pendulum-v1", 0, 256, eval_episodes=2, overrides=small)
    assert result["preset"] == "continuous" and result["config"]["normalize_env"] is True
    assert result["config"]["hidden"] == 16 and result["updates"] == 2
    assert result["final_train_return"] is None  # a Pendulum game lasts 200 steps
    assert result["curve"][-1]["episodes"] == 0
    assert result["final_eval_return"] < 0  # Pendulum's rewards are costs


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("NoSuchEnv-v0", 0, 1000), {}, "unknown gymnax env 'NoSuchEnv-v0'"),
        (("CartPole-v1", 0, 1000), {"overrides": {"learning_rate": 1e-3}}, "unknown PPO field"),
        (("CartPole-v1", 0, 1000), {"overrides": {"num_envs": "many"}}, "num_envs must be"),
        (("CartPole-v1", 0, 1000), {"overrides": {"num_minibatches": 3}}, "must divide"),
        (("CartPole-v1", 0, 0), {}, "total_env_steps must be positive"),
        (("CartPole-v1", 0, -5), {}, "total_env_steps must be positive"),
        (("CartPole-v1", 0, 100), {}, "less than one update"),
        (("CartPole-v1", 0, 1000), {"eval_every": 0}, "eval_every must be positive"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(
    ppo: Any, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ppo.train(*args, **kwargs)


def test_cartpole_learns_well_past_random_play_in_100k_steps(ppo: Any) -> None:
    """Random play averages about 22; PureJaxRL's CartPole config passes 100 by 100k steps."""
    result = ppo.train("CartPole-v1", 0, 100_000, eval_episodes=8)
    assert result["final_train_return"] > 100
    assert result["final_eval_return"] > 100
    assert result["curve"][-1]["train_return"] > 3 * result["curve"][0]["train_return"]
