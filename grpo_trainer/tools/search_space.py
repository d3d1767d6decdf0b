"""A sweep's search space: which config fields vary, and over what (`sweep --space FILE`).

A JSON object from field name to its range (docs/trainer.md, "Sweeps with Optuna"):

    {"lr":           {"low": 0.003, "high": 0.03, "log": true},
     "epochs":       {"choices": [4, 8]},
     "hidden_sizes": {"choices": [[64, 64], [128, 128]]}}

Each entry is checked against the field's type before any trial runs. No Optuna here:
`Param.suggest` takes any object with Optuna's `suggest_*` methods.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from grpo_trainer.base.config import GRPOConfig, RunConfig, field_type

RANGE_KEYS = {"low", "high", "step", "log"}


@dataclasses.dataclass(frozen=True)
class Param:
    """One field's range: `kind` is "int", "float" or "choices"."""

    name: str  # "lr" or "run.eval_episodes"
    kind: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        """The config value a trial draws (a choice that is a list comes back as a tuple)."""
        if self.kind == "int":
            return trial.suggest_int(
                self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log
            )
        if self.kind == "float":
            return trial.suggest_float(
                self.name, float(self.low), float(self.high), step=self.step, log=self.log
            )
        # Optuna's choices are scalars: a list choice (hidden_sizes) is drawn by its JSON text
        labels = [json.dumps(c) if isinstance(c, (list, tuple)) else c for c in self.choices]
        label = trial.suggest_categorical(self.name, labels)
        value = self.choices[labels.index(label)]
        return tuple(value) if isinstance(value, list) else value


def load_space(path: str | Path) -> list[Param]:
    """Read and check a space file; a bad one raises `ValueError` naming the file and field."""
    try:
        return parse_space(json.loads(Path(path).read_text()))
    except (OSError, ValueError) as err:  # ValueError: bad JSON too
        raise ValueError(f"{path}: {err}") from None


def parse_space(data: Any) -> list[Param]:
    """`Param`s from the space's JSON data (see the module's docstring)."""
    if not isinstance(data, dict) or not data:
        raise ValueError(
            'the search space must be a JSON object of fields, e.g. {"lr": {"low": 0.003, '
            f'"high": 0.03, "log": true}}}}, got {data!r}'
        )
    params, seen = [], set()
    for key, spec in data.items():
        name, cls, field = _field(key)
        if name in seen:
            raise ValueError(f"{key}: named twice")
        seen.add(name)
        params.append(_param(name, spec, get_type_hints(cls)[field]))
    return params


def apply(config: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A copy of a config dict (`GRPOConfig.to_dict()`) with `values` set by `Param.name`."""
    out = json.loads(json.dumps(config))
    for name, value in values.items():
        value = list(value) if isinstance(value, tuple) else value
        if name.startswith("run."):
            out.setdefault("run", {})[name[4:]] = value
        else:
            out[name] = value
    return out


def check_against(params: list[Param], base: dict[str, Any]) -> None:
    """Every bound and choice, set alone on `base`, makes a valid config (else fail at once)."""
    for param in params:
        ends = param.choices if param.kind == "choices" else (param.low, param.high)
        for value in ends:
            if param.kind == "int":
                value = int(value)
            try:
                GRPOConfig.from_dict(apply(base, {param.name: value}))
            except (TypeError, ValueError) as err:
                raise ValueError(f"{param.name}: the value {value!r} is not valid: {err}") from None


def _field(key: Any) -> tuple[str, type, str]:
    """(canonical name, dataclass, field name) of a space key."""
    grpo = {f.name for f in dataclasses.fields(GRPOConfig)} - {"run"}
    run = {f.name for f in dataclasses.fields(RunConfig)}
    if isinstance(key, str) and key.startswith("run.") and key[4:] in run:
        return key, RunConfig, key[4:]
    if key in grpo:
        return key, GRPOConfig, key
    if key in run:
        return f"run.{key}", RunConfig, key
    raise ValueError(
        f"{key}: no such config field (GRPOConfig fields by name, RunConfig fields as "
        "run.NAME; python -m grpo_trainer train --help lists them)"
    )


def _param(name: str, spec: Any, hint: Any) -> Param:
    if not isinstance(spec, dict):
        raise ValueError(
            f'{name}: expected {{"low": ..., "high": ...}} or {{"choices": [...]}}, got {spec!r}'
        )
    hint, optional = field_type(hint)
    if "choices" in spec:
        if set(spec) != {"choices"}:
            raise ValueError(f"{name}: choices go alone, got {sorted(spec)}")
        return _choices(name, spec["choices"], hint, optional)
    unknown = sorted(set(spec) - RANGE_KEYS)
    if unknown:
        raise ValueError(f"{name}: unknown key(s) {unknown}; a range has low, high, step, log")
    if "low" not in spec or "high" not in spec:
        raise ValueError(f"{name}: a range needs low and high (or give choices)")
    if hint not in (int, float):
        raise ValueError(f"{name}: a {_type_name(hint)} field takes choices, not a range")
    kind = "int" if hint is int else "float"
    low, high, step, log = spec["low"], spec["high"], spec.get("step"), spec.get("log", False)
    for key, value in (("low", low), ("high", high), ("step", step)):
        if value is None and key == "step":
            continue
        ok = isinstance(value, int) if kind == "int" else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok or not math.isfinite(value):
            raise ValueError(f"{name}: {key} must be a finite {kind}, got {value!r}")
    if not isinstance(log, bool):
        raise ValueError(f"{name}: log must be true or false, got {log!r}")
    if low > high:
        raise ValueError(f"{name}: low ({low}) is above high ({high})")
    if log and low <= 0:
        raise ValueError(f"{name}: log needs low > 0, got {low}")
    if step is not None:
        if step <= 0:
            raise ValueError(f"{name}: step must be positive, got {step}")
        if log:
            raise ValueError(f"{name}: step and log do not go together")
        if kind == "int" and (high - low) % step:
            raise ValueError(f"{name}: high - low ({high - low}) is not a multiple of step {step}")
    return Param(name, kind, low, high, step, log)


def _choices(name: str, choices: Any, hint: Any, optional: bool) -> Param:
    if not isinstance(choices, list) or not choices:
        raise ValueError(f"{name}: choices must be a non-empty list, got {choices!r}")
    origin = get_origin(hint)
    if origin is dict or hint is dict:
        raise ValueError(f"{name}: a dict field cannot be swept")
    for choice in choices:
        if choice is None:
            ok = optional
        elif origin is tuple:
            ok = isinstance(choice, list) and all(
                isinstance(x, int) and not isinstance(x, bool) for x in choice
            )
        elif origin is typing.Literal:
            ok = choice in get_args(hint)
        elif hint is bool:
            ok = isinstance(choice, bool)
        elif hint is int:
            ok = isinstance(choice, int) and not isinstance(choice, bool)
        elif hint is float:
            ok = isinstance(choice, (int, float)) and not isinstance(choice, bool)
        else:
            ok = isinstance(choice, str)
        if not ok:
            raise ValueError(f"{name}: the choice {choice!r} is not a {_type_name(hint)}")
    labels = [json.dumps(c) for c in choices]
    if len(set(labels)) != len(labels):
        raise ValueError(f"{name}: choices repeat, got {choices!r}")
    return Param(name, "choices", choices=tuple(choices))


def _type_name(hint: Any) -> str:
    if get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(map(repr, get_args(hint)))
    if get_origin(hint) is tuple:
        return "list of ints"
    return getattr(hint, "__name__", str(hint))
