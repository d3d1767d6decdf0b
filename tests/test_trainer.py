"""`GRPOTrainer` end to end on CPU: updates, learning, AMP, compile, fused optimizer, accel."""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import gymnasium as gym
import pytest
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig, TrainingStopped
from grpo_trainer.algorithm.policy import GaussianHead
from grpo_trainer.base import accel
from grpo_trainer.base.accel import Compiled, make_optimizer, resolve_device, should_compile
from grpo_trainer.base.metrics import spec
from grpo_trainer.base.schedules import lr_factor
from grpo_trainer.envs import make_envs

# What every update reports (the registry in grpo_trainer/base/metrics.py declares each).
UPDATE_FIELDS = {
    "update",
    "env_steps",
    "valid_steps",
    "steps_per_s",
    "rollout_s",
    "update_s",
    "train_s",
    "lr",
    "episodes",
    "length_max",
    "frac_zero_std_groups",
    "loss",
    "policy_loss",
    "kl",
    "entropy",
    "clip_fraction",
    "approx_kl_old",
    "mean_bound",
    "grad_norm",
    "skipped_steps",
    "mem_rss_mib",
    "mem_peak_rss_mib",
}
EPISODE_FIELDS = {"return_mean", "return_std", "return_min", "return_max", "length_mean"}


def _fruit_trainer(
    num_groups: int = 4, group_size: int = 4, env_kwargs: dict[str, Any] | None = None, **kw: Any
) -> GRPOTrainer:
    run_kw = {k: kw.pop(k) for k in list(kw) if k in RunConfig.__dataclass_fields__}
    run = RunConfig(**{"progress": False, "device": "cpu", **run_kw})
    kw.setdefault("rollout_steps", 16)
    kw.setdefault("window", 8)
    kw.setdefault("minibatch_size", 128)
    kw.setdefault("hidden_sizes", (16,))
    cfg = GRPOConfig(num_groups=num_groups, group_size=group_size, run=run, **kw)
    envs = make_envs(cfg, cfg.num_envs, torch.device("cpu"), **(env_kwargs or {}))
    return GRPOTrainer(envs, cfg)


def _params(trainer: GRPOTrainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.policy.parameters()]


def _changed(before: list[torch.Tensor], trainer: GRPOTrainer) -> bool:
    return any(
        not torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters(), strict=True)
    )


# -- construction ------------------------------------------------------------------------------


def test_env_and_config_sizes_must_agree() -> None:
    """num_envs != num_groups * group_size raises ValueError with both numbers."""
    envs = gym.make_vec("FruitCatcher-v0", num_envs=6)
    cfg = GRPOConfig(num_groups=2, group_size=2, run=RunConfig(progress=False, device="cpu"))
    with pytest.raises(ValueError, match=r"6 sub-envs.*2 x 2 = 4"):
        GRPOTrainer(envs, cfg)


def test_env_without_a_limit_trains_windowed_but_needs_one_for_episodes() -> None:
    """Windowed rollouts need no episode limit; whole-episode rollouts do."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    envs = gym.vector.SyncVectorEnv([CartPoleEnv] * 4)  # no TimeLimit, no spec
    run = RunConfig(progress=False, device="cpu")
    with pytest.raises(ValueError, match="max_episode_steps"):
        GRPOTrainer(envs, GRPOConfig(num_groups=2, group_size=2, rollout="episodes", run=run))
    trainer = GRPOTrainer(envs, GRPOConfig(num_groups=2, group_size=2, rollout_steps=8, run=run))
    assert trainer.update()["env_steps"] == 4 * 8


def test_a_field_this_version_lacks_is_refused_by_name() -> None:
    """A config.json with a field this version does not have (an earlier version's
    `minibatches`, a misspelt run field) is refused, naming each, not silently dropped."""
    old = {**GRPOConfig().to_dict(), "minibatches": 8}
    with pytest.raises(ValueError, match=r"unknown GRPOConfig field\(s\): minibatches$"):
        GRPOConfig.from_dict(old)
    typo = GRPOConfig().to_dict()
    typo["run"] = {**typo["run"], "sed": 1}
    with pytest.raises(ValueError, match=r"unknown RunConfig field\(s\): sed$"):
        GRPOConfig.from_dict(typo)


def test_bad_device_raises_naming_it() -> None:
    """A device name torch does not know is a ValueError naming the device."""
    with pytest.raises(ValueError, match="device 'bogus'"):
        _fruit_trainer(device="bogus")


# -- one update --------------------------------------------------------------------------------


def test_update_reports_every_documented_metric() -> None:
    """update() returns finite host floats for every documented field and counts env steps."""
    trainer = _fruit_trainer()
    before = _params(trainer)
    m = trainer.update()
    assert set(m) >= UPDATE_FIELDS, UPDATE_FIELDS - set(m)
    assert all(isinstance(v, float | int) and math.isfinite(v) for v in m.values()), m
    for name in m:  # every reported metric is declared once, with its reduction and help
        spec(name, trainer.env.episode_ratios)
    assert m["update"] == 1 and trainer.update_index == 1
    # 16 sub-envs x 16 steps were simulated; the trained rows of a first update are the
    # look-ahead's empty rows plus 16 - 7 = 9 new ones.
    assert m["env_steps"] == trainer.env_steps == 16 * 16
    assert m["valid_steps"] == 16 * (16 - 7)
    assert m["lr"] == trainer.config.lr  # linear schedule at progress 0
    assert 0.0 <= m["clip_fraction"] <= 1.0 and 0.0 <= m["frac_zero_std_groups"] <= 1.0
    assert m["kl"] == 0.0 and m["skipped_steps"] == 0.0
    assert 0.0 < m["entropy"] <= math.log(3) + 1e-6
    # 200-step games: none ended, so there is no episode figure (a 0 would read as "caught
    # nothing") and no internal column.
    assert m["episodes"] == 0.0
    assert not (EPISODE_FIELDS | {"catch_rate"}) & set(m)
    assert not [k for k in m if k.startswith(("episode_", "_"))]
    assert _changed(before, trainer)


def test_episode_figures_and_the_catch_rate_appear_when_episodes_end() -> None:
    """Games of 30 steps: updates report their episodes, the env's info fields and the
    catch rate it declares, caught / (caught + missed)."""
    trainer = _fruit_trainer(env_kwargs={"max_episode_steps": 30}, rollout_steps=40)
    m = trainer.update()
    assert m["episodes"] > 0 and set(m) >= EPISODE_FIELDS | {"catch_rate", "episode_caught"}
    assert m["episode_l"] == m["length_mean"] == 30.0
    assert m["episode_caught"] - m["episode_missed"] == pytest.approx(m["return_mean"])
    expected = m["episode_caught"] / (m["episode_caught"] + m["episode_missed"])
    assert m["catch_rate"] == pytest.approx(expected)
    assert m["return_min"] <= m["return_mean"] <= m["return_max"]


def test_gradient_steps_grow_with_the_batch() -> None:
    """Minibatches are sized in samples: 4x the sub-envs, 4x the optimiser steps."""
    steps = []
    for groups in (2, 8):
        trainer = _fruit_trainer(num_groups=groups, epochs=3, minibatch_size=64)
        trainer.update()
        state = trainer.optimizer.state[next(trainer.policy.parameters())]
        steps.append(int(state["step"]))
    # Trained rows per update: 16; samples 2*4*16 = 128 -> 2 minibatches; 512 -> 8.
    assert steps == [3 * 2, 3 * 8]


def test_a_batch_within_one_trust_region_trains_as_with_one_anchor() -> None:
    """`anchor_samples` at least the batch (4 x 4 sub-envs x 16 rows = 256 samples) changes
    nothing: the update is bit-identical to one without re-anchoring."""
    a = _fruit_trainer(seed=5, anchor_samples=256)
    b = _fruit_trainer(seed=5, anchor_samples=None)
    for _ in range(2):
        assert a.update()["loss"] == b.update()["loss"]
    assert all(torch.equal(x, y) for x, y in zip(_params(a), _params(b), strict=True))


def test_each_trust_region_starts_from_its_own_anchor() -> None:
    """256 samples in regions of 64, one minibatch each: every gradient step is taken where
    its region was anchored (the ratio is 1, nothing is clipped), with as many steps as with
    one anchor for the batch, where the later steps see the policy moved away from it."""
    results = {}
    for anchor in (64, None):
        trainer = _fruit_trainer(seed=5, anchor_samples=anchor, epochs=1, minibatch_size=64)
        results[anchor] = trainer.update()
        assert int(trainer.optimizer.state[next(trainer.policy.parameters())]["step"]) == 4
    assert results[64]["clip_fraction"] == 0.0
    assert results[64]["approx_kl_old"] < 1e-9  # 0 up to rounding
    assert results[None]["approx_kl_old"] > 1e-6


def test_micro_batches_accumulate_the_same_gradient() -> None:
    """Gradient accumulation over 2 micro-batches gives (numerically) the same update as 1:
    every sample's loss is divided by the same normaliser, so the gradients sum exactly."""
    a = _fruit_trainer(micro_batches=1, fused_optimizer=False)
    b = _fruit_trainer(micro_batches=2, fused_optimizer=False)
    ma, mb = a.update(), b.update()
    for x, y in zip(a.policy.parameters(), b.policy.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    assert ma["loss"] == pytest.approx(mb["loss"], rel=1e-4, abs=1e-6)


def test_same_seed_same_run() -> None:
    """Two trainers with the same seed produce bit-identical parameters (CPU)."""
    a, b = _fruit_trainer(seed=3), _fruit_trainer(seed=3)
    for _ in range(2):
        a.update()
        b.update()
    assert all(
        torch.equal(x, y) for x, y in zip(a.policy.parameters(), b.policy.parameters(), strict=True)
    )
    c = _fruit_trainer(seed=4)
    c.update()
    c.update()
    assert not all(
        torch.equal(x, y) for x, y in zip(a.policy.parameters(), c.policy.parameters(), strict=True)
    )


def test_kl_reference_is_frozen_and_kl_grows_from_zero() -> None:
    """kl_coef > 0: a frozen reference copy; KL is positive once the policy has moved."""
    trainer = _fruit_trainer(kl_coef=0.5, lr=1e-2)
    ref = trainer.reference
    assert ref is not None
    assert all(not p.requires_grad for p in ref.parameters())
    initial = [p.detach().clone() for p in ref.parameters()]
    m = trainer.update()
    m2 = trainer.update()
    assert m["kl"] >= 0.0 and m2["kl"] > 0.0
    assert all(torch.equal(a, b) for a, b in zip(initial, ref.parameters(), strict=True))


def test_lr_schedules() -> None:
    """lr_factor: linear and cosine decay (floored at 0.02), constant; from the first update
    on (no warm-up), and the budget's end holds past it."""
    assert lr_factor(0.0, "linear") == 1.0
    assert lr_factor(0.25, "linear") == pytest.approx(0.75)
    assert lr_factor(1.0, "linear") == pytest.approx(0.02)  # floor
    assert lr_factor(1.3, "linear") == pytest.approx(0.02)  # the last update may overshoot
    # cos(pi/2) = 0 -> 0.5 * (1 + 0) = 0.5 at the half-way point.
    assert lr_factor(0.5, "cosine") == pytest.approx(0.5)
    assert lr_factor(0.0, "cosine") == 1.0
    assert lr_factor(0.7, "constant") == 1.0


def test_a_time_budget_sets_the_learning_rate_by_the_seconds_spent() -> None:
    """With `time_budget_s`, the schedule follows whichever budget is further along: a run
    that has spent half its seconds but few of its env steps trains at half its rate."""
    trainer = _fruit_trainer(total_env_steps=10**6, time_budget_s=100.0, lr=1e-3)
    trainer.train_s = 50.0  # as a checkpoint restores it
    assert trainer.update()["lr"] == pytest.approx(0.5e-3)
    untimed = _fruit_trainer(total_env_steps=10**6, lr=1e-3)
    untimed.train_s = 50.0
    assert untimed.update()["lr"] == 1e-3  # its first update: no env step spent yet


def test_a_time_budget_ends_training_after_the_update_that_spends_it() -> None:
    """No update starts once `time_budget_s` seconds of training are spent: a budget any
    update outlasts trains exactly one, far short of the env steps."""
    trainer = _fruit_trainer(total_env_steps=10**6, time_budget_s=1e-9)
    metrics = trainer.train()
    assert trainer.update_index == 1 and metrics["update"] == 1
    assert trainer.env_steps == 16 * 16 and trainer.train_s > 1e-9
    assert trainer.stop_reason == "the time budget (1e-09 s of training) is spent"
    assert trainer.stop_signal is None
    unbounded = _fruit_trainer(total_env_steps=512, time_budget_s=1e6)
    unbounded.train()
    assert unbounded.env_steps == 512 and unbounded.stop_reason is None  # its env steps


def test_a_resumed_run_goes_on_counting_its_seconds(tmp_path: Any) -> None:
    """A checkpoint keeps `train_s`: resumed with the time budget it spent, a run trains no
    further update; given more seconds, it trains on from its own count."""
    spent = _fruit_trainer(total_env_steps=10**6, time_budget_s=1e-9, run_dir=str(tmp_path))
    spent.train()
    seconds = spent.train_s
    again = _fruit_trainer(total_env_steps=10**6, time_budget_s=1e-9, resume=str(tmp_path))
    again.train()
    assert again.update_index == 1 and again.train_s == seconds
    assert again.stop_reason == "the time budget (1e-09 s of training) is spent"
    more = _fruit_trainer(total_env_steps=512, time_budget_s=1e6, resume=str(tmp_path))
    more.train()
    assert more.env_steps == 512 and more.train_s > seconds and more.stop_reason is None


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, "10"])
def test_a_bad_time_budget_is_named(bad: Any) -> None:
    with pytest.raises(ValueError, match="time_budget_s"):
        GRPOConfig(time_budget_s=bad)


def test_box_actions_on_a_numpy_sync_env() -> None:
    """A Gymnasium numpy env with Box actions (Pendulum, SyncVectorEnv) trains a step."""
    envs = gym.make_vec("Pendulum-v1", num_envs=8, vectorization_mode="sync")
    run = RunConfig(progress=False, device="cpu")
    cfg = GRPOConfig(
        num_groups=2, group_size=4, rollout_steps=16, window=4, hidden_sizes=(16,), run=run
    )
    trainer = GRPOTrainer(envs, cfg)
    log_std = trainer.policy.head.log_std.detach().clone()  # type: ignore[union-attr]
    m = trainer.update()
    assert math.isfinite(m["loss"]) and m["valid_steps"] == 8 * (16 - 3)
    # Pendulum rewards are continuous: members' returns differ, nothing is dropped.
    assert m["frac_zero_std_groups"] == 0.0
    assert not torch.equal(log_std, trainer.policy.head.log_std)  # type: ignore[union-attr]
    envs.close()


def _pendulum_trainer(mean_bound_coef: float) -> tuple[Any, GRPOTrainer]:
    """Pendulum (actions in [-2, 2]) on a small, fast-moving config for the bound tests."""
    envs = gym.make_vec("Pendulum-v1", num_envs=8, vectorization_mode="sync")
    run = RunConfig(progress=False, device="cpu", seed=0)
    shape = {"num_groups": 2, "group_size": 4, "rollout_steps": 16, "window": 4}
    cfg = GRPOConfig(**shape, hidden_sizes=(16,), lr=0.03, mean_bound_coef=mean_bound_coef, run=run)
    return envs, GRPOTrainer(envs, cfg)


def test_a_gaussian_mean_past_the_bounds_is_pulled_back_by_the_bound_penalty() -> None:
    """Pendulum's action bound is 2; a mean of 8 is clipped to 2 for every member, so every
    group step has no spread and weight 0. The bound penalty counts on those rows (the CPU
    keeps them in its passes) and pulls the mean back within a few updates, after which the
    groups spread again. Without it (mean_bound_coef 0) nothing moves the policy at all."""
    results = {}
    for coef in (1.0, 0.0):
        envs, trainer = _pendulum_trainer(mean_bound_coef=coef)
        assert trainer.drop_flat_rows
        with torch.no_grad():
            trainer.policy.body[-1].bias.fill_(8.0)
        before = _params(trainer)
        results[coef] = [trainer.update() for _ in range(3)]
        assert _changed(before, trainer) == (coef > 0)
        envs.close()
    pulled, stuck = results[1.0], results[0.0]
    assert pulled[0]["frac_zero_std_groups"] == 1.0 and pulled[0]["mean_bound"] > 1.0
    # A tenth of the first update's penalty from the next update on: the mean is back at the
    # bound, where it hovers (0.02-0.05 here on an Intel VM, below 0.01 on an AMD one).
    assert max(m["mean_bound"] for m in pulled[1:]) < pulled[0]["mean_bound"] / 10
    assert pulled[-1]["frac_zero_std_groups"] < 0.5
    assert all(m["skipped_steps"] == 0 for m in pulled)
    assert [m["frac_zero_std_groups"] for m in stuck] == [1.0] * 3


def test_a_gaussian_std_wider_than_half_the_range_is_pulled_back_by_the_bound_penalty() -> None:
    """Pendulum's actions lie in [-2, 2]; a log-std of 4 (a std of 55) makes almost every
    action a clipped push. The bound penalty pulls the log-std back to log 2, the half-range,
    within three updates, where the entropy bonus and the surrogate hold it just above; without
    it (mean_bound_coef 0) the std stays that wide."""
    stds = {}
    for coef in (1.0, 0.0):
        envs, trainer = _pendulum_trainer(mean_bound_coef=coef)
        head = trainer.policy.head
        assert isinstance(head, GaussianHead)
        with torch.no_grad():
            head.log_std.fill_(4.0)
        metrics = []
        stds[coef] = []
        for _ in range(3):
            metrics.append(trainer.update())
            stds[coef].append(float(head.log_std))
        envs.close()
        if coef:
            # (4 - log 2)^2 = 10.9 at the first step; the update's mean falls as it pulls.
            assert metrics[0]["mean_bound"] > 1.0
            assert metrics[-1]["mean_bound"] < metrics[0]["mean_bound"] / 10
    assert stds[1.0][0] < 4.0 and stds[1.0] == sorted(stds[1.0], reverse=True)
    assert abs(stds[1.0][-1] - math.log(2.0)) < 0.05
    assert min(stds[0.0]) > 3.9


def test_train_runs_to_the_step_budget() -> None:
    """train() updates until total_env_steps valid steps and returns the last metrics."""
    trainer = _fruit_trainer(total_env_steps=600)  # 16 envs x 16 steps = 256 per update
    m = trainer.train()
    # ceil(600 / 256) = 3 updates.
    assert trainer.update_index == 3 and m["update"] == 3
    assert trainer.env_steps == 3 * 256 >= 600
    assert m["warmup_s"] > 0.0


def test_non_finite_gradients_skip_steps_then_stop() -> None:
    """A nan in the weights makes every gradient non-finite: steps are skipped (weights kept)
    and after max_consecutive_skips updates train() raises TrainingStopped."""
    for fused in (True, False):
        trainer = _fruit_trainer(
            total_env_steps=10**6, max_consecutive_skips=2, fused_optimizer=fused
        )
        with torch.no_grad():
            trainer.policy.body[-1].bias[0] = math.nan
        before = _params(trainer)
        with pytest.raises(TrainingStopped, match="2 updates in a row"):
            trainer.train()
        assert trainer.update_index == 2
        after = list(trainer.policy.parameters())
        for a, b in zip(before, after, strict=True):
            assert torch.equal(a, b) or torch.equal(a.isnan(), b.isnan()), "a step was applied"
        # Only the planted nan is non-finite: nothing was updated.
        assert all(
            torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in zip(before, after, strict=True)
        )


# -- speed features on CPU ---------------------------------------------------------------------


def test_amp_fp16_on_cpu_is_refused() -> None:
    """fp16 autocast needs CUDA: on CPU the trainer raises ValueError naming amp."""
    with pytest.raises(ValueError, match="amp='fp16'"):
        _fruit_trainer(amp="fp16")


def test_amp_bf16_on_cpu_trains() -> None:
    """bf16 autocast on CPU: finite losses, weights move, stored logps are float32."""
    trainer = _fruit_trainer(amp="bf16", lr=1e-2)
    before = _params(trainer)
    for _ in range(2):
        m = trainer.update()
        for name in ("loss", "policy_loss", "entropy", "grad_norm", "approx_kl_old"):
            assert math.isfinite(m[name]), (name, m[name])
        assert m["skipped_steps"] == 0.0
    assert trainer.buffer.logp.dtype == torch.float32
    assert _changed(before, trainer)
    assert all(p.dtype == torch.float32 for p in trainer.policy.parameters())


def test_fused_and_foreach_optimizers_agree() -> None:
    """fused_optimizer True/False both run on CPU and make (numerically) the same update."""
    fused = _fruit_trainer(fused_optimizer=True)
    foreach = _fruit_trainer(fused_optimizer=False)
    # fused AdamW on the CPU: torch >= 2.4
    assert fused.optimizer_step.fused is True and fused.optimizer.defaults["fused"] is True
    assert foreach.optimizer_step.fused is False and foreach.optimizer.defaults["foreach"] is True
    fused.update()
    foreach.update()
    for a, b in zip(fused.policy.parameters(), foreach.policy.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_make_optimizer_reports_what_it_built() -> None:
    """make_optimizer returns AdamW, without weight decay (AdamW's own default is 0.01), and
    whether it is the fused kernel."""
    params = [torch.nn.Parameter(torch.zeros(3))]
    opt, fused = make_optimizer(params, 1e-3, fused=False)
    assert isinstance(opt, torch.optim.AdamW) and fused is False
    assert opt.defaults["weight_decay"] == 0.0
    opt, fused = make_optimizer(params, 1e-3, fused=True)
    assert fused is True and opt.defaults["fused"] is True
    assert opt.defaults["weight_decay"] == 0.0


def test_make_optimizer_falls_back_to_foreach(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where fused AdamW is unavailable (it raises), make_optimizer builds the foreach one."""
    real = torch.optim.AdamW

    def adamw(params: Any, **kwargs: Any) -> torch.optim.AdamW:
        if kwargs.get("fused"):
            raise RuntimeError("fused=True requires all the params to be on a supported device")
        return real(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", adamw)
    opt, fused = make_optimizer([torch.nn.Parameter(torch.zeros(3))], 1e-3, fused=True)
    assert fused is False and opt.defaults["foreach"] is True


def test_compiled_falls_back_to_eager_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """When the compiled function raises, Compiled logs a warning and runs eagerly from then on."""
    calls = {"compiled": 0, "eager": 0}

    def broken_compile(fn: Any, *args: Any, **kwargs: Any) -> Any:
        def compiled(*a: Any, **k: Any) -> Any:
            calls["compiled"] += 1
            raise RuntimeError("inductor exploded")

        return compiled

    def eager(x: int) -> int:
        calls["eager"] += 1
        return x * 2

    monkeypatch.setattr(torch, "compile", broken_compile)
    wrapped = Compiled(eager, True, "doubling")
    with caplog.at_level(logging.WARNING, logger="grpo_trainer.base.accel"):
        assert wrapped(21) == 42
    assert "doubling" in caplog.text and "inductor exploded" in caplog.text
    assert wrapped.compiled is False
    assert wrapped(5) == 10
    assert calls == {"compiled": 1, "eager": 2}  # the broken path is not tried again


def test_compiled_disabled_never_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """enabled=False calls the function directly and never touches torch.compile."""

    def no_compile(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("torch.compile must not be called")

    monkeypatch.setattr(torch, "compile", no_compile)
    assert Compiled(lambda x: x + 1, False, "inc")(1) == 2


def test_trainer_survives_a_failing_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    """compile=True with a compiler that fails: the trainer still updates, eagerly."""

    def broken_compile(fn: Any, *args: Any, **kwargs: Any) -> Any:
        def compiled(*a: Any, **k: Any) -> Any:
            raise RuntimeError("no compiler here")

        return compiled

    monkeypatch.setattr(torch, "compile", broken_compile)
    trainer = _fruit_trainer(compile=True)
    assert trainer.sample.compiled and trainer.loss.compiled
    m = trainer.update()
    assert math.isfinite(m["loss"])
    assert not trainer.sample.compiled and not trainer.loss.compiled


@pytest.mark.parametrize(
    ("asked", "used"), [("reduce-overhead", None), ("max-autotune", "max-autotune")]
)
def test_compile_mode_on_the_cpu(
    asked: str, used: str | None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """CUDA graphs need CUDA: on the CPU 'reduce-overhead' compiles in the default mode (torch's
    mode=None) with a log line saying so; the other modes reach torch.compile as asked."""
    modes = []

    def recording_compile(fn: Any, mode: str | None = None, **kwargs: Any) -> Any:
        modes.append(mode)
        return fn

    monkeypatch.setattr(torch, "compile", recording_compile)
    with caplog.at_level(logging.INFO, logger="grpo_trainer"):
        trainer = _fruit_trainer(compile=True, compile_mode=asked)
    assert modes == [used, used]  # the sampling step and the loss
    fell_back = "(CUDA graphs) needs CUDA; using 'default'" in caplog.text
    assert fell_back == (asked == "reduce-overhead")
    assert math.isfinite(trainer.update()["loss"])


def test_should_compile_on_large_cpu_minibatches_only() -> None:
    """compile=None means: on the CPU from CPU_COMPILE_MIN_SAMPLES samples per minibatch,
    never on CUDA (measured: the compile is not won back there); True/False are obeyed."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    big = accel.CPU_COMPILE_MIN_SAMPLES
    assert should_compile(None, cpu, big - 1) is False
    assert should_compile(None, cpu, big) is True
    assert should_compile(None, cuda, 1) is False
    assert should_compile(None, cuda, big) is False
    assert should_compile(True, cpu, 1) is True
    assert should_compile(False, cuda, big) is False
    assert should_compile(True, cuda, 1) is True


def test_amp_is_off_by_default_and_modes_are_checked() -> None:
    assert RunConfig().amp == "off"
    assert accel.resolve_amp("bf16", torch.device("cpu")) == "bf16"
    with pytest.raises(ValueError, match="fp16"):
        accel.resolve_amp("fp16", torch.device("cpu"))


def test_resolve_device() -> None:
    """'auto' picks CUDA when present, 'cpu' is cpu, 'meta' is the test device; unknown or
    missing devices raise."""
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="'tpu'"):
        resolve_device("tpu")
    assert resolve_device("meta") == torch.device("meta")
    with pytest.raises(ValueError, match="only 'auto', 'cpu' and 'cuda"):
        resolve_device("mps")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
    else:
        with pytest.raises(ValueError, match="GPU"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")


def test_autocast_off_is_a_no_op() -> None:
    """accel.autocast('off') leaves the default dtype; 'bf16' on CPU computes in bfloat16."""
    x = torch.ones(2, 2)
    with accel.autocast("off", torch.device("cpu")):
        assert (x @ x).dtype == torch.float32
    with accel.autocast("bf16", torch.device("cpu")):
        assert (x @ x).dtype == torch.bfloat16


@pytest.mark.slow
def test_compile_on_cpu_matches_eager() -> None:
    """RunConfig(compile=True) on CPU compiles sampling and loss and matches the eager run."""
    kw: dict[str, Any] = {
        "num_groups": 2,
        "group_size": 2,
        "hidden_sizes": (8,),
        "epochs": 1,
        "minibatch_size": 1024,
        "fused_optimizer": False,
    }
    compiled = _fruit_trainer(compile=True, **kw)
    eager = _fruit_trainer(compile=False, **kw)
    mc, me = compiled.update(), eager.update()
    assert compiled.sample.compiled and compiled.loss.compiled  # no fallback happened
    for name in ("valid_steps", "loss", "entropy", "clip_fraction"):
        assert mc[name] == pytest.approx(me[name], rel=1e-4, abs=1e-5), name
    for a, b in zip(compiled.policy.parameters(), eager.policy.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


# -- learning ----------------------------------------------------------------------------------


def _run_updates(trainer: GRPOTrainer) -> list[dict[str, float]]:
    history = []
    while trainer.env_steps < trainer.config.total_env_steps:
        history.append(trainer.update())
    return history


def _assert_improved(history: list[dict[str, float]], last: int = 3) -> None:
    """The mean return of the last updates' episodes beats the first's by 5 standard errors.

    Only updates in which episodes ended report returns; a return mean over n episodes has
    standard error return_std / sqrt(n), and the estimates are independent.
    """
    reported = [m for m in history if "return_mean" in m]
    first, tail = reported[0], reported[-last:]
    tail_mean = sum(m["return_mean"] for m in tail) / last
    se_first = first["return_std"] / math.sqrt(first["episodes"])
    se_tail = math.sqrt(sum(m["return_std"] ** 2 / m["episodes"] for m in tail)) / last
    margin = 5 * math.hypot(se_first, se_tail)
    assert tail_mean - first["return_mean"] > margin, (first["return_mean"], tail_mean, margin)


@pytest.mark.slow
def test_training_improves_fruit_catcher() -> None:
    """32 groups x 8 on FruitCatcher (50-step games): the mean score rises clearly."""
    trainer = _fruit_trainer(
        num_groups=32,
        group_size=8,
        env_kwargs={"max_episode_steps": 50},
        hidden_sizes=(64, 64),
        rollout_steps=32,
        window=16,
        minibatch_size=1024,
        total_env_steps=200_000,
        epochs=4,
    )
    history = _run_updates(trainer)
    _assert_improved(history)


@pytest.mark.slow
def test_training_improves_cartpole() -> None:
    """8 groups x 8 on Gymnasium's CartPole (vector entry point): episodes get much longer."""
    envs = gym.make_vec("CartPole-v1", num_envs=64, vectorization_mode="vector_entry_point")
    run = RunConfig(progress=False, device="cpu", seed=0)
    cfg = GRPOConfig(
        num_groups=8,
        group_size=8,
        rollout_steps=32,
        window=32,
        gamma=0.99,
        minibatch_size=512,
        total_env_steps=40_000,
        epochs=4,
        run=run,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # CartPole's int-only seeding
        history = _run_updates(GRPOTrainer(envs, cfg))
    _assert_improved(history)
    # CartPole pays +1 per step, so the return is the episode length.
    reported = [m for m in history if "return_mean" in m]
    assert reported[-1]["return_mean"] == pytest.approx(reported[-1]["length_mean"])
    assert reported[-1]["return_mean"] > 2 * reported[0]["return_mean"]
