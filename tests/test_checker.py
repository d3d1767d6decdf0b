"""`grpo_trainer.tools.checker.check_vector_env` and `python -m grpo_trainer check`.

FruitCatcher passes in every autoreset and observation mode; Gymnasium's own vector envs
pass with the warnings they earn (and skip the sub-env state check: they offer no snapshots);
EnvPool and gymnax fail what they break. Each small fake env below breaks one rule, and
exactly that check fails (or warns), with evidence.
"""

from __future__ import annotations

import copy
import json
import random
import re
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from fruit_env import cli as fruit_env_cli
from grpo_trainer.tools import cli
from grpo_trainer.tools.checker import CHECKS, Check, CheckReport, check_vector_env

SHORT = {"max_episode_steps": 24}  # episodes end within the search for an end
ALL_PASS = dict.fromkeys(CHECKS, "pass")


def fruit(n: int, mode: str, **kwargs: Any) -> VectorEnv:
    return gym.make_vec("FruitCatcher-v0", num_envs=n, autoreset_mode=mode, **SHORT, **kwargs)


# -- FruitCatcher ------------------------------------------------------------------------------


@pytest.mark.parametrize("obs_mode", ["features", "pixels"])
@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP", "DISABLED"])
def test_fruit_catcher_passes_in_every_mode(mode: str, obs_mode: str) -> None:
    env = fruit(4, mode, obs_mode=obs_mode)
    report = check_vector_env(env, steps=16, make_env=lambda n: fruit(n, mode, obs_mode=obs_mode))
    assert report.ok, str(report)
    # the CPU default validates actions immediately: one flag read per step, free on the CPU
    assert report.statuses() == {**ALL_PASS, "host_syncs": "warn"}, str(report)
    assert mode in report["autoreset"].evidence
    assert "ValueError" in report["invalid_actions"].evidence
    assert episode_ends(report) >= 1  # copies restarted alike after an episode end


def episode_ends(report: CheckReport) -> int:
    """How many episode ends the snapshot check saw in its window (from its evidence)."""
    found = re.search(r"\((\d+) episode ends among them\)", report["state_snapshots"].evidence)
    assert found, report["state_snapshots"].evidence
    return int(found[1])


@pytest.mark.parametrize("num_envs", [2, 5])
def test_fruit_catcher_snapshots_pass_with_default_rules(num_envs: int) -> None:
    env = gym.make_vec("FruitCatcher-v0", num_envs=num_envs)  # 200-step episodes
    report = check_vector_env(env, checks=("state_snapshots",))
    assert report.statuses() == {"state_snapshots": "pass"}, str(report)
    assert episode_ends(report) >= 1
    assert "played 64 steps as their sources did" in report["state_snapshots"].evidence


def test_one_sub_env_skips_the_snapshot_check() -> None:
    report = check_vector_env(fruit(1, "NEXT_STEP"), steps=8, checks=("state_snapshots",))
    assert report.statuses() == {"state_snapshots": "skip"}
    assert "num_envs=1" in report["state_snapshots"].evidence


def test_fruit_catcher_is_sync_free_with_its_fast_kwargs_even_when_strict() -> None:
    kwargs = {"validate_actions": False, "obs_mode": "features"}
    env = fruit(4, "SAME_STEP", **kwargs)
    report = check_vector_env(env, steps=8, strict_syncs=True, checks=("host_syncs",))
    assert report.statuses() == {"host_syncs": "pass"}
    strict = check_vector_env(fruit(4, "SAME_STEP"), steps=8, strict_syncs=True)
    assert strict.statuses()["host_syncs"] == "fail" and not strict.ok
    assert "_local_scalar_dense" in strict["host_syncs"].evidence


def test_without_make_env_invariance_is_skipped_and_defaults_hold() -> None:
    report = check_vector_env(gym.make_vec("FruitCatcher-v0", num_envs=3, **SHORT))
    assert report.ok
    assert report["num_envs_invariance"].status == "skip"
    assert "make_env" in report["num_envs_invariance"].evidence


def test_the_checker_keeps_global_rng_states_and_leaves_the_env_open() -> None:
    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    expected = (torch.rand(1), np.random.rand(), random.random())
    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    env = FakeEnv(3)
    check_vector_env(env, steps=4)
    assert (torch.rand(1), np.random.rand(), random.random()) == expected
    assert not env.closed
    env.step(torch.ones(3, dtype=torch.int64))  # reset and usable


def test_report_table_and_dict() -> None:
    report = CheckReport("X", [Check("spaces", "pass", "fine"), Check("autoreset", "fail", "bad")])
    assert not report.ok and report.failed == [Check("autoreset", "fail", "bad")]
    text = str(report)
    assert "X: FAILED" in text and "autoreset" in text and "bad" in text
    assert json.loads(json.dumps(report.to_dict()))["checks"][1] == {
        "name": "autoreset",
        "status": "fail",
        "evidence": "bad",
    }
    with pytest.raises(ValueError, match="status"):
        Check("spaces", "maybe")
    with pytest.raises(ValueError, match="unknown checks"):
        check_vector_env(FakeEnv(2), checks=("nope",))


# -- Gymnasium's own vector envs -----------------------------------------------------------------


def test_gymnasium_cartpole_vector_env() -> None:
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="vector_entry_point")
    report = check_vector_env(env)
    assert report.ok
    assert report.statuses() == {
        **ALL_PASS,
        "determinism": "warn",  # reset takes one int seed, not a list
        "num_envs_invariance": "skip",
        "state_snapshots": "skip",  # no sub-env state protocol
        "host_syncs": "skip",  # numpy
        "invalid_actions": "warn",  # an assert
    }
    assert "Seed must be a python integer" in report["determinism"].evidence
    assert report["state_snapshots"].evidence == (
        "no sub-env state protocol: snapshot_state and restore_state missing"
    )
    assert "AssertionError" in report["invalid_actions"].evidence


def test_gymnasium_sync_vector_env() -> None:
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    report = check_vector_env(env)
    assert report.ok
    assert report.statuses() == {
        **ALL_PASS,
        "num_envs_invariance": "skip",
        "state_snapshots": "skip",
        "host_syncs": "skip",
        "invalid_actions": "warn",
    }


def test_envpool_fails_what_it_breaks() -> None:
    envpool = pytest.importorskip("envpool")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = envpool.make_gymnasium("CartPole-v1", num_envs=4, seed=0)
        report = check_vector_env(env)
    assert {c.name for c in report.failed} == {"spaces", "info_masks", "determinism"}
    assert "observation_space (4,)" in report["spaces"].evidence  # not batched
    assert "info['env_id'] has no mask" in report["info_masks"].evidence
    assert "reset(seed=list) twice" in report["determinism"].evidence  # seeds ignored
    assert report["invalid_actions"].status == "warn"
    assert "accepted silently" in report["invalid_actions"].evidence


def test_gymnax_fails_what_it_breaks() -> None:
    pytest.importorskip("gymnax")
    import gymnax
    from gymnasium.wrappers.vector import JaxToTorch
    from gymnax.wrappers.gym import GymnaxToVectorGymWrapper

    env, params = gymnax.make("CartPole-v1")
    vector = GymnaxToVectorGymWrapper(env, num_envs=4, params=params, seed=0)
    vector.metadata = {**vector.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}
    report = check_vector_env(JaxToTorch(vector, device="cpu"))
    assert {c.name for c in report.failed} == {"autoreset", "info_masks"}
    assert "final_observation" in report["autoreset"].evidence  # the old key name
    assert "has no mask" in report["info_masks"].evidence
    assert report["determinism"].status == "warn"  # one seed for all sub-envs
    assert report["host_syncs"].status == "pass"


# -- fake envs, each breaking one rule -------------------------------------------------------


class FakeEnv(VectorEnv):
    """A conforming torch vector env: obs (x, t/10) in [0, 1], actions 0..2; an episode lasts
    3 to 8 steps. State lives in numpy (one generator per sub-env, so sub-env i plays the same
    game for the same seed whatever num_envs is); outputs are torch tensors."""

    def __init__(self, num_envs: int, autoreset_mode: str = "NEXT_STEP") -> None:
        mode = AutoresetMode[autoreset_mode]
        self.metadata = {"autoreset_mode": mode, "num_envs_invariant": True}
        self.num_envs = num_envs
        self.single_observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.single_action_space = gym.spaces.Discrete(3)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.closed = False
        self._rngs = [np.random.default_rng(i) for i in range(num_envs)]
        self._x = np.zeros(num_envs)
        self._t = np.zeros(num_envs, dtype=np.int64)
        self._limit = np.zeros(num_envs, dtype=np.int64)
        self._pending = np.zeros(num_envs, dtype=bool)

    def seeds(self, seed: Any) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, int):
            return [seed + i for i in range(self.num_envs)]
        return list(seed)

    def _restart(self, i: int) -> None:
        rng = self._rngs[i]
        self._x[i], self._t[i], self._limit[i] = rng.random(), 0, rng.integers(3, 9)

    def _obs(self) -> torch.Tensor:
        return torch.from_numpy(np.stack([self._x, self._t / 10], 1).astype(np.float32))

    def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[Any, dict]:
        mask = (options or {}).get("reset_mask")
        mask = np.ones(self.num_envs, bool) if mask is None else np.asarray(mask)
        for i, s in enumerate(self.seeds(seed)):
            if s is not None:
                self._rngs[i] = np.random.default_rng(s)
            if mask[i]:
                self._restart(i)
                self._pending[i] = False
        return self._obs(), {}

    def check_actions(self, actions: np.ndarray) -> None:
        if actions.shape != (self.num_envs,):
            raise ValueError(f"actions must have shape ({self.num_envs},)")
        if ((actions < 0) | (actions > 2)).any():
            raise ValueError("actions must be 0, 1 or 2")

    def move(self, i: int, action: int) -> None:
        self._x[i] = np.clip(self._x[i] + 0.1 * (action - 1) + 0.05 * self._rngs[i].random(), 0, 1)

    def step(self, actions: Any) -> tuple[Any, ...]:
        actions = np.asarray(actions.numpy() if isinstance(actions, torch.Tensor) else actions)
        self.check_actions(actions)
        n, mode = self.num_envs, self.metadata["autoreset_mode"]
        reward = np.zeros(n, np.float32)
        ended = np.zeros(n, bool)
        final = None
        for i in range(n):
            if mode == AutoresetMode.NEXT_STEP and self._pending[i]:
                self.restart_after_end(i, int(actions[i]))
                continue
            self.move(i, int(actions[i]))
            self._t[i] += 1
            reward[i] = float(actions[i] == 1)
            ended[i] = self._t[i] >= self._limit[i]
        self._pending = ended.copy()
        info: dict[str, Any] = {
            "t": torch.from_numpy(self._t.copy()),
            "_t": torch.ones(n, dtype=torch.bool),
        }
        if mode == AutoresetMode.SAME_STEP and ended.any():
            final = self._obs()
            for i in np.nonzero(ended)[0]:
                self._restart(i)
            info.update(self.final_info(final, ended))
        terminated = torch.from_numpy(ended)
        return (
            self._obs(),
            torch.from_numpy(reward),
            terminated,
            torch.zeros(n, dtype=torch.bool),
            info,
        )

    def restart_after_end(self, i: int, action: int) -> None:
        self._restart(i)

    # the sub-env state protocol (docs/env.md): numpy rows plus each generator's state

    def snapshot_state(self, index: Any) -> tuple[Any, ...]:
        rows = self.rows(index)
        fields = (self._x, self._t, self._limit, self._pending)
        return (*(field[rows] for field in fields), self.rng_states(rows))

    def restore_state(self, index: Any, snapshot: tuple[Any, ...]) -> None:
        rows = self.rows(index)
        *values, rng_states = snapshot
        for field, value in zip(
            (self._x, self._t, self._limit, self._pending), values, strict=True
        ):
            field[rows] = value
        self.set_rng_states(rows, rng_states)

    @staticmethod
    def rows(index: Any) -> np.ndarray:
        index = index.cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
        if index.ndim != 1 or index.dtype.kind not in "iu":
            raise ValueError(f"index must be 1-D integers, got {index.dtype} {index.shape}")
        return index.astype(np.int64)

    def rng_states(self, rows: np.ndarray) -> list[dict[str, Any]]:
        return [copy.deepcopy(self._rngs[m].bit_generator.state) for m in rows]

    def set_rng_states(self, rows: np.ndarray, states: list[dict[str, Any]]) -> None:
        for m, state in zip(rows, states, strict=True):  # one generator per sub-env, never shared
            self._rngs[m] = np.random.default_rng()
            self._rngs[m].bit_generator.state = copy.deepcopy(state)

    def final_info(self, final: torch.Tensor, ended: np.ndarray) -> dict[str, Any]:
        return {"final_obs": final, "_final_obs": torch.from_numpy(ended)}

    def close_extras(self, **kwargs: Any) -> None:
        self.closed = True


class WrongDtype(FakeEnv):
    def _obs(self) -> torch.Tensor:
        return super()._obs().double()


class WrongShape(FakeEnv):
    def _obs(self) -> torch.Tensor:
        return torch.cat([super()._obs(), torch.zeros(self.num_envs, 1)], 1)


class IntReward(FakeEnv):
    """Rewards as int64 tensors (a rule that forgot its dtype)."""

    def step(self, actions: Any) -> tuple[Any, ...]:
        obs, reward, *rest = super().step(actions)
        return (obs, reward.to(torch.int64), *rest)


class DoubleReward(FakeEnv):
    """Rewards as float64 tensors: a torch env gives float32."""

    def step(self, actions: Any) -> tuple[Any, ...]:
        obs, reward, *rest = super().step(actions)
        return (obs, reward.double(), *rest)


class NumpyIntReward(FakeEnv):
    """Rewards as a numpy int64 array."""

    def step(self, actions: Any) -> tuple[Any, ...]:
        obs, reward, *rest = super().step(actions)
        return (obs, reward.numpy().astype(np.int64), *rest)


class NoFinalObs(FakeEnv):
    def final_info(self, final: torch.Tensor, ended: np.ndarray) -> dict[str, Any]:
        return {}


class ActionAfterEnd(FakeEnv):
    """NEXT_STEP, but the reset step also applies the action."""

    def restart_after_end(self, i: int, action: int) -> None:
        self._restart(i)
        self.move(i, action)


class IgnoresResetMask(FakeEnv):
    """DISABLED, but `reset(options={"reset_mask": m})` restarts every sub-env (claims no
    num_envs invariance: with whole resets at other sizes' episode ends it has none; and
    offers no snapshots: a neighbour's episode end would restart a copy early)."""

    snapshot_state = restore_state = None  # type: ignore[assignment]

    def __init__(self, num_envs: int, autoreset_mode: str = "NEXT_STEP") -> None:
        super().__init__(num_envs, autoreset_mode)
        self.metadata = {**self.metadata, "num_envs_invariant": False}

    def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[Any, dict]:
        return super().reset(seed=seed)


class MissingMask(FakeEnv):
    def step(self, actions: Any) -> tuple[Any, ...]:
        *out, info = super().step(actions)
        del info["_t"]
        return (*out, info)


class IgnoresSeeds(FakeEnv):
    """Draws from a fresh generator whatever the seed: not reproducible; claims nothing."""

    def __init__(self, num_envs: int, autoreset_mode: str = "NEXT_STEP") -> None:
        super().__init__(num_envs, autoreset_mode)
        self.metadata = {**self.metadata, "num_envs_invariant": False}

    def seeds(self, seed: Any) -> list[int | None]:
        return [int(np.random.SeedSequence().entropy % 2**32) for _ in range(self.num_envs)]


class SizeDependent(FakeEnv):
    """Claims invariance, but sub-env i's game depends on num_envs."""

    def seeds(self, seed: Any) -> list[int | None]:
        return [None if s is None else s + 1000 * self.num_envs for s in super().seeds(seed)]


class OutOfBounds(FakeEnv):
    """Observations outside the declared [0, 1] box."""

    def _obs(self) -> torch.Tensor:
        return super()._obs() + 2.0


class RewardShape(FakeEnv):
    def step(self, actions: Any) -> tuple[Any, ...]:
        obs, reward, *rest = super().step(actions)
        return (obs, reward[:, None], *rest)


class IntTerminated(FakeEnv):
    def step(self, actions: Any) -> tuple[Any, ...]:
        obs, reward, terminated, *rest = super().step(actions)
        return (obs, reward, terminated.long(), *rest)


class WrongFinalMask(FakeEnv):
    """SAME_STEP with `_final_obs` set for every sub-env, not only the ended ones."""

    def final_info(self, final: torch.Tensor, ended: np.ndarray) -> dict[str, Any]:
        return {"final_obs": final, "_final_obs": torch.ones(self.num_envs, dtype=torch.bool)}


class MixedDevices(FakeEnv):
    """An info tensor on another device than the rest (meta stands in for a GPU here)."""

    def step(self, actions: Any) -> tuple[Any, ...]:
        *out, info = super().step(actions)
        info["t"] = info["t"].to("meta")
        return (*out, info)


class SyncsPerStep(FakeEnv):
    def step(self, actions: Any) -> tuple[Any, ...]:
        if isinstance(actions, torch.Tensor):
            actions.max().item()  # a host read: a sync on a GPU
        return super().step(actions)


class ClampsActions(FakeEnv):
    def check_actions(self, actions: np.ndarray) -> None:
        if actions.shape != (self.num_envs,):
            raise ValueError(f"actions must have shape ({self.num_envs},)")
        np.clip(actions, 0, 2, out=actions)


class ForgetsRandomness(FakeEnv):
    """Snapshots without the generators' states: a copy draws from its target's generator."""

    def rng_states(self, rows: np.ndarray) -> list[dict[str, Any]]:
        return []

    def set_rng_states(self, rows: np.ndarray, states: list[dict[str, Any]]) -> None:
        pass


class RestoresIntoNeighbour(FakeEnv):
    """`restore_state` writes each row into sub-env `index[j] + 1` too (an off-by-one slice),
    then into `index[j]`: the restored sub-envs are right, a neighbour is overwritten."""

    def restore_state(self, index: Any, snapshot: tuple[Any, ...]) -> None:
        super().restore_state((self.rows(index) + 1) % self.num_envs, snapshot)
        super().restore_state(index, snapshot)


class ReversedRows(FakeEnv):
    """`restore_state` puts row `j` into sub-env `index[-1 - j]`."""

    def restore_state(self, index: Any, snapshot: tuple[Any, ...]) -> None:
        super().restore_state(self.rows(index)[::-1], snapshot)


class HalfProtocol(FakeEnv):
    """Offers `snapshot_state` but no callable `restore_state`: not the protocol."""

    restore_state = None  # type: ignore[assignment]


class NumpyOutputs(FakeEnv):
    """The same game with numpy outputs, as Gymnasium's numpy vector envs give them."""

    def step(self, actions: Any) -> tuple[Any, ...]:
        *out, info = super().step(actions)
        return (*(x.numpy() for x in out), {k: np.asarray(v) for k, v in info.items()})

    def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[Any, dict]:
        obs, info = super().reset(seed=seed, options=options)
        return obs.numpy(), info


class NumpyForgetsRandomness(NumpyOutputs, ForgetsRandomness):
    pass


SWAP = (  # the first episode end is at step 2 (sub-env 2), so the snapshot is before step 1
    "sub-envs 2 and 0 swapped before step 1 by snapshot_state(torch.tensor([2, 0])) and "
    "restore_state(np.array([0, 2]))"
)
# sub-env 0 plays sub-env 2's game but draws from its own generator: the first step differs
FORGOTTEN = f"{SWAP}, each on the other's actions, neighbours on others; copy vs source: step 1: "
FORGOTTEN += "obs sub-env 0: [0.4031,0.2 ] vs [0.4069,0.2 ]"
OVERWRITTEN = f"{SWAP} changed a neighbour; with vs without the restore: step 1: obs sub-env 1: "
REVERSED = f"{SWAP}, each on the other's actions, neighbours on others (sub-envs 2 and 0 played "
REVERSED += "on their own games, as if restore_state reversed the rows or did nothing); copy vs "
REVERSED += "source: step 1: obs sub-env 0: "


def check(cls: type[FakeEnv], mode: str = "NEXT_STEP", **kwargs: Any) -> CheckReport:
    return check_vector_env(cls(4, mode), steps=12, make_env=lambda n: cls(n, mode), **kwargs)


@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP", "DISABLED"])
def test_the_conforming_fake_passes(mode: str) -> None:
    report = check(FakeEnv, mode)
    assert report.statuses() == ALL_PASS, str(report)


@pytest.mark.parametrize(
    ("cls", "mode", "name", "evidence"),
    [
        (WrongDtype, "NEXT_STEP", "spaces", "reset: obs dtype float64, observation_space float32"),
        (WrongShape, "NEXT_STEP", "spaces", "reset: obs shape (4, 3), observation_space (4, 2)"),
        (NoFinalObs, "SAME_STEP", "autoreset", "info lacks ['final_obs', '_final_obs']"),
        (ActionAfterEnd, "NEXT_STEP", "autoreset", "the step after the end"),
        (IgnoresResetMask, "DISABLED", "autoreset", "changed unmasked sub-env"),
        (MissingMask, "NEXT_STEP", "info_masks", "step 0: info['t'] has no mask info['_t']"),
        (IgnoresSeeds, "NEXT_STEP", "determinism", "reset(seed=list) twice, same actions: reset:"),
        (SizeDependent, "NEXT_STEP", "num_envs_invariance", "num_envs=4 vs 2"),
        (OutOfBounds, "NEXT_STEP", "spaces", "outside single_observation_space"),
        (RewardShape, "NEXT_STEP", "spaces", "step 0: reward shape (4, 1), expected (4,)"),
        (IntTerminated, "NEXT_STEP", "spaces", "step 0: terminated dtype int64, expected bool"),
        (IntReward, "NEXT_STEP", "spaces", "step 0: reward dtype torch.int64, expected"),
        (DoubleReward, "NEXT_STEP", "spaces", "reward dtype torch.float64, expected torch.float32"),
        (NumpyIntReward, "NEXT_STEP", "spaces", "reward dtype int64, expected float32 or float64"),
        (WrongFinalMask, "SAME_STEP", "autoreset", "info['_final_obs'] is"),
        (MixedDevices, "NEXT_STEP", "spaces", "torch outputs on ['cpu', 'meta']"),
        (ForgetsRandomness, "NEXT_STEP", "state_snapshots", FORGOTTEN),
        (ForgetsRandomness, "SAME_STEP", "state_snapshots", FORGOTTEN),
        (ForgetsRandomness, "DISABLED", "state_snapshots", FORGOTTEN),
        (RestoresIntoNeighbour, "NEXT_STEP", "state_snapshots", OVERWRITTEN),
        (ReversedRows, "SAME_STEP", "state_snapshots", REVERSED),
    ],
)
def test_a_broken_rule_fails_exactly_its_check(
    cls: type[FakeEnv], mode: str, name: str, evidence: str
) -> None:
    report = check(cls, mode)
    failed = [c.name for c in report.failed]
    assert failed == [name], str(report)
    assert evidence in report[name].evidence, report[name].evidence
    assert not report.ok


def test_action_dependent_reset_step_names_the_sub_env_and_actions() -> None:
    evidence = check(ActionAfterEnd)["autoreset"].evidence
    assert "depends on the action: sub-env" in evidence and "with action" in evidence


def test_a_host_read_per_step_warns_on_cpu_and_fails_when_strict() -> None:
    report = check(SyncsPerStep)
    assert report.ok and report.statuses() == {**ALL_PASS, "host_syncs": "warn"}
    assert "1 host syncs per step on cpu" in report["host_syncs"].evidence
    strict = check(SyncsPerStep, strict_syncs=True)
    assert [c.name for c in strict.failed] == ["host_syncs"]


def test_half_the_snapshot_protocol_is_not_the_protocol() -> None:
    report = check(HalfProtocol)
    assert report.ok and report.statuses() == {**ALL_PASS, "state_snapshots": "skip"}
    assert report["state_snapshots"].evidence == "no sub-env state protocol: restore_state missing"


@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP", "DISABLED"])
def test_snapshots_of_a_numpy_env(mode: str) -> None:
    """numpy outputs, snapshots of numpy rows and dicts, indices as tensors or arrays."""
    report = check(NumpyOutputs, mode)
    assert report.statuses() == {**ALL_PASS, "host_syncs": "skip"}, str(report)
    assert episode_ends(report) == 5  # sub-envs 2 and 0 both restart inside the window
    broken = check(NumpyForgetsRandomness, mode)
    assert [c.name for c in broken.failed] == ["state_snapshots"], str(broken)
    assert FORGOTTEN in broken["state_snapshots"].evidence


def test_a_game_that_does_not_replay_skips_the_snapshot_check() -> None:
    evidence = check(IgnoresSeeds)["state_snapshots"]
    assert evidence.status == "skip"
    assert evidence.evidence.startswith(
        "the game does not replay under reset(seed=0) (see determinism), so copies cannot be "
        "compared: reset: obs sub-env 0: "
    )


def test_silently_clamped_actions_warn() -> None:
    report = check(ClampsActions)
    assert report.ok and report.statuses() == {**ALL_PASS, "invalid_actions": "warn"}
    assert "action 3 (Discrete(3)): accepted silently" in report["invalid_actions"].evidence


# -- the CLI ---------------------------------------------------------------------------------


def grpo(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`python -m grpo_trainer ARGV`: the exit status, stdout and stderr."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # usage errors leave through argparse
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_check_passes_with_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    """The env is built as `train` builds it: with its fast options (Fruit Catcher: no
    per-step action check, so no host sync, and invalid actions clamped silently)."""
    argv = ["check", "FruitCatcher-v0", "--num-envs", "3", "--steps", "8", "--device", "cpu"]
    code, out, _ = grpo([*argv, "--env-kwargs", json.dumps(SHORT)], capsys)
    assert code == 0, out
    assert "FruitCatcher-v0 (FruitCatcherVectorEnv): ok" in out
    assert "num_envs_invariance  pass" in out  # the CLI passes make_env
    assert "host_syncs           pass" in out and "invalid_actions      warn" in out


def test_cli_check_failure_exits_1_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["check", "FruitCatcher-v0", "--num-envs", "2", "--steps", "4", "--strict-syncs"]
    kwargs = {**SHORT, "validate_actions": True}  # the user's env_kwargs win over fast options
    code, out, _ = grpo([*argv, "--env-kwargs", json.dumps(kwargs), "--json"], capsys)
    assert code == 1
    report = json.loads(out)
    assert report["ok"] is False
    assert {c["name"]: c["status"] for c in report["checks"]}["host_syncs"] == "fail"


def test_cli_check_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = grpo(["check", "NoSuchEnv-v0"], capsys)
    assert code == 2 and "NoSuchEnv" in err
    code, _, err = grpo(["check", "FruitCatcher-v0", "--env-kwargs", '{"width": "wide"}'], capsys)
    assert code == 2 and "cannot make 'FruitCatcher-v0'" in err
    code, _, err = grpo(["check", "FruitCatcher-v0", "--env-kwargs", "[1]"], capsys)
    assert code == 2 and "expected a JSON object" in err
    code, _, err = grpo(["check", "FruitCatcher-v0", "--num-envs", "0"], capsys)
    assert code == 2 and "argument --num-envs: must be at least 1" in err


def test_cli_check_builds_the_trainers_ids(capsys: pytest.CaptureFixture[str]) -> None:
    """`gymnax:CartPole-v1` is the trainer's gymnax env (`GymnaxVectorEnv`), not Gymnasium's
    CartPole that make_vec would build after importing gymnax."""
    pytest.importorskip("gymnax")
    argv = ["check", "gymnax:CartPole-v1", "--num-envs", "3", "--steps", "8", "--device", "cpu"]
    code, out, _ = grpo([*argv, "--json"], capsys)
    report = json.loads(out)
    assert "GymnaxVectorEnv" in report["env"], report["env"]
    assert code == (0 if report["ok"] else 1)


def test_fruit_env_check_names_the_new_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert fruit_env_cli.main(["check", "FruitCatcher-v0", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "python -m grpo_trainer check ENV_ID" in err
