"""examples/grpo_one_page.py: the trainer's update written on one page, and the benchmark's
naive reference.

`GRPOTrainer.learn` takes a `Rollout`, which carries the collection's episode statistics
besides its tensors, and has no seam for bare tensors: so the trainer plays (`collect`), and
both learn from that one rollout (`GRPOTrainer.learn` and the example's `learn`), from the
same weights.
"""

from __future__ import annotations

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
    minibatch, a constant rate, no KL, float32 storage and arithmetic, eager."""
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
        rollout.valid.float().clone(),
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
    config = one_page.Config(num_groups=GROUPS, group_size=SIZE, horizon=HORIZON)
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
    grpo = one_page.OnePageGRPO(
        make_envs(**SHORT_GAMES), one_page.Config(num_groups=GROUPS, group_size=SIZE, horizon=200)
    )
    batch = grpo.collect()
    rows = batch.valid.shape[0]
    lengths = batch.valid.sum(0)
    assert rows == lengths.max() < 200
    prefix = (torch.arange(rows)[:, None] < lengths[None, :]).float()
    assert torch.equal(batch.valid, prefix)
    assert set(batch.rewards.sum(0).tolist()) <= {-4.0, 4.0}  # each the score that ended it
    starts = batch.obs[0].unflatten(0, (GROUPS, SIZE))
    assert torch.equal(starts, starts[:, :1].expand_as(starts))
    assert not torch.equal(starts[:, 0], starts[:1, 0].expand_as(starts[:, 0]))
    with torch.no_grad():
        logp = Categorical(logits=grpo.policy(batch.obs)).log_prob(batch.actions)
    torch.testing.assert_close(batch.logp, logp)  # the playing policy's log-probs


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


def test_main_prints_a_line_per_update_and_every_field_is_a_documented_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    grpo = one_page.main(["--updates", "2", "--num-groups", "2", "--horizon", "8", "--lr", "0.02"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["update   1", "update   2"]
    assert grpo.update_index == 2 and grpo.config.lr == 0.02 and grpo.num_envs == 16
    with pytest.raises(SystemExit):
        one_page.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for field in one_page.Config.__dataclass_fields__:
        assert f"--{field.replace('_', '-')}" in help_text
    assert "DAPO's clip-higher" in help_text  # the fields' docstrings are the help
