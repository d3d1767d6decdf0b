"""Command line: `python -m grpo_trainer train | eval | play | sweep | check` (also `grpo`).

Every field of `GRPOConfig` and `RunConfig` is a flag (`num_groups` -> `--num-groups`),
generated from the dataclasses so the two can never disagree.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import signal
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from grpo_trainer.base import checkpoint
from grpo_trainer.base.accel import resolve_device
from grpo_trainer.base.config import GRPOConfig, RunConfig, field_type, without_derived
from grpo_trainer.envs import make_envs
from grpo_trainer.run.evaluation import (
    EVAL_SEED,
    MAX_EVAL_ENVS,
    evaluate,
    open_policy,
    play_episode,
    write_animation,
)

log = logging.getLogger("grpo_trainer")

EXTRAS = ("wandb", "optuna")  # optional packages whose absence is a usage error (exit 2)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_field(parser: argparse.ArgumentParser, field: dataclasses.Field, hint: Any) -> None:
    """One flag per field, typed from its annotation and described by its config help;
    defaults stay with the dataclass (shown in the help)."""
    default = field.default_factory() if callable(field.default_factory) else field.default
    shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
    shown = json.dumps(shown) if isinstance(shown, dict) else shown
    kwargs: dict[str, Any] = {
        "dest": field.name,
        "default": argparse.SUPPRESS,
        "help": f"{field.metadata['help']} (default: {shown})",
    }
    hint, optional = field_type(hint)
    origin, args = get_origin(hint), get_args(hint)
    if hint is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif origin is typing.Literal:
        kwargs["choices"] = list(args)
    elif origin is tuple:
        kwargs["type"] = _int_tuple
        kwargs["metavar"] = "N,N"
    elif origin is dict:
        kwargs["type"] = _json_dict
        kwargs["metavar"] = "JSON"
    elif hint in (int, float) and optional:  # "none" gives None: `--dual-clip none`
        kwargs["type"] = _number_or_none(hint)
        kwargs["metavar"] = f"{hint.__name__.upper()}|none"
    elif hint in (int, float, str):
        kwargs["type"] = hint
    else:
        raise TypeError(f"no flag type for field {field.name}: {hint}")
    parser.add_argument(_flag(field.name), **kwargs)


def _number_or_none(kind: type) -> Any:
    """A flag's type for a field that allows None: a number, or "none"."""

    def parse(text: str) -> int | float | None:
        if text.strip().lower() == "none":
            return None
        try:
            return kind(text)
        except ValueError:
            message = f"expected {kind.__name__} or none, got {text!r}"
            raise argparse.ArgumentTypeError(message) from None

    parse.__name__ = kind.__name__  # argparse names the type in its error message
    return parse


def _int_tuple(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None


def _json_dict(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}: {err}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _config_flags(parser: argparse.ArgumentParser) -> None:
    for cls in (GRPOConfig, RunConfig):
        hints = get_type_hints(cls)
        group = parser.add_argument_group(f"{cls.__name__} fields")
        for field in dataclasses.fields(cls):
            if field.name != "run":
                _add_field(group, field, hints[field.name])  # type: ignore[arg-type]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo", description=__doc__.splitlines()[0])
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train",
        help="train a policy (every config field is a flag)",
        description="Train a policy. Every GRPOConfig and RunConfig field is a flag; "
        "docs/trainer.md explains each.",
    )
    train.add_argument("--config", type=Path, help="a config.json to start from (flags override)")
    _config_flags(train)

    evaluate = sub.add_parser("eval", help="evaluate a checkpoint")
    evaluate.add_argument("--checkpoint", type=Path, required=True)
    evaluate.add_argument("--episodes", type=int, default=100)
    evaluate.add_argument("--sampled", action="store_true", help="sample actions (default: greedy)")
    evaluate.add_argument(
        "--num-envs", type=int, default=None, help=f"default: min(episodes, {MAX_EVAL_ENVS})"
    )
    evaluate.add_argument("--device", default="auto")
    evaluate.add_argument("--seed", type=int, default=EVAL_SEED)
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")

    sweep = sub.add_parser(
        "sweep",
        help="search hyper-parameters with Optuna (the sweep extra)",
        description="Search config fields with Optuna: each trial trains in this process into "
        "SWEEP_DIR/trial_NNNN/; results.csv and best_config.json are rewritten after every "
        "trial, and the same command continues an interrupted sweep. docs/trainer.md "
        "explains the objectives and the pruner.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sweep.add_argument(
        "--space",
        type=Path,
        required=True,
        help='JSON: {"lr": {"low": 0.003, "high": 0.03, '
        '"log": true}, "epochs": {"choices": [4, 8]}}; run fields as "run.NAME"',
    )
    sweep.add_argument("--trials", type=int, default=20, help="finished trials wanted in all")
    sweep.add_argument(
        "--sweep-dir", type=Path, default=Path("runs/sweep"), help="study.db, trials, results"
    )
    sweep.add_argument("--config", type=Path, help="the base config.json every trial starts from")
    sweep.add_argument(
        "--objective",
        choices=["eval_score", "time_to_target"],
        default="eval_score",
        help="eval_score: the best evaluation score, maximised; time_to_target: wall seconds "
        "to the target (run.target or the env's goal), minimised",
    )
    sweep.add_argument(
        "--pruner",
        choices=["median", "none"],
        default="median",
        help="median: stop a trial whose evaluation is worse than the median of earlier "
        "trials' at the same step (after 5 finished trials)",
    )
    sweep.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    sweep.add_argument("--study-name", default="sweep", help="the study's name in study.db")

    play = sub.add_parser("play", help="record or show a trained agent")
    play.add_argument("--checkpoint", type=Path, required=True)
    play.add_argument(
        "--out", type=Path, default=Path("agent.gif"), help=".gif (or .mp4 with imageio)"
    )
    play.add_argument("--ansi", action="store_true", help="print text frames instead of a file")
    play.add_argument("--steps", type=int, default=200)
    play.add_argument("--fps", type=int, default=10)
    play.add_argument("--seed", type=int, default=0)
    play.add_argument("--device", default="cpu")

    _add_check_command(sub)
    return parser


def _add_check_command(sub: Any) -> None:
    """`check`'s flags (they are `check_vector_env`'s arguments, not config fields)."""
    check = sub.add_parser(
        "check",
        help="check a vector env's conformance, built as the trainer builds it",
        description="Run grpo_trainer.tools.checker.check_vector_env on ENV_ID as train would make "
        "it (gymnax:, envpool: and minatar: ids included; the env's fast options, which "
        "--env-kwargs override). Exit 0: no check failed; 1: one did; 2: a usage error.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    check.add_argument("env_id", help="an env id as --env takes it, e.g. CartPole-v1")
    check.add_argument("--num-envs", type=int, default=4)
    check.add_argument(
        "--env-kwargs", type=_json_dict, default={}, metavar="JSON", help="as train's"
    )
    check.add_argument(
        "--vectorization-mode",
        choices=("sync", "vector_entry_point"),
        default=None,
        help="make_vec's vectorization_mode (default: the env's vector entry point if any)",
    )
    check.add_argument("--steps", type=int, default=64, help="steps per trajectory")
    check.add_argument("--max-steps", type=int, default=1000, help="steps to find an episode end")
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--device", default="auto")
    check.add_argument("--strict-syncs", action="store_true", help="host syncs fail on the CPU too")
    check.add_argument("--json", action="store_true", help="print the report as JSON")


def config_from_args(args: argparse.Namespace) -> GRPOConfig:
    """The config a command asked for: the `--config` file's values, then the flags, over
    the defaults, resolved once from the result, as `GRPOConfig(...)` resolves the same
    values (a derived field follows the final budget, never an intermediate one). Invalid
    values raise `ValueError`."""
    data: dict[str, Any] = {"run": {}}
    if args.config:
        try:
            loaded = json.loads(args.config.read_text())
        except (OSError, ValueError) as err:  # ValueError: bad JSON, or not UTF-8 at all
            raise ValueError(f"--config {args.config}: {err}") from None
        if not isinstance(loaded, dict) or not isinstance(loaded.get("run", {}), dict):
            raise ValueError(f"--config {args.config}: expected a JSON object like config.json")
        try:
            loaded = without_derived(loaded)  # what its run derived is derived again
        except ValueError as err:
            raise ValueError(f"--config {args.config}: {err}") from None
        data.update({k: v for k, v in loaded.items() if k != "run"})
        # a file's overwrite never carries over: replacing a run is asked for on the command
        data["run"].update({k: v for k, v in loaded.get("run", {}).items() if k != "overwrite"})
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    for name, value in vars(args).items():  # only the flags given (their default: SUPPRESS)
        if name in run_fields:
            data["run"][name] = value
        elif name in grpo_fields:
            data[name] = value
    return GRPOConfig.from_dict(data)


def _train(args: argparse.Namespace) -> int:
    import torch

    from grpo_trainer.base import distributed
    from grpo_trainer.run.trainer import open_run

    config = config_from_args(args)
    # Under torchrun: join the process group; each rank gets its own device and envs.
    device = distributed.init_from_env(resolve_device(config.run.device))
    if not distributed.is_main():
        logging.getLogger().setLevel(logging.WARNING)  # rank 0 reports progress
    try:
        trainer = open_run(config, device)
        torch.set_float32_matmul_precision("high")
        metrics = trainer.train()  # as a script's .train(): a resumed run keeps its best.pt
        trainer.env.envs.close()
    finally:
        distributed.shutdown()
    if trainer.stop_signal:  # stopped early, checkpoint written: 128 + signal, as shells do
        number = getattr(signal.Signals, trainer.stop_signal, signal.SIGTERM)
        return 128 + int(number)
    return 0 if metrics or trainer.config.run.resume else 1


def _sweep(args: argparse.Namespace) -> int:
    from grpo_trainer.tools.search_space import load_space
    from grpo_trainer.tools.sweep import best_trial, import_optuna, run_sweep

    import_optuna()
    if args.trials < 1:
        raise ValueError(f"argument --trials: must be at least 1, got {args.trials}")
    try:
        params = load_space(args.space)
    except ValueError as err:
        raise ValueError(f"argument --space: {err}") from None
    try:
        base = config_from_args(argparse.Namespace(config=args.config))
    except ValueError as err:
        raise ValueError(f"argument --config: {err}") from None
    study = run_sweep(
        params,
        base,
        args.trials,
        args.sweep_dir,
        objective=args.objective,
        pruner=args.pruner,
        seed=args.seed,
        study_name=args.study_name,
    )
    best = best_trial(study)
    if best is None:
        print(f"no trial completed; see {args.sweep_dir / 'results.csv'}")
        return 1
    print(f"best trial {best.number}: {args.objective} {best.value:.4g} {best.params}")
    print(f"train it: python -m grpo_trainer train --config {args.sweep_dir / 'best_config.json'}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    if args.episodes < 1:
        raise ValueError(f"--episodes must be at least 1, got {args.episodes}")
    num_envs = args.num_envs or min(args.episodes, MAX_EVAL_ENVS)
    policy, envs = open_policy(args.checkpoint, resolve_device(args.device), num_envs)
    result = evaluate(policy, envs, args.episodes, greedy=not args.sampled, seed=args.seed)
    result["greedy"] = float(not args.sampled)
    if args.json:
        print(json.dumps(result))
    else:
        for name, value in result.items():
            print(f"{name:>24}  {value:.4f}")
    return 0


def _play(args: argparse.Namespace) -> int:
    mode = "ansi" if args.ansi else "rgb_array"
    policy, envs = open_policy(args.checkpoint, resolve_device(args.device), render_mode=mode)
    frames = play_episode(policy, envs, steps=args.steps, seed=args.seed)
    if args.ansi:
        for frame in frames:
            print(frame, end="\n\n")
        return 0
    write_animation(frames, args.out, fps=args.fps)
    print(f"wrote {len(frames)} frames to {args.out}")
    return 0


def _check(args: argparse.Namespace) -> int:
    """The conformance checks on the env `train` would build (`make_envs`), at two sizes for
    the num_envs invariance check; 0 when no check failed, 1 when one did."""
    from grpo_trainer.tools.checker import check_vector_env

    for flag in ("num_envs", "steps", "max_steps"):
        if getattr(args, flag) < 1:
            raise ValueError(f"argument {_flag(flag)}: must be at least 1")
    device = resolve_device(args.device)
    run = RunConfig(env=args.env_id, env_kwargs=args.env_kwargs, device=args.device, seed=args.seed)
    config = GRPOConfig(run=run)
    mode = args.vectorization_mode
    extra = {} if mode is None else {"vectorization_mode": mode}

    def make(num_envs: int) -> Any:
        return make_envs(config, num_envs, device, **extra)

    try:
        env = make(args.num_envs)
    except (TypeError, ValueError) as err:  # the env's own check of its kwargs
        raise ValueError(
            f"argument env_id/--env-kwargs: cannot make {args.env_id!r} with "
            f"{args.env_kwargs}: {err}"
        ) from None
    try:
        report = check_vector_env(
            env,
            seed=args.seed,
            steps=args.steps,
            max_steps=args.max_steps,
            strict_syncs=args.strict_syncs,
            make_env=make,
        )
    finally:
        env.close()
    print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    commands = {"train": _train, "eval": _eval, "play": _play, "sweep": _sweep, "check": _check}
    command = commands[args.command]
    del args.command, args.verbose
    name = command.__name__[1:]
    try:
        return command(args)
    except ValueError as err:
        parser.exit(2, f"grpo {name}: error: {_name_flag(parser, name, str(err))}\n")
    except ImportError as err:
        if err.name not in EXTRAS:  # a missing extra is the user's to install; else a bug
            raise
        parser.exit(2, f"grpo {name}: error: {err}\n")
    except OSError as err:
        parser.exit(1, f"grpo {name}: error: {err}\n")
    except KeyboardInterrupt:
        if name == "sweep":
            parser.exit(130, "grpo sweep: interrupted; the same command continues the sweep\n")
        parser.exit(130, f"grpo {name}: interrupted; nothing saved since the last checkpoint\n")
    except Exception as err:
        from grpo_trainer.run.harness import TrainingStopped

        if isinstance(err, checkpoint.CheckpointError):  # a bad --resume or --checkpoint
            flag = "--resume" if name == "train" else "--checkpoint"
            parser.exit(2, f"grpo {name}: error: argument {flag}: {err}\n")
        if isinstance(err, TrainingStopped):
            parser.exit(1, f"grpo {name}: error: {err}\n")
        if isinstance(err.__cause__, OSError):  # e.g. the metrics writer hit a full disk
            parser.exit(1, f"grpo {name}: error: {err}\n")
        raise
    return 0


def _name_flag(parser: argparse.ArgumentParser, command: str, message: str) -> str:
    """Prefix `argument --flag:` (argparse's own style) when a message starts with a field name.

    Config validation names fields (`num_groups must be ...`); on the command line the
    user typed `--num-groups`, so that is what the error should say.
    """
    if message.startswith(("argument ", "--")):
        return message
    word = re.match(r"[a-z_]+", message)
    sub = next(
        (a.choices[command] for a in parser._actions if isinstance(a, argparse._SubParsersAction)),
        None,
    )
    if word is None or sub is None:
        return message
    flags = {a.dest: a.option_strings[0] for a in sub._actions if a.option_strings}
    flag = flags.get(word.group(0))
    return f"argument {flag}: {message}" if flag else message


if __name__ == "__main__":
    sys.exit(main())
