"""`check_vector_env`: a conformance checker for any Gymnasium vector env (torch, numpy or JAX
outputs), with a status and concrete evidence for each rule (`CHECKS`; docs/integrations.md).

    report = check_vector_env(gym.make_vec("CartPole-v1", num_envs=4))
    print(report)        # a table: check, status, evidence
    assert report.ok     # no check failed (warnings and skips do not fail)

It steps and finally resets the env, closes nothing it did not create, and restores the global
RNG states. It lives here because it checks what the trainer relies on, for any env.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from grpo_trainer.tools.syncs import SyncCounter

__all__ = ["CHECKS", "STATUSES", "Check", "CheckReport", "check_vector_env"]

STATUSES = ("pass", "warn", "fail", "skip")
CLEAR_ERRORS = (ValueError, TypeError, IndexError, KeyError, gym.error.Error)


@dataclasses.dataclass(frozen=True)
class Check:
    """One named check: `status` is "pass", "warn", "fail" or "skip"; `evidence` says why."""

    name: str
    status: str
    evidence: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


@dataclasses.dataclass
class CheckReport:
    """The checks run on one env. `ok`: no check failed (warnings and skips do not fail)."""

    env: str
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def __getitem__(self, name: str) -> Check:
        return {c.name: c for c in self.checks}[name]

    def statuses(self) -> dict[str, str]:
        """{check name: status}."""
        return {c.name: c.status for c in self.checks}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: env, ok, and every check as {name, status, evidence}."""
        return {
            "env": self.env,
            "ok": self.ok,
            "checks": [dataclasses.asdict(c) for c in self.checks],
        }

    def __str__(self) -> str:
        width = max(len("check"), *(len(c.name) for c in self.checks))
        lines = [
            f"{self.env}: {'ok' if self.ok else 'FAILED'}",
            f"{'check':<{width}}  status  evidence",
        ]
        lines += [f"{c.name:<{width}}  {c.status:<6}  {c.evidence}" for c in self.checks]
        return "\n".join(lines)


class Verdict(Exception):
    """Raised inside a check to end it with a status other than "pass", and its evidence."""

    def __init__(self, status: str, evidence: str) -> None:
        super().__init__(evidence)
        self.status, self.evidence = status, evidence


def check_vector_env(
    env: gym.vector.VectorEnv,
    *,
    seed: int = 0,
    steps: int = 64,
    max_steps: int = 1000,
    strict_syncs: bool = False,
    make_env: Callable[[int], gym.vector.VectorEnv] | None = None,
    checks: Sequence[str] | None = None,
) -> CheckReport:
    """Run `checks` on `env` and return the report (nothing is raised for a failed check).

    `steps`: steps per trajectory compared (determinism, invariance, snapshots, syncs, spaces).
    `max_steps`: how many random steps to play looking for an episode end (autoreset, snapshots).
    `strict_syncs`: host syncs on a CPU env fail instead of warn (on other devices they fail).
    `make_env(n)`: builds this env with `n` sub-envs, for the `num_envs_invariance` check.
    `checks`: the names of `CHECKS` to run (default: all), run in `CHECKS`' order.
    """
    unknown = set(checks or ()) - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; known: {list(CHECKS)}")
    player = EnvPlayer(env, seed=seed, steps=steps, max_steps=max_steps)
    player.strict_syncs, player.make_env = strict_syncs, make_env
    results = []
    with _rng_kept():
        for name in (n for n in CHECKS if checks is None or n in checks):
            try:
                status, evidence = "pass", CHECKS[name](player)
            except Verdict as verdict:
                status, evidence = verdict.status, verdict.evidence
            except Exception as err:  # the env crashed inside a check: that is evidence
                status, evidence = "fail", f"raised {_error(err)}"
            results.append(Check(name, status, evidence))
        with contextlib.suppress(Exception):  # leave the env reset; a broken reset is reported
            env.reset(seed=seed)
    return CheckReport(_env_name(env), results)


# -- playing the env -----------------------------------------------------------------------------

# One step's (obs, reward, terminated, truncated) as numpy; a reset's (obs,).
Outputs = tuple[Any, ...]


class EnvPlayer:
    """Plays `env` for the checks: seeded random actions of the env's own kind, in the dtype
    `step` takes, with ended sub-envs reset by mask where the env does not autoreset."""

    def __init__(self, env: Any, *, seed: int, steps: int, max_steps: int) -> None:
        self.env, self.seed, self.steps, self.max_steps = env, seed, steps, max_steps
        self.n = int(env.num_envs)
        self.single_action = getattr(env, "single_action_space", None) or env.action_space
        self.single_obs = getattr(env, "single_observation_space", None)
        self.mode = AutoresetMode(env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        self.action_dtype: Any = None  # a dtype that `step` accepts, when not the space's
        self.action_note = ""
        self.device: torch.device | None = None
        self.kind: str | None = None
        self.infos: list[tuple[str, dict[str, Any]]] = []  # (where, info), for info_masks
        self.strict_syncs = False  # host syncs on the CPU fail too (host_syncs)
        self.make_env: Callable[[int], Any] | None = None  # another size (num_envs_invariance)

    def sample(self, rng_seed: int, count: int, n: int | None = None) -> list[np.ndarray]:
        """`count` batches of actions for `n` sub-envs; sub-env i's column is the same for
        any `n` (so vector envs of different sizes get the same per-env actions)."""
        n = self.n if n is None else n
        space = copy.deepcopy(self.single_action)
        batches = []
        for t in range(count):
            space.seed(rng_seed * 1_000_003 + t)
            batches.append(np.stack([np.asarray(space.sample()) for _ in range(n)]))
        return batches

    def other_actions(self, actions: list[np.ndarray], seed: int) -> list[np.ndarray]:
        """Random actions that differ from `actions` entry by entry where the space allows."""
        space = copy.deepcopy(self.single_action)
        space.seed(seed)
        return [np.stack([_another(space, a) for a in batch]) for batch in actions]

    def convert(self, actions: np.ndarray) -> Any:
        if self.action_dtype is not None:
            actions = actions.astype(self.action_dtype)
        if self.kind == "torch":
            return torch.as_tensor(actions, device=self.device)
        return actions

    def reset(self, env: Any = None, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = (env or self.env).reset(**kwargs)
        if self.kind is None:
            first = obs if not isinstance(obs, Mapping) else next(iter(obs.values()))
            self.kind = _kind(first)
            self.device = first.device if self.kind == "torch" else None
        return obs, info

    def step(self, actions: np.ndarray, env: Any = None) -> tuple[Any, ...]:
        """`env.step`; an env that rejects the space's integer dtype gets the other width."""
        env = env or self.env
        try:
            return env.step(self.convert(actions))
        except Exception as err:
            if self.action_dtype is not None or actions.dtype.kind not in "iu":
                raise
            for dtype in (d for d in (np.int32, np.int64) if d != actions.dtype):
                try:
                    out = env.step(self.convert(actions.astype(dtype)))
                except Exception:
                    continue
                self.action_dtype = dtype
                self.action_note = (
                    f"step rejects actions of the action space's dtype {actions.dtype} "
                    f"({_error(err)}); it takes {np.dtype(dtype)}"
                )
                return out
            raise

    def play(self, actions: list[np.ndarray], env: Any = None) -> list[Outputs]:
        """Step through `actions`: each step's outputs as numpy."""
        out = []
        for a in actions:
            obs, reward, term, trunc, _ = self.step(a, env)
            out.append((_np(obs), _np(reward), _np(term), _np(trunc)))
            self.restart_ended(term, trunc, env)
        return out

    def trajectory(
        self, seed: Any, steps: int, env: Any = None, n: int | None = None
    ) -> list[Outputs]:
        """The reset's (obs,) and `steps` steps' outputs, from `reset(seed=seed)`."""
        obs, _ = self.reset(env, seed=seed)
        return [(_np(obs),), *self.play(self.sample(self.seed + 1, steps, n), env)]

    def restart_ended(self, term: Any, trunc: Any, env: Any = None) -> None:
        """DISABLED: reset the ended sub-envs, as a caller must before stepping them again."""
        if self.mode != AutoresetMode.DISABLED:
            return
        ended = _np(term) | _np(trunc)
        if ended.any():
            (env or self.env).reset(options={"reset_mask": self.mask(ended)})

    def mask(self, rows: np.ndarray) -> Any:
        """A bool mask of sub-envs in the env's kind (a tensor on its device, or numpy)."""
        return torch.as_tensor(rows, device=self.device) if self.kind == "torch" else rows

    def play_to_end(self) -> tuple[list[np.ndarray], int, tuple[Any, ...]]:
        """Random steps from `reset(seed)` until some episode ends: (actions, step index,
        that step's outputs); a skip if none ends in `max_steps`."""
        self.reset(seed=self.seed)
        actions = self.sample(self.seed + 2, self.max_steps)
        for t, a in enumerate(actions):
            out = self.step(a)
            if np.any(_np(out[2]) | _np(out[3])):
                return actions, t, out
        raise Verdict(
            "skip", f"no episode ended in {self.max_steps} random steps (pass a larger max_steps)"
        )


# -- spaces, dtypes and devices ------------------------------------------------------------------


def check_spaces(play: EnvPlayer) -> str:
    """`reset` and `step` outputs fit the spaces and the vector API, on one device."""
    env, problems = play.env, []
    if play.single_obs is None:
        problems.append("env has no single_observation_space")
    if getattr(env, "single_action_space", None) is None:
        problems.append("env has no single_action_space")
    obs, info = play.reset(seed=play.seed)
    play.infos.append(("reset", info))
    problems += _obs_problems(play, obs, "reset") + _device_problems((obs, info), "reset")
    for t, actions in enumerate(play.sample(play.seed + 3, play.steps)):
        obs, reward, term, trunc, info = play.step(actions)
        where = f"step {t}"
        play.infos.append((where, info))
        problems += _obs_problems(play, obs, where)
        problems += _output_problems(play.n, where, reward=reward, terminated=term, truncated=trunc)
        problems += _device_problems((obs, reward, term, trunc, info), where)
        if problems:
            break
        play.restart_ended(term, trunc)
    if play.action_note:
        problems.insert(0, play.action_note)
    if problems:
        raise Verdict("fail", "; ".join(problems[:3]))
    array = _np(obs)
    on = f" on {play.device}" if play.device is not None else ""
    return f"{play.steps} steps: {play.kind} obs {tuple(array.shape)} {array.dtype}{on}"


def _obs_problems(play: EnvPlayer, obs: Any, where: str) -> list[str]:
    space, array = play.env.observation_space, _np(obs)
    if isinstance(space, gym.spaces.Dict | gym.spaces.Tuple) or isinstance(array, dict):
        return [] if space.contains(array) else [f"{where}: obs not in observation_space"]
    shape, dtype = getattr(space, "shape", None), getattr(space, "dtype", None)
    if shape is not None and array.shape != tuple(shape):
        return [f"{where}: obs shape {array.shape}, observation_space {tuple(shape)}"]
    if dtype is not None and array.dtype != dtype:
        return [f"{where}: obs dtype {array.dtype}, observation_space {np.dtype(dtype)}"]
    for i in range(play.n if play.single_obs is not None else 0):
        if not play.single_obs.contains(array[i]):  # type: ignore[union-attr]
            return [
                f"{where}: sub-env {i} obs {_short(array[i])} outside "
                f"single_observation_space {play.single_obs}"
            ]
    return []


def _output_problems(n: int, where: str, **outputs: Any) -> list[str]:
    """Rewards are floats (torch: float32, else a rule forgot its dtype; numpy float64 is
    `SyncVectorEnv`'s), `terminated` and `truncated` bools, each of shape `(n,)`."""
    problems = []
    for name, value in outputs.items():
        array, flag = _np(value), name != "reward"
        if array.shape != (n,):
            problems.append(f"{where}: {name} shape {array.shape}, expected ({n},)")
        elif flag and array.dtype.kind != "b":
            problems.append(f"{where}: {name} dtype {array.dtype}, expected bool")
        elif not flag and isinstance(value, torch.Tensor) and value.dtype != torch.float32:
            problems.append(f"{where}: reward dtype {value.dtype}, expected torch.float32")
        elif not flag and array.dtype.kind != "f":
            problems.append(f"{where}: reward dtype {array.dtype}, expected float32 or float64")
    return problems


def _device_problems(tree: Any, where: str) -> list[str]:
    devices = {path: x.device for path, x in _leaves(tree) if isinstance(x, torch.Tensor)}
    if len(set(devices.values())) <= 1:
        return []
    first = next(iter(devices.values()))
    other = next(p for p, d in devices.items() if d != first)
    return [f"{where}: torch outputs on {sorted(map(str, set(devices.values())))} ({other})"]


# -- autoreset modes and reset_mask --------------------------------------------------------------


def check_autoreset(play: EnvPlayer) -> str:
    """The first episode end follows `metadata["autoreset_mode"]`."""
    actions, t, out = play.play_to_end()
    ended = _np(out[2]) | _np(out[3])
    where = f"step {t}, sub-envs {np.nonzero(ended)[0].tolist()}"
    if play.mode == AutoresetMode.SAME_STEP:
        return check_same_step(play, out, ended, where)
    if play.mode == AutoresetMode.DISABLED:
        return check_reset_mask(play, out, ended, where)
    return check_next_step(play, actions, t, out, ended, where)


def check_next_step(
    play: EnvPlayer,
    actions: list[np.ndarray],
    t: int,
    out: tuple[Any, ...],
    ended: np.ndarray,
    where: str,
) -> str:
    """NEXT_STEP: the step after an end is a reset step: reward 0, not done, and the action
    does not matter (the same game replayed with other actions there gives the same obs)."""
    after = play.step(actions[t + 1])
    reward, term, trunc = (_np(x) for x in after[1:4])
    wrong = np.nonzero(ended & ((reward != 0) | term | trunc))[0]
    if wrong.size:
        i = int(wrong[0])
        raise Verdict(
            "fail",
            f"NEXT_STEP: the step after the end ({where}) gave sub-env {i} reward "
            f"{reward[i]}, terminated {term[i]}, truncated {trunc[i]}; expected 0, False, False",
        )
    other = actions[t + 1].copy()  # other actions for the ended sub-envs on the reset step
    other[ended] = play.other_actions([other], play.seed + 4)[0][ended]
    play.reset(seed=play.seed)
    replay = [play.step(a) for a in actions[: t + 1]]
    if _first_difference(_np(replay[-1][0]), _np(out[0]), "obs"):
        raise Verdict(
            "skip",
            "NEXT_STEP: the game does not replay under reset(seed) (see determinism), so "
            "whether the step after an end ignores the action cannot be tested",
        )
    first, again = _np(after[0]), _np(play.step(other)[0])
    j = _first_row_that_differs(first, again, ended)
    if j is not None:
        raise Verdict(
            "fail",
            f"NEXT_STEP: the step after the end ({where}) depends on the action: "
            f"sub-env {j} obs {_short(first[j])} with action {_short(actions[t + 1][j])}, "
            f"{_short(again[j])} with {_short(other[j])}",
        )
    return f"NEXT_STEP: {where} ended; the next step ignored the action, reward 0, not done"


def check_same_step(play: EnvPlayer, out: tuple[Any, ...], ended: np.ndarray, where: str) -> str:
    """SAME_STEP: the ended sub-envs restart in the step that ends them; their last obs is in
    `info["final_obs"]`, masked by `info["_final_obs"]` = terminated | truncated."""
    info = out[4]
    missing = [k for k in ("final_obs", "_final_obs") if k not in info]
    if missing:
        raise Verdict(
            "fail", f"SAME_STEP: {where} ended but info lacks {missing} (info keys {sorted(info)})"
        )
    mask = _np(info["_final_obs"])
    if mask.dtype != np.bool_ or mask.shape != (play.n,) or not np.array_equal(mask, ended):
        raise Verdict(
            "fail",
            f"SAME_STEP: info['_final_obs'] is {_short(mask)}, expected "
            f"terminated | truncated = {_short(ended)}",
        )
    final, obs, same = info["final_obs"], _np(out[0]), []
    for j in np.nonzero(ended)[0]:
        last = np.asarray(_np(final[j]) if _kind(final) != "torch" else _np(final)[j])
        if play.single_obs is not None and not play.single_obs.contains(last):
            raise Verdict(
                "fail",
                f"SAME_STEP: final_obs of sub-env {j} {_short(last)} outside "
                "single_observation_space",
            )
        same.append(np.array_equal(last, obs[j]))
    if all(same):
        raise Verdict(
            "fail",
            f"SAME_STEP: at {where} the returned obs equal final_obs: "
            "the ended sub-envs were not reset in the same step",
        )
    return f"SAME_STEP: {where} ended; final_obs and _final_obs given, obs restarted"


def check_reset_mask(play: EnvPlayer, out: tuple[Any, ...], ended: np.ndarray, where: str) -> str:
    """DISABLED: `reset(options={"reset_mask": m})` restarts only the masked sub-envs."""
    before = _np(out[0])
    after = _np(play.reset(options={"reset_mask": play.mask(ended)})[0])
    j = _first_row_that_differs(before, after, ~ended)
    if j is not None:
        raise Verdict(
            "fail",
            f"DISABLED: reset(options={{'reset_mask': mask}}) at {where} changed unmasked "
            f"sub-env {j}: {_short(before[j])} -> {_short(after[j])}",
        )
    moved = play.step(play.sample(play.seed + 5, 1)[0])
    if np.any((_np(moved[2]) | _np(moved[3]))[ended]):
        raise Verdict("warn", "DISABLED: a masked sub-env ended again on the step after its reset")
    return f"DISABLED: {where} ended; reset_mask reset those and kept the others"


# -- info masks ----------------------------------------------------------------------------------


def check_info_masks(play: EnvPlayer) -> str:
    """Every per-env info entry `k`, at any depth, has its bool `(num_envs,)` mask `_k`."""
    if not play.infos:  # spaces did not run: gather some infos
        play.reset(seed=play.seed)
        for t, a in enumerate(play.sample(play.seed + 3, play.steps)):
            play.infos.append((f"step {t}", play.step(a)[4]))
    with contextlib.suppress(Verdict):
        _, t, out = play.play_to_end()
        play.infos.append((f"step {t} (an episode end)", out[4]))
    skip = {"final_obs", "final_info"} if play.mode == AutoresetMode.SAME_STEP else set()
    keys: set[str] = set()
    for where, info in play.infos:
        problem = _mask_problem(play.n, info, "info", covered=False, skip=skip, keys=keys)
        if problem:
            raise Verdict("fail", f"{where}: {problem}")
    if not keys:
        return f"{len(play.infos)} infos, no per-env entries"
    top = sorted({k.split("]")[0].removeprefix("info[") for k in keys})
    return (
        f"{len(play.infos)} infos; {len(keys)} per-env entries under {', '.join(top)}, all masked"
    )


def _mask_problem(
    n: int, info: Mapping[str, Any], path: str, *, covered: bool, skip: set[str], keys: set[str]
) -> str | None:
    """The first per-env entry of `info` without a bool `(n,)` mask (`covered`: a mask one
    level up stands for this one's); `keys` collects the entries seen."""
    for key, value in info.items():
        if not isinstance(key, str) or key.startswith("_") or key in skip:
            continue
        mask_key, is_dict = f"_{key}", isinstance(value, Mapping)
        if not is_dict and getattr(value, "shape", ())[:1] != (n,):
            continue
        keys.add(f"{path}[{key!r}]")
        if mask_key in info:
            mask = _np(info[mask_key])
            if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (n,):
                got = f"{mask.dtype} {mask.shape}" if hasattr(mask, "shape") else type(mask)
                return f"{path}[{mask_key!r}] must be a bool array of shape ({n},), got {got}"
        elif not covered:
            return f"{path}[{key!r}] has no mask {path}[{mask_key!r}]"
        if is_dict:
            inner = covered or mask_key in info
            problem = _mask_problem(
                n, value, f"{path}[{key!r}]", covered=inner, skip=set(), keys=keys
            )
            if problem:
                return problem
    return None


# -- seeding -------------------------------------------------------------------------------------


def check_determinism(play: EnvPlayer) -> str:
    """`reset(seed=list)` and `reset(seed=int)`, twice with the same actions, replay alike."""
    warning = ""
    seeds = [play.seed + 101 * (i + 1) for i in range(play.n)]
    try:
        first = play.trajectory(seeds, play.steps)
    except Exception as err:
        warning = f"reset(seed=[{play.n} ints]) raised {_error(err)}"
    else:
        diff = _difference(first, play.trajectory(seeds, play.steps))
        if diff:
            raise Verdict("fail", f"reset(seed=list) twice, same actions: {diff}")
    first = play.trajectory(play.seed, play.steps)
    diff = _difference(first, play.trajectory(play.seed, play.steps))
    if diff:
        raise Verdict("fail", f"reset(seed={play.seed}) twice, same actions: {diff}")
    if warning:
        raise Verdict("warn", f"{warning}; reset(seed={play.seed}) reproduces")
    return f"reset(seed=list) and reset(seed=int) replay {play.steps} steps exactly"


def check_num_envs_invariance(play: EnvPlayer) -> str:
    """With `metadata["num_envs_invariant"]`, sub-env i plays alike in an env of another size."""
    if not play.env.metadata.get("num_envs_invariant", False):
        raise Verdict("skip", "metadata['num_envs_invariant'] is not True")
    if play.make_env is None:
        raise Verdict("skip", "no make_env given to build a vector env of another size")
    n = play.n
    m = max(1, n // 2) if n > 1 else 2
    k = min(m, n)
    seeds = [play.seed + 13 * (i + 1) for i in range(max(n, m))]
    other = play.make_env(m)
    try:
        big = play.trajectory(seeds[:n], play.steps)
        small = play.trajectory(seeds[:m], play.steps, env=other, n=m)
    finally:
        other.close()
    diff = _difference(big, small, sub_envs=k)
    if diff:
        raise Verdict("fail", f"num_envs={n} vs {m}, same per-env seeds and actions: {diff}")
    return f"sub-envs 0..{k - 1} play the same {play.steps} steps with num_envs={n} and {m}"


# -- sub-env state snapshots ---------------------------------------------------------------------


class _SnapshotPlan(NamedTuple):
    """The snapshot check's set-up: sub-envs i and j, the step they swap at, and the actions:
    before it, the source's after it, and the swapped and rewound runs'."""

    i: int
    j: int
    start: int
    pre: list[np.ndarray]
    source: list[np.ndarray]
    swapped: list[np.ndarray]
    rewound: list[np.ndarray]


def check_state_snapshots(play: EnvPlayer) -> str:
    """The sub-env state protocol of docs/env.md, where offered: a copied game plays on exactly
    as its source would (the swap, rewind and comparisons: docs/integrations.md)."""
    names = ("snapshot_state", "restore_state")
    missing = [name for name in names if not callable(getattr(play.env, name, None))]
    if missing:
        raise Verdict("skip", f"no sub-env state protocol: {' and '.join(missing)} missing")
    if play.n < 2:
        raise Verdict("skip", "num_envs=1: no other sub-env to restore a snapshot into")
    plan = _snapshot_plan(play)
    runs = _snapshot_runs(play, plan)
    for got, other, rows, first, what in _snapshot_comparisons(play.n, plan, runs):
        want = [_with_rows(g, o, rows) for g, o in zip(got, other, strict=True)]
        diff = _difference(got, want, first)
        if diff:
            raise Verdict("fail", f"{what}: {diff}")
    i, j = plan.i, plan.j
    ended = [np.asarray(s[2], bool) | np.asarray(s[3], bool) for s in runs[0]]
    ends = sum(int(np.count_nonzero(e[[i, j]])) for e in ended)
    return (
        f"sub-envs {i} and {j} swapped by snapshots before step {plan.start} played "
        f"{play.steps} steps as their sources did ({ends} episode ends among them), neighbours "
        f"on other actions and unchanged; sub-env {i} rewound to its own snapshot replayed "
        "them too"
    )


def _snapshot_plan(play: EnvPlayer) -> _SnapshotPlan:
    """Which sub-envs swap, when, and every sub-env's actions before and after."""
    k = play.steps
    try:  # put the first episode end inside the window, so copies must restart alike
        _, end, out = play.play_to_end()
        i = int(np.nonzero(_np(out[2]) | _np(out[3]))[0][0])
        start = end - min(k // 2, (end + 1) // 2)
    except Verdict:
        i, start = 0, k // 4
    j = (i + play.n // 2) % play.n
    played = play.sample(play.seed + 2, start + k)  # play_to_end's actions, extended
    pre, source = played[:start], played[start:]
    swapped = play.other_actions(source, play.seed + 9)  # neighbours: other actions
    rewound = play.other_actions(source, play.seed + 10)
    for t, a in enumerate(source):
        swapped[t][j], swapped[t][i] = a[i], a[j]
        rewound[t][i] = a[i]
    return _SnapshotPlan(i, j, start, pre, source, swapped, rewound)


def _snapshot_runs(play: EnvPlayer, plan: _SnapshotPlan) -> list[list[Outputs]]:
    """The source's steps, the swapped and rewound runs, and both without their restore, once
    every run is seen to replay the same game up to `plan.start`."""
    env, i, j = play.env, plan.i, plan.j
    own: list[Any] = []  # sub-env i's own snapshot, for the rewind

    def swap() -> None:  # a tensor index for one snapshot, a numpy one for the other
        index = torch.tensor([i, j], device=play.device)
        both = _call(f"snapshot_state(torch.tensor([{i}, {j}]))", env.snapshot_state, index)
        own[:] = [_call(f"snapshot_state(np.array([{i}]))", env.snapshot_state, np.array([i]))]
        _call(
            f"restore_state(np.array([{j}, {i}]), ...)", env.restore_state, np.array([j, i]), both
        )

    def rewind() -> None:
        into = torch.tensor([i], device=play.device)
        _call(f"restore_state(torch.tensor([{i}]), ...)", env.restore_state, into, own[0])

    def run(phases: list[list[np.ndarray]], calls: Mapping[int, Callable[[], None]]) -> Any:
        """`plan.pre` from `reset(seed)`, then each phase after `calls[phase]`."""
        obs, _ = play.reset(seed=play.seed)
        before, out = [(_np(obs),), *play.play(plan.pre)], []
        for p, actions in enumerate(phases):
            if p in calls:
                calls[p]()
            out.append(play.play(actions))
        return before, out

    reference, (source_out,) = run([plan.source], {})
    runs = [
        run([plan.swapped, plan.rewound], {0: swap, 1: rewind}),
        run([plan.swapped], {}),  # neighbours without the swap
        run([plan.swapped, plan.rewound], {0: swap}),  # ... without the rewind
    ]
    for before, _ in runs:
        diff = _difference(reference, before)
        if diff:
            raise Verdict(
                "skip",
                f"the game does not replay under reset(seed={play.seed}) (see determinism), "
                f"so copies cannot be compared: {diff}",
            )
    (after_swap, after_rewind), (unswapped,), (_, unrewound) = (out for _, out in runs)
    return [source_out, after_swap, after_rewind, unswapped, unrewound]


def _snapshot_comparisons(
    n: int, plan: _SnapshotPlan, runs: list[list[Outputs]]
) -> list[tuple[list[Outputs], list[Outputs], dict[int, int], int, str]]:
    """(outputs, the run their rows should come from, {row: that run's row}, first step,
    what it shows): copies against their sources, neighbours with against without."""
    source_out, after_swap, after_rewind, unswapped, unrewound = runs
    i, j, start, k = plan.i, plan.j, plan.start, len(plan.source)
    swap = (
        f"sub-envs {i} and {j} swapped before step {start} by "
        f"snapshot_state(torch.tensor([{i}, {j}])) and restore_state(np.array([{j}, {i}]))"
    )
    rewind = (
        f"sub-env {i} restored before step {start + k} from its own "
        f"snapshot_state(np.array([{i}])) of before step {start}"
    )
    kept = [_with_rows(g, o, {i: i, j: j}) for g, o in zip(after_swap, unswapped, strict=True)]
    stayed = (  # a diagnosis: the restore moved no game
        f" (sub-envs {i} and {j} played on their own games, as if restore_state reversed "
        "the rows or did nothing)"
        if _difference(after_swap, kept, start) is None
        else ""
    )
    swapped = f"{swap}, each on the other's actions, neighbours on others{stayed}; copy vs source"
    rewound = f"{rewind}, on the same actions again, neighbours on others; copy vs source"
    neighbour = "changed a neighbour; with vs without the restore"
    not_ij = {m: m for m in range(n) if m not in (i, j)}
    not_i = {m: m for m in range(n) if m != i}
    return [
        (after_swap, source_out, {j: i, i: j}, start, swapped),
        (after_swap, unswapped, not_ij, start, f"{swap} {neighbour}"),
        (after_rewind, source_out, {i: i}, start + k, f"{rewound} ({k} steps earlier)"),
        (after_rewind, unrewound, not_i, start + k, f"{rewind} {neighbour}"),
    ]


# -- host syncs and invalid actions --------------------------------------------------------------


def check_host_syncs(play: EnvPlayer) -> str:
    """A torch env's `step` reads no device data on the host (a GPU sync; on the CPU a warning
    unless `play.strict_syncs`)."""
    play.reset(seed=play.seed)
    if play.kind != "torch":
        raise Verdict("skip", f"outputs are {play.kind}, not torch tensors")
    actions = [play.convert(a) for a in play.sample(play.seed + 6, play.steps)]
    with SyncCounter() as syncs:
        for a in actions:
            play.env.step(a)
    if syncs.count == 0:
        return f"no host sync in {len(actions)} steps on {play.device}"
    ops = sorted(set(syncs.calls))
    per_step = syncs.count / max(1, len(actions))
    text = f"{per_step:g} host syncs per step on {play.device} ({', '.join(ops[:3])})"
    if play.device is not None and play.device.type == "cpu" and not play.strict_syncs:
        raise Verdict("warn", text + "; free on the CPU, a sync on a GPU")
    raise Verdict("fail", text)


def check_invalid_actions(play: EnvPlayer) -> str:
    """An out-of-range action and actions of the wrong shape raise a clear error (at once,
    or at the next reset), and the env stays usable."""
    space, n = play.single_action, play.n
    good = play.sample(play.seed + 7, 1)[0]
    cases = [(f"actions of shape {(n + 1, *good.shape[1:])}", np.concatenate([good, good[:1]]))]
    bad = good.copy()
    if isinstance(space, gym.spaces.Discrete):
        bad[-1] = space.start + space.n
        cases.insert(0, (f"sub-env {n - 1} action {bad[-1]} (Discrete({space.n}))", bad))
    elif isinstance(space, gym.spaces.MultiDiscrete):
        bad[-1] = space.start + space.nvec
        cases.insert(0, (f"sub-env {n - 1} action start + nvec", bad))
    outcomes = []
    for what, actions in cases:
        outcomes.append(_invalid_action_outcome(play, what, actions))
        try:
            play.reset(seed=play.seed)
            play.step(good)
        except Exception as err:
            texts = "; ".join(text for text, _ in outcomes)
            raise Verdict("fail", f"{texts}; then the env is unusable: {_error(err)}") from None
    text = "; ".join(text for text, _ in outcomes)
    if any(status == "warn" for _, status in outcomes):
        raise Verdict("warn", text)
    return text


def _invalid_action_outcome(play: EnvPlayer, what: str, actions: np.ndarray) -> tuple[str, str]:
    """What stepping with invalid `actions` did, and its status."""
    play.reset(seed=play.seed)
    try:
        play.step(actions)
    except CLEAR_ERRORS as err:
        return f"{what}: {_error(err)}", "pass"
    except AssertionError as err:
        return f"{what}: {_error(err)} (an assert: gone under python -O)", "warn"
    except Exception as err:
        return f"{what}: unrelated error {_error(err)}", "warn"
    try:  # a deferred check raises on the next reset
        play.reset(seed=play.seed)
    except CLEAR_ERRORS as err:
        return f"{what}: accepted, then reset raised {_error(err)}", "pass"
    return f"{what}: accepted silently", "warn"


# -- helpers -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _rng_kept() -> Iterator[None]:
    """Save the global torch / CUDA / numpy / random RNG states; restore them on exit."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    saved = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        np.random.set_state(saved[1])
        random.setstate(saved[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _env_name(env: Any) -> str:
    spec = getattr(env, "spec", None)
    name = getattr(spec, "id", None) if spec is not None else None
    return f"{name} ({type(env).__name__})" if name else type(env).__name__


def _error(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {text[:200]}" if text else type(err).__name__


def _kind(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return "torch"
    if isinstance(x, np.ndarray):
        return "numpy"
    if type(x).__module__.startswith(("jax", "jaxlib")):
        return "jax"
    return type(x).__name__


def _np(x: Any) -> Any:
    """A numpy view (or copy) of a torch / numpy / JAX array, for comparison only."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        return (x.float() if x.dtype == torch.bfloat16 else x).cpu().numpy()
    if isinstance(x, Mapping):
        return {k: _np(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_np(v) for v in x)
    if isinstance(x, np.ndarray) or x is None or isinstance(x, (int, float, bool, str)):
        return x
    return np.asarray(x)  # JAX and other array types (the array protocol)


def _leaves(tree: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            yield from _leaves(v, f"{path}[{k!r}]")
    elif isinstance(tree, (tuple, list)):
        for i, v in enumerate(tree):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, tree


def _first_difference(a: Any, b: Any, what: str) -> str | None:
    """Where two (numpy) outputs differ: the key and sub-env, with both values; else None."""
    for (path, x), (_, y) in zip(_leaves(a), _leaves(b), strict=False):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape:
            return f"{what}{path}: shape {x.shape} vs {y.shape}"
        if x.dtype == object or y.dtype == object:
            continue
        equal = (x == y) | ((x != x) & (y != y)) if x.dtype.kind == "f" else x == y  # NaN == NaN
        if equal.all():
            continue
        if x.ndim == 0:
            return f"{what}{path}: {x} vs {y}"
        i = int(np.nonzero(~equal.reshape(len(equal), -1).all(1))[0][0])
        if x.ndim > 2 or (x.ndim == 2 and x.shape[1] > 8):  # name the first element
            at = tuple(int(a) for a in np.argwhere(~equal[i])[0])
            return f"{what}{path} sub-env {i} at {at}: {x[i][at]} vs {y[i][at]}"
        return f"{what}{path} sub-env {i}: {_short(x[i])} vs {_short(y[i])}"
    return None


def _difference(
    a: list[Outputs], b: list[Outputs], first: int = -1, sub_envs: int | None = None
) -> str | None:
    """The first difference between two lists of outputs (of their first `sub_envs` only),
    named by step (the first is `first`; -1: a reset), key and sub-env."""
    names = ("obs", "reward", "terminated", "truncated")
    for t, (x, y) in enumerate(zip(a, b, strict=True)):
        for name, u, v in zip(names, x, y, strict=False):
            if sub_envs is not None:
                u, v = u[:sub_envs], v[:sub_envs]
            diff = _first_difference(u, v, name)
            if diff:
                return f"{'reset' if first + t < 0 else f'step {first + t}'}: {diff}"
    return None


def _another(space: gym.Space, value: np.ndarray) -> np.ndarray:
    """A sample of `space` other than `value` (the last of 20 draws where none differs)."""
    for _ in range(20):
        candidate = np.asarray(space.sample())
        if not np.array_equal(candidate, value):
            break
    return candidate


def _short(x: Any) -> str:
    text = np.array2string(np.asarray(x), threshold=8, precision=4, separator=",")
    return " ".join(text.split())[:120]


def _with_rows(tree: Any, source: Any, rows: Mapping[int, int]) -> Any:
    """`tree` with row `dst` taken from `source`'s row `src` for each `dst: src`: what it
    should be if those sub-envs played `source`'s games (a comparison then names the row)."""
    if isinstance(tree, Mapping):
        return {k: _with_rows(v, source[k], rows) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_with_rows(v, w, rows) for v, w in zip(tree, source, strict=True))
    out = np.array(tree, copy=True)
    for dst, src in rows.items():
        out[dst] = np.asarray(source)[src]
    return out


def _first_row_that_differs(a: np.ndarray, b: np.ndarray, rows: np.ndarray) -> int | None:
    """The first sub-env among `rows` (a bool mask) whose entries of `a` and `b` differ."""
    for j in np.nonzero(rows)[0]:
        if not np.array_equal(a[j], b[j]):
            return int(j)
    return None


def _call(what: str, function: Callable[..., Any], *args: Any) -> Any:
    """Call one of the env's protocol methods; a raise fails the check, naming the call."""
    try:
        return function(*args)
    except Exception as err:
        raise Verdict("fail", f"{what} raised {_error(err)}") from None


# The checks, in the order they run: {name: check}.
CHECKS: dict[str, Callable[[EnvPlayer], str]] = {
    "spaces": check_spaces,
    "autoreset": check_autoreset,
    "info_masks": check_info_masks,
    "determinism": check_determinism,
    "num_envs_invariance": check_num_envs_invariance,
    "state_snapshots": check_state_snapshots,
    "host_syncs": check_host_syncs,
    "invalid_actions": check_invalid_actions,
}
