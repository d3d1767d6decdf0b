"""examples/grpo_one_page.py: the trainer's update written on one page, and the benchmark's
naive reference.

Default (windowed) mode: from the same weights and env, the example and `GRPOTrainer` with
`GRPOConfig()`'s defaults each play and learn, update after update, and their rollouts,
advantages and parameters are compared. Episodes mode: `GRPOTrainer.learn` takes a
`Rollout`, which carries the collection's episode statistics besides its tensors, and has no
seam for bare tensors: so the trainer plays (`collect`), and both learn from that one rollout
(`GRPOTrainer.learn` and the example's `learn`), from the same weights.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import pytest
import torch
from loading import load_module
from torch.distributions import Categorical

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.algorithm.advantages import group_relative, windowed_returns

if TYPE_CHECKING:
    from grpo_trainer.algorithm.rollout import Rollout

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "grpo_one_page.py"
one_page = load_module(EXAMPLE, "grpo_one_page_example")

GROUPS, SIZE, HORIZON = 4, 8, 60
# Scores of +-4 end most episodes within HORIZON steps, at different steps within a group, so
# the validity mask and the group means over the members still playing matter.
SHORT_GAMES = {"win_score": 4, "lose_score": -4, "compile": False}


def make_envs(**rules: Any) -> gym.vector.VectorEnv:
    return gym.make_vec("FruitCatcher-v0", num_envs=GROUPS * SIZE, **rules)


def matching_trainer(config: Any, *, fused: bool) -> GRPOTrainer:
    """A trainer whose update is the one-page one: one whole episode per member from group
    resets, returns to the episode's end, the batch std as scale, one trust region and one
    minibatch, a constant rate, no KL, no dual clip, float32 storage and arithmetic, eager."""
    trainer_config = GRPOConfig(
        num_groups=config.num_groups,
        group_size=config.group_size,
        rollout="episodes",
        max_episode_steps=config.horizon,
        advantage="per_step",
        scale="batch_std",
        gamma=config.gamma,
        zero_std_eps=config.zero_std_eps,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        dual_clip=None,  # the one page has no dual clip, which binds only past a ratio of 3
        epochs=config.epochs,
        anchor_samples=None,
        minibatch_size=1 << 30,
        micro_batches=1,
        kl_coef=0.0,
        entropy_coef=config.entropy_coef,
        max_grad_norm=config.max_grad_norm,
        lr=config.lr,
        lr_schedule="constant",
        hidden_sizes=(config.hidden, config.hidden),
        activation=config.activation,
        obs_storage="float32",
        run=RunConfig(
            device="cpu", compile=False, amp="off", fused_optimizer=fused, seed=3, progress=False
        ),
    )
    return GRPOTrainer(make_envs(**SHORT_GAMES), trainer_config)


def as_batch(rollout: Rollout) -> Any:
    """The trainer's rollout as the example's batch (copies: nothing is shared)."""
    return one_page.Batch(
        rollout.obs.float().clone(),
        rollout.actions.long().clone(),
        rollout.logp.clone(),
        rollout.rewards.clone(),
        rollout.valid.clone(),
        rollout.cut.clone(),
        rollout.earlier_policy_rows,
    )


@pytest.mark.parametrize(
    ("epochs", "activation", "fused"),
    [(1, "relu", True), (3, "tanh", False)],
    ids=["one-step-relu-fused", "three-steps-tanh-foreach"],
)
def test_the_example_and_the_trainer_make_the_same_update(
    epochs: int, activation: str, fused: bool
) -> None:
    """Same rollout, same weights: the same losses, gradient norm and zero-spread fraction,
    and parameters equal to 1e-5 after steps that move them by about `lr` each."""
    config = one_page.Config(
        num_groups=GROUPS,
        group_size=SIZE,
        rollout="episodes",
        horizon=HORIZON,
        epochs=epochs,
        minibatches=1,
        activation=activation,
    )
    trainer = matching_trainer(config, fused=fused)
    grpo = one_page.OnePageGRPO(make_envs(**SHORT_GAMES), config)
    with torch.no_grad():
        for mine, theirs in zip(grpo.policy.parameters(), trainer.policy.parameters(), strict=True):
            mine.copy_(theirs)
    start = [p.detach().clone() for p in grpo.policy.parameters()]
    rollout = trainer.collect()
    assert 0.3 < rollout.valid.float().mean() < 0.9  # episodes ended at many different steps

    ours = grpo.learn(as_batch(rollout))
    theirs = trainer.learn(rollout).metrics

    for name in ("loss", "policy_loss", "entropy", "grad_norm"):
        assert ours[name] == pytest.approx(theirs[name], rel=1e-5, abs=1e-7), name
    assert ours["frac_zero_std_groups"] == pytest.approx(theirs["frac_zero_std_groups"], abs=1e-7)
    assert 0 < ours["frac_zero_std_groups"] < 0.5
    assert ours["valid_steps"] == theirs["valid_steps"]
    for mine, theirs_p, before in zip(
        grpo.policy.parameters(), trainer.policy.parameters(), start, strict=True
    ):
        torch.testing.assert_close(mine, theirs_p, rtol=0.0, atol=1e-5)
        assert (mine - before).abs().max() > 0.5 * config.lr * epochs  # Adam moved it


def test_returns_and_advantages_are_the_trainers() -> None:
    """On a played rollout: returns and weights bit-equal to grpo_trainer.algorithm.advantages', the
    advantages equal to float32 rounding."""
    config = one_page.Config(
        num_groups=GROUPS, group_size=SIZE, rollout="episodes", horizon=HORIZON
    )
    rollout = matching_trainer(config, fused=True).collect()
    rows = rollout.rewards.shape[0]

    returns = one_page.returns_to_go(rollout.rewards, config.gamma)
    advantages, weights, spread = one_page.group_advantages(
        returns, rollout.valid.float(), SIZE, config.zero_std_eps
    )

    expected_returns = windowed_returns(
        rollout.rewards, rollout.cut, rows=rows, window=rows, gamma=config.gamma
    )
    expected = group_relative(
        expected_returns,
        rollout.valid,
        rollout.valid,
        SIZE,
        scale="batch_std",
        zero_std_eps=config.zero_std_eps,
    )
    assert torch.equal(returns, expected_returns)
    assert torch.equal(weights, expected.weights)
    assert torch.equal(expected.zero_spread, expected.compared & ~spread)
    torch.testing.assert_close(advantages, expected.advantages, rtol=1e-6, atol=1e-7)
    assert (weights == 0).any() and (weights == 1).any()


def test_collect_plays_one_episode_per_member_from_its_groups_start() -> None:
    """Members of a group start from one state; each member's steps count until its episode
    ends, its later episodes do not, and playing stops once every episode has ended."""
    config = one_page.Config(num_groups=GROUPS, group_size=SIZE, rollout="episodes", horizon=200)
    grpo = one_page.OnePageGRPO(make_envs(**SHORT_GAMES), config)
    batch = grpo.collect()
    rows = batch.valid.shape[0]
    lengths = batch.valid.sum(0)
    assert rows == lengths.max() < 200 and batch.carried == 0
    prefix = torch.arange(rows)[:, None] < lengths[None, :]
    assert torch.equal(batch.valid, prefix)
    assert set(batch.rewards.sum(0).tolist()) <= {-4.0, 4.0}  # each the score that ended it
    assert torch.equal(batch.cut, torch.arange(rows)[:, None] == lengths[None, :] - 1)
    starts = batch.obs[0].unflatten(0, (GROUPS, SIZE))
    assert torch.equal(starts, starts[:, :1].expand_as(starts))
    assert not torch.equal(starts[:, 0], starts[:1, 0].expand_as(starts[:, 0]))
    with torch.no_grad():
        logp = Categorical(logits=grpo.policy(batch.obs)).log_prob(batch.actions)
    torch.testing.assert_close(batch.logp, logp)  # the playing policy's log-probs


UPDATES = 4


def default_trainer() -> GRPOTrainer:
    """The trainer's default update: `GRPOConfig()`'s defaults (windowed rollouts, window and
    discount from the episode limit, 8 epochs of 8 minibatches, the linear rate decay,
    branching ended members) apart from sizes, and one storage setting:
    `obs_storage="float32"`, since the default stores Fruit Catcher's observations as float16,
    which rounds what the policy sees, and the example stores them as float32. The batch holds
    fewer samples than `anchor_samples`, so it is one trust region, as the example's is."""
    config = GRPOConfig(
        num_groups=GROUPS,
        total_env_steps=UPDATES * GROUPS * SIZE * GRPOConfig.rollout_steps,
        obs_storage="float32",
        run=RunConfig(device="cpu", progress=False),
    )
    return GRPOTrainer(make_envs(**SHORT_GAMES), config)


def example_like(trainer: GRPOTrainer) -> Any:
    """The example on the same env, with the trainer's resolved settings and weights."""
    cfg = trainer.config
    assert cfg.rollout == "windowed" and cfg.branch_ended and not cfg.branch_every
    assert cfg.kl_coef == 0 and cfg.scale == "batch_std" and cfg.advantage == "per_step"
    assert GROUPS * SIZE * cfg.rollout_steps <= cfg.anchor_samples  # one trust region
    config = one_page.Config(
        num_groups=GROUPS,
        group_size=SIZE,
        rollout_steps=cfg.rollout_steps,
        window=cfg.window,
        restart_every=cfg.restart_every,
        updates=UPDATES,
        epochs=cfg.epochs,
        minibatches=GROUPS * SIZE * cfg.rollout_steps // cfg.minibatch_size,
        lr=cfg.lr,
        gamma=cfg.gamma,
        seed=cfg.run.seed,
    )
    grpo = one_page.OnePageGRPO(make_envs(**SHORT_GAMES), config)
    with torch.no_grad():
        for mine, theirs in zip(grpo.policy.parameters(), trainer.policy.parameters(), strict=True):
            mine.copy_(theirs)
    return grpo


def test_the_example_and_the_trainer_make_the_same_windowed_updates() -> None:
    """The trainer's default mode, update after update from the same weights and env: the
    same rollouts (observations, actions, rewards, validity and cuts bit for bit, log-probs to
    float32 rounding, the same rows carried over), bit-equal sample weights and zero-spread
    group steps, advantages to float32 rounding, the same losses and episode figures, and
    parameters equal to 1e-5 after each update's 64 AdamW steps at its decayed rate. The envs'
    short games end episodes at many steps, so groups restart and ended members branch."""
    trainer = default_trainer()
    grpo = example_like(trainer)
    assert (trainer.config.window, trainer.config.epochs, grpo.config.minibatches) == (32, 8, 8)
    played: list[torch.Tensor] = []
    for update in range(UPDATES):
        theirs = trainer.collect()
        ours = grpo.collect()
        assert ours.carried == theirs.earlier_policy_rows == trainer.config.window - 1
        assert torch.equal(ours.obs, theirs.obs) and torch.equal(
            ours.actions, theirs.actions.long()
        )
        for name in ("rewards", "valid", "cut"):
            assert torch.equal(getattr(ours, name), getattr(theirs, name)), (update, name)
        torch.testing.assert_close(ours.logp, theirs.logp, rtol=0.0, atol=1e-6)
        played.append(ours.valid[ours.carried :].clone())

        advantages, weights, spread = grpo.compare(ours)
        expected = trainer.advantages(theirs)
        assert torch.equal(weights, expected.weights)
        assert torch.equal(expected.zero_spread, expected.compared & ~spread)
        torch.testing.assert_close(advantages, expected.advantages, rtol=1e-6, atol=1e-6)
        assert (weights == 0).any() and (weights == 1).any()

        before = [p.detach().clone() for p in grpo.policy.parameters()]
        mine = grpo.learn(ours)
        report = trainer.learn(theirs).metrics
        for name in ("loss", "policy_loss", "entropy", "grad_norm"):
            assert mine[name] == pytest.approx(report[name], rel=1e-5, abs=1e-7), (update, name)
        for name in ("valid_steps", "frac_zero_std_groups", "episodes"):
            assert mine[name] == pytest.approx(report[name], abs=1e-7), (update, name)
        if mine["episodes"]:
            assert mine["return_mean"] == pytest.approx(report["return_mean"], abs=1e-6)
        for p, q, p0 in zip(
            grpo.policy.parameters(), trainer.policy.parameters(), before, strict=True
        ):
            torch.testing.assert_close(p, q, rtol=0.0, atol=1e-5)
            assert (p - p0).abs().max() > 0.5 * trainer.config.lr * (1 - update / UPDATES)
    assert grpo.update_index == trainer.update_index == UPDATES

    # What the rollouts exercised: a member that had ended playing again while its group
    # played on (a branch), and a whole group that had ended starting again (a restart).
    valid = torch.cat(played).unflatten(1, (GROUPS, SIZE))  # every played row, in order
    again = ~valid[:-1] & valid[1:]  # (rows - 1, groups, members): counts again next row
    group_on = valid[:-1].any(-1, keepdim=True)
    assert (again & group_on).any() and (again & ~group_on).any()
    assert 0.3 < valid.float().mean() < 0.95


def test_windowed_rollouts_carry_their_look_ahead_and_start_groups_alike() -> None:
    """The last `window - 1` rows of a rollout are the first of the next; members of a group
    start from one state, groups from different ones; an ended member waits for a restart
    check (every `restart_every` steps) and no longer."""
    config = one_page.Config(num_groups=GROUPS, group_size=SIZE, window=16, rollout_steps=24)
    grpo = one_page.OnePageGRPO(make_envs(**SHORT_GAMES), config)
    first = grpo.collect()
    assert first.rewards.shape[0] == 24 + 15 and first.obs.shape[0] == 24
    assert not first.valid[:15].any() and first.carried == 15  # no earlier rollout
    starts = first.obs[15].unflatten(0, (GROUPS, SIZE))
    assert torch.equal(starts, starts[:, :1].expand_as(starts))
    assert not torch.equal(starts[:, 0], starts[:1, 0].expand_as(starts[:, 0]))
    look_ahead = [t[24:].clone() for t in (first.rewards, first.valid, first.cut)]
    grpo.learn(first)
    second = grpo.collect()
    for carried, now in zip(look_ahead, (second.rewards, second.valid, second.cut), strict=True):
        assert torch.equal(now[:15], carried)
    valid = torch.cat((first.valid[15:], second.valid[15:]))  # 48 steps played in order
    every = config.restart_every
    assert (~valid).any()
    for step in range(valid.shape[0] - every):
        ended = ~valid[step]  # a check falls within the next `every` steps
        assert valid[step + 1 : step + every + 1].any(0)[ended].all()


@pytest.fixture
def naive_benchmark(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """benchmarks/naive_grpo.py, loaded as train_throughput.py loads it; the sys.path entry and
    modules it adds are taken away afterwards."""
    monkeypatch.setattr(sys, "path", [*sys.path])
    yield load_module(ROOT / "benchmarks" / "naive_grpo.py", "naive_grpo_benchmark")
    for name in ("naive_grpo_benchmark", "grpo_one_page"):
        sys.modules.pop(name, None)


def test_the_benchmarks_naive_row_is_this_example(naive_benchmark: ModuleType) -> None:
    """One naive implementation: the benchmark's class adds only its constructor to the
    example's, and an update with train_throughput.py's arguments runs every step."""
    naive = naive_benchmark.NaiveGRPO
    assert [Path(inspect.getfile(base)) for base in naive.__bases__] == [EXAMPLE]
    assert [name for name, value in vars(naive).items() if callable(value)] == ["__init__"]
    grpo = naive(make_envs(), GROUPS, SIZE, 16, epochs=1, minibatches=1, activation="relu")
    metrics = grpo.update()
    assert metrics["valid_steps"] == GROUPS * SIZE * 16  # 200-step games: nobody ended
    assert grpo.config.num_groups == GROUPS and grpo.config.horizon == 16


@pytest.mark.parametrize(
    "mode", [["--rollout-steps", "8"], ["--rollout", "episodes", "--horizon", "8"]]
)
def test_main_prints_a_line_per_update_and_every_field_is_a_documented_flag(
    mode: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    grpo = one_page.main(["--updates", "2", "--num-groups", "2", "--lr", "0.02", *mode])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["update   1", "update   2"]
    assert grpo.update_index == 2 and grpo.config.lr == 0.02 and grpo.num_envs == 16
    assert grpo.optimizer.param_groups[0]["lr"] == pytest.approx(0.01)  # decayed linearly
    with pytest.raises(SystemExit):
        one_page.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for field in one_page.Config.__dataclass_fields__:
        assert f"--{field.replace('_', '-')}" in help_text
    assert "DAPO's clip-higher" in help_text  # the fields' docstrings are the help


def test_bad_settings_are_refused_with_the_reason() -> None:
    config = one_page.Config(num_groups=GROUPS, group_size=SIZE)
    with pytest.raises(ValueError, match="rollout must be 'windowed' or 'episodes'"):
        one_page.OnePageGRPO(make_envs(), dataclasses.replace(config, rollout="window"))
    with pytest.raises(ValueError, match="the env has 16 sub-envs, the config 32"):
        one_page.OnePageGRPO(gym.make_vec("FruitCatcher-v0", num_envs=16), config)
    cartpole = gym.make_vec("CartPole-v1", num_envs=GROUPS * SIZE, vectorization_mode="sync")
    with pytest.raises(ValueError, match="windowed rollouts need state snapshots"):
        one_page.OnePageGRPO(cartpole, config)
