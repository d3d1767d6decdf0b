"""Rollouts: group starts, windowed collection with restarts and branches, episodes mode.

Restarts and branches are watched through a wrapper that exposes FruitCatcher's state
protocol: after every restore the members of each restarted group must hold identical
states, and the observation the trainer stored next must be the one of that state.
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import pytest
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from uncopyable import LockedEnv

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from fruit_env.games.fruit_catcher.rules import FruitCatcher
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
from grpo_trainer.algorithm.rollout import storage_dtype
from grpo_trainer.envs.env_io import EnvIO

CPU = torch.device("cpu")
SHORT = {"win_score": 3, "lose_score": -3, "max_episode_steps": 30}  # ends at varied steps


def _fruit(num_envs: int, **kwargs: object) -> gym.vector.VectorEnv:
    return gym.make_vec("FruitCatcher-v0", num_envs=num_envs, validate_actions=False, **kwargs)


def _cartpole(num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="vector_entry_point")


class OwnRestarts(CartPoleVectorEnv):
    """A numpy vector env the trainer has no adapter for (a subclass may keep more state than
    the arrays `ARRAY_LAYOUTS` names for CartPoleVectorEnv): it restarts sub-envs itself, and
    its reset takes one seed for all."""


def _unadapted(num_envs: int) -> gym.vector.VectorEnv:
    return OwnRestarts(num_envs=num_envs)


def _trainer(envs: gym.vector.VectorEnv, **cfg: Any) -> GRPOTrainer:
    run = RunConfig(progress=False, device="cpu", seed=cfg.pop("seed", 0))
    cfg.setdefault("hidden_sizes", (16,))
    cfg.setdefault("group_size", 2)
    groups = cfg.pop("num_groups", envs.num_envs // cfg["group_size"])
    return GRPOTrainer(envs, GRPOConfig(num_groups=groups, run=run, **cfg))


class Watched(gym.vector.VectorWrapper):
    """FruitCatcher with its state protocol passed through, recording every restore."""

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        self.steps = 0
        self.restores: list[tuple[int, torch.Tensor, Any]] = []  # (steps, source, state)
        self._source: torch.Tensor | None = None

    def step(self, actions: Any) -> Any:
        self.steps += 1
        return self.env.step(actions)

    def snapshot_state(self, index: torch.Tensor) -> Any:
        self._source = index.clone()
        return self.env.unwrapped.snapshot_state(index)

    def restore_state(self, index: torch.Tensor, snapshot: Any) -> None:
        self.env.unwrapped.restore_state(index, snapshot)
        if len(index) == self.num_envs:  # a restart point (checkpoint restores are not)
            self.restores.append((self.steps, self._source, self.env.unwrapped.state))


# -- group starts ------------------------------------------------------------------------------


def test_reset_groups_gives_identical_starts_within_groups() -> None:
    """Members of a group start alike, groups differ, and equal actions keep members alike."""
    groups, size = 3, 4
    io = EnvIO(_fruit(groups * size), CPU)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FruitCatcher takes per-env seeds: no fallback warning
        obs = io.reset_groups([101, 202, 303], size)
    assert io.per_env_seeds is True and io.restart_method.name == "snapshot"
    grouped = obs.unflatten(0, (groups, size))
    assert torch.equal(grouped, grouped[:, :1].expand_as(grouped))
    assert not torch.equal(grouped[0, 0], grouped[1, 0])
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        per_group = torch.randint(0, 3, (groups,), generator=generator)
        step = io.step(per_group.repeat_interleave(size))
        grouped = step.obs.unflatten(0, (groups, size))
        assert torch.equal(grouped, grouped[:, :1].expand_as(grouped))


def test_reset_groups_passes_each_member_its_group_seed() -> None:
    seen: list[object] = []

    class Recording(gym.vector.VectorWrapper):
        def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
            seen.append(seed)
            return super().reset(seed=seed, options=options)

    EnvIO(Recording(_fruit(6)), CPU).reset_groups([7, 8, 9], 2)
    assert seen == [[7, 7, 8, 8, 9, 9]]


def test_restart_strategies_follow_what_the_env_offers() -> None:
    """State protocol (own, or an adapter's) -> snapshot; Gymnasium's vector envs of envs
    that cannot be copied -> seeded; otherwise independent."""
    assert EnvIO(_fruit(2), CPU).restart_method.name == "snapshot"
    assert EnvIO(_cartpole(2), CPU).restart_method.name == "snapshot"  # ArrayStateVectorEnv
    sync = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    assert EnvIO(sync, CPU).restart_method.name == "snapshot"  # CopiedStateVectorEnv
    async_envs = _async_cartpole(2)
    try:
        assert EnvIO(async_envs, CPU).restart_method.name == "snapshot"  # PickledStateVectorEnv
    finally:
        async_envs.close()
    with pytest.warns(RuntimeWarning, match="cannot be copied"):
        assert EnvIO(_uncopyable(2), CPU).restart_method.name == "seeded"
    assert EnvIO(_unadapted(2), CPU).restart_method.name == "independent"
    # A wrapper hides the protocol of the env it wraps unless it passes it on itself.
    assert EnvIO(gym.vector.VectorWrapper(_fruit(2)), CPU).restart_method.name == "independent"


def test_an_env_without_seed_lists_warns_once() -> None:
    io = EnvIO(_unadapted(4), CPU)
    with pytest.warns(RuntimeWarning, match="list of seeds"):
        obs = io.reset_groups([1, 2], 2)
    assert io.per_env_seeds is False and obs.shape == (4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(obs, io.reset_groups([1, 2], 2))


def test_env_io_rejects_a_single_env() -> None:
    with pytest.raises(ValueError, match="VectorEnv"):
        EnvIO(gym.make("CartPole-v1"), CPU)  # type: ignore[arg-type]


# -- storage -----------------------------------------------------------------------------------


def test_fruit_features_cost_at_most_32_bytes_per_step() -> None:
    """float16 obs x 10 (20 B) + uint8 action (1) + float32 logp (4) + float32 reward (4)
    + valid, cut and bootstrap flags (1 + 1 + 1) = 32 bytes per stored env-step."""
    buffer = _trainer(_fruit(4), rollout_steps=8, window=4).buffer
    assert buffer.obs.dtype == torch.float16 and buffer.obs.shape[2:] == (10,)
    assert buffer.actions.dtype == torch.uint8
    assert buffer.bytes_per_step == 10 * 2 + 1 + 4 + 4 + 1 + 1 + 1 <= 32
    assert buffer.rows == 8 + 3 and buffer.trained_rows == 8 and buffer.lookahead_rows == 3


def test_storage_dtype_follows_the_observation_space() -> None:
    pixels = _fruit(1, obs_mode="pixels").single_observation_space
    features = _fruit(1).single_observation_space
    cartpole = _cartpole(1).single_observation_space  # infinite bounds
    assert storage_dtype(pixels, "auto") == torch.uint8
    assert storage_dtype(features, "auto") == torch.float16
    assert storage_dtype(cartpole, "auto") == torch.float32
    assert storage_dtype(features, "bfloat16") == torch.bfloat16


# -- windowed rollouts -------------------------------------------------------------------------


def _collect(trainer: GRPOTrainer) -> Any:
    return trainer.rollout.collect(trainer.sample, trainer.generator)


def test_look_ahead_rows_carry_over_to_the_next_rollout() -> None:
    trainer = _trainer(_fruit(8, **SHORT), rollout_steps=6, window=4)
    _collect(trainer)
    tail = {k: t[6:].clone() for k, t in trainer.buffer.tensors.items()}
    _collect(trainer)
    for name, t in trainer.buffer.tensors.items():
        assert torch.equal(t[:3], tail[name]), name


def test_valid_steps_end_with_a_cut_and_resume_only_at_restart_points() -> None:
    every = 4  # without branch_ended, a member that ended waits for its whole group
    trainer = _trainer(
        _fruit(8, **SHORT), rollout_steps=40, window=1, restart_every=every, branch_ended=False
    )
    for _ in range(3):
        _collect(trainer)
        valid, cut = trainer.buffer.valid, trainer.buffer.cut
        stopped = valid[:-1] & ~valid[1:]  # valid at t, not at t + 1
        assert torch.equal(stopped & cut[:-1], stopped)  # only an episode end stops a member
        started = ~valid[:-1] & valid[1:]
        rows = started.any(1).nonzero().flatten() + 1  # rows where some member starts again
        steps_done = trainer.rollout.restarts.steps - 40
        assert all((steps_done + int(r)) % every == 0 for r in rows)
        # Members of a group are alive together: restarts are group-synchronous.
        grouped = valid.unflatten(1, (-1, 2))
        assert torch.equal(
            started.unflatten(1, (-1, 2)).any(2), started.unflatten(1, (-1, 2)).all(2)
        )
        assert grouped.shape[-1] == 2


@pytest.mark.parametrize(("branch_every", "branch_ended"), [(0, False), (5, False), (0, True)])
def test_group_members_are_identical_after_every_restart_and_branch(
    branch_every: int, branch_ended: bool
) -> None:
    size, every = 4, 3
    env = Watched(_fruit(12, **SHORT))
    trainer = _trainer(
        env,
        group_size=size,
        rollout_steps=30,
        window=2,
        restart_every=every,
        branch_every=branch_every,
        branch_ended=branch_ended,
    )
    moves = 0
    for _ in range(3):
        before = env.steps
        _collect(trainer)
        for steps, source, state in [r for r in env.restores if r[0] > before]:
            moved = source != torch.arange(12)
            moves += int(moved.any())
            for b in moved.nonzero().flatten().tolist():
                for field in state:
                    assert torch.equal(field[b], field[int(source[b])]), field
                # Every member of b's group that moves follows one source.
                group = slice(b // size * size, b // size * size + size)
                assert (source[group][moved[group]] == source[b]).all()
            row = trainer.buffer.lookahead_rows + steps - before  # the row stored after the restore
            if row < trainer.buffer.rows:
                expected = FruitCatcher(env.unwrapped.params).features(state.board).half()
                assert torch.equal(trainer.buffer.obs[row], expected)
    assert moves >= 3, "the scenario restarts (and branches) groups several times"


def test_a_member_that_ended_plays_on_from_a_member_still_playing() -> None:
    """branch_ended: at every check a member whose episode ended, in a group where another
    still plays, takes that one's state (the same state, so the same next observation) and
    is valid from the next row on; a member waits only when its whole group has ended."""
    size, every = 4, 2
    env = Watched(_fruit(16, **SHORT))
    trainer = _trainer(env, group_size=size, rollout_steps=40, window=1, restart_every=every)
    assert trainer.config.branch_ended  # the default
    _collect(trainer)
    valid = trainer.buffer.valid.unflatten(1, (-1, size))  # (rows, groups, members)
    checks = range(every - 1, trainer.buffer.rows - 1, every)  # rows after which it checks
    took_over = 0
    for row in checks:
        playing_group = valid[row].any(-1, keepdim=True).expand_as(valid[row])
        waiting = (
            playing_group & ~valid[row] & trainer.buffer.cut[: row + 1].any(0).view_as(valid[row])
        )
        took_over += int(waiting.sum())
        # Every member of a group that still played is valid at the next row.
        assert valid[row + 1][playing_group].all()
    assert took_over > 0, "SHORT games end at varied steps: some members end before others"
    for _steps, source, state in env.restores:
        moved = source != torch.arange(16)
        for b in moved.nonzero().flatten().tolist():
            for field in state:
                assert torch.equal(field[b], field[int(source[b])]), field


def test_episodes_are_counted_once_from_their_start() -> None:
    """A member that took over another's state plays on from the middle of that episode: its
    end is not a new episode, so every counted episode was played from its start."""
    from grpo_trainer.envs.episodes import EpisodeRunner

    io = EnvIO(_fruit(2, max_episode_steps=5), CPU)
    runner = EpisodeRunner(io)
    io.reset_groups([0, 1], 1)
    runner.begin_episodes()
    stay = torch.ones(2, dtype=torch.long)
    runner.step(stay)
    runner.branch_from(torch.tensor([0, 0]), torch.zeros(2, dtype=torch.bool))
    for _ in range(4):
        runner.step(stay)
    sums = runner.stats.sums()
    assert int(sums["episodes"]) == 1 and float(sums["length_sum"]) == 5.0


def test_a_branch_cuts_the_rows_before_it() -> None:
    env = Watched(_fruit(8))  # 200-step games: no episode ends in this test
    trainer = _trainer(
        env, group_size=4, rollout_steps=24, window=1, restart_every=4, branch_every=8
    )
    _collect(trainer)
    cut_rows = trainer.buffer.cut.any(1).nonzero().flatten().tolist()
    assert cut_rows == [8 - 1, 16 - 1, 24 - 1]  # every 8 steps, the last row before the jump
    assert trainer.buffer.cut[cut_rows].all()  # the whole group: every member's window stops


def _async_cartpole(num_envs: int) -> gym.vector.VectorEnv:
    """Sub-envs in other processes (spawned: forking a process that runs JAX can deadlock)."""
    return gym.make_vec(
        "CartPole-v1", num_envs, vectorization_mode="async", vector_kwargs={"context": "spawn"}
    )


def _uncopyable(num_envs: int) -> gym.vector.VectorEnv:
    """Seeded restarts without snapshots: its sub-envs cannot be copied."""
    return gym.vector.SyncVectorEnv([LockedEnv] * num_envs)


@pytest.mark.parametrize("make", [_uncopyable, _unadapted], ids=["seeded", "restarts itself"])
def test_branching_needs_state_snapshots(make: Any) -> None:
    """Refused, not ignored, also where the env restarts its sub-envs itself."""
    refused = pytest.raises(ValueError, match="branch_every: branching needs state snapshots")
    with refused, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "cannot be copied" / "list of seeds"
        _trainer(make(2), branch_every=4)


def test_group_restarts_give_identical_starts_on_a_sync_vector_env() -> None:
    """Gymnasium's SyncVectorEnv: members of a restarted group start alike (copies of the
    group's first member, through CopiedStateVectorEnv)."""
    envs = gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync")
    trainer = _trainer(
        envs, group_size=4, rollout_steps=64, window=1, restart_every=1, branch_ended=False
    )
    with torch.inference_mode():
        _collect(trainer)
    valid, obs = trainer.buffer.valid, trainer.buffer.obs
    started = ~valid[:-1] & valid[1:]
    restarts = started.nonzero().tolist()
    assert restarts, "CartPole episodes end within 64 steps under a random policy"
    for row, b in restarts:
        first = b // 4 * 4
        assert torch.equal(obs[row + 1, b], obs[row + 1, first])


def test_independent_restarts_skip_the_next_step_reset_step() -> None:
    """CartPoleVectorEnv autoresets on its own (NEXT_STEP): the step after an end is its
    reset step, whose action is ignored; it is not a valid sample."""
    with pytest.warns(RuntimeWarning):
        trainer = _trainer(_unadapted(4), rollout_steps=80, window=1)
    _collect(trainer)
    valid, cut = trainer.buffer.valid, trainer.buffer.cut
    ends = cut.nonzero().tolist()
    assert ends
    for row, b in ends:
        if row + 2 < trainer.buffer.rows:
            assert not valid[row + 1, b] and valid[row + 2, b]


def test_an_env_that_never_restarts_is_refused_for_windowed_rollouts() -> None:
    envs = _unadapted(4)
    envs.metadata = {**envs.metadata, "autoreset_mode": gym.vector.AutoresetMode.DISABLED}
    with pytest.raises(ValueError, match="rollout='episodes'"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(envs)


# -- episodes mode -----------------------------------------------------------------------------


def _replay(
    seeds: list[int], actions: torch.Tensor, **env_kwargs: object
) -> tuple[torch.Tensor, torch.Tensor]:
    envs = _fruit(actions.shape[1], **env_kwargs)
    envs.reset(seed=seeds)
    rewards, dones = [], []
    for a in actions:
        _, reward, terminated, truncated, _ = envs.step(a.long())
        rewards.append(reward.float())
        dones.append(terminated | truncated)
    return torch.stack(rewards), torch.stack(dones)


def test_episodes_mode_masks_steps_after_each_members_end() -> None:
    """Valid steps, cuts and rewards match a replay of the recorded actions."""
    kwargs = {"win_score": 2, "lose_score": -2}
    trainer = _trainer(_fruit(16, **kwargs), rollout="episodes", group_size=4, max_episode_steps=48)
    metrics = trainer.update()
    buffer = trainer.buffer
    seeds = [s for s in trainer.rollout.seeds(0) for _ in range(4)]
    raw_reward, raw_done = _replay(seeds, buffer.actions, **kwargs)
    steps = torch.arange(48)[:, None]
    first_done = torch.where(raw_done, steps, 48).min(0).values
    lengths = torch.clamp(first_done + 1, max=48)
    assert torch.equal(buffer.valid, steps < lengths[None, :])
    assert torch.equal(buffer.rewards, torch.where(buffer.valid, raw_reward, 0.0))
    assert torch.equal(buffer.cut.any(0), first_done < 48)
    assert metrics["episodes"] == float((first_done < 48).sum())
    assert len(set(lengths.tolist())) > 1 and bool((raw_reward[~buffer.valid] != 0).any())


def test_episodes_mode_shortens_the_horizon_when_every_episode_ends_early() -> None:
    trainer = _trainer(_fruit(4, max_episode_steps=20), rollout="episodes", max_episode_steps=100)
    first = trainer.update()
    assert first["horizon"] == 100 and first["episodes"] == 4 and first["length_max"] == 20
    assert trainer.rollout.horizon == 48  # ceil16(1.25 * 20 + 8)
    assert trainer.update()["horizon"] == 48


def test_episodes_mode_needs_an_episode_limit() -> None:
    from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

    envs = CartPoleVectorEnv(num_envs=4)
    envs.max_episode_steps = None  # as an env without a limit declares
    with pytest.raises(ValueError, match="max_episode_steps"):
        _trainer(envs, rollout="episodes")
