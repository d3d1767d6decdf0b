"""`GRPOConfig` and `RunConfig`: every bad field raises `ValueError` naming it; JSON round-trips."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from grpo_trainer.base.config import GRPOConfig, RunConfig

# (field, bad value): one row per validation rule of GRPOConfig.
BAD_GRPO_FIELDS: list[tuple[str, Any]] = [
    ("num_groups", 0),
    ("num_groups", 2.5),
    ("num_groups", True),  # a bool is not an int here
    ("group_size", 1),  # a group of one has nothing to compare with
    ("total_env_steps", 0),
    ("max_episode_steps", 0),
    ("epochs", 0),
    ("minibatch_size", 0),
    ("anchor_samples", 0),
    ("rollout_steps", 0),
    ("window", 0),
    ("restart_every", 0),
    ("branch_every", -1),
    ("branch_ended", 1),
    ("noise_correlation", 1.0),  # a noise that never changes explores nothing
    ("noise_correlation", -0.5),
    ("rollout", "bogus"),
    ("cnn_channels", ()),
    ("micro_batches", 0),
    ("advantage", "bogus"),
    ("scale", "bogus"),
    ("lr_schedule", "bogus"),
    ("activation", "gelu"),
    ("obs_storage", "int8"),
    ("gamma", 1.5),
    ("gamma", -0.1),
    ("gamma", math.nan),
    ("zero_std_eps", -1.0),
    ("clip_low", 0.0),
    ("clip_low", 1.0),
    ("clip_high", 0.0),
    ("dual_clip", 1.0),  # a bound at 1 x A would cut a negative advantage inside the clip
    ("dual_clip", math.inf),
    ("dual_clip", "3"),
    ("logit_cap", 0.0),  # a cap at 0 leaves every action equally likely
    ("logit_cap", -10.0),
    ("logit_cap", math.inf),
    ("kl_coef", -0.1),
    ("entropy_coef", -0.1),
    ("mean_bound_coef", -0.1),
    ("mean_bound_coef", math.inf),
    ("max_grad_norm", 0.0),
    ("lr", 0.0),
    ("lr", "abc"),
    ("hidden_sizes", (0,)),
    ("hidden_sizes", (64, True)),
    ("hidden_sizes", "64"),
    ("run", "cpu"),
]

BAD_RUN_FIELDS: list[tuple[str, Any]] = [
    ("amp", "bogus"),
    ("seed", -1),
    ("seed", 1.5),
    ("checkpoint_every", -1),
    ("keep_checkpoints", 0),
    ("max_consecutive_skips", 0),
    ("env", ""),
    ("env_kwargs", "width=10"),
    ("device", ""),
    ("compile", "yes"),
]


@pytest.mark.parametrize(("field", "value"), BAD_GRPO_FIELDS)
def test_bad_grpo_field_raises_naming_it(field: str, value: Any) -> None:
    """Each invalid GRPOConfig value raises ValueError whose message starts with the field."""
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        GRPOConfig(**{field: value})


@pytest.mark.parametrize(("field", "value"), BAD_RUN_FIELDS)
def test_bad_run_field_raises_naming_it(field: str, value: Any) -> None:
    """Each invalid RunConfig value raises ValueError whose message starts with the field."""
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        RunConfig(**{field: value})


def test_infinite_learning_rate_is_rejected() -> None:
    """lr must be a finite positive number."""
    with pytest.raises(ValueError, match=r"^lr\b"):
        GRPOConfig(lr=math.inf)


def test_boundary_values_are_accepted() -> None:
    """The edges of each closed range are valid (and floats given as ints become floats)."""
    cfg = GRPOConfig(
        num_groups=1,
        group_size=2,
        gamma=0,
        zero_std_eps=0,
        clip_low=0.5,
        kl_coef=0,
        entropy_coef=0,
        max_episode_steps=1,
    )
    assert cfg.num_envs == 2
    assert isinstance(cfg.gamma, float) and cfg.gamma == 0.0
    assert GRPOConfig(gamma=1.0).gamma == 1.0


def test_num_envs_is_groups_times_size() -> None:
    """num_envs = num_groups * group_size."""
    assert GRPOConfig(num_groups=3, group_size=5).num_envs == 15


def test_dict_round_trip_through_json() -> None:
    """to_dict -> JSON -> from_dict rebuilds an equal config (tuples survive as lists)."""
    cfg = GRPOConfig(
        num_groups=3,
        hidden_sizes=(16, 8),
        advantage="outcome",
        rollout="episodes",
        run=RunConfig(seed=7, amp="bf16", env_kwargs={"width": 10}, compile=False),
    )
    data = json.loads(json.dumps(cfg.to_dict()))
    assert data["hidden_sizes"] == [16, 8]
    again = GRPOConfig.from_dict(data)
    assert again == cfg
    assert again.hidden_sizes == (16, 8)
    assert isinstance(again.run, RunConfig)


def test_from_dict_rejects_unknown_fields() -> None:
    """Typos in a saved config are errors, in the algorithm part and in the run part."""
    data = GRPOConfig().to_dict()
    with pytest.raises(ValueError, match=r"GRPOConfig field.*num_grops"):
        GRPOConfig.from_dict({**data, "num_grops": 4})
    data["run"]["sed"] = 1
    with pytest.raises(ValueError, match=r"RunConfig field.*sed"):
        GRPOConfig.from_dict(data)


def test_run_given_as_dict_and_hidden_sizes_as_list_are_converted() -> None:
    """A nested dict becomes a RunConfig (validated), a list of sizes becomes a tuple."""
    cfg = GRPOConfig(run={"seed": 3}, hidden_sizes=[4, 4])  # type: ignore[arg-type]
    assert cfg.run == RunConfig(seed=3)
    assert cfg.hidden_sizes == (4, 4)
    with pytest.raises(ValueError, match=r"^seed"):
        GRPOConfig(run={"seed": -3})  # type: ignore[arg-type]


def test_every_field_has_a_default_that_validates() -> None:
    """The defaults form a valid config, and every field appears in to_dict()."""
    cfg = GRPOConfig()
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert set(cfg.to_dict()) == names
    assert set(cfg.to_dict()["run"]) == {f.name for f in dataclasses.fields(RunConfig)}


def test_outcome_advantages_need_whole_episodes() -> None:
    """A windowed rollout has no whole-episode return to compare: the config says so."""
    with pytest.raises(ValueError, match="rollout='episodes'"):
        GRPOConfig(advantage="outcome")
    assert GRPOConfig(advantage="outcome", rollout="episodes").advantage == "outcome"


def test_every_field_has_a_one_line_description() -> None:
    """The descriptions feed --help, docs/trainer.md and config.json."""
    from grpo_trainer.base.config import describe

    for cls in (GRPOConfig, RunConfig):
        for field in dataclasses.fields(cls):
            text = describe(cls, field.name)
            assert text and "\n" not in text, field.name


# -- defaults that follow the budget and the env ------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "samples", "groups"),
    [
        (100_000, 1024, 4),
        (300_000, 1024, 4),
        (500_000, 2048, 8),
        (1_000_000, 8192, 32),
        (2_000_000, 16384, 64),
        (2_500_000, 32768, 128),
    ],
)
def test_the_default_batch_follows_the_budget(budget: int, samples: int, groups: int) -> None:
    """64 to 128 updates a run of 1M env steps or more, more below (the budget / 128, times
    budget / 1M below 1M, rounded up to a power of two of samples, at least 1024), 32-step
    rollouts, 8 minibatches, and Adam's learning rate by the square root of the minibatch."""
    config = GRPOConfig(total_env_steps=budget)
    assert config.num_envs * config.rollout_steps == samples
    assert (config.num_groups, config.rollout_steps) == (groups, 32)
    assert config.minibatch_size == samples // 8
    assert config.lr == pytest.approx(1e-2 * math.sqrt(samples / 8 / 4096))
    updates = budget / samples
    assert 64 <= updates <= (128 if budget >= 1_000_000 else 300)


def test_a_huge_budget_keeps_one_trust_region_per_update() -> None:
    config = GRPOConfig(total_env_steps=10**9)
    assert config.num_envs * config.rollout_steps == config.anchor_samples == 32768


@pytest.mark.parametrize(
    ("limit", "window", "epochs"), [(200, 32, 8), (500, 128, 4), (2500, 128, 4), (None, 128, 4)]
)
def test_window_discount_and_epochs_follow_the_episode_limit(
    limit: int | None, window: int, epochs: int
) -> None:
    config = GRPOConfig()
    assert (config.window, config.gamma, config.epochs) == (None, None, None)
    resolved = config.resolve(limit)
    assert resolved.window == window
    assert resolved.gamma == pytest.approx(1 - 1 / window)
    assert resolved.epochs == epochs
    assert resolved.num_groups == config.num_groups  # the env's size does not move


def test_a_config_is_a_frozen_record() -> None:
    """What a run resolved cannot change under it; `dataclasses.replace` makes another."""
    config = GRPOConfig().resolve(200)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lr = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.run.device = "cuda"  # type: ignore[misc]
    assert dataclasses.replace(config, lr=1e-3).lr == 1e-3 and config.lr == 1e-2
    assert config.resolve(500) is config  # resolved once: another limit changes nothing


def test_resolve_keeps_only_what_was_derived() -> None:
    """A resumed run keeps its derived values; a field the user set is not the run's to keep."""
    asked = GRPOConfig(lr=3e-3)
    kept = asked.resolve(200, {"num_groups": 8, "window": 64})
    assert (kept.num_groups, kept.window, kept.lr, kept.epochs) == (8, 64, 3e-3, 6)
    assert kept.derived == asked.derived
    with pytest.raises(ValueError, match=r"not derived by this config: \['lr'\]"):
        asked.resolve(200, {"lr": 1e-2})


def test_fields_set_by_hand_are_kept() -> None:
    config = GRPOConfig(
        num_groups=3, window=16, gamma=0.9, epochs=2, minibatch_size=100, lr=0.5
    ).resolve(1000)
    assert (config.num_groups, config.window, config.gamma) == (3, 16, 0.9)
    assert (config.epochs, config.minibatch_size, config.lr) == (2, 100, 0.5)
    plain = GRPOConfig(window=64).resolve(1000)  # no critic: the window's discount and passes
    assert (plain.value_coef, plain.epochs, plain.gamma) == (0.0, 6, 1 - 1 / 64)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"rollout": "episodes", "max_episode_steps": "64"}, "max_episode_steps"),
        ({"window": 8, "value_coef": "0.5"}, "value_coef"),
    ],
)
def test_a_bad_field_that_a_derivation_reads_is_named(fields: dict[str, Any], named: str) -> None:
    """Fields the derived ones are computed from are checked before any rule compares them:
    a string episode limit or critic weight is named, not a TypeError inside a rule."""
    with pytest.raises(ValueError, match=rf"^{named}\b"):
        GRPOConfig(**fields)
