"""End-to-end GRPO training throughput on FruitCatcher-v0, with every speed feature toggled.

    python benchmarks/train_throughput.py --quick     # < 1 min on 2 CPU cores: headline rows
    python benchmarks/train_throughput.py             # full table (about 10 min on 2 cores)
    python benchmarks/train_throughput.py --profile   # + torch.profiler of one update

What one row measures: `GRPOTrainer.update()` (group reset, rollout, advantages, optimiser
steps, the one host copy of metrics) timed from outside, in env-steps per second of wall
time, split into the trainer's own `rollout_s` and `update_s`. Every row is one
configuration; rows are measured interleaved (one update of each, round after round) so
that a change in the machine's load hits all of them alike, and the table shows medians.
The first update of each row (compilation, allocator warm-up) is reported separately and
excluded. CPU time per env-step is recorded too: on a shared machine it is the figure that
does not depend on how many cores were free.

The configurations:

* "throughput": epochs=1, minibatches=4, micro-batches of at most `--micro-batch` samples,
  a fixed rollout horizon (`--horizon`, every member plays that many steps), bf16 autocast,
  torch.compile, fused AdamW, float16 observation storage, the env's compiled step. At
  several epochs the policy's FLOPs per env-step are several times those of one epoch: the
  default learning configuration (`GRPOConfig`'s epochs and minibatches) is therefore
  measured alongside, not hidden.
* one row per feature switched off (or, for AMP, to the other mode) at `--ref-envs`;
* the naive reference (benchmarks/naive_grpo.py) at the same batch, horizon, network,
  epochs and minibatches, in the same run: the speed-up is a ratio measured side by side;
* the env alone (reset plus the horizon's steps with fixed actions), so that the policy's
  share of the time, and its FLOP rate, can be worked out.

Peak memory per row is measured in a fresh subprocess per configuration (CPU: growth of the
peak resident set over the process's size before building anything; CUDA: the allocator's
peak), skipped with --quick. JSON with the machine, versions, command, load and every raw
timing goes to benchmarks/results/train_throughput[_quick].json.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

# Inductor notes that float16 observations meet bf16 activations in one kernel; harmless.
warnings.filterwarnings("ignore", message="bf16 and fp16 are mixed")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(ROOT))  # appended: --ab puts an older grpo_trainer first on PYTHONPATH

from naive_grpo import NaiveGRPO  # noqa: E402

import fruit_env  # noqa: E402, F401  (registers FruitCatcher-v0)
from grpo_trainer import GRPOConfig, GRPOTrainer, RunConfig  # noqa: E402


def _machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gymnasium": gym.__version__,
        "cpu_count": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _write_result(name: str, result: dict[str, Any]) -> Path:
    out = RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return out


try:  # the benchmarks' shared helpers, where present
    from _common import machine_info, write_result  # type: ignore[import-not-found]
except ImportError:
    machine_info, write_result = _machine_info, _write_result


# -- configurations ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Variant:
    """One row of the table: a batch size and a setting of every speed feature."""

    name: str
    num_groups: int
    group_size: int = 8
    epochs: int = 1
    minibatches: int = 4
    micro_batch: int = 32768  # at most this many samples per forward/backward
    compile: bool = True
    amp: str = "bf16"
    fused: bool = True
    obs_storage: str = "auto"
    env_compile: bool = True
    env_validate: bool = False  # the env's per-step action check (its default is on)
    threads: int = 0  # 0: the run's --threads
    kind: str = "trainer"  # "trainer", "naive" or "env" (the env alone)

    @property
    def num_envs(self) -> int:
        return self.num_groups * self.group_size

    def micro_batches(self, horizon: int) -> int:
        per_minibatch = math.ceil(horizon * self.num_envs / self.minibatches)
        return max(1, math.ceil(per_minibatch / self.micro_batch))


def variants(args: argparse.Namespace) -> list[Variant]:
    """The rows: a batch-size sweep, one toggle per feature, the learning config, the naive."""
    k = 8
    best = Variant("throughput", args.ref_envs // k, amp=args.amp)
    rows: list[Variant] = []
    # The naive program uses the env as `gym.make_vec` gives it (eager step, actions checked);
    # "naive, same env" gives it the trainer's env settings, to isolate the training code.
    plain_env = {"env_compile": False, "env_validate": True}
    for envs in args.sizes:
        v = dataclasses.replace(best, num_groups=envs // k)
        rows.append(v)
        if envs in (256, args.ref_envs):
            rows.append(dataclasses.replace(v, name="naive", kind="naive", **plain_env))
            if not args.quick:
                rows.append(dataclasses.replace(v, name="naive, same env", kind="naive"))
        rows.append(dataclasses.replace(v, name="env only", kind="env"))
    if args.quick:
        return rows
    toggles = {
        "compile off": {"compile": False},
        "amp off (fp32)" if best.amp == "bf16" else "amp bf16": {
            "amp": "off" if best.amp == "bf16" else "bf16"
        },
        "fused AdamW off (foreach)": {"fused": False},
        "obs stored float32": {"obs_storage": "float32"},
        "env step not compiled": {"env_compile": False},
    }
    toggles["all off (eager fp32, foreach, f32 obs)"] = {
        "compile": False,
        "amp": "off",
        "fused": False,
        "obs_storage": "float32",
        "env_compile": False,
    }
    if args.device == "cpu":
        toggles["2 threads" if args.threads == 1 else "1 thread"] = {
            "threads": 2 if args.threads == 1 else 1
        }
    for name, change in toggles.items():
        rows.append(dataclasses.replace(best, name=name, **change))
    default = GRPOConfig()  # the learning configuration is whatever the defaults are
    shape = f"{default.epochs}x{default.minibatches}"
    learning = {
        "name": f"learning config ({shape})",
        "epochs": default.epochs,
        "minibatches": default.minibatches,
    }
    rows.append(dataclasses.replace(best, **learning))
    rows.append(dataclasses.replace(best, **learning, num_groups=256 // k))
    naive = {**learning, **plain_env, "name": f"naive {shape}", "kind": "naive"}
    rows.append(dataclasses.replace(best, **naive, num_groups=256 // k))
    return rows


# -- runners -------------------------------------------------------------------------------------


def make_env(v: Variant, device: torch.device) -> gym.vector.VectorEnv:
    """FruitCatcher-v0 with the row's env settings (the trainer's actions are always valid,
    so its rows switch the per-step action check off)."""
    return gym.make_vec(
        "FruitCatcher-v0",
        num_envs=v.num_envs,
        device=str(device),
        validate_actions=v.env_validate,
        compile=v.env_compile,
    )


class Runner:
    """Builds one row's trainer (or naive trainer, or env) and runs one timed update."""

    def __init__(self, v: Variant, args: argparse.Namespace) -> None:
        self.v, self.args = v, args
        self.device = torch.device(args.device)
        self.threads = v.threads or args.threads
        self.samples: list[dict[str, float]] = []
        self.warmup_s: list[float] = []
        with self._threads():
            self.env = make_env(v, self.device)
            self.update = self._build()

    def _threads(self) -> Any:
        runner = self

        class _Threads:
            def __enter__(self) -> None:
                runner._previous = torch.get_num_threads()
                torch.set_num_threads(runner.threads)

            def __exit__(self, *exc: object) -> None:
                torch.set_num_threads(runner._previous)

        return _Threads()

    def _build(self) -> Callable[[], dict[str, float]]:
        v, h = self.v, self.args.horizon
        if v.kind == "naive":
            naive = NaiveGRPO(
                self.env,
                v.num_groups,
                v.group_size,
                h,
                epochs=v.epochs,
                minibatches=v.minibatches,
                device=self.device,
            )
            self.bytes_per_step = naive.bytes_per_step
            return naive.update
        if v.kind == "env":
            actions = torch.ones(v.num_envs, dtype=torch.int64, device=self.device)
            seeds = [s for s in range(v.num_groups) for _ in range(v.group_size)]

            def env_only() -> dict[str, float]:
                start = time.perf_counter()
                self.env.reset(seed=seeds)
                for _ in range(h):
                    self.env.step(actions)
                _sync(self.device)
                return {"valid_steps": h * v.num_envs, "rollout_s": time.perf_counter() - start}

            self.bytes_per_step = 0
            return env_only
        config = GRPOConfig(
            num_groups=v.num_groups,
            group_size=v.group_size,
            epochs=v.epochs,
            minibatches=v.minibatches,
            micro_batches=v.micro_batches(h),
            max_episode_steps=h,
            obs_storage=v.obs_storage,
            total_env_steps=10**15,  # the lr schedule stays at its start
            run=RunConfig(
                device=str(self.device),
                compile=v.compile,
                amp=v.amp,
                fused_optimizer=v.fused,
                progress=False,
                seed=self.args.seed,
            ),
        )
        trainer = GRPOTrainer(self.env, config)
        self.trainer = trainer
        self.bytes_per_step = trainer.buffer.bytes_per_step
        return trainer.update

    def step(self, timed: bool) -> dict[str, float]:
        with self._threads():
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
            _sync(self.device)
            wall, cpu = time.perf_counter(), time.process_time()
            m = self.update()
            _sync(self.device)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        sample = {
            "wall_s": wall,
            "cpu_s": cpu,
            "rollout_s": float(m.get("rollout_s", wall)),
            "update_s": float(m.get("update_s", 0.0)),
            "valid_steps": float(m["valid_steps"]),
            "load_1m": load,
        }
        if timed:
            self.samples.append(sample)
        else:
            self.warmup_s.append(wall)
        return sample

    def summary(self) -> dict[str, Any]:
        def med(key: str) -> float:
            return statistics.median(s[key] for s in self.samples)

        steps = med("valid_steps")
        return {
            **dataclasses.asdict(self.v),
            "num_envs": self.v.num_envs,
            "threads": self.threads,
            "micro_batches": self.v.micro_batches(self.args.horizon),
            "bytes_per_step": self.bytes_per_step,
            "steps_per_s": statistics.median(s["valid_steps"] / s["wall_s"] for s in self.samples),
            "wall_s": med("wall_s"),
            "rollout_s": med("rollout_s"),
            "update_s": med("update_s"),
            "cpu_us_per_step": 1e6 * med("cpu_s") / steps,
            "valid_steps": steps,
            "first_update_s": self.warmup_s[0] if self.warmup_s else None,
            "samples": self.samples,
        }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- hardware figures for the roofline -----------------------------------------------------------


def _median_time(
    fn: Callable[[], Any], device: torch.device, repeats: int = 31
) -> tuple[float, float]:
    """Median wall and CPU seconds of `fn`. On a shared CPU a long op is often preempted
    and its wall time then counts other programs' work; CPU time does not."""
    fn()
    walls, cpus = [], []
    for _ in range(repeats):
        _sync(device)
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        _sync(device)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def hardware(device: torch.device) -> dict[str, float]:
    """Matmul rate (16384x64 @ 64x64, fp32 and bf16) and copy bandwidth, measured here.

    `*_cpu` figures are per CPU-second (per busy core); plain ones per wall second.
    """
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x = torch.randn(16384, 64, device=device, dtype=dtype)
        w = torch.randn(64, 64, device=device, dtype=dtype)
        y = torch.empty(16384, 64, device=device, dtype=dtype)
        wall, cpu = _median_time(lambda x=x, w=w, y=y: torch.mm(x, w, out=y), device)
        out[f"matmul_{name}_gflops"] = 2 * 16384 * 64 * 64 / wall / 1e9
        out[f"matmul_{name}_gflops_cpu"] = 2 * 16384 * 64 * 64 / cpu / 1e9
    big = torch.empty(64 * 2**20, device=device)  # 256 MiB: far beyond any cache
    dst = torch.empty_like(big)
    big.fill_(1.0)
    dst.fill_(0.0)
    wall, cpu = _median_time(lambda: dst.copy_(big), device, repeats=11)
    out["copy_bandwidth_gbs"] = 2 * big.numel() * 4 / wall / 1e9  # read + write
    out["copy_bandwidth_gbs_cpu"] = 2 * big.numel() * 4 / cpu / 1e9
    return out


def policy_flops(obs_dim: int = 10, hidden: tuple[int, ...] = (64, 64), actions: int = 3) -> int:
    """Multiply-adds x 2 of one forward pass of the MLP for one observation."""
    sizes = (obs_dim, *hidden, actions)
    return sum(2 * a * b for a, b in itertools.pairwise(sizes))


# -- memory probes (a fresh process per configuration) -------------------------------------------


def probe_memory(v: Variant, args: argparse.Namespace) -> dict[str, float]:
    """Peak memory of one configuration: 2 updates in a fresh Python process."""
    command = [
        sys.executable,
        __file__,
        "--probe",
        json.dumps(dataclasses.asdict(v)),
        "--device",
        args.device,
        "--horizon",
        str(args.horizon),
        "--threads",
        str(v.threads or args.threads),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rss_mib(field: str) -> float | None:
    """VmRSS / VmHWM (current / peak resident set) from /proc, in MiB; None elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def probe_main(args: argparse.Namespace) -> None:
    """Peak resident memory of one configuration, over what the process held before.

    The peak is reset first (/proc/self/clear_refs): a child process inherits its parent's
    high-water mark across exec, so `ru_maxrss` would report the benchmark driver's size.
    """
    v = Variant(**json.loads(args.probe))
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.zeros(1, device=device) + 1  # runtime initialised before the baseline
    try:
        Path("/proc/self/clear_refs").write_text("5")
        base = _rss_mib("VmRSS")
    except OSError:
        base = None
    if base is None:  # not Linux: ru_maxrss, which may include an inherited peak
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    runner = Runner(v, args)
    for _ in range(2):
        runner.step(timed=False)
    peak = _rss_mib("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"peak_mib": peak - base, "base_mib": base}
    if device.type == "cuda":
        out["cuda_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    print(json.dumps(out))


# -- A/B of git revisions (before/after of a change) --------------------------------------------


def ab_main(args: argparse.Namespace) -> None:
    """The same row with grpo_trainer taken from each git revision, in fresh processes
    launched in turn (round-robin), so each change's effect is measured side by side."""
    import tempfile

    v = dataclasses.replace(Variant("ab", args.ref_envs // 8, amp=args.amp), **_overrides(args))
    results: dict[str, list[dict[str, Any]]] = {rev: [] for rev in args.ab}
    with tempfile.TemporaryDirectory() as tmp:
        for rev in args.ab:
            folder = Path(tmp) / rev.replace("/", "_")
            folder.mkdir()
            archive = subprocess.run(
                ["git", "archive", rev, "grpo_trainer"], cwd=ROOT, capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
        for r in range(args.rounds):
            for rev in args.ab if r % 2 == 0 else args.ab[::-1]:
                folder = Path(tmp) / rev.replace("/", "_")
                env = {**os.environ, "PYTHONPATH": str(folder)}
                command = [
                    sys.executable,
                    __file__,
                    "--ab-worker",
                    json.dumps(dataclasses.asdict(v)),
                ]
                command += ["--device", args.device, "--horizon", str(args.horizon)]
                command += ["--threads", str(args.threads)]
                if args.profile and r == 0:
                    command.append("--profile")
                done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{rev}: {done.stderr.strip()[-2000:]}")
                lines = done.stdout.strip().splitlines()
                results[rev].append(json.loads(lines[-1]))
                if args.profile and r == 0:
                    print(f"\n== {rev} ==")
                    print("\n".join(lines[:-1]))
    base = None
    print(f"\n{v.num_envs} envs, {dataclasses.asdict(v)}")
    summary = {}
    for rev, rows in results.items():
        cpu = statistics.median(x["cpu_us_per_step"] for x in rows)
        wall = statistics.median(x["steps_per_s"] for x in rows)
        base = base or cpu
        summary[rev] = {"cpu_us_per_step": cpu, "steps_per_s": wall, "runs": rows}
        print(f"  {rev:12s} {cpu:7.3f} CPU us/step ({base / cpu:4.2f}x)  {wall:11,.0f} steps/s")
    mode = f"{'compiled' if v.compile else 'eager'}_{v.amp}"
    write_result(
        f"train_ab_{v.num_envs}_{mode}",
        {
            "benchmark": "train_throughput --ab",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": machine_info(),
            "variant": dataclasses.asdict(v),
            "horizon": args.horizon,
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "revisions": summary,
        },
    )


def ab_worker(args: argparse.Namespace) -> None:
    import grpo_trainer

    v = Variant(**json.loads(args.ab_worker))
    torch.set_num_threads(args.threads)
    runner = Runner(v, args)
    for _ in range(2):
        runner.step(timed=False)
    for _ in range(3):
        runner.step(timed=True)
    out = runner.summary()
    if args.profile:
        profile_update(v, args, rows=12)
    print(
        json.dumps(
            {
                "cpu_us_per_step": out["cpu_us_per_step"],
                "steps_per_s": out["steps_per_s"],
                "rollout_s": out["rollout_s"],
                "update_s": out["update_s"],
                "grpo_trainer": str(Path(grpo_trainer.__file__).parent),
                "load_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            }
        )
    )


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """--set key=value pairs for Variant fields (bools and ints parsed)."""
    out: dict[str, Any] = {}
    types = {f.name: f.type for f in dataclasses.fields(Variant)}
    for item in args.set or []:
        key, _, value = item.partition("=")
        if key not in types:
            raise SystemExit(f"--set {key}: not a field of Variant ({', '.join(types)})")
        kind = types[key]
        if kind == "bool":
            out[key] = value.lower() in ("1", "true", "yes", "on")
        elif kind == "int":
            out[key] = int(value)
        else:
            out[key] = value
    return out


# -- profile -------------------------------------------------------------------------------------


def profile_update(v: Variant, args: argparse.Namespace, rows: int = 20) -> list[dict[str, Any]]:
    """torch.profiler over one warm update: the top ops by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    runner = Runner(v, args)
    for _ in range(2):
        runner.step(timed=False)
    activities = [ProfilerActivity.CPU]
    if args.device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with runner._threads(), profile(activities=activities) as prof:
        runner.update()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    top = [
        {
            "op": e.key,
            "self_cpu_ms": e.self_cpu_time_total / 1e3,
            "share": e.self_cpu_time_total / total,
            "calls": e.count,
        }
        for e in events[:rows]
    ]
    print(f"\nprofile of one update, {v.name} at {v.num_envs} envs (self CPU time):")
    for row in top:
        print(
            f"  {row['op'][:60]:60s} {row['self_cpu_ms']:9.1f} ms "
            f"{row['share']:6.1%} x{row['calls']}"
        )
    return top


# -- main ----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="headline rows only, < 1 min")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="intra-op threads (CPU default 1: on a shared machine 2 threads wait on each other)",
    )
    parser.add_argument("--horizon", type=int, default=None, help="rollout steps per update")
    parser.add_argument("--sizes", type=int, nargs="*", default=None, help="num_envs sweep")
    parser.add_argument("--ref-envs", type=int, default=16384, help="batch of the toggle rows")
    parser.add_argument("--amp", default=None, help="AMP of the throughput config")
    parser.add_argument("--rounds", type=int, default=None, help="timed updates per row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="profile one reference update")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory probes")
    parser.add_argument("--ab", nargs="+", metavar="REV", help="compare git revisions (A/B)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="--ab row fields")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--ab-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    if args.threads is None:
        args.threads = torch.get_num_threads() if cuda else 1
    if args.horizon is None:
        args.horizon = 32 if args.quick else 64
    if args.amp is None:
        args.amp = "bf16"
    if args.probe:
        probe_main(args)
        return
    if args.ab_worker:
        ab_worker(args)
        return
    if args.ab:
        args.rounds = args.rounds or 3
        ab_main(args)
        return
    if args.sizes is None:
        if args.quick:
            args.sizes = [256, args.ref_envs]
        elif cuda:
            args.sizes = [256, 4096, 65536, 2**20, 2**22]
        else:
            args.sizes = [256, 1024, 4096, 16384, 65536]
    if args.rounds is None:
        args.rounds = 3 if args.quick else 7
    torch.set_num_threads(args.threads)
    # Every row compiles the same functions in one process. As separate runs would: static
    # shapes per row (no "automatic dynamic" kernels after the second batch size), and no
    # fallback to eager after 8 recompilations.
    torch._dynamo.config.automatic_dynamic_shapes = False
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)

    started = time.time()
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    device = torch.device(args.device)
    hw = hardware(device)
    rows = variants(args)
    runners = [Runner(v, args) for v in rows]
    for runner in runners:  # the first update compiles; the second settles the caches
        for _ in range(2 if runner.v.kind == "trainer" else 1):
            runner.step(timed=False)
    for r in range(args.rounds):  # interleaved, alternating direction against drift
        for runner in runners if r % 2 == 0 else runners[::-1]:
            runner.step(timed=True)
    summaries = [runner.summary() for runner in runners]
    load_after = os.getloadavg() if hasattr(os, "getloadavg") else None
    del runners
    if not args.quick and not args.no_memory:
        for s, v in zip(summaries, rows, strict=True):
            if v.kind != "env":
                s["memory"] = probe_memory(v, args)
    reference = next(v for v in rows if v.name == "throughput" and v.num_envs == args.ref_envs)
    profile = profile_update(reference, args) if args.profile else None

    by_key = {(s["name"], s["num_envs"], s["epochs"]): s for s in summaries}
    flops_fwd = policy_flops()
    for s in summaries:
        naive_name = "naive" if s["epochs"] == 1 else f"naive {s['epochs']}x{s['minibatches']}"
        naive = by_key.get((naive_name, s["num_envs"], s["epochs"]))
        if naive and s["kind"] == "trainer":
            s["vs_naive"] = s["steps_per_s"] / naive["steps_per_s"]
            s["vs_naive_cpu"] = naive["cpu_us_per_step"] / s["cpu_us_per_step"]
        same = by_key.get(("naive, same env", s["num_envs"], s["epochs"]))
        if same and s["kind"] == "trainer":
            s["vs_naive_same_env"] = s["steps_per_s"] / same["steps_per_s"]
            s["vs_naive_same_env_cpu"] = same["cpu_us_per_step"] / s["cpu_us_per_step"]
        env = by_key.get(("env only", s["num_envs"], 1))
        flops = flops_fwd * (1 + 3 * s["epochs"])
        s["policy_flops_per_step"] = flops
        same_env = env and (env["env_compile"], env["threads"]) == (s["env_compile"], s["threads"])
        if same_env and s["kind"] == "trainer":
            # The policy's share: the row's time minus the env's time for as many steps.
            scale = s["valid_steps"] / env["valid_steps"]
            policy_wall = max(s["wall_s"] - env["wall_s"] * scale, 1e-9)
            policy_cpu = max(s["cpu_us_per_step"] - env["cpu_us_per_step"], 1e-9) * 1e-6
            s["policy_gflops"] = flops * s["valid_steps"] / policy_wall / 1e9
            s["policy_gflops_cpu"] = flops / policy_cpu / 1e9
            s["update_gflops"] = (
                3 * flops_fwd * s["epochs"] * s["valid_steps"] / s["update_s"] / 1e9
            )
            same = "bf16" if s["amp"] == "bf16" else "fp32"
            s["matmul_fraction"] = s["policy_gflops_cpu"] / hw["matmul_fp32_gflops_cpu"]
            s["matmul_fraction_wall"] = s["policy_gflops"] / hw["matmul_fp32_gflops"]
            s["matmul_fraction_same_precision"] = (
                s["policy_gflops_cpu"] / hw[f"matmul_{same}_gflops_cpu"]
            )

    result = {
        "benchmark": "train_throughput",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git": _git_state(),
        "machine": machine_info(),
        "device": args.device,
        "threads": args.threads,
        "horizon": args.horizon,
        "rounds": args.rounds,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "seconds": time.time() - started,
        "hardware": hw,
        "policy": {
            "forward_flops_per_step": flops_fwd,
            "note": "FLOPs per env-step = forward x (1 + 3 x epochs): rollout + update",
        },
        "rows": summaries,
        "profile": profile,
    }
    path = write_result("train_throughput_quick" if args.quick else "train_throughput", result)
    print_table(summaries, hw, args)
    head = by_key.get(("throughput", args.ref_envs, 1))
    small = by_key.get(("throughput", 256, 1))
    parts = []
    for s in (head, small):
        if s:
            ratio = f" = {s['vs_naive']:.1f}x naive" if "vs_naive" in s else ""
            if "vs_naive_same_env" in s:
                ratio += f" ({s['vs_naive_same_env']:.1f}x with its env settings)"
            parts.append(f"{s['num_envs']} envs {s['steps_per_s']:,.0f} steps/s{ratio}")
    if head and "matmul_fraction" in head:
        parts.append(
            f"policy work at {head['matmul_fraction']:.0%} of the fp32 matmul rate "
            f"({head['matmul_fraction_same_precision']:.0%} of {head['amp']})"
        )
    if head:
        parts.append(f"{head['bytes_per_step']} B/step")
    load = f"load {load_before[0]:.1f}" if load_before else ""
    print(f"train_throughput: {'; '.join(parts)} ({load}, {args.threads} threads) -> {path}")


def _git_state() -> dict[str, Any]:
    """The commit measured, and whether the working tree had uncommitted changes."""

    def git(*argv: str) -> str:
        done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "" if value is None else format(value, spec) + suffix


def print_table(rows: list[dict[str, Any]], hw: dict[str, float], args: argparse.Namespace) -> None:
    """One line per row; "vs naive" is the wall-clock ratio, "same env" the ratio to the
    naive program given the trainer's env settings."""
    print(
        f"\nhorizon {args.horizon}, {args.threads} threads, medians of {args.rounds} interleaved "
        f"updates; per CPU-second: matmul fp32 {hw['matmul_fp32_gflops_cpu']:.0f} GFLOP/s, bf16 "
        f"{hw['matmul_bf16_gflops_cpu']:.0f} GFLOP/s, copy {hw['copy_bandwidth_gbs_cpu']:.1f} GB/s"
    )
    head = (
        f"{'row':38s} {'envs':>7s} {'steps/s':>10s} {'rollout s':>9s} {'update s':>8s} "
        f"{'CPU us/st':>9s} {'first s':>7s} {'vs naive':>8s} {'same env':>8s} {'GFLOP/s':>7s} "
        f"{'B/step':>6s} {'peak MiB':>8s} {'KiB/env':>7s}"
    )
    print(head)
    print("-" * len(head))
    for s in rows:
        mem = s.get("memory", {})
        peak = mem.get("cuda_peak_mib", mem.get("peak_mib"))
        print(
            f"{s['name'][:38]:38s} {s['num_envs']:7d} {s['steps_per_s']:10,.0f} "
            f"{s['rollout_s']:9.3f} {s['update_s']:8.3f} {s['cpu_us_per_step']:9.2f} "
            f"{_fmt(s['first_update_s'], '.1f'):>7s} {_fmt(s.get('vs_naive'), '.1f', 'x'):>8s} "
            f"{_fmt(s.get('vs_naive_same_env'), '.1f', 'x'):>8s} "
            f"{_fmt(s.get('policy_gflops_cpu'), '.0f'):>7s} {s['bytes_per_step'] or '':>6} "
            f"{_fmt(peak, '.0f'):>8s} "
            f"{_fmt(peak * 1024 / s['num_envs'] if peak is not None else None, '.1f'):>7s}"
        )


if __name__ == "__main__":
    main()
