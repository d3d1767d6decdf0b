"""The GPU's checks in one short sitting (`make gpu-check`): every check that needs CUDA.

    python scripts/gpu_check.py                      # every step, within 8 minutes
    python scripts/gpu_check.py --budget 300 --only games train
    python scripts/gpu_check.py --out "$OUT"         # the report somewhere else

Steps, most important first, each in its own process with a time limit (a step that crashes
loses nothing measured before it), progress printed as they go:

1. `games`: every kit game registered by `import fruit_env`, made on CUDA with the defaults
   (what `make_vec` gives), plays the same seeds and actions as on the CPU, bit for bit, one
   process per game. No crash, which step ran, the seconds `make_vec` took (a compiled
   package's build and check: `scripts/aoti_cuda_probe.py`);
2. `train`: `make train`'s command on CUDA (`python -m grpo_trainer train` with no flags):
   first update, training seconds and env steps to a greedy 0.70, the final catch rate,
   env steps per second, the config the device derived;
3. `profile`: host-sync ops of one default update (`SyncCounter` around `collect()` and
   `learn()`), device-to-host copies and kernel launches the profiler sees, whether sampling
   and the loss ran compiled, peak memory;
4. `train_modes`: `train` again with each of `TRAIN_MODES`' flags (the compiled update, in
   CUDA graphs or not), each stopped at 0.70;
5. `throughput`: env only, as `make_vec` gives it (Fruit Catcher 4k to 4M sub-envs, against
   the device's copy bandwidth as the roofline; Breakout against gymnax's `jit(vmap(step))`
   at 4k and 262k), env + policy, and full training at 131k sub-envs (bf16 autocast beside);
6. `step_modes`: the kit's step graph (what a package is built from) eager, under
   `torch.compile`, and each captured in a CUDA graph, at a small and a large size: whether
   each plays the eager step's games, and its env steps per second;
7. `tests`: the tests that need CUDA (they skip elsewhere), but those that build a package;
8. `package_tests`: the CUDA tests that build a compiled-step package (minutes each).

The report, `gpu_check.json` and `gpu_check.md` (the device, driver and torch named), goes to
benchmarks/results/ or `--out`, rewritten after every step. The steps share the `--budget`
(480 s by default) and each has its own limit (`STEP_LIMITS_S`, together within the budget,
so one call runs steps 1-7); `package_tests` get what the others leave. A step with under
`MIN_STEP_S` left is skipped and says so. Children keep the caller's `PYTHONPATH` (the
repository is put in front of it). On a machine without CUDA the script refuses in one line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TOTAL_LIMIT_S = 480  # the whole check's default budget: one sitting on a lent GPU
MIN_STEP_S = 20  # a step with less time left than this is skipped
STEPS = (
    *("games", "train", "profile", "train_modes", "throughput", "step_modes", "tests"),
    "package_tests",
)
# Each step's own limit, so that one slow step cannot starve the rest of the sitting. They
# sum to TOTAL_LIMIT_S. The H200 sitting of 2026-11-27 (docs/performance.md, "On a GPU")
# took games 32 s, train 59 s, profile 23 s, train_modes 57 s, step_modes 44 s and tests
# 33 s; throughput was cut at its 40 s before its bf16 row, so it gets 20 s of step_modes'
# room. A step cut short keeps what its worker saved so far. package_tests (the CUDA tests
# that build a compiled-step package, minutes each) get what the others leave.
STEP_LIMITS_S = {
    "games": 60,
    "train": 90,
    "profile": 40,
    "train_modes": 100,
    "throughput": 60,
    "step_modes": 80,
    "tests": 50,
}
DEVICE = "cuda"  # the workers' device; the tests run them on the CPU as stand-ins
WORKER_STEPS = ("games", "game", "profile", "train_modes", "throughput", "step_modes")
# The defaults' rivals on a GPU: `make train` again with the flags of each, so that what
# the defaults compile is chosen by the time to 0.70 on the device. The defaults compile
# nothing there since the H200 run of 2026-11-27 (docs/performance.md, "On a GPU"), where
# `--no-compile` reached 0.70 first; the rivals are the compiled update, and the compiled
# update in CUDA graphs.
TRAIN_MODES = {
    "compile": ["--compile"],
    "compile_cuda_graphs": ["--compile", "--compile-mode", "reduce-overhead"],
}
# The rivals stop at 0.70 (what they are compared by), to leave the sitting's time to the
# steps after them; the train step itself runs make train whole, for its final catch rate.
TRAIN_MODES_STOP = ("--target", "catch_rate=0.70")


def child_env() -> dict[str, str]:
    """The caller's environment with the repository in front of its `PYTHONPATH` (packages
    the caller put there, gymnasium say, stay visible)."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def run_step(command: list[str], result_file: Path | None, timeout: float) -> dict[str, Any]:
    """Run one step's command; its result is the JSON it wrote to `result_file` (whatever
    it printed on the way), its output's tail is kept for the record."""
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout
        )
        code, out = done.returncode, done.stdout[-3000:] + done.stderr[-3000:]
    except subprocess.TimeoutExpired as err:
        code, out = -1, f"timed out after {timeout:.0f} s: {str(err.stdout)[-2000:]}"
    record: dict[str, Any] = {
        "command": " ".join(command),
        "returncode": code,
        "seconds": round(time.perf_counter() - start, 1),
        "tail": out,
    }
    if result_file is not None and result_file.exists():
        record["result"] = json.loads(result_file.read_text())
    return record


def run_steps(
    commands: dict[str, tuple[list[str], Path | None]],
    report: dict[str, Any],
    results: Path,
    total_limit_s: float = TOTAL_LIMIT_S,
    step_limits: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Run the steps in order within `total_limit_s`, each within its own limit too
    (`step_limits`, none by default), writing the report after each one."""
    step_limits = step_limits or {}
    deadline = time.monotonic() + total_limit_s
    for i, (step, (command, result_file)) in enumerate(commands.items(), 1):
        left = deadline - time.monotonic()
        if left < MIN_STEP_S:
            report[step] = {"skipped": f"{left:.0f} s left of the {total_limit_s:.0f} s budget"}
            print(f"[{i}/{len(commands)}] {step}: skipped, out of time", flush=True)
        else:
            print(f"[{i}/{len(commands)}] {step}: {' '.join(command[1:])}", flush=True)
            report[step] = run_step(command, result_file, min(left, step_limits.get(step, left)))
            r = report[step]
            print(f"    done in {r['seconds']:.0f} s, exit {r['returncode']}", flush=True)
        write_report(report, list(commands)[:i], results)
    return report


def write_report(report: dict[str, Any], steps: list[str], results: Path) -> None:
    """gpu_check.json (everything) and gpu_check.md (a line per step) in `results`."""
    results.mkdir(parents=True, exist_ok=True)
    (results / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        f"GPU check on {report.get('device')} (driver {report.get('driver')}, torch "
        f"{report.get('torch')}, {report.get('date')})",
        "",
        "| step | exit | seconds | result |",
        "|---|---|---|---|",
    ]
    for step in steps:
        r = report[step]
        if "skipped" in r:
            lines.append(f"| {step} | - | - | skipped: {r['skipped']} |")
            continue
        if "result" in r:
            summary = json.dumps({k: v for k, v in r["result"].items() if k != "top_kernels"})
        else:
            summary = (r["tail"].strip().splitlines() or [""])[-1]
        summary = summary.replace("|", "/")[:300]
        lines.append(f"| {step} | {r['returncode']} | {r['seconds']:.0f} | {summary} |")
    (results / "gpu_check.md").write_text("\n".join(lines) + "\n")


# -- the steps that run in this script, in a child process (`--worker STEP`) -------------------


def kit_games() -> list[str]:
    """The ids `import fruit_env` registers for `make_vec` (an entry point is a string or,
    for the MinAtar games, a function of `fruit_env.registration`)."""
    import gymnasium as gym

    import fruit_env  # noqa: F401  (registers its games)

    def module(entry: Any) -> str:
        return entry if isinstance(entry, str) else getattr(entry, "__module__", "")

    return sorted(
        name
        for name, spec in gym.registry.items()
        if spec.vector_entry_point and module(spec.vector_entry_point).startswith("fruit_env.")
    )


def _sync() -> None:
    import torch

    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def _save(result: dict[str, Any], out: Path) -> None:
    out.write_text(json.dumps(result, indent=1))


def _plays(env: Any, steps: int, seed: int) -> list[Any]:
    """Every output of a reset and `steps` steps of seeded random actions, on the host."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    n = env.num_envs
    outputs = [env.reset(seed=seed)[0]]
    for _ in range(steps):
        action = torch.randint(0, int(env.single_action_space.n), (n,), generator=gen)
        obs, reward, terminated, truncated, info = env.step(action.to(env.unwrapped.device))
        outputs += [obs, reward, terminated, truncated, *info["episode"].values()]
    return [t.cpu() for t in outputs]


def game_worker(env_id: str, out: Path, num_envs: int = 1024, steps: int = 300) -> None:
    """One game on CUDA with the defaults, against the CPU's games bit for bit."""
    import gymnasium as gym
    import torch

    import fruit_env  # noqa: F401  (registers its games in this process)

    result: dict[str, Any] = {"env": env_id}
    started = time.perf_counter()
    default = gym.make_vec(env_id, num_envs=num_envs, device=DEVICE)  # what users get
    result["make_vec_s"] = round(time.perf_counter() - started, 1)
    result["compiled"] = bool(default.unwrapped.compiled)
    result["captured"] = bool(default.unwrapped.captured)
    _save(result, out)
    cpu = _plays(gym.make_vec(env_id, num_envs=num_envs, device="cpu", compile=False), steps, 7)
    got = _plays(default, steps, 7)
    result["default_equals_cpu"] = len(got) == len(cpu) and all(
        a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, cpu, strict=True)
    )
    _save(result, out)


def games_worker(out: Path) -> None:
    """Every kit game at once, one process each (their packages build in parallel)."""
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        procs = {}
        for env_id in kit_games():
            file = Path(tmp) / f"{env_id}.json"
            command = [sys.executable, __file__, "--worker", "game", "--game", env_id]
            procs[env_id] = (
                subprocess.Popen([*command, "--out", str(file)], env=child_env()),
                file,
            )
        for env_id, (proc, file) in procs.items():
            code = proc.wait()
            row = json.loads(file.read_text()) if file.exists() else {}
            result[env_id] = {**row, "returncode": code}
            _save(result, out)
    if not all(r["returncode"] == 0 and r.get("default_equals_cpu") for r in result.values()):
        raise SystemExit("a game crashed or differs from the CPU's games")


def _trainer(num_groups: int | None = None, amp: str = "off") -> Any:
    """A trainer as `train` builds it on CUDA: the defaults, progress off."""
    import torch

    from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig
    from grpo_trainer.envs import make_envs

    torch.set_float32_matmul_precision("high")  # as the command line sets it
    config = GRPOConfig(
        num_groups=num_groups, run=RunConfig(progress=False, device=DEVICE, amp=amp)
    )
    return GRPOTrainer(make_envs(config, config.num_envs, torch.device(DEVICE)), config)


def profile_worker(out: Path) -> None:
    """Host syncs, device-to-host copies and launches of one default update; peak memory."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from grpo_trainer.tools.syncs import SyncCounter

    if DEVICE.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t = _trainer()
    for _ in range(3):
        t.update()
    with SyncCounter() as collect_syncs:
        rollout = t.collect()
    with SyncCounter() as learn_syncs:
        t.learn(rollout)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t.update()
        _sync()
    events = prof.key_averages()
    result = {
        "num_envs": t.config.num_envs,
        "sample_compiled": t.sample.compiled,  # torch.compile on, and it did not fall back
        "loss_compiled": t.loss.compiled,
        "compiled_regions_per_update": sum(
            e.count for e in events if e.key.startswith("Torch-Compiled Region")
        ),
        "eager_backward_nodes_per_update": sum(
            e.count
            for e in events
            if e.key.startswith("autograd::engine::evaluate_function")
            and "CompiledFunctionBackward" not in e.key
            and "AccumulateGrad" not in e.key
        ),
        "sync_ops_collect": collect_syncs.count,
        "sync_ops_learn": learn_syncs.count,
        # the CPU's one count per minibatch of its rows of weight 0; off on a GPU
        "drop_flat_rows": t.drop_flat_rows,
        "optimizer_steps_per_update": sum(
            e.count for e in events if e.key.startswith("Optimizer.step#")
        ),
        "device_to_host_copies_per_update": sum(e.count for e in events if "DtoH" in e.key),
        "kernel_launches_per_update": sum(e.count for e in events if e.key == "cudaLaunchKernel"),
        "graph_launches_per_update": sum(e.count for e in events if e.key == "cudaGraphLaunch"),
        "peak_mib": torch.cuda.max_memory_allocated() / 2**20
        if DEVICE.startswith("cuda")
        else None,
        "top_kernels": events.table(sort_by="cuda_time_total", row_limit=15),
    }
    _save(result, out)


def _rate(step: Any, steps: int, num_envs: int, sync: Any = None) -> float:
    """Env steps per second of `step()`: the benchmarks' `median_time`, 5 blocks of `steps`
    calls after a warm-up block, the device synchronised around each block."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _common import median_time

    sync = sync or _sync
    return num_envs / median_time(step, repeats=5, warmup=steps, number=steps, sync=sync).median


def _env_rate(env_id: str, num_envs: int, **kwargs: Any) -> dict[str, Any]:
    import gymnasium as gym
    import torch

    import fruit_env  # noqa: F401  (registers its games in this process)

    env = gym.make_vec(env_id, num_envs=num_envs, device=DEVICE, validate_actions=False, **kwargs)
    env.reset(seed=0)
    actions = torch.randint(0, int(env.single_action_space.n), (64, num_envs), device=DEVICE)
    i = iter(range(10**9))
    rate = _rate(lambda: env.step(actions[next(i) % 64]), 20, num_envs)
    state_bytes = 4 * env.unwrapped.layout.rows  # the packed state, read and written
    obs = env.single_observation_space
    out_bytes = int(obs.dtype.itemsize * max(1, int(torch.tensor(obs.shape).prod()))) + 4 + 3
    return {
        "steps_per_s": rate,
        "compiled": bool(env.unwrapped.compiled),
        "captured": bool(env.unwrapped.captured),
        "bytes_per_step": 2 * state_bytes + out_bytes,
    }


def _copy_bandwidth() -> float:
    """Bytes per second of a device-to-device copy of 1 GiB: the roofline's memory rate."""
    import torch

    a = torch.empty(2**28, dtype=torch.float32, device=DEVICE)
    b = torch.empty_like(a)
    return 2 * a.numel() * 4 * _rate(lambda: b.copy_(a), 5, 1)


def _gymnax_rate(num_envs: int) -> float:
    import gymnax
    import jax

    env, params = gymnax.make("Breakout-MinAtar")
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
    keys = jax.random.split(jax.random.PRNGKey(0), num_envs)
    _, state = jax.vmap(env.reset, in_axes=(0, None))(keys, params)
    actions = jax.random.randint(jax.random.PRNGKey(1), (num_envs,), 0, 3)
    holder = {"state": state}

    def one() -> None:
        _, holder["state"], *_ = step(keys, holder["state"], actions, params)

    return _rate(one, 20, num_envs, sync=lambda: jax.block_until_ready(holder["state"]))


def throughput_worker(out: Path) -> None:
    """Env only, env + policy, full training: the GPU tables of docs/performance.md."""
    result: dict[str, Any] = {"copy_bytes_per_s": _copy_bandwidth(), "env": [], "train": {}}
    _save(result, out)
    # The env as make_vec gives it (the eager step): a compiled step is step_modes' question
    # in this process, and a package's is the probe's (a compile=True row here would build
    # one, minutes of the sitting).
    for n in (4096, 65536, 1048576, 4194304):
        row = {"env": "FruitCatcher-v0", "num_envs": n, **_env_rate("FruitCatcher-v0", n)}
        row["roofline_fraction"] = (
            row["steps_per_s"] * row["bytes_per_step"] / result["copy_bytes_per_s"]
        )
        result["env"].append(row)
        _save(result, out)
    for n in (4096, 262144):
        row = {"env": "Breakout-MinAtar-v0", "num_envs": n}
        row.update(_env_rate("Breakout-MinAtar-v0", n))
        result["env"].append(row)
        _save(result, out)
        try:
            result["env"].append(
                {"env": "gymnax Breakout-MinAtar", "num_envs": n, "steps_per_s": _gymnax_rate(n)}
            )
        except Exception as err:  # no JAX on the machine: the row says so
            result["env"].append(
                {"env": "gymnax Breakout-MinAtar", "num_envs": n, "error": repr(err)}
            )
        _save(result, out)
    for amp in ("off", "bf16"):
        t = _trainer(num_groups=16384, amp=amp)  # 131,072 sub-envs
        started = time.perf_counter()
        t.update()
        first = time.perf_counter() - started
        updates = sorted((t.update() for _ in range(3)), key=lambda m: m["steps_per_s"])
        played = t.config.num_envs * t.config.rollout_steps
        result["train"][amp] = {
            "num_envs": t.config.num_envs,
            "first_update_s": first,
            "steps_per_s": updates[1]["steps_per_s"],  # env, policy and learning
            "env_and_policy_steps_per_s": played / updates[1]["rollout_s"],  # the rollout
        }
        _save(result, out)
        del t


# The sizes of the step_modes step: where launches dominate, and where memory does.
STEP_MODE_SIZES = {"FruitCatcher-v0": (4096, 1048576), "Breakout-MinAtar-v0": (4096, 262144)}
STEP_MODE_CHECK = 8  # steps each mode plays against the eager graph from the same start


def _step_graph(env_id: str, num_envs: int) -> tuple[Any, list[Any], int]:
    """The kit's step graph of `env_id` (`step_graph.StepGraph`: what a package is built from)
    and its inputs for `num_envs` freshly reset games: packed rows, keys and counters,
    which a step rewrites in place."""
    import gymnasium as gym
    import torch

    import fruit_env  # noqa: F401  (registers its games in this process)
    from fruit_env.kit import proof, step_graph

    env = gym.make_vec(env_id, num_envs=8, device=DEVICE, compile=False).unwrapped
    game, layout, mode = env.game, env.layout, env.autoreset_mode
    key = torch.arange(num_envs, dtype=torch.int64, device=DEVICE) * 7919 + 1
    inputs = proof.graph_inputs(game, layout, mode, key)
    return step_graph.StepGraph(game, layout, mode), inputs, game.num_actions


def _play_and_time(
    step: Any, capture: bool, start: list[Any], actions: Any
) -> tuple[list[Any], float]:
    """Every output and the state after each of `STEP_MODE_CHECK` steps from a copy of
    `start`, then env steps per second (`_rate`), of `step` called or captured (by the
    kit's `cuda_graph`, what compile="auto" runs on CUDA)."""
    from fruit_env.kit.captured import cuda_graph

    inputs, action = [t.clone() for t in start], actions[0].clone()
    call = cuda_graph(lambda: step(*inputs, action)) if capture else lambda: step(*inputs, action)
    for t, s in zip(inputs, start, strict=True):  # a capture's warm-up moved the state on
        t.copy_(s)
    played = []
    for i in range(STEP_MODE_CHECK):
        action.copy_(actions[i])
        played += [t.clone() for t in (*call(), *inputs)]
    feed = iter(range(10**9))

    def one() -> None:
        action.copy_(actions[next(feed) % actions.shape[0]])
        call()

    return played, _rate(one, 20, action.shape[0])


def step_modes_worker(out: Path, sizes: dict[str, tuple[int, ...]] | None = None) -> None:
    """Each env and size: the step graph eager, under `torch.compile` (inductor's kernels in
    this process: no package, no loader) and, on CUDA, each captured in a CUDA graph. Every
    mode first plays `STEP_MODE_CHECK` steps from a copy of one start, compared with the
    eager graph's (`equals_eager`), then is timed as `_rate` times a step."""
    import torch

    result: dict[str, Any] = {"rows": []}
    for env_id, env_sizes in (sizes or STEP_MODE_SIZES).items():
        for n in env_sizes:
            graph, start, num_actions = _step_graph(env_id, n)
            actions = torch.randint(0, num_actions, (64, n), device=DEVICE)
            started = time.perf_counter()
            jit = torch.compile(graph, dynamic=False)
            jit(*[t.clone() for t in start], actions[0])
            _sync()
            compile_s = time.perf_counter() - started
            modes = [("eager", graph, False), ("torch.compile", jit, False)]
            if DEVICE.startswith("cuda"):
                modes += [("eager, CUDA graph", graph, True)]
                modes += [("torch.compile, CUDA graph", jit, True)]
            reference: list[Any] = []
            for name, step, capture in modes:
                row: dict[str, Any] = {"env": env_id, "num_envs": n, "step": name}
                if name.startswith("torch.compile"):
                    row["compile_s"] = compile_s
                try:
                    played, row["steps_per_s"] = _play_and_time(step, capture, start, actions)
                    reference = reference or played
                    row["equals_eager"] = all(
                        torch.equal(a, b) for a, b in zip(played, reference, strict=True)
                    )
                except Exception as err:  # a mode that fails is a finding, not the end
                    row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
                result["rows"].append(row)
                _save(result, out)


def train_command(run_dir: Path) -> list[str]:
    """`make train`'s training command, with no flags beyond the run directory."""
    return [sys.executable, "-m", "grpo_trainer", "train", "--run-dir", str(run_dir)]


def summarise_train(run_dir: Path) -> dict[str, Any]:
    """What `make train` on CUDA showed: from the run's own metrics.jsonl and config.json."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "update" in r]
    evals = [r for r in rows if "eval_score" in r]
    reached = next((r for r in evals if r["eval_score"] >= 0.70), None)
    config = json.loads((run_dir / "config.json").read_text())
    return {
        "config": {
            k: config.get(k)
            for k in ("num_groups", "minibatch_size", "lr", "epochs", "total_env_steps")
        },
        "first_update_s": rows[0].get("warmup_s") if rows else None,
        "train_s": rows[-1].get("train_s") if rows else None,
        "steps_per_s_median": sorted(r["steps_per_s"] for r in rows)[len(rows) // 2]
        if rows
        else None,
        "reached_070_train_s": reached and reached.get("train_s"),
        "reached_070_wall_s": reached and reached.get("target_reached_s"),
        "reached_070_env_steps": reached and reached.get("env_steps"),
        "final_eval_score": evals[-1]["eval_score"] if evals else None,
    }


def train_modes_worker(out: Path, extra: tuple[str, ...] = ()) -> None:
    """`make train`'s command with each of `TRAIN_MODES`' flags (and `extra`), one after the
    other, each summarised as the train step is; the result is rewritten after each."""
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in TRAIN_MODES.items():
            run_dir = Path(tmp) / name
            command = [*train_command(run_dir), *flags, *TRAIN_MODES_STOP, *extra]
            started = time.perf_counter()
            done = subprocess.run(
                command, cwd=ROOT, env=child_env(), capture_output=True, text=True
            )
            row: dict[str, Any] = {
                "flags": flags,
                "command": " ".join(command[1:]),
                "returncode": done.returncode,
                "seconds": round(time.perf_counter() - started, 1),
                "tail": (done.stdout + done.stderr)[-1500:],
            }
            if (run_dir / "metrics.jsonl").exists():
                row.update(summarise_train(run_dir))
            result[name] = row
            _save(result, out)


def _worker(step: str, out: Path, game: str | None) -> None:
    if step == "game":
        assert game is not None
        game_worker(game, out)
    elif step == "games":
        games_worker(out)
    elif step == "profile":
        profile_worker(out)
    elif step == "train_modes":
        train_modes_worker(out)
    elif step == "throughput":
        throughput_worker(out)
    elif step == "step_modes":
        step_modes_worker(out)
    else:
        raise ValueError(f"unknown worker step {step!r}")


def _train_step(python: str, scratch: Path) -> list[str]:
    """`train` as a child that trains, then writes its summary as the step's result."""
    run_dir = scratch / "train-run"
    code = (
        "import json, subprocess, sys; sys.path.insert(0, sys.argv[1]);"
        "import gpu_check as g; from pathlib import Path;"
        "done = subprocess.run(g.train_command(Path(sys.argv[2])), env=g.child_env());"
        "Path(sys.argv[3]).write_text(json.dumps(g.summarise_train(Path(sys.argv[2]))));"
        "sys.exit(done.returncode)"
    )
    return [python, "-c", code, str(ROOT / "scripts"), str(run_dir), str(scratch / "train.json")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=STEPS, default=list(STEPS))
    parser.add_argument("--budget", type=float, default=TOTAL_LIMIT_S, help="seconds for all steps")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the report")
    parser.add_argument("--worker", choices=WORKER_STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--game", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu-check needs a CUDA GPU; this machine has none (torch.cuda.is_available() is False)"
        )
        return 2
    if args.worker:
        _worker(args.worker, args.out, args.game)
        return 0

    python = sys.executable
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    os.environ.setdefault("FRUIT_ENV_CACHE_DIR", str(scratch / "fruit_env_cache"))
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU

    def worker(step: str) -> tuple[list[str], Path]:
        file = scratch / f"{step}.json"
        return [python, __file__, "--worker", step, "--out", str(file)], file

    tests = [python, "-m", "pytest", "-q", "-rs", "-k", "cuda", "-p", "no:cacheprovider", "tests/"]
    if importlib.util.find_spec("xdist"):  # the package tests build packages in parallel
        tests += ["-n", "4"]
    everything: dict[str, tuple[list[str], Path | None]] = {
        "games": worker("games"),
        "train": (_train_step(python, scratch), scratch / "train.json"),
        "profile": worker("profile"),
        "train_modes": worker("train_modes"),
        "throughput": worker("throughput"),
        "step_modes": worker("step_modes"),
        "tests": ([*tests, "-m", "not package"], None),
        "package_tests": ([*tests, "-m", "package"], None),
    }
    commands = {step: everything[step] for step in STEPS if step in args.only}
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "driver": _driver(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "budget_s": args.budget,
    }
    report = run_steps(commands, report, args.out, args.budget, STEP_LIMITS_S)
    print(f"wrote {args.out / 'gpu_check.json'} and gpu_check.md")
    return 0 if all(report[s].get("returncode") == 0 for s in commands) else 1


def _driver() -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return None


if __name__ == "__main__":
    sys.exit(main())
