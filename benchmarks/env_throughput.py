"""Env-steps per second of FruitCatcher-v0: the vector env's eager and compiled steps against
the game's readable rules run eagerly on the kit (what a game gets with no form of its own and
no compile: the straightforward torch version), timed in one run.

    python benchmarks/env_throughput.py            # full: 64 .. 65536 envs (CPU), both obs modes
    python benchmarks/env_throughput.py --quick    # 1024 and 16384 envs, fewer blocks
    python benchmarks/env_throughput.py --device cuda --sizes 1048576 4194304
    python benchmarks/env_throughput.py --ab f0a5dfb HEAD --sizes 16384   # git revisions A/B

What one run does, in order (CPU; CUDA is the same without the cold phase's meaning):

1. Points `FRUIT_ENV_CACHE_DIR` at an empty folder (or `--cache-dir`): the state of a new
   machine. `gymnasium.make_vec("FruitCatcher-v0", num_envs=N)`, the default, runs the eager
   step (`compile="auto"` is the eager step on every device); recorded.
2. Builds the compiled step in a fresh process with an empty inductor cache too: the
   once-per-machine compile time.
3. Starts a second fresh process that makes a `compile=True` env, resets it and steps once,
   for two sizes: how soon a new process steps once the package is cached (wall time from
   interpreter start, `import torch` and the rest, and from the env's construction).
4. Times, at each size, in turns (one block of each variant, round after round, so that a
   change in a shared machine's load hits all alike): the readable rules run eagerly
   ("readable"), the eager step (`compile=False`, the CPU default: the rules' eager form),
   the compiled step (`compile=True`), and Gymnasium's `SyncVectorEnv` of the single-game
   env at small sizes. Ratios are to the readable rules' median block at that size, and per
   round (the paired ratio: the median over rounds of the two blocks' ratio).

Actions are random integers in {0, 1, 2}, generated before timing as a bank of int64 tensors
on the device; each step takes the next. Envs use their defaults (NEXT_STEP autoreset,
action validation: on the CPU one flag read per step).
On CUDA a block ends with `torch.cuda.synchronize()`. The JSON (`benchmarks/results/`)
keeps every block, the machine, the versions and the settings.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, median_time, write_result

import fruit_env  # registers FruitCatcher-v0

ROOT = Path(__file__).resolve().parents[1]
CPU_SIZES = (64, 256, 1024, 4096, 16384, 65536)
GPU_SIZES = (64, 1024, 16384, 65536, 262144, 1048576, 4194304)
PIXEL_SIZES = (256, 4096, 16384)
SYNC_SIZES = (64, 256)
QUICK_SIZES = (1024, 16384)
REFERENCE_ENVS = 16384
ACTION_BANK_BYTES = 256 * 2**20  # at most this much memory for pre-generated actions
TARGET_ENV_STEPS = 4_000_000  # env steps per timed block (before the clamps in `block_steps`)


def block_steps(num_envs: int, quick: bool, divide: int = 1) -> int:
    """Steps per timed block: about TARGET_ENV_STEPS / divide env steps, 5 to 500 steps."""
    target = TARGET_ENV_STEPS // divide // (4 if quick else 1)
    return max(5, min(500, target // num_envs))


def action_bank(num_envs: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """`(K, num_envs)` int64 random actions on `device`, K in [4, 64] within the byte budget."""
    k = max(4, min(64, ACTION_BANK_BYTES // (8 * num_envs)))
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, 3, (k, num_envs), generator=gen, device=device)


def make_stepper(env: Any, actions: Any, steps: int) -> Callable[[], None]:
    """A function that steps `env` `steps` times through the bank `actions`."""
    count = len(actions)
    position = [0]

    def run() -> None:
        i = position[0]
        for _ in range(steps):
            env.step(actions[i])
            i = (i + 1) % count
        position[0] = i

    return run


def make_env(n: int, device: torch.device, obs_mode: str, **kwargs: Any) -> Any:
    return gym.make_vec("FruitCatcher-v0", num_envs=n, device=device, obs_mode=obs_mode, **kwargs)


def time_variants(
    variants: dict[str, tuple[Callable[[], None], int]],
    n: int,
    repeats: int,
    sync: Callable[[], object] | None,
) -> dict[str, dict[str, Any]]:
    """Blocks of each variant in turns (alternating the order each round): wall and CPU
    seconds per block, page faults."""
    out: dict[str, dict[str, Any]] = {
        name: {"steps_per_block": steps, "block_seconds": [], "block_cpu_seconds": [], "faults": 0}
        for name, (_, steps) in variants.items()
    }
    names = list(variants)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            run, _ = variants[name]
            before = _minor_faults()
            timing = median_time(run, repeats=1, warmup=0, sync=sync)
            out[name]["faults"] += _minor_faults() - before
            out[name]["block_seconds"] += timing.wall
            out[name]["block_cpu_seconds"] += timing.cpu
    for row in out.values():
        steps = row["steps_per_block"]
        row["env_steps_per_s"] = n * steps / statistics.median(row["block_seconds"])
        row["minor_page_faults_per_step"] = row.pop("faults") / (repeats * steps)
    return out


def readable_env(n: int, device: torch.device, obs_mode: str) -> Any:
    """FruitCatcher's readable rules run eagerly on the kit, without the rules' eager form."""
    from fruit_env.games.fruit_catcher.rules import FruitCatcher
    from fruit_env.kit import TensorVectorEnv

    class Readable(FruitCatcher):
        def eager_form(self, num_envs: int, device: torch.device) -> FruitCatcher:
            return self

    game = Readable(fruit_env.FruitParams(obs_mode=obs_mode))
    return TensorVectorEnv(game, n, device=device, compile=False)


def bench_size(
    n: int, obs_mode: str, device: torch.device, repeats: int, quick: bool, sync_sizes: tuple
) -> list[dict[str, Any]]:
    """Readable, eager, compiled (and SyncVectorEnv) at one size, in turns."""
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    actions = action_bank(n, device)
    variants: dict[str, tuple[Callable[[], None], int]] = {}
    flags: dict[str, bool] = {}
    steps = block_steps(n, quick)
    envs = {
        "readable": readable_env(n, device, obs_mode),
        "eager": make_env(n, device, obs_mode, compile=False),
        "compiled": make_env(n, device, obs_mode, compile=True),
    }
    for name, env in envs.items():
        env.reset(seed=0)
        flags[name] = env.compiled
        variants[name] = (make_stepper(env, actions, steps), steps)
    if n in sync_sizes and obs_mode == "features":
        env = gym.make_vec("FruitCatcher-v0", num_envs=n, vectorization_mode="sync")
        env.reset(seed=0)
        bank = list(np.random.default_rng(0).integers(0, 3, size=(64, n)))
        steps = block_steps(n, quick, 40)
        variants["gymnasium_sync"] = (make_stepper(env, bank, steps), steps)
    for run, _ in variants.values():
        run()  # warm-up block
    timed = time_variants(variants, n, repeats, sync)
    rows = []
    base = timed["readable"]
    for name, row in timed.items():
        paired = [
            (n * row["steps_per_block"] / t) / (n * base["steps_per_block"] / b)
            for t, b in zip(row["block_seconds"], base["block_seconds"], strict=True)
        ]
        rows.append(
            {
                "impl": name,
                "obs_mode": obs_mode,
                "num_envs": n,
                **row,
                "compiled": flags.get(name),
                "over_readable": row["env_steps_per_s"] / base["env_steps_per_s"],
                "over_readable_paired": statistics.median(paired),
            }
        )
        print_row(rows[-1])
    return rows


def print_row(row: dict[str, Any]) -> None:
    print(
        f"{row['obs_mode']:<8} {row['impl']:<15} {row['num_envs']:>9,} envs "
        f"{row['env_steps_per_s']:>15,.0f} env-steps/s  {row['over_readable']:7.2f}x readable "
        f"(paired {row['over_readable_paired']:.2f}x)",
        flush=True,
    )


# -- compile cost, second process ------------------------------------------------------------


_FIRST_STEP = """
import time
t0 = time.perf_counter()
import json, sys, torch
import gymnasium as gym
import fruit_env
t1 = time.perf_counter()
n, obs_mode, device = int(sys.argv[1]), sys.argv[2], sys.argv[3]
env = gym.make_vec("FruitCatcher-v0", num_envs=n, obs_mode=obs_mode, device=device, compile=True)
env.reset(seed=0)
env.step(torch.ones(n, dtype=torch.int64, device=device))
if device.startswith("cuda"):
    torch.cuda.synchronize()
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "make_reset_step_s": t2 - t1, "compiled": env.compiled}))
"""

_BUILD = """
import sys, time
import torch
from fruit_env import FruitCatcherVectorEnv
t0 = time.perf_counter()
env = FruitCatcherVectorEnv(64, obs_mode=sys.argv[1], device=sys.argv[2], compile=True)
print(time.perf_counter() - t0, env.compiled)
"""


def _python(code: str, *args: str, env: dict[str, str] | None = None) -> tuple[str, float]:
    """Run `code` in a fresh interpreter; its last stdout line and the process's wall time."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return done.stdout.strip().splitlines()[-1], time.perf_counter() - started


def cold_then_warm(obs_mode: str, device: torch.device, sizes: tuple[int, ...]) -> dict[str, Any]:
    """The default env with an empty cache; the compile in a fresh process (fresh inductor
    cache too); then a second process's time to its first step, at `sizes`."""
    default = make_env(64, device, obs_mode)
    result: dict[str, Any] = {"default_compiled_with_empty_cache": default.compiled}
    with tempfile.TemporaryDirectory() as inductor_cache:
        line, wall = _python(
            _BUILD, obs_mode, str(device), env={"TORCHINDUCTOR_CACHE_DIR": inductor_cache}
        )
    seconds, built = line.split()
    result["compile_seconds_cold"] = float(seconds)
    result["compile_process_seconds"] = wall
    assert built == "True", "the compiled step could not be built"
    result["second_process"] = []
    for n in sizes:
        line, wall = _python(_FIRST_STEP, str(n), obs_mode, str(device))
        row = {"num_envs": n, "process_wall_s": wall, **json.loads(line)}
        result["second_process"].append(row)
        first = row["make_reset_step_s"]
        print(
            f"{obs_mode:<8} second process, {n:,} envs: first step {first:.3f} s after the "
            f"imports ({row['import_s']:.2f} s; whole process {wall:.2f} s, "
            f"compiled={row['compiled']})",
            flush=True,
        )
    print(
        f"{obs_mode:<8} default with an empty cache: compiled={default.compiled}; "
        f"cold compile {result['compile_seconds_cold']:.1f} s",
        flush=True,
    )
    return result


def copy_bandwidth(device: torch.device) -> dict[str, float]:
    """GB/s (bytes read + written) of `dst.copy_(src)`: 256 MiB (memory) and 2 MiB (cache),
    median of 7 timings: the roofline's memory ceiling."""
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    result = {}
    for mib, number in ((256, 4), (2, 400)):
        src = torch.rand(mib * 2**18, device=device)
        dst = torch.empty_like(src)
        copy = functools.partial(dst.copy_, src)
        timing = median_time(copy, repeats=7, warmup=2, number=number, sync=sync)
        result[f"copy_{mib}MiB_GBps"] = 2 * src.nbytes / timing.median / 1e9
    return result


def _minor_faults() -> int:
    """Page faults so far: freshly allocated outputs that the C allocator had returned to the
    OS fault in again, which shows up as system time at large num_envs."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def summary_table(rows: list[dict[str, Any]], obs_mode: str) -> str:
    """Markdown: env-steps/s and the ratio to the readable rules per size and variant."""
    mine = [r for r in rows if r["obs_mode"] == obs_mode]
    by = {(r["impl"], r["num_envs"]): r for r in mine}
    lines = [
        "| num_envs | readable | eager | compiled | eager / readable | compiled / readable "
        "| SyncVectorEnv |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sorted({r["num_envs"] for r in mine}):

        def rate(impl: str, n: int = n) -> str:
            row = by.get((impl, n))
            return f"{row['env_steps_per_s'] / 1e6:,.2f}M" if row else "-"

        def ratio(impl: str, n: int = n) -> str:
            row = by.get((impl, n))
            return f"{row['over_readable']:.2f}x" if row else "-"

        lines.append(
            f"| {n:,} | {rate('readable')} | {rate('eager')} | {rate('compiled')} "
            f"| {ratio('eager')} | {ratio('compiled')} | {rate('gymnasium_sync')} |"
        )
    return "\n".join(lines)


# -- A/B of git revisions ------------------------------------------------------------------------


def ab_main(args: argparse.Namespace, sizes: tuple[int, ...], device: torch.device) -> None:
    """Each (size, eager/compiled) with `fruit_env` from each revision, in fresh processes,
    the revisions in turns, `--repeats` rounds (default 3)."""
    rounds = args.repeats or 3
    results: dict[str, list[dict[str, Any]]] = {rev: [] for rev in args.ab}
    with tempfile.TemporaryDirectory() as tmp:
        for rev in args.ab:
            folder = Path(tmp) / rev.replace("/", "_")
            (folder / "cache").mkdir(parents=True)
            archive = subprocess.run(
                ["git", "archive", rev, "fruit_env"], cwd=ROOT, capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
        for r in range(rounds):
            for rev in args.ab if r % 2 == 0 else args.ab[::-1]:
                folder = Path(tmp) / rev.replace("/", "_")
                env = {
                    **os.environ,
                    "PYTHONPATH": str(folder),  # ahead of the installed fruit_env
                    "TORCHINDUCTOR_CACHE_DIR": str(folder / "cache"),
                    "FRUIT_ENV_CACHE_DIR": str(folder / "cache"),
                }
                job = {"sizes": sizes, "device": str(device), "threads": args.threads}
                command = [sys.executable, __file__, "--ab-worker", json.dumps(job)]
                done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{rev}: {done.stderr.strip()[-2000:]}")
                rows = json.loads(done.stdout.strip().splitlines()[-1])
                for row in rows:
                    row["round"] = r
                    print(
                        f"{rev:>10} round {r}: {row['impl']} {row['num_envs']:,} envs "
                        f"{row['env_steps_per_s']:,.0f} env-steps/s"
                    )
                results[rev] += rows
    summary: dict[str, dict[str, Any]] = {}
    for rev, rows in results.items():
        for impl in ("eager", "compiled"):
            for n in sizes:
                mine = [x for x in rows if x["impl"] == impl and x["num_envs"] == n]
                seconds = [t for x in mine for t in x["block_seconds"]]
                per_s = n * mine[0]["steps_per_block"] / statistics.median(seconds)
                summary[f"{rev} {impl} {n}"] = {"env_steps_per_s": per_s}
                print(f"{rev:>10} {impl:<10} {n:>9,} envs {per_s:>15,.0f} env-steps/s")
    path = write_result(
        args.output or "env_throughput_ab",
        {
            "machine": machine_info(),
            "revisions": args.ab,
            "rounds": rounds,
            "summary": summary,
            "rows": results,
        },
    )
    print(f"\nwrote {path}")


def ab_worker(job: dict[str, Any]) -> None:
    """One round for `--ab`: eager and compiled at each size, 3 timed blocks each (only the
    env's own `compile` flag is used, which every revision has)."""
    if job["threads"]:
        torch.set_num_threads(job["threads"])
    device = torch.device(job["device"])
    rows = []
    for n in job["sizes"]:
        actions = action_bank(n, device)
        variants = {}
        for name, choice in (("eager", False), ("compiled", True)):
            env = gym.make_vec("FruitCatcher-v0", num_envs=n, device=device, compile=choice)
            env.reset(seed=0)
            env.step(actions[0])
            steps = block_steps(n, False)
            variants[name] = (make_stepper(env, actions, steps), steps)
            variants[name][0]()
        sync = torch.cuda.synchronize if device.type == "cuda" else None
        for name, row in time_variants(variants, n, 3, sync).items():
            rows.append({"impl": name, "num_envs": n, **row})
    print(json.dumps(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two sizes, fewer repeats")
    parser.add_argument(
        "--device", default="auto", help="cpu, cuda, cuda:1, ... (auto: cuda if any)"
    )
    parser.add_argument("--sizes", type=int, nargs="+", help="num_envs values (features)")
    parser.add_argument("--pixel-sizes", type=int, nargs="*", help="num_envs values (pixels)")
    parser.add_argument("--sync-sizes", type=int, nargs="*", help="num_envs for SyncVectorEnv")
    parser.add_argument("--repeats", type=int, help="timed blocks per variant (default 7, quick 3)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--cache-dir", help="FRUIT_ENV_CACHE_DIR to use (default: a new empty one)")
    parser.add_argument("--output", help="results file name (default from mode and device)")
    parser.add_argument("--ab", nargs="+", metavar="REV", help="compare git revisions of fruit_env")
    parser.add_argument("--ab-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ab_worker:
        ab_worker(json.loads(args.ab_worker))
        return

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    on_gpu = device.type == "cuda"
    sizes = tuple(args.sizes or (QUICK_SIZES if args.quick else GPU_SIZES if on_gpu else CPU_SIZES))
    pixel_sizes = tuple(
        args.pixel_sizes
        if args.pixel_sizes is not None
        else (16384,)
        if args.quick
        else PIXEL_SIZES
    )
    sync_sizes = tuple(args.sync_sizes if args.sync_sizes is not None else SYNC_SIZES)
    repeats = args.repeats or (3 if args.quick else 7)
    print(f"FruitCatcher-v0 env-steps/s on {device} ({torch.get_num_threads()} torch threads)")
    if args.ab:
        ab_main(args, tuple(args.sizes or (REFERENCE_ENVS,)), device)
        return

    started = time.perf_counter()
    machine = machine_info()  # load average at the start; the end's is added below
    folder = tempfile.TemporaryDirectory()
    os.environ["FRUIT_ENV_CACHE_DIR"] = args.cache_dir or folder.name
    bandwidth = copy_bandwidth(device)
    print("copy bandwidth (GB/s, read + write):", {k: round(v, 1) for k, v in bandwidth.items()})
    startup = {}
    for obs_mode, mode_sizes in (("features", sizes), ("pixels", pixel_sizes)):
        if mode_sizes:
            startup[obs_mode] = cold_then_warm(obs_mode, device, (REFERENCE_ENVS, 1000))
    rows: list[dict[str, Any]] = []
    for obs_mode, mode_sizes in (("features", sizes), ("pixels", pixel_sizes)):
        for n in mode_sizes:
            rows += bench_size(n, obs_mode, device, repeats, args.quick, sync_sizes)
    tables = {obs_mode: summary_table(rows, obs_mode) for obs_mode in ("features", "pixels")}
    for obs_mode, table in tables.items():
        print(f"\n{obs_mode}\n{table}")
    summary = {
        f"{r['obs_mode']} {r['impl']} {r['num_envs']}": {
            "env_steps_per_s": r["env_steps_per_s"],
            "over_readable": r["over_readable"],
            "over_readable_paired": r["over_readable_paired"],
        }
        for r in rows
    }
    name = args.output or "env_throughput" + ("_quick" if args.quick else "") + (
        f"_{device.type}" if on_gpu else ""
    ) + (f"_threads{args.threads}" if args.threads else "")
    path = write_result(
        name,
        {
            "machine": machine,
            "load_average_end": os.getloadavg(),
            "device": str(device),
            "bandwidth": bandwidth,
            "settings": {
                "quick": args.quick,
                "repeats": repeats,
                "autoreset_mode": "NEXT_STEP",
                "validate_actions": "default (CPU: immediate; CUDA: deferred)",
                "actions": "bank of int64 torch.randint tensors on the device, made before timing",
                "fruit_env_cache_dir": "given" if args.cache_dir else "new, empty",
            },
            "startup": startup,
            "summary": summary,
            "tables": tables,
            "rows": rows,
            "total_seconds": time.perf_counter() - started,
        },
    )
    folder.cleanup()
    print(f"\nwrote {path} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
