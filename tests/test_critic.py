"""The critic (`value_coef > 0`): GAE(λ) advantages compared within the group, the critic's
squared error in the loss, its encoder of its own or the policy's, and its checkpoints."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch
from gymnasium.vector import AutoresetMode

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from fruit_env import FruitCatcherVectorEnv
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.algorithm.advantages import (
    VALUE_VARIANCE_FLOOR,
    gae,
    group_relative,
    value_weights,
    windowed_returns,
)
from grpo_trainer.algorithm.policy import build_policy
from grpo_trainer.base import checkpoint
from grpo_trainer.envs import make_envs
from grpo_trainer.envs.env_io import EnvIO
from grpo_trainer.envs.episodes import EpisodeRunner

CPU = torch.device("cpu")


def test_gae_by_hand() -> None:
    """Three rows of one sub-env, a cut after the second: the cut ends the bootstrap and the
    sum, and the last row bootstraps from nothing."""
    rewards = torch.tensor([[1.0], [0.0], [2.0]])
    values = torch.tensor([[0.5], [1.0], [0.0]])
    cut = torch.tensor([[False], [True], [False]])
    adv, targets = gae(rewards, cut, values, rows=2, gamma=0.9, lam=0.8)
    # row 1: 0 - 1.0 (no bootstrap past the cut); row 0: 1 + 0.9 * 1.0 - 0.5 + 0.72 * (-1)
    assert adv[:, 0].tolist() == pytest.approx([0.68, -1.0])
    assert targets[:, 0].tolist() == pytest.approx([1.18, 0.0])


def test_gae_by_hand_past_a_time_limit() -> None:
    """The same rows, the cut now a time limit's: the sum still ends there, but the value of
    the next row (the episode's last observation) carries its return on."""
    rewards = torch.tensor([[1.0], [0.0], [2.0]])
    values = torch.tensor([[0.5], [1.0], [3.0]])
    cut = torch.tensor([[False], [True], [False]])
    adv, targets = gae(rewards, cut, values, rows=2, gamma=0.9, lam=0.8, bootstrap=cut)
    # row 1: 0 + 0.9 * 3.0 - 1.0 (the trace from row 2 still cut); row 0: 1.4 + 0.72 * 1.7
    assert adv[:, 0].tolist() == pytest.approx([2.624, 1.7])
    assert targets[:, 0].tolist() == pytest.approx([3.124, 2.7])
    unmarked = gae(rewards, cut, values, rows=2, gamma=0.9, lam=0.8, bootstrap=~cut)
    torch.testing.assert_close(unmarked, gae(rewards, cut, values, rows=2, gamma=0.9, lam=0.8))


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_the_runner_tells_an_end_by_the_clock_from_an_end_by_the_game(mode: AutoresetMode) -> None:
    """`timed_out`: the env truncated the episode and did not terminate it, and the step's
    observation is the episode's last. Under SAME_STEP it is already the next episode's first,
    so nothing is marked there."""
    rules = {"win_score": 2, "lose_score": -2, "max_episode_steps": 25}
    n = 16
    reference = FruitCatcherVectorEnv(n, autoreset_mode=mode, **rules)
    runner = EpisodeRunner(EnvIO(FruitCatcherVectorEnv(n, autoreset_mode=mode, **rules), CPU))
    reference.reset(seed=list(range(n)))
    runner.env.reset_groups(list(range(n)), 1)
    runner.begin_episodes()
    generator = torch.Generator().manual_seed(0)
    resetting = torch.zeros(n, dtype=torch.bool)
    ends = {"game": 0, "clock": 0}
    for _ in range(80):
        actions = torch.randint(0, 3, (n,), generator=generator)
        _, _, terminated, truncated, _ = reference.step(actions)
        step = runner.step(actions)
        by_clock = step.ended & truncated & ~terminated
        ends["clock"] += int(by_clock.sum())
        ends["game"] += int((step.ended & terminated).sum())
        expected = by_clock if mode == AutoresetMode.NEXT_STEP else torch.zeros_like(by_clock)
        assert torch.equal(step.timed_out, expected)
        if mode == AutoresetMode.NEXT_STEP:  # as IndependentRestarts follows the env
            runner.begin_episodes(resetting)
            resetting = step.ended
        else:
            runner.begin_episodes(step.ended)
    assert ends["clock"] > 0 and ends["game"] > 0


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_the_runners_own_limit_is_an_end_by_the_clock(mode: AutoresetMode) -> None:
    rules = {"win_score": 1000, "lose_score": -1000, "max_episode_steps": 100}
    runner = EpisodeRunner(EnvIO(FruitCatcherVectorEnv(4, autoreset_mode=mode, **rules), CPU), 3)
    runner.env.reset_groups([0, 1, 2, 3], 1)
    runner.begin_episodes()
    marks = [runner.step(torch.zeros(4, dtype=torch.int64)).timed_out.tolist() for _ in range(4)]
    assert marks == [[False] * 4, [False] * 4, [True] * 4, [False] * 4]


def _freeway_cut_at_5_steps(restart_every: int = 8) -> GRPOTrainer:
    config = GRPOConfig(
        num_groups=2,
        group_size=2,
        hidden_sizes=(16,),
        rollout_steps=16,
        restart_every=restart_every,
        run=RunConfig(
            env="fruit_env:Freeway-MinAtar-v0",
            env_kwargs={"max_episode_steps": 5},
            progress=False,
            device="cpu",
            compile=False,
        ),
    )
    return GRPOTrainer(make_envs(config, config.num_envs, CPU), config)


@pytest.mark.parametrize(("restart_every", "kept"), [(8, True), (5, False)])
def test_a_rollout_bootstraps_a_time_limit_where_the_next_row_is_the_episodes_own(
    restart_every: int, kept: bool
) -> None:
    """Freeway ends by its clock alone. Cut at 5 steps and restarted at the checks every 8
    steps, every end's next row holds the episode's last observation, and the critic's target
    there is the reward plus the discounted value of that row. Checked every 5 steps, each
    group restarts right after its end, the next row is a new game's, and no end is marked."""
    trainer = _freeway_cut_at_5_steps(restart_every)
    assert trainer.config.value_coef > 0  # a grid: the critic is derived
    for _ in range(3):  # until the trained rows are played ones (they wait for a look-ahead)
        trainer.update()
    rollout = trainer.collect()
    rows = rollout.obs.shape[0]
    ends = rollout.cut[:rows] & rollout.valid[:rows]
    assert ends.sum(0).min() >= 2  # every sub-env ended at least twice in the trained rows
    assert torch.equal(rollout.bootstrap, rollout.cut if kept else torch.zeros_like(rollout.cut))
    played = trainer.buffer.obs[: len(rollout.rewards)]
    with torch.no_grad():
        values = trainer.policy.values(played.flatten(0, 1)).view(played.shape[0], -1)
    targets = trainer.advantages(rollout).value_targets
    assert targets is not None
    expected = rollout.rewards[:rows] + trainer.config.gamma * values[1 : rows + 1] * kept
    torch.testing.assert_close(targets[ends], expected[ends])


def test_gae_with_lambda_one_and_no_values_is_the_discounted_return() -> None:
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randn(40, 6, generator=generator)
    cut = torch.rand(40, 6, generator=generator) < 0.1
    adv, targets = gae(rewards, cut, torch.zeros(40, 6), rows=25, gamma=0.97, lam=1.0)
    expected = windowed_returns(rewards, cut, rows=25, window=40, gamma=0.97)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(targets, expected)


def _space() -> tuple[gym.Space, gym.Space]:
    return gym.spaces.Box(0.0, 1.0, (5,)), gym.spaces.Discrete(3)


def test_the_critics_error_is_weighed_by_the_variance_of_its_valid_targets() -> None:
    targets = torch.tensor([[1.0, 3.0], [5.0, 100.0]])
    valid = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # the 100 does not count
    variance = torch.tensor([1.0, 3.0, 5.0]).var(unbiased=False)  # 8/3
    torch.testing.assert_close(value_weights(targets, valid), valid / variance)
    # scale-free: returns ten times larger weigh a hundred times less
    torch.testing.assert_close(value_weights(10 * targets, valid), valid / (100 * variance))
    # targets that barely vary are divided by the floor, not by nearly 0
    flat = value_weights(torch.full((2, 2), 7.0) + 1e-4 * targets, valid)
    torch.testing.assert_close(flat, valid / VALUE_VARIANCE_FLOOR)


@pytest.mark.parametrize("critic", ["separate", "shared"])
def test_a_separate_critic_has_an_encoder_of_its_own(critic: str) -> None:
    policy = build_policy(GRPOConfig(value_coef=0.5, critic=critic), *_space())  # type: ignore[arg-type]
    obs = torch.rand(7, 5)
    before = policy.values(obs)
    assert before.shape == (7,)
    with torch.no_grad():
        policy.body[1].weight.mul_(3.0)  # the policy's first layer
    moved = not torch.equal(policy.values(obs), before)
    assert moved == (critic == "shared")


def test_without_a_critic_the_network_is_the_policy_alone() -> None:
    plain = build_policy(GRPOConfig(), *_space())
    assert all(name.startswith("body.") for name in plain.state_dict())
    with pytest.raises(RuntimeError, match="no critic"):
        plain.values(torch.rand(2, 5))


def _trainer(**overrides: Any) -> GRPOTrainer:
    config = GRPOConfig(
        **{
            "num_groups": 4,
            "group_size": 4,
            "hidden_sizes": (16,),
            "rollout_steps": 8,
            "window": 16,
            "epochs": 2,
            "minibatch_size": 64,
            "value_coef": 0.5,
            "run": RunConfig(progress=False, device="cpu", compile=False, seed=3),
            **overrides,
        }
    )
    return GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)


def test_the_update_compares_the_critics_gae_and_regresses_it_on_its_targets() -> None:
    """What reaches the loss: the group-relative GAE of the critic's values of every played
    row (look-ahead included), GAE plus value as the target, and its error weighed by the
    update's target variance. Every played row is valued by the update's own critic, the
    rows carried from the last rollout too, so that each GAE sum reads one critic."""
    trainer = _trainer()
    for _ in range(3):
        trainer.update()
    cfg = trainer.config
    rollout = trainer.collect()
    played = trainer.buffer.obs[: len(rollout.rewards)]  # every row, look-ahead included
    assert played.shape[0] == rollout.rewards.shape[0] == rollout.obs.shape[0] + cfg.window - 1
    with torch.no_grad():
        values = trainer.policy.values(played.flatten(0, 1)).view(played.shape[0], -1)
    rows = rollout.obs.shape[0]
    adv, targets = gae(
        rollout.rewards,
        rollout.cut,
        values,
        rows=rows,
        gamma=cfg.gamma,
        lam=cfg.gae_lambda,
        bootstrap=rollout.bootstrap,
    )
    trained = rollout.valid[:rows]
    expected = group_relative(
        adv, trained, trained, cfg.group_size, scale=cfg.scale, zero_std_eps=cfg.zero_std_eps
    )
    # the public seam that scripts read (benchmarks/ratio_moves.py) gives the same GAE
    torch.testing.assert_close(trainer.advantages(rollout).advantages, expected.advantages)
    seen: list[tuple[torch.Tensor, ...]] = []
    loss = trainer.loss

    def recording(*args: Any) -> Any:
        seen.append((args[3], args[7], args[8]))  # advantages, value targets and weights
        return loss(*args)

    trainer.loss = recording  # type: ignore[assignment]
    trainer.learn(rollout)
    first_epoch = seen[: len(seen) // cfg.epochs]
    got_adv, got_targets, got_weights = (
        torch.cat(column) for column in zip(*first_epoch, strict=True)
    )
    assert got_adv.numel() == got_targets.numel() == trained.numel()  # every valid row
    torch.testing.assert_close(got_adv.sort().values, expected.advantages.flatten().sort().values)
    torch.testing.assert_close(got_targets.sort().values, targets.flatten().sort().values)
    weights = value_weights(targets, trained).flatten()
    assert 0 < weights.max() < 1 / VALUE_VARIANCE_FLOOR  # the floor is not what divides here
    torch.testing.assert_close(got_weights.sort().values, weights.sort().values)


@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_an_update_scores_every_played_row_with_one_pass_of_its_encoder(critic: str) -> None:
    """Before it trains, an update values every played row and re-scores the rows an
    earlier policy played (`RowScores.both`): the same values and log-probs as passes of their
    own, with the shared encoder run over each played row once, those re-scored too (a
    separate critic's encoder values them, the policy's scores the re-scored rows)."""
    trainer = _trainer(critic=critic)
    trainer.update()
    rollout = trainer.collect()
    played = trainer.buffer.obs[: len(rollout.rewards)]
    earlier = rollout.earlier_policy_rows
    assert 0 < earlier < played.shape[0]
    with torch.no_grad():
        values = trainer.policy.values(played.flatten(0, 1)).view(played.shape[0], -1)
        obs, actions = (t[:earlier].flatten(0, 1) for t in (rollout.obs, rollout.actions))
        logp = trainer.policy.log_prob_entropy(obs, actions)[0].view(earlier, -1)
    encoders = {"policy": trainer.policy.body[0]}
    if trainer.policy.critic is not None:
        encoders["critic"] = trainer.policy.critic[0]
    rows = dict.fromkeys(encoders, 0)

    def counter(name: str) -> Any:
        def hook(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], out: Any) -> None:
            rows[name] += inputs[0].shape[0]

        return hook

    hooks = [module.register_forward_hook(counter(n)) for n, module in encoders.items()]
    got_values, got_logp = trainer.scores.both(rollout)
    for hook in hooks:
        hook.remove()
    torch.testing.assert_close(got_values, values)
    torch.testing.assert_close(got_logp, logp)
    played_rows, rescored_rows = played.shape[0] * played.shape[1], earlier * played.shape[1]
    if critic == "shared":
        assert rows == {"policy": played_rows}
    else:
        assert rows == {"policy": rescored_rows, "critic": played_rows}


def test_the_critic_learns_the_value() -> None:
    """With λ = 1 the targets are the discounted returns, whatever the values: learning one
    rollout again and again, the critic's error on it falls."""
    trainer = _trainer(gae_lambda=1.0)
    for _ in range(2):
        trainer.update()
    rollout = trainer.collect()
    losses = [trainer.learn(rollout).metrics["value_loss"] for _ in range(30)]
    assert losses == sorted(losses, reverse=True)  # every pass lowers it
    assert losses[-1] < 0.7 * losses[0]


def test_without_a_critic_the_value_loss_is_zero() -> None:
    trainer = _trainer(value_coef=0.0)
    assert trainer.update()["value_loss"] == 0.0


def test_exact_resume_with_a_critic(tmp_path: Path) -> None:
    original = _trainer()
    for _ in range(2):
        original.update()
    path = tmp_path / "k.pt"
    checkpoint.atomic_save(original.state_dict(), path)
    expected = [original.update()["value_loss"] for _ in range(2)]
    resumed = _trainer(run=RunConfig(progress=False, device="cpu", compile=False, seed=3))
    resumed.load(path)
    assert [resumed.update()["value_loss"] for _ in range(2)] == expected
    for a, b in zip(original.policy.parameters(), resumed.policy.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_checkpoint_from_before_the_bootstrap_flag_resumes_with_its_rows_unmarked(
    tmp_path: Path,
) -> None:
    """Checkpoints written before the flag existed carry no `bootstrap` rows: they resume,
    and their carried ends are plain cuts, as their writer trained them."""
    original = _freeway_cut_at_5_steps()
    for _ in range(3):
        original.update()
    carried = original.buffer.trained_rows
    assert original.buffer.bootstrap[carried:].any()
    state = original.state_dict()
    del state["rollouts"][0]["carry"]["bootstrap"]
    path = tmp_path / "older.pt"
    checkpoint.atomic_save(state, path)
    resumed = _freeway_cut_at_5_steps()
    resumed.load(path)
    assert not resumed.buffer.bootstrap[carried:].any()
    assert torch.equal(resumed.buffer.cut[carried:], original.buffer.cut[carried:])
    assert math.isfinite(resumed.update()["value_loss"])


def test_a_checkpoint_without_a_critic_does_not_load_into_one(tmp_path: Path) -> None:
    plain = _trainer(value_coef=0.0)
    path = tmp_path / "plain.pt"
    checkpoint.atomic_save(plain.state_dict(), path)
    with pytest.raises(checkpoint.CheckpointError):
        _trainer().load(path)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"value_coef": -0.5}, "value_coef"),
        ({"gae_lambda": 1.5}, "gae_lambda"),
        ({"critic": "twin"}, "critic"),
        (
            {"value_coef": 0.5, "rollout": "episodes", "advantage": "outcome"},
            "value_coef > 0 compares per-step GAE",
        ),
    ],
)
def test_the_config_refuses_a_bad_critic(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**fields)


# -- the derived default: a critic for observations with two or more axes ------------------


@pytest.mark.parametrize(
    ("spatial", "fields", "expected"),
    [
        (True, {}, (0.5, 32, 0.995, 4)),  # a grid's planes: the critic and its settings
        (False, {}, (0.0, 128, 1 - 1 / 128, 4)),  # flat: none; the window follows the limit
        (True, {"value_coef": 0.0}, (0.0, 128, 1 - 1 / 128, 4)),  # asked for none: none
        (False, {"value_coef": 0.25}, (0.25, 32, 0.995, 4)),  # asked for one: its settings
        (True, {"window": 64}, (0.5, 64, 0.995, 4)),  # a given window stays
        (True, {"rollout": "episodes", "advantage": "outcome"}, (0.0, 128, 1 - 1 / 128, 4)),
    ],
)
def test_the_critic_and_its_settings_are_derived_from_the_observations(
    spatial: bool, fields: dict[str, Any], expected: tuple[float, int, float, int]
) -> None:
    config = GRPOConfig(**fields).resolve(1000, spatial=spatial)
    assert (config.value_coef, config.window, config.gamma, config.epochs) == expected
    assert "value_coef" in config.derived or "value_coef" in fields


def test_a_grid_env_trains_with_a_critic_and_a_flat_one_without() -> None:
    """Through both ways into a run: the train command's (`open_run`) and a trainer built on
    an env made by hand, which derive the same config."""
    from grpo_trainer.run.trainer import open_run
    from grpo_trainer.tools.cli import build_parser, config_from_args

    for env, critic in (("fruit_env:Freeway-MinAtar-v0", True), ("FruitCatcher-v0", False)):
        argv = ["train", "--env", env, "--total-env-steps", "2048", "--device", "cpu"]
        config = config_from_args(build_parser().parse_args([*argv, "--no-progress"]))
        from_cli = open_run(config).config
        by_hand = GRPOTrainer(make_envs(config, config.num_envs, torch.device("cpu")), config)
        assert by_hand.config == from_cli
        assert (from_cli.value_coef > 0, by_hand.policy.value_out is not None) == (critic,) * 2
        assert by_hand.config.window == 32  # the critic's; Fruit Catcher's limit (200) too
        assert by_hand.config.gamma == (0.995 if critic else 1 - 1 / 32)
