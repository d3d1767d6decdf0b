"""Joining the process group `torchrun` describes, and this process's `Collective`. Each rank
plays its own env and groups; a single process creates no group and pays nothing.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from grpo_trainer.base.collective import Collective, SingleProcess, TorchDistributed

log = logging.getLogger(__name__)

_host_group: Any = None  # gloo group for small host-side objects when the backend is nccl


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    try:
        return default if value is None else int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an int") from None


def local_device(device: torch.device, local_rank: int) -> torch.device:
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
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*) and
    return this rank's device; with one process nothing happens (its collectives change nothing)."""
    global _host_group
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size <= 1 or is_distributed():
        return rank_device(device)
    device = local_device(device, _env_int("LOCAL_RANK", 0))
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
    """This rank's device: cuda:LOCAL_RANK in a torchrun CUDA run, else `device` as given."""
    if not is_distributed() or "LOCAL_RANK" not in os.environ:
        return device
    return local_device(device, _env_int("LOCAL_RANK", 0))


def collective() -> Collective:
    """This process's collective: torch.distributed in a group of several ranks, else none."""
    return TorchDistributed(_host_group) if is_distributed() else SingleProcess()
