"""Env-steps per second of FruitCatcher-v0: the torch vector env (eager and torch.compile'd)
against Gymnasium's SyncVectorEnv of the single-game env (the per-game Python reference).

    python benchmarks/env_throughput.py            # full: 64 .. 65536 envs (CPU), 64 .. 4M (GPU)
    python benchmarks/env_throughput.py --quick    # under a minute once torch.compile is cached
    python benchmarks/env_throughput.py --device cuda --sizes 1048576 4194304
    python benchmarks/env_throughput.py --ab f0a5dfb HEAD --sizes 16384   # git revisions A/B

Method. Actions are random integers in {0, 1, 2}, generated before timing as a bank of
int64 tensors on the env's device (`torch.randint`, the dtype a Categorical policy samples);
each step takes the next tensor of the bank. An env is reset, stepped untimed (the first
compiled step includes torch.compile: its time is reported separately as the compile time),
then timed in `repeats` blocks of `steps` steps; the table shows the median block's env-steps
per second and the JSON keeps every block. Variants are timed in turns (eager block, compiled
block, eager block, ...), so that a change in a shared machine's load hits them alike. On
CUDA a block ends with `torch.cuda.synchronize()`.

`--ab REV ...` times `fruit_env` as it is at each git revision, in fresh processes launched in
turns (round-robin, alternating order), each with its own torch.compile cache: the first
round's compile time is a cold compile.

Envs use their defaults (NEXT_STEP autoreset, feature observations), except that on CUDA
`validate_actions=False`: the action check costs a device-to-host sync per step there (on the
CPU it is one flag read, and stays on).
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

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)

CPU_SIZES = (64, 256, 1024, 4096, 16384, 65536)
GPU_SIZES = (64, 1024, 16384, 65536, 262144, 1048576, 4194304)
SYNC_SIZES = (64, 256, 1024)
QUICK_SIZES = (1024, 16384)
QUICK_COMPILED_SIZES = (16384,)  # each size compiles anew (static shapes)
QUICK_SYNC_SIZES = (256,)
ACTION_BANK_BYTES = 256 * 2**20  # at most this much memory for pre-generated actions
TARGET_ENV_STEPS = 4_000_000  # env steps per timed block (before the clamps in `block_steps`)


def block_steps(num_envs: int, quick: bool, reference: bool = False) -> int:
    """Steps per timed block: about TARGET_ENV_STEPS env steps, 5 to 500 steps."""
    target = TARGET_ENV_STEPS // (40 if reference else 1) // (4 if quick else 1)
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


def bench_vector(
    sizes: tuple[int, ...],
    compiled_sizes: tuple[int, ...],
    device: torch.device,
    repeats: int,
    quick: bool,
    quiet: bool = False,
) -> list[dict[str, Any]]:
    rows = []
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    validate = device.type != "cuda"
    for n in sorted(set(sizes) | set(compiled_sizes)):
        steps = block_steps(n, quick)
        actions = action_bank(n, device)
        variants: dict[str, Callable[[], None]] = {}
        compile_s: float | None = None
        for name, use_compile in (("eager", False), ("compiled", True)):
            if n not in (compiled_sizes if use_compile else sizes):
                continue
            env = gym.make_vec(
                "FruitCatcher-v0",
                num_envs=n,
                device=device,
                compile=use_compile,
                validate_actions=validate,
            )
            env.reset(seed=0)
            t0 = time.perf_counter()
            env.step(actions[0])
            if sync is not None:
                sync()
            if use_compile:
                compile_s = time.perf_counter() - t0
            variants[name] = make_stepper(env, actions, steps)
            variants[name]()  # warm-up block
        timings: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        faults: dict[str, int] = dict.fromkeys(variants, 0)
        for _ in range(repeats):  # variants in turns
            for name, run in variants.items():
                before = _minor_faults()
                timing = median_time(run, repeats=1, warmup=0, sync=sync)
                faults[name] += _minor_faults() - before
                timings[name] += timing.wall
                cpu[name] += timing.cpu
        for name in variants:
            rows.append(
                {
                    "impl": f"vector_{name}",
                    "num_envs": n,
                    "steps_per_block": steps,
                    "block_seconds": timings[name],
                    "block_cpu_seconds": cpu[name],
                    "env_steps_per_s": n * steps / statistics.median(timings[name]),
                    "compile_seconds": compile_s if name == "compiled" else None,
                    "minor_page_faults_per_step": faults[name] / (repeats * steps),
                }
            )
            if not quiet:
                print_row(rows[-1])
    return rows


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


def bench_sync(sizes: tuple[int, ...], repeats: int, quick: bool) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        steps = block_steps(n, quick, reference=True)
        env = gym.make_vec("FruitCatcher-v0", num_envs=n, vectorization_mode="sync")
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        actions = list(rng.integers(0, 3, size=(64, n)))
        timing = median_time(make_stepper(env, actions, steps), repeats=repeats, warmup=1)
        env.close()
        rows.append(
            {
                "impl": "gymnasium_sync",
                "num_envs": n,
                "steps_per_block": steps,
                "block_seconds": timing.wall,
                "block_cpu_seconds": timing.cpu,
                "env_steps_per_s": n * steps / timing.median,
                "compile_seconds": None,
                "minor_page_faults_per_step": None,
            }
        )
        print_row(rows[-1])
    return rows


def print_row(row: dict[str, Any]) -> None:
    compile_s = row["compile_seconds"]
    extra = f"   (compile {compile_s:.1f} s)" if compile_s is not None else ""
    print(
        f"{row['impl']:<16} {row['num_envs']:>9,} envs {row['env_steps_per_s']:>15,.0f} "
        f"env-steps/s{extra}",
        flush=True,
    )


def summary_table(rows: list[dict[str, Any]], reference_size: int) -> tuple[str, dict[str, Any]]:
    """The markdown table, and the ratio of the vector env at `reference_size` to the best
    SyncVectorEnv figure."""
    by = {(r["impl"], r["num_envs"]): r["env_steps_per_s"] for r in rows}
    sizes = sorted({r["num_envs"] for r in rows})
    lines = [
        "| num_envs | vector env, eager | vector env, compiled | SyncVectorEnv |",
        "|---:|---:|---:|---:|",
    ]

    def cell(impl: str, n: int) -> str:
        value = by.get((impl, n))
        return f"{value:,.0f}" if value is not None else "-"

    for n in sizes:
        lines.append(
            f"| {n:,} | {cell('vector_eager', n)} | {cell('vector_compiled', n)} "
            f"| {cell('gymnasium_sync', n)} |"
        )
    sync_best = max((v for (impl, _), v in by.items() if impl == "gymnasium_sync"), default=None)
    summary: dict[str, Any] = {"reference_num_envs": reference_size, "sync_best": sync_best}
    for impl in ("vector_eager", "vector_compiled"):
        value = by.get((impl, reference_size))
        summary[impl] = value
        if value is not None and sync_best:
            summary[f"{impl}_over_sync"] = value / sync_best
    return "\n".join(lines), summary


# -- A/B of git revisions ------------------------------------------------------------------------


def ab_main(args: argparse.Namespace, sizes: tuple[int, ...], device: torch.device) -> None:
    """Each (size, eager/compiled) with `fruit_env` from each revision, in fresh processes."""
    root = Path(__file__).resolve().parents[1]
    rounds = args.repeats or 3
    results: dict[str, list[dict[str, Any]]] = {rev: [] for rev in args.ab}
    with tempfile.TemporaryDirectory() as tmp:
        for rev in args.ab:
            folder = Path(tmp) / rev.replace("/", "_")
            (folder / "cache").mkdir(parents=True)
            archive = subprocess.run(
                ["git", "archive", rev, "fruit_env"], cwd=root, capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
        for r in range(rounds):
            for rev in args.ab if r % 2 == 0 else args.ab[::-1]:
                folder = Path(tmp) / rev.replace("/", "_")
                env = {
                    **os.environ,
                    "PYTHONPATH": str(folder),  # ahead of the installed fruit_env
                    "TORCHINDUCTOR_CACHE_DIR": str(folder / "cache"),
                }
                job = {"sizes": sizes, "device": str(device), "threads": args.threads}
                command = [sys.executable, __file__, "--ab-worker", json.dumps(job)]
                done = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{rev}: {done.stderr.strip()[-2000:]}")
                rows = json.loads(done.stdout.strip().splitlines()[-1])
                for row in rows:
                    row["round"] = r
                    print(f"{rev:>10} round {r}: ", end="")
                    print_row(row)
                results[rev] += rows
    summary: dict[str, dict[str, Any]] = {}
    print()
    for rev, rows in results.items():
        for impl in ("vector_eager", "vector_compiled"):
            for n in sizes:
                mine = [x for x in rows if x["impl"] == impl and x["num_envs"] == n]
                seconds = [t for x in mine for t in x["block_seconds"]]
                per_s = n * mine[0]["steps_per_block"] / statistics.median(seconds)
                cold = mine[0]["compile_seconds"]
                summary[f"{rev} {impl} {n}"] = {"env_steps_per_s": per_s, "cold_compile_s": cold}
                extra = f"   cold compile {cold:.1f} s" if cold is not None else ""
                print(f"{rev:>10} {impl:<16} {n:>9,} envs {per_s:>15,.0f} env-steps/s{extra}")
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
    """One round for `--ab`: eager and compiled at each size, 3 timed blocks each."""
    if job["threads"]:
        torch.set_num_threads(job["threads"])
    rows = bench_vector(  # with the fruit_env that PYTHONPATH put first
        tuple(job["sizes"]), tuple(job["sizes"]), torch.device(job["device"]), 3, False, quiet=True
    )
    print(json.dumps(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two sizes, fewer repeats")
    parser.add_argument(
        "--device", default="auto", help="cpu, cuda, cuda:1, ... (auto: cuda if any)"
    )
    parser.add_argument("--sizes", type=int, nargs="+", help="num_envs values for the vector env")
    parser.add_argument(
        "--compiled-sizes",
        type=int,
        nargs="*",
        help="num_envs for the compiled env (default: sizes)",
    )
    parser.add_argument("--sync-sizes", type=int, nargs="*", help="num_envs for SyncVectorEnv")
    parser.add_argument("--repeats", type=int, help="timed blocks per variant (default 7, quick 3)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
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
    compiled_sizes = tuple(
        args.compiled_sizes
        if args.compiled_sizes is not None
        else QUICK_COMPILED_SIZES
        if args.quick and not args.sizes
        else sizes
    )
    sync_sizes = tuple(
        args.sync_sizes
        if args.sync_sizes is not None
        else QUICK_SYNC_SIZES
        if args.quick
        else SYNC_SIZES
    )
    repeats = args.repeats or (3 if args.quick else 7)
    reference_size = 16384 if 16384 in sizes else max(sizes)

    print(f"FruitCatcher-v0 env-steps/s on {device} ({torch.get_num_threads()} torch threads)")
    if args.ab:
        ab_main(args, tuple(args.sizes or (16384,)), device)
        return
    started = time.perf_counter()
    machine = machine_info()  # load average at the start; the end's is added below
    bandwidth = copy_bandwidth(device)
    print("copy bandwidth (GB/s, read + write):", {k: round(v, 1) for k, v in bandwidth.items()})
    rows = bench_vector(sizes, compiled_sizes, device, repeats, args.quick)
    rows += bench_sync(sync_sizes, repeats, args.quick)
    table, summary = summary_table(rows, reference_size)
    print()
    print(table)
    for impl in ("vector_eager", "vector_compiled"):
        if f"{impl}_over_sync" in summary:
            print(
                f"{impl} at {reference_size:,} envs / best SyncVectorEnv: "
                f"{summary[f'{impl}_over_sync']:,.0f}x"
            )

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
                "obs_mode": "features",
                "validate_actions": not on_gpu,
                "actions": "bank of int64 torch.randint tensors on the device, made before timing",
                "torchinductor_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
            },
            "summary": summary,
            "table": table,
            "rows": rows,
            "total_seconds": time.perf_counter() - started,
        },
    )
    print(f"\nwrote {path} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
