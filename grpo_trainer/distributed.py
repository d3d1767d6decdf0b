"""Data-parallel training across processes started by `torchrun`.

Every rank owns its own vector env on its own device and plays its own groups; gradients are
averaged by `DistributedDataParallel`. Per update the trainer adds a few small collectives to
DDP's gradient all-reduces: an all-reduce of the valid-sample count (the loss normaliser, see
docs/distributed.md), one of three moments with `scale="batch_std"`, and a gather of the
stacked metrics (after a host-side gather of their names) before the single host copy.

A process not started by torchrun, or started as its only process, never creates a process
group: `init_from_env` returns its device unchanged and the trainer takes its single-process
path, with no collective and no overhead.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from grpo_trainer.objective import _EPS  # the epsilon of one process's batch_std

log = logging.getLogger(__name__)

STOP = "_stop_requested"  # column in the reduced metrics: some rank got SIGINT/SIGTERM
EPISODE_COUNT = "_episodes_reporting_"  # + info field: episodes that reported it (summed)

# How each metric combines across ranks; a name not listed is a mean over the ranks that
# report it. Every rank holds the same number of groups and members, so a mean over ranks of
# per-rank means is the mean over the concatenated batch. Add new count-like metrics here.
REDUCTIONS: dict[str, str] = {
    "valid_steps": "sum",
    "return_min": "min",
    "return_max": "max",
    "length_max": "max",
    "return_std": "std",  # pooled: from each rank's std and mean, see POOLED_STD
    "grad_norm": "max",  # identical on every rank (computed from the averaged gradient)
    "skipped_steps": "max",  # identical on every rank, for the same reason
    STOP: "max",
}
POOLED_STD = {"return_std": "return_mean"}  # std metric -> the mean it is taken around

_host_group: Any = None  # gloo group for small host-side objects when the backend is nccl


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    try:
        return default if value is None else int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an int") from None


def _local_device(device: torch.device, local_rank: int) -> torch.device:
    """CUDA ranks use cuda:LOCAL_RANK, one GPU per process; CPU ranks stay on the CPU."""
    if device.type != "cuda":
        return device
    if device.index is not None and device.index != local_rank:
        raise ValueError(
            f"device {device} conflicts with LOCAL_RANK={local_rank}: in a distributed run each "
            "rank uses cuda:LOCAL_RANK; pass --device cuda or --device auto"
        )
    if local_rank >= torch.cuda.device_count():
        raise ValueError(
            f"LOCAL_RANK={local_rank} but this node has {torch.cuda.device_count()} GPU(s): "
            "start at most one process per GPU (--nproc-per-node)"
        )
    return torch.device("cuda", local_rank)


def init_from_env(device: torch.device) -> torch.device:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*).

    Returns this rank's device. Without torchrun, or with one process, nothing happens: a
    one-process group would only add collectives that change nothing.
    """
    global _host_group
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size <= 1 or is_distributed():
        return rank_device(device)
    device = _local_device(device, _env_int("LOCAL_RANK", 0))
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        _host_group = dist.new_group(backend="gloo")
    else:
        dist.init_process_group("gloo")
        _host_group = None
    log.info("rank %d of %d on %s (%s)", dist.get_rank(), world_size, device, dist.get_backend())
    return device


def shutdown() -> None:
    """Leave the process group, if this process joined one."""
    global _host_group
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _host_group = None


def is_distributed() -> bool:
    """True inside a process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside a process group."""
    return (dist.get_rank(), dist.get_world_size()) if is_distributed() else (0, 1)


def is_main() -> bool:
    """Only rank 0 logs progress and writes metrics and checkpoints."""
    return rank_and_world()[0] == 0


def barrier() -> None:
    """Wait for every rank (a no-op in a single process)."""
    if is_distributed():
        dist.barrier()


def rank_device(device: torch.device) -> torch.device:
    """This rank's device: cuda:LOCAL_RANK in a torchrun CUDA run, else `device` as given.

    A process group made without torchrun (no LOCAL_RANK) keeps the device its caller chose.
    """
    if not is_distributed() or "LOCAL_RANK" not in os.environ:
        return device
    return _local_device(device, _env_int("LOCAL_RANK", 0))


def rank_seed(seed: int, update: int, rank: int) -> int:
    """Seed for a rank's sampling generator at one update.

    A function of (seed, update, rank) alone, so a resume with the same world size replays
    every rank's stream exactly without saving K generator states, and a resume on another
    world size is still deterministic.
    """
    digest = hashlib.blake2b(f"{seed}/{update}/{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def sum_over_ranks(x: torch.Tensor) -> torch.Tensor:
    """Sum of `x` over ranks, on the device (asynchronous under nccl: no host sync)."""
    out = x.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def scale_by_global_std(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`advantages / (std + eps)` with the weighted std of every rank's advantages.

    What `scale="batch_std"` computes in one process over its whole batch: a per-rank std
    would make the update depend on how the batch is split. One all-reduce of three sums.
    """
    w, x = weights.double(), advantages.double()
    moments = sum_over_ranks(torch.stack((w.sum(), (w * x).sum(), (w * x * x).sum())))
    count = moments[0].clamp_min(1.0)
    mean = moments[1] / count
    std = (moments[2] / count - mean**2).clamp_min(0.0).sqrt()
    return advantages / (std.to(advantages.dtype) + _EPS)


class _LogProbEntropy(nn.Module):
    """The update's forward as a module, so that DDP sees every parameter used in it.

    DDP averages gradients only for work done through its own `forward`; the loss needs the
    head's log-prob and entropy too (the Gaussian head owns a parameter), not just logits.
    """

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy.log_prob_entropy(obs, actions)  # type: ignore[operator]


def data_parallel(
    policy: nn.Module,
) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """`policy.log_prob_entropy` wrapped in DDP; the rollout keeps using the plain module.

    Construction broadcasts rank 0's parameters and buffers, so replicas start identical.
    Buffers are constants derived from the spaces, so they are not re-synced every forward.
    """
    device = next(policy.parameters()).device
    return nn.parallel.DistributedDataParallel(
        _LogProbEntropy(policy),
        device_ids=[device] if device.type == "cuda" else None,
        forward_sync_buffers=False,
    )


def _agreed_names(names: list[str]) -> list[str]:
    """The union of every rank's metric names, in the same order on every rank.

    Info-derived metrics (`episode_*`) exist only where some episode ended, which can differ
    between ranks; a gather of differently sized tensors would fail or hang.
    """
    gathered: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, names, group=_host_group)
    union: dict[str, None] = {}
    for rank_names in gathered:
        union.update(dict.fromkeys(rank_names or []))
    return list(union)


def combine(values: torch.Tensor, weights: torch.Tensor, names: list[str]) -> torch.Tensor:
    """Reduce `(ranks, metrics)` values into one figure per metric, on the device.

    `weights` is 0 where a rank lacks the metric, the episode count for `episode_*` means, and
    1 otherwise. Sums add, min/max ignore missing entries, means are weighted means, and a
    pooled std comes from each rank's second moment around zero (std**2 + mean**2).
    """
    present = weights > 0
    total_weight = weights.sum(0).clamp_min(torch.finfo(weights.dtype).tiny)
    mean = (values * weights).sum(0) / total_weight
    by_kind = {
        "sum": values.sum(0),
        "mean": mean,
        "min": values.masked_fill(~present, torch.inf).amin(0),
        "max": values.masked_fill(~present, -torch.inf).amax(0),
    }
    columns = []
    for i, name in enumerate(names):
        kind = "sum" if name.startswith(EPISODE_COUNT) else REDUCTIONS.get(name, "mean")
        if kind == "std":
            j = names.index(POOLED_STD[name])
            moment = ((values[:, i] ** 2 + values[:, j] ** 2) * weights[:, i]).sum(0)
            columns.append((moment / total_weight[i] - mean[j] ** 2).clamp_min(0).sqrt())
        else:
            columns.append(by_kind[kind][i])
    return torch.stack(columns)


def reduce_metrics(
    metrics: Mapping[str, torch.Tensor | float],
    counts: Mapping[str, torch.Tensor],
    *,
    stop: bool,
) -> dict[str, torch.Tensor]:
    """Metrics of the whole data-parallel batch, identical on every rank, still on the device.

    One gather of a stacked `(2, metrics)` tensor (value, weight), then a local reduction:
    a single all-reduce applies one operation to all columns, but sums, means, min/max and a
    pooled std need different ones. `counts` weighs means over episodes (`episode_*`) by how
    many episodes each rank finished. `stop` (a pending signal) comes back as the `STOP`
    column, set on every rank if any rank had one, so all ranks stop after the same update.
    """
    local = {**metrics, STOP: float(stop)}
    names = _agreed_names(list(local))
    device = next(v.device for v in local.values() if isinstance(v, torch.Tensor))
    dtype = torch.float64  # sums of step counts stay exact
    values, weights = [], []
    for name in names:
        value = local.get(name)
        if isinstance(value, torch.Tensor):
            values.append(value.detach().to(dtype).reshape(()))
        else:  # absent here (weight 0), or a host number: filled on the device, no copy
            values.append(torch.full((), float(value or 0.0), dtype=dtype, device=device))
        weight = counts[name].to(dtype) if name in counts else float(value is not None)
        weights.append(
            weight.reshape(())
            if isinstance(weight, torch.Tensor)
            else torch.full((), weight, dtype=dtype, device=device)
        )
    stacked = torch.stack((torch.stack(values), torch.stack(weights)))
    gathered = [torch.empty_like(stacked) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, stacked)
    every = torch.stack(gathered)  # (ranks, 2, metrics)
    reduced = combine(every[:, 0], every[:, 1], names)
    return dict(zip(names, reduced.unbind(), strict=True))
