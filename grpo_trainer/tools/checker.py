"""`check_vector_env`: a conformance checker for any Gymnasium vector env (torch, numpy or JAX
outputs), with a named result and concrete evidence for each rule.

    report = check_vector_env(gym.make_vec("CartPole-v1", num_envs=4))
    print(report)        # a table: check, status, evidence
    assert report.ok     # no check failed (warnings and skips do not fail)

The checks (`CHECKS`, in this order):

* `spaces`: `reset`/`step` outputs against the spaces: shapes, dtypes, bounds, one device
  for every torch output; rewards `(num_envs,)`, `terminated`/`truncated` bool `(num_envs,)`.
* `autoreset`: the semantics of `metadata["autoreset_mode"]` (NEXT_STEP when absent), seen
  at the first episode end within `max_steps` random steps.
* `info_masks`: every per-env info entry `k` has its bool `(num_envs,)` mask `_k`.
* `determinism`: `reset(seed=[...])` and `reset(seed=int)` twice with the same actions give
  the same trajectories.
* `num_envs_invariance`: with `metadata["num_envs_invariant"]` and a `make_env`, sub-env `i`
  plays the same game in a vector env of another size.
* `state_snapshots`: where the env offers `snapshot_state` / `restore_state` (docs/env.md), a
  restored sub-env continues exactly as its source did, episode ends and restarts included,
  whatever its neighbours do, and a restore touches no other sub-env.
* `host_syncs`: torch envs only: aten calls that read device data on the host per `step`.
* `invalid_actions`: out-of-range and wrong-shape actions raise a clear error.

The checker steps the env it is given (and resets it at the end) but closes nothing it did not
create; the global torch, numpy and `random` RNG states are restored when it returns. It lives
in `grpo_trainer` because it checks what the trainer relies on, for any env;
`python -m grpo_trainer check ENV_ID` runs it on an env built as the trainer builds it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from grpo_trainer.tools.syncs import SyncCounter

__all__ = ["CHECKS", "STATUSES", "Check", "CheckReport", "check_vector_env"]

CHECKS = (
    "spaces",
    "autoreset",
    "info_masks",
    "determinism",
    "num_envs_invariance",
    "state_snapshots",
    "host_syncs",
    "invalid_actions",
)
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

    @property
    def warned(self) -> list[Check]:
        return [c for c in self.checks if c.status == "warn"]

    def __getitem__(self, name: str) -> Check:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(name)

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


class _Failed(Exception):
    """Raised inside a check to end it with a status and evidence."""

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
    checks: tuple[str, ...] = CHECKS,
) -> CheckReport:
    """Run `checks` on `env` and return the report (nothing is raised for a failed check).

    `steps`: steps per trajectory compared (determinism, invariance, snapshots, syncs, spaces).
    `max_steps`: how many random steps to play looking for an episode end (autoreset, snapshots).
    `strict_syncs`: host syncs on a CPU env fail instead of warn (on other devices they fail).
    `make_env(n)`: builds this env with `n` sub-envs, for the `num_envs_invariance` check.
    """
    unknown = set(checks) - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; known: {CHECKS}")
    runner = _Runner(env, seed=seed, steps=steps, max_steps=max_steps)
    functions: dict[str, Callable[[], str]] = {
        "spaces": runner.spaces,
        "autoreset": runner.autoreset,
        "info_masks": runner.info_masks,
        "determinism": runner.determinism,
        "num_envs_invariance": lambda: runner.invariance(make_env),
        "state_snapshots": runner.state_snapshots,
        "host_syncs": lambda: runner.host_syncs(strict_syncs),
        "invalid_actions": runner.invalid_actions,
    }
    results = []
    with _rng_kept():
        for name in CHECKS:
            if name not in checks:
                continue
            try:
                status, evidence = "pass", functions[name]()
            except _Failed as result:
                status, evidence = result.status, result.evidence
            except Exception as err:  # the env crashed inside a check: that is evidence
                status, evidence = "fail", f"raised {_error(err)}"
            results.append(Check(name, status, evidence))
        with contextlib.suppress(Exception):  # leave the env reset; a broken reset is reported
            env.reset(seed=seed)
    return CheckReport(_env_name(env), results)


# -- helpers -------------------------------------------------------------------------------------


class _rng_kept:
    """Save the global torch / CUDA / numpy / random RNG states; restore them on exit."""

    def __enter__(self) -> None:
        self.torch = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.numpy = np.random.get_state()
        self.random = random.getstate()

    def __exit__(self, *exc: object) -> None:
        torch.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        np.random.set_state(self.numpy)
        random.setstate(self.random)


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
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.cpu().numpy()
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


def _short(x: Any) -> str:
    text = np.array2string(np.asarray(x), threshold=8, precision=4, separator=",")
    return " ".join(text.split())[:120]


def _with_rows(tree: Any, source: Any, rows: Mapping[int, int]) -> Any:
    """`tree` (numpy outputs) with row `dst` replaced by `source`'s row `src` for each
    `dst: src`: what `tree` should be if those sub-envs played `source`'s games. Comparing
    against it names the sub-env of `tree` that differs."""
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
        raise _Failed("fail", f"{what} raised {_error(err)}") from None


def _steps_difference(
    got: list[tuple[Any, ...]], want: list[tuple[Any, ...]], first: int
) -> str | None:
    """The first difference between two lists of step outputs, named by env step (the
    first being `first`), key and sub-env."""
    names = ("obs", "reward", "terminated", "truncated")
    for t, (x, y) in enumerate(zip(got, want, strict=True)):
        for name, u, v in zip(names, x, y, strict=True):
            diff = _first_difference(u, v, name)
            if diff:
                return f"step {first + t}: {diff}"
    return None


class _SnapshotPlan(NamedTuple):
    """The state-snapshot check's set-up: sub-env i and j, the step they swap at, and the
    actions: before it, the source's after it, and the swapped and rewound runs'."""

    i: int
    j: int
    start: int
    pre: list[np.ndarray]
    source: list[np.ndarray]
    swapped: list[np.ndarray]
    rewound: list[np.ndarray]


class _Runner:
    """Plays `env` for the checks: seeded random actions of the env's own kind."""

    def __init__(self, env: Any, *, seed: int, steps: int, max_steps: int) -> None:
        self.env, self.seed, self.steps, self.max_steps = env, seed, steps, max_steps
        self.n = int(env.num_envs)
        self.single_action = getattr(env, "single_action_space", None) or env.action_space
        self.single_obs = getattr(env, "single_observation_space", None)
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self.mode = AutoresetMode(mode) if not isinstance(mode, AutoresetMode) else mode
        self.action_dtype: Any = None  # a dtype that `step` accepts, when not the space's
        self.action_note = ""
        self.device: torch.device | None = None
        self.kind: str | None = None
        self._infos: list[tuple[str, dict[str, Any]]] = []  # (where, info) for info_masks

    # -- playing ------------------------------------------------------------------------------

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

    def convert(self, actions: np.ndarray) -> Any:
        if self.action_dtype is not None:
            actions = actions.astype(self.action_dtype)
        if self.kind == "torch":
            return torch.as_tensor(actions, device=self.device)
        return actions

    def reset(self, env: Any = None, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = (env or self.env).reset(**kwargs)
        if self.kind is None:
            self.kind = _kind(obs if not isinstance(obs, Mapping) else next(iter(obs.values())))
            if self.kind == "torch":
                first = obs if isinstance(obs, torch.Tensor) else next(iter(obs.values()))
                self.device = first.device
        return obs, info

    def step(self, actions: np.ndarray, env: Any = None) -> tuple[Any, ...]:
        env = env or self.env
        try:
            return env.step(self.convert(actions))
        except Exception as err:
            if self.action_dtype is not None or actions.dtype.kind not in "iu":
                raise
            for dtype in (np.int32, np.int64):  # an env that takes only one integer width
                if dtype == actions.dtype:
                    continue
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

    def trajectory(
        self, seed: Any, steps: int, env: Any = None, n: int | None = None
    ) -> list[tuple[Any, ...]]:
        """[(obs, reward, terminated, truncated)] as numpy, from `reset(seed=seed)`."""
        obs, _ = self.reset(env, seed=seed)
        out = [(_np(obs),)]
        for actions in self.sample(self.seed + 1, steps, n):
            obs, reward, term, trunc, _ = self.step(actions, env)
            out.append((_np(obs), _np(reward), _np(term), _np(trunc)))
            self._restart_ended(term, trunc, env)
        return out

    def _restart_ended(self, term: Any, trunc: Any, env: Any = None) -> None:
        """DISABLED: reset the ended sub-envs, as a caller must before stepping them again."""
        if self.mode != AutoresetMode.DISABLED:
            return
        ended = _np(term) | _np(trunc)
        if ended.any():
            mask = torch.as_tensor(ended, device=self.device) if self.kind == "torch" else ended
            (env or self.env).reset(options={"reset_mask": mask})

    def play_to_end(self) -> tuple[list[np.ndarray], int, tuple[Any, ...], Any]:
        """Random steps from `reset(seed)` until some episode ends: (actions, step index,
        that step's outputs, the obs before it); a skip if none ends in `max_steps`."""
        obs, _ = self.reset(seed=self.seed)
        actions = self.sample(self.seed + 2, self.max_steps)
        for t, a in enumerate(actions):
            before = obs
            out = self.step(a)
            obs = out[0]
            ended = _np(out[2]) | _np(out[3])
            if np.any(ended):
                return actions, t, out, before
        raise _Failed(
            "skip",
            f"no episode ended in {self.max_steps} random steps (pass a larger max_steps)",
        )

    # -- the checks ---------------------------------------------------------------------------

    def spaces(self) -> str:
        problems: list[str] = []
        if self.single_obs is None:
            problems.append("env has no single_observation_space")
        obs_space = self.env.observation_space
        if getattr(self.env, "single_action_space", None) is None:
            problems.append("env has no single_action_space")
        obs, info = self.reset(seed=self.seed)
        self._infos.append(("reset", info))
        problems += self._obs_problems(obs, obs_space, "reset")
        problems += self._device_problems((obs, info), "reset")
        for t, actions in enumerate(self.sample(self.seed + 3, self.steps)):
            obs, reward, term, trunc, info = self.step(actions)
            self._infos.append((f"step {t}", info))
            where = f"step {t}"
            problems += self._obs_problems(obs, obs_space, where)
            for name, value, kinds in (
                ("reward", reward, "fiub"),
                ("terminated", term, "b"),
                ("truncated", trunc, "b"),
            ):
                array = _np(value)
                if array.shape != (self.n,):
                    problems.append(f"{where}: {name} shape {array.shape}, expected ({self.n},)")
                elif array.dtype.kind not in kinds or (kinds == "fiub" and array.dtype.kind == "b"):
                    want = "bool" if kinds == "b" else "a number"
                    problems.append(f"{where}: {name} dtype {array.dtype}, expected {want}")
            problems += self._device_problems((obs, reward, term, trunc, info), where)
            if problems:
                break
            self._restart_ended(term, trunc)
        if self.action_note:
            problems.insert(0, self.action_note)
        if problems:
            raise _Failed("fail", "; ".join(problems[:3]))
        return f"{self.steps} steps: {self.kind} obs {tuple(_np(obs).shape)} {_np(obs).dtype}" + (
            f" on {self.device}" if self.device is not None else ""
        )

    def _obs_problems(self, obs: Any, space: gym.Space, where: str) -> list[str]:
        array = _np(obs)
        if isinstance(space, gym.spaces.Dict | gym.spaces.Tuple) or isinstance(array, dict):
            return [] if space.contains(array) else [f"{where}: obs not in observation_space"]
        shape, dtype = getattr(space, "shape", None), getattr(space, "dtype", None)
        if shape is not None and array.shape != tuple(shape):
            return [f"{where}: obs shape {array.shape}, observation_space {tuple(shape)}"]
        if dtype is not None and array.dtype != dtype:
            return [f"{where}: obs dtype {array.dtype}, observation_space {np.dtype(dtype)}"]
        if self.single_obs is not None:
            for i in range(self.n):
                if not self.single_obs.contains(array[i]):
                    return [
                        f"{where}: sub-env {i} obs {_short(array[i])} outside "
                        f"single_observation_space {self.single_obs}"
                    ]
        return []

    def _device_problems(self, tree: Any, where: str) -> list[str]:
        devices = {
            path: value.device for path, value in _leaves(tree) if isinstance(value, torch.Tensor)
        }
        if len(set(devices.values())) > 1:
            first = next(iter(devices.values()))
            other = next(p for p, d in devices.items() if d != first)
            return [
                f"{where}: torch outputs on {sorted(map(str, set(devices.values())))} ({other})"
            ]
        return []

    def autoreset(self) -> str:
        actions, t, out, _ = self.play_to_end()
        ended = _np(out[2]) | _np(out[3])
        idx = np.nonzero(ended)[0]
        where = f"step {t}, sub-envs {idx.tolist()}"
        if self.mode == AutoresetMode.SAME_STEP:
            return self._same_step(out, ended, where)
        if self.mode == AutoresetMode.DISABLED:
            return self._disabled(out, ended, where)
        return self._next_step(actions, t, out, ended, where)

    def _next_step(
        self, actions: list[np.ndarray], t: int, out: tuple[Any, ...], ended: np.ndarray, where: str
    ) -> str:
        after = self.step(actions[t + 1])
        reward, term, trunc = (_np(x) for x in after[1:4])
        wrong = np.nonzero(ended & ((reward != 0) | term | trunc))[0]
        if wrong.size:
            i = int(wrong[0])
            raise _Failed(
                "fail",
                f"NEXT_STEP: the step after the end ({where}) gave sub-env {i} reward "
                f"{reward[i]}, terminated {term[i]}, truncated {trunc[i]}; "
                "expected 0, False, False",
            )
        # the same game again, with other actions for the ended sub-envs on the reset step
        other = actions[t + 1].copy()
        space = copy.deepcopy(self.single_action)
        space.seed(self.seed + 4)
        for j in np.nonzero(ended)[0]:
            for _ in range(20):
                candidate = np.asarray(space.sample())
                if not np.array_equal(candidate, other[j]):
                    other[j] = candidate
                    break
        self.reset(seed=self.seed)
        replay = [self.step(a) for a in actions[: t + 1]]
        if _first_difference(_np(replay[-1][0]), _np(out[0]), "obs"):
            raise _Failed(
                "skip",
                "NEXT_STEP: the game does not replay under reset(seed) (see determinism), so "
                "whether the step after an end ignores the action cannot be tested",
            )
        again = _np(self.step(other)[0])
        first = _np(after[0])
        j = _first_row_that_differs(first, again, ended)
        if j is not None:
            raise _Failed(
                "fail",
                f"NEXT_STEP: the step after the end ({where}) depends on the action: "
                f"sub-env {j} obs {_short(first[j])} with action {_short(actions[t + 1][j])}, "
                f"{_short(again[j])} with {_short(other[j])}",
            )
        return f"NEXT_STEP: {where} ended; the next step ignored the action, reward 0, not done"

    def _same_step(self, out: tuple[Any, ...], ended: np.ndarray, where: str) -> str:
        info = out[4]
        if "final_obs" not in info or "_final_obs" not in info:
            missing = [k for k in ("final_obs", "_final_obs") if k not in info]
            raise _Failed(
                "fail",
                f"SAME_STEP: {where} ended but info lacks {missing} (info keys {sorted(info)})",
            )
        mask = _np(info["_final_obs"])
        if mask.dtype != np.bool_ or mask.shape != (self.n,) or not np.array_equal(mask, ended):
            raise _Failed(
                "fail",
                f"SAME_STEP: info['_final_obs'] is {_short(mask)}, expected "
                f"terminated | truncated = {_short(ended)}",
            )
        final = info["final_obs"]
        obs = _np(out[0])
        same = []
        for j in np.nonzero(ended)[0]:
            last = _np(final[j]) if _kind(final) != "torch" else _np(final)[j]
            if self.single_obs is not None and not self.single_obs.contains(np.asarray(last)):
                raise _Failed(
                    "fail",
                    f"SAME_STEP: final_obs of sub-env {j} "
                    f"{_short(last)} outside single_observation_space",
                )
            same.append(np.array_equal(np.asarray(last), obs[j]))
        if all(same):
            raise _Failed(
                "fail",
                f"SAME_STEP: at {where} the returned obs equal final_obs: "
                "the ended sub-envs were not reset in the same step",
            )
        return f"SAME_STEP: {where} ended; final_obs and _final_obs given, obs restarted"

    def _disabled(self, out: tuple[Any, ...], ended: np.ndarray, where: str) -> str:
        before = _np(out[0])
        mask = ended if self.kind != "torch" else torch.as_tensor(ended, device=self.device)
        obs, _ = self.reset(options={"reset_mask": mask})
        after = _np(obs)
        j = _first_row_that_differs(before, after, ~ended)
        if j is not None:
            raise _Failed(
                "fail",
                f"DISABLED: reset(options={{'reset_mask': mask}}) at {where} changed unmasked "
                f"sub-env {j}: {_short(before[j])} -> {_short(after[j])}",
            )
        moved = self.step(self.sample(self.seed + 5, 1)[0])
        if np.any((_np(moved[2]) | _np(moved[3]))[ended]):
            raise _Failed(
                "warn", "DISABLED: a masked sub-env ended again on the step after its reset"
            )
        return f"DISABLED: {where} ended; reset_mask reset those and kept the others"

    def info_masks(self) -> str:
        if not self._infos:  # spaces did not run: gather some infos
            self.reset(seed=self.seed)
            for t, a in enumerate(self.sample(self.seed + 3, self.steps)):
                self._infos.append((f"step {t}", self.step(a)[4]))
        try:
            _, t, out, _ = self.play_to_end()
            self._infos.append((f"step {t} (an episode end)", out[4]))
        except _Failed:
            pass
        skip = {"final_obs", "final_info"} if self.mode == AutoresetMode.SAME_STEP else set()
        keys: set[str] = set()
        for where, info in self._infos:
            problem = self._mask_problem(info, "info", covered=False, skip=skip, keys=keys)
            if problem:
                raise _Failed("fail", f"{where}: {problem}")
        if not keys:
            return f"{len(self._infos)} infos, no per-env entries"
        top = sorted({k.split("]")[0].removeprefix("info[") for k in keys})
        return (
            f"{len(self._infos)} infos; {len(keys)} per-env entries under {', '.join(top)}, "
            "all masked"
        )

    def _mask_problem(
        self, info: Mapping[str, Any], path: str, *, covered: bool, skip: set[str], keys: set[str]
    ) -> str | None:
        for key, value in info.items():
            if not isinstance(key, str) or key.startswith("_") or key in skip:
                continue
            mask_key = f"_{key}"
            is_dict = isinstance(value, Mapping)
            per_env = not is_dict and getattr(value, "shape", ())[:1] == (self.n,)
            if not (is_dict or per_env):
                continue
            keys.add(f"{path}[{key!r}]")
            if mask_key in info:
                mask = _np(info[mask_key])
                if (
                    not isinstance(mask, np.ndarray)
                    or mask.dtype != np.bool_
                    or (mask.shape != (self.n,))
                ):
                    got = f"{mask.dtype} {mask.shape}" if hasattr(mask, "shape") else type(mask)
                    return (
                        f"{path}[{mask_key!r}] must be a bool array of shape ({self.n},), got {got}"
                    )
            elif not covered:
                return f"{path}[{key!r}] has no mask {path}[{mask_key!r}]"
            if is_dict:
                problem = self._mask_problem(
                    value,
                    f"{path}[{key!r}]",
                    covered=covered or mask_key in info,
                    skip=set(),
                    keys=keys,
                )
                if problem:
                    return problem
        return None

    def determinism(self) -> str:
        warnings = []
        seeds = [self.seed + 101 * (i + 1) for i in range(self.n)]
        try:
            first = self.trajectory(seeds, self.steps)
        except Exception as err:
            warnings.append(f"reset(seed=[{self.n} ints]) raised {_error(err)}")
        else:
            second = self.trajectory(seeds, self.steps)
            diff = self._trajectory_difference(first, second)
            if diff:
                raise _Failed("fail", f"reset(seed=list) twice, same actions: {diff}")
        first = self.trajectory(self.seed, self.steps)
        second = self.trajectory(self.seed, self.steps)
        diff = self._trajectory_difference(first, second)
        if diff:
            raise _Failed("fail", f"reset(seed={self.seed}) twice, same actions: {diff}")
        if warnings:
            raise _Failed("warn", "; ".join(warnings) + f"; reset(seed={self.seed}) reproduces")
        return f"reset(seed=list) and reset(seed=int) replay {self.steps} steps exactly"

    @staticmethod
    def _trajectory_difference(
        a: list[tuple[Any, ...]], b: list[tuple[Any, ...]], sub_envs: int | None = None
    ) -> str | None:
        """The first difference between two `trajectory`s (of their first `sub_envs` only)."""
        names = ("obs", "reward", "terminated", "truncated")
        for t, (x, y) in enumerate(zip(a, b, strict=True)):
            for name, u, v in zip(names, x, y, strict=False):
                if sub_envs is not None:
                    u, v = u[:sub_envs], v[:sub_envs]
                diff = _first_difference(u, v, name)
                if diff:
                    return f"{'reset' if t == 0 else f'step {t - 1}'}: {diff}"
        return None

    def invariance(self, make_env: Callable[[int], Any] | None) -> str:
        if not self.env.metadata.get("num_envs_invariant", False):
            raise _Failed("skip", "metadata['num_envs_invariant'] is not True")
        if make_env is None:
            raise _Failed("skip", "no make_env given to build a vector env of another size")
        m = max(1, self.n // 2) if self.n > 1 else 2
        k = min(m, self.n)
        seeds = [self.seed + 13 * (i + 1) for i in range(max(self.n, m))]
        other = make_env(m)
        try:
            big = self.trajectory(seeds[: self.n], self.steps)
            small = self.trajectory(seeds[:m], self.steps, env=other, n=m)
        finally:
            other.close()
        diff = self._trajectory_difference(big, small, sub_envs=k)
        if diff:
            raise _Failed(
                "fail", f"num_envs={self.n} vs {m}, same per-env seeds and actions: {diff}"
            )
        return (
            f"sub-envs 0..{k - 1} play the same {self.steps} steps with num_envs={self.n} and {m}"
        )

    def state_snapshots(self) -> str:
        """The sub-env state protocol of docs/env.md, where offered: a trainer copies games
        between sub-envs with it and trusts a copy to play on exactly as its source would.

        Sub-envs i and j swap games by snapshots, then i is rewound to its own older snapshot,
        while their neighbours play other actions; each copy must replay its source's steps,
        and no neighbour may notice."""
        names = ("snapshot_state", "restore_state")
        missing = [name for name in names if not callable(getattr(self.env, name, None))]
        if missing:
            raise _Failed("skip", f"no sub-env state protocol: {' and '.join(missing)} missing")
        if self.n < 2:
            raise _Failed("skip", "num_envs=1: no other sub-env to restore a snapshot into")
        plan = self._snapshot_plan()
        source_out, after_swap, after_rewind, unswapped, unrewound = self._snapshot_runs(plan)
        i, j, start, k = plan.i, plan.j, plan.start, self.steps
        swap_text = (
            f"sub-envs {i} and {j} swapped before step {start} by "
            f"snapshot_state(torch.tensor([{i}, {j}])) and restore_state(np.array([{j}, {i}]))"
        )
        rewind_text = (
            f"sub-env {i} restored before step {start + k} from its own "
            f"snapshot_state(np.array([{i}])) of before step {start}"
        )
        kept = [_with_rows(g, o, {i: i, j: j}) for g, o in zip(after_swap, unswapped, strict=True)]
        stayed = (  # a diagnosis: the restore moved no game
            f" (sub-envs {i} and {j} played on their own games, as if restore_state reversed "
            "the rows or did nothing)"
            if _steps_difference(after_swap, kept, start) is None
            else ""
        )
        others = [m for m in range(self.n) if m not in (i, j)]
        comparisons = [  # (outputs, expected rows from, {row: from row}, first step, what)
            (
                after_swap,
                source_out,
                {j: i, i: j},
                start,
                f"{swap_text}, each on the other's actions, neighbours on others{stayed}; "
                "copy vs source",
            ),
            (
                after_swap,
                unswapped,
                {m: m for m in others},
                start,
                f"{swap_text} changed a neighbour; with vs without the restore",
            ),
            (
                after_rewind,
                source_out,
                {i: i},
                start + k,
                f"{rewind_text}, on the same actions again, neighbours on others; copy vs "
                f"source ({k} steps earlier)",
            ),
            (
                after_rewind,
                unrewound,
                {m: m for m in range(self.n) if m != i},
                start + k,
                f"{rewind_text} changed a neighbour; with vs without the restore",
            ),
        ]
        for got, other, rows, first, what in comparisons:
            want = [_with_rows(g, o, rows) for g, o in zip(got, other, strict=True)]
            diff = _steps_difference(got, want, first)
            if diff:
                raise _Failed("fail", f"{what}: {diff}")
        ends = sum(
            int(np.count_nonzero((np.asarray(s[2], bool) | np.asarray(s[3], bool))[[i, j]]))
            for s in source_out
        )
        return (
            f"sub-envs {i} and {j} swapped by snapshots before step {start} played {k} steps "
            f"as their sources did ({ends} episode ends among them), neighbours on other "
            f"actions and unchanged; sub-env {i} rewound to its own snapshot replayed them too"
        )

    def _snapshot_plan(self) -> _SnapshotPlan:
        """Which sub-envs swap, when, and every sub-env's actions before and after."""
        k = self.steps
        try:  # put the first episode end inside the window, so copies must restart alike
            _, end, out, _ = self.play_to_end()
            i = int(np.nonzero(_np(out[2]) | _np(out[3]))[0][0])
            start = end - min(k // 2, (end + 1) // 2)
        except _Failed:
            i, start = 0, k // 4
        j = (i + self.n // 2) % self.n
        played = self.sample(self.seed + 2, start + k)  # play_to_end's actions, extended
        pre, source = played[:start], played[start:]
        swapped = self._other_actions(source, self.seed + 9)  # neighbours: other actions
        rewound = self._other_actions(source, self.seed + 10)
        for t, a in enumerate(source):
            swapped[t][j], swapped[t][i] = a[i], a[j]
            rewound[t][i] = a[i]
        return _SnapshotPlan(i, j, start, pre, source, swapped, rewound)

    def _snapshot_runs(self, plan: _SnapshotPlan) -> tuple[list[Any], ...]:
        """The source's steps, then the swapped and rewound runs with and without their
        restores, after checking that every run replays the same game up to `plan.start`."""
        env, i, j = self.env, plan.i, plan.j
        own: list[Any] = []  # sub-env i's own snapshot, for the rewind

        def swap() -> None:  # a tensor index for one snapshot, a numpy one for the other
            both = _call(
                f"snapshot_state(torch.tensor([{i}, {j}]))",
                env.snapshot_state,
                torch.tensor([i, j], device=self.device),
            )
            own[:] = [_call(f"snapshot_state(np.array([{i}]))", env.snapshot_state, np.array([i]))]
            _call(
                f"restore_state(np.array([{j}, {i}]), ...)",
                env.restore_state,
                np.array([j, i]),
                both,
            )

        def rewind() -> None:
            into = torch.tensor([i], device=self.device)
            _call(f"restore_state(torch.tensor([{i}]), ...)", env.restore_state, into, own[0])

        pre, swapped, rewound = plan.pre, plan.swapped, plan.rewound
        reference, (source_out,) = self._snapshot_run(pre, [plan.source], {})
        runs = [
            self._snapshot_run(pre, [swapped, rewound], {0: swap, 1: rewind}),
            self._snapshot_run(pre, [swapped], {}),  # neighbours without the swap
            self._snapshot_run(pre, [swapped, rewound], {0: swap}),  # ... without the rewind
        ]
        for before, _ in runs:
            diff = self._trajectory_difference(reference, before)
            if diff:
                raise _Failed(
                    "skip",
                    f"the game does not replay under reset(seed={self.seed}) (see determinism), "
                    f"so copies cannot be compared: {diff}",
                )
        (after_swap, after_rewind), (unswapped,), (_, unrewound) = (out for _, out in runs)
        return source_out, after_swap, after_rewind, unswapped, unrewound

    def _other_actions(self, actions: list[np.ndarray], seed: int) -> list[np.ndarray]:
        """Random actions that differ from `actions` entry by entry where the space allows."""
        space = copy.deepcopy(self.single_action)
        space.seed(seed)
        others = []
        for batch in actions:
            other = batch.copy()
            for m in range(len(batch)):
                for _ in range(20):
                    other[m] = np.asarray(space.sample())
                    if not np.array_equal(other[m], batch[m]):
                        break
            others.append(other)
        return others

    def _snapshot_run(
        self,
        pre: list[np.ndarray],
        phases: list[list[np.ndarray]],
        calls: Mapping[int, Callable[[], None]],
    ) -> tuple[list[tuple[Any, ...]], list[list[tuple[Any, ...]]]]:
        """Play `pre` from `reset(seed)`, then each phase, making `calls[p]` before phase `p`:
        (the `trajectory` of `pre`, each phase's [(obs, reward, terminated, truncated)])."""
        obs, _ = self.reset(seed=self.seed)
        before = [(_np(obs),), *self._play(pre)]
        out = []
        for p, actions in enumerate(phases):
            if p in calls:
                calls[p]()
            out.append(self._play(actions))
        return before, out

    def _play(self, actions: list[np.ndarray]) -> list[tuple[Any, ...]]:
        out = []
        for a in actions:
            obs, reward, term, trunc, _ = self.step(a)
            out.append((_np(obs), _np(reward), _np(term), _np(trunc)))
            self._restart_ended(term, trunc)
        return out

    def host_syncs(self, strict: bool) -> str:
        self.reset(seed=self.seed)
        if self.kind != "torch":
            raise _Failed("skip", f"outputs are {self.kind}, not torch tensors")
        actions = [self.convert(a) for a in self.sample(self.seed + 6, self.steps)]
        with SyncCounter() as syncs:
            for a in actions:
                self.env.step(a)
        per_step = syncs.count / max(1, len(actions))
        if syncs.count == 0:
            return f"no host sync in {len(actions)} steps on {self.device}"
        ops = sorted(set(syncs.calls))
        text = f"{per_step:g} host syncs per step on {self.device} ({', '.join(ops[:3])})"
        if self.device is not None and self.device.type == "cpu" and not strict:
            raise _Failed("warn", text + "; free on the CPU, a sync on a GPU")
        raise _Failed("fail", text)

    def invalid_actions(self) -> str:
        space = self.single_action
        good = self.sample(self.seed + 7, 1)[0]
        cases: list[tuple[str, np.ndarray]] = []
        if isinstance(space, gym.spaces.Discrete):
            bad = good.copy()
            bad[-1] = space.start + space.n
            cases.append(
                (f"sub-env {self.n - 1} action {space.start + space.n} (Discrete({space.n}))", bad)
            )
        elif isinstance(space, gym.spaces.MultiDiscrete):
            bad = good.copy()
            bad[-1] = space.start + space.nvec
            cases.append((f"sub-env {self.n - 1} action start + nvec", bad))
        cases.append(
            (f"actions of shape {(self.n + 1, *good.shape[1:])}", np.concatenate([good, good[:1]]))
        )
        outcomes, statuses = [], []
        for what, actions in cases:
            self.reset(seed=self.seed)
            try:
                self.step(actions)
            except CLEAR_ERRORS as err:
                outcomes.append(f"{what}: {_error(err)}")
                statuses.append("pass")
            except AssertionError as err:
                outcomes.append(f"{what}: {_error(err)} (an assert: gone under python -O)")
                statuses.append("warn")
            except Exception as err:
                outcomes.append(f"{what}: unrelated error {_error(err)}")
                statuses.append("warn")
            else:
                try:  # a deferred check raises on the next reset
                    self.reset(seed=self.seed)
                except CLEAR_ERRORS as err:
                    outcomes.append(f"{what}: accepted, then reset raised {_error(err)}")
                    statuses.append("pass")
                else:
                    outcomes.append(f"{what}: accepted silently")
                    statuses.append("warn")
            try:
                self.reset(seed=self.seed)
                self.step(good)
            except Exception as err:
                raise _Failed(
                    "fail", "; ".join(outcomes) + f"; then the env is unusable: {_error(err)}"
                ) from None
        status = "warn" if "warn" in statuses else "pass"
        if status == "warn":
            raise _Failed("warn", "; ".join(outcomes))
        return "; ".join(outcomes)
