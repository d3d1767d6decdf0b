"""What data-parallel ranks share, behind one interface: `SingleProcess` (the identity) or
`TorchDistributed` (all-reduces over torchrun's process group), so that no other module
branches on the world size (docs/distributed.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

# log-probs, entropies, bound penalties and values (Policy.update_terms)
Terms = tuple[Tensor, Tensor, Tensor | None, Tensor | None]
UpdateTerms = Callable[[Tensor, Tensor], Terms]


class Collective:
    """The operations ranks share (rank 0 writes files); here, for one process, identities."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, x: Tensor) -> Tensor:
        """`x` summed over ranks, on the device."""
        return x

    def reduce(self, values: Mapping[str, Tensor], kinds: Mapping[str, str]) -> dict[str, Tensor]:
        """Each 0-d tensor combined over ranks by its kind: sum, mean, min or max."""
        return dict(values)

    def agree_names(self, names: list[str]) -> list[str]:
        """The union of every rank's names, in one order on every rank."""
        return names

    def slowest(self, seconds: float) -> float:
        """The most `seconds` of any rank (host floats: no device sync)."""
        return seconds

    def finite(self, grad_norm: Tensor, loss: Tensor) -> Tensor:
        """Whether to apply this step: a verdict every rank reaches alike (on the device)."""
        return torch.isfinite(grad_norm) & torch.isfinite(loss)

    def data_parallel(self, policy: nn.Module) -> UpdateTerms:
        """The update's forward: gradients through it are averaged over ranks."""
        return policy.update_terms  # type: ignore[return-value]

    def sampling_seed(self, seed: int, update: int) -> int | None:
        """A seed for this rank's sampling at `update`, or None: the generator goes on."""
        return None

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj` (host objects, e.g. a checkpoint's per-rank rollout state)."""
        return [obj]


class SingleProcess(Collective):
    """One process: every operation is the identity (`Collective`'s own)."""


_OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
}


class TorchDistributed(Collective):
    """Ranks of a `torch.distributed` process group (gloo on CPU, nccl on CUDA)."""

    def __init__(self, host_group: Any = None) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self._host_group = host_group  # gloo group for host objects when the backend is nccl

    def sum(self, x: Tensor) -> Tensor:
        out = x.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    def reduce(self, values: Mapping[str, Tensor], kinds: Mapping[str, str]) -> dict[str, Tensor]:
        """One all-reduce per kind over the stacked values (float64: step counts stay exact)."""
        out: dict[str, Tensor] = {}
        for kind, op in _OPS.items():
            names = [n for n in values if kinds[n] == kind]
            if not names:
                continue
            stacked = torch.stack([values[n].detach().double().reshape(()) for n in names])
            dist.all_reduce(stacked, op=op)
            if kind == "mean":
                stacked = stacked / self.world_size
            out.update(zip(names, stacked.unbind(), strict=True))
        return {n: out[n] for n in values}

    def agree_names(self, names: list[str]) -> list[str]:
        gathered: list[list[str] | None] = [None] * self.world_size
        dist.all_gather_object(gathered, names, group=self._host_group)
        union: dict[str, None] = {}
        for rank_names in gathered:
            union.update(dict.fromkeys(rank_names or []))
        return list(union)

    def slowest(self, seconds: float) -> float:
        out = torch.tensor(seconds, dtype=torch.float64)  # on the host: gloo's
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=self._host_group)
        return float(out)

    def finite(self, grad_norm: Tensor, loss: Tensor) -> Tensor:
        # Only the all-reduced gradient is shared; a rank's own loss is not.
        return torch.isfinite(grad_norm)

    def data_parallel(self, policy: nn.Module) -> UpdateTerms:
        """`policy.update_terms` wrapped in DDP (which broadcasts rank 0's parameters); the
        buffers are constants of the spaces, so they are not re-synced every forward."""
        device = next(policy.parameters()).device
        return nn.parallel.DistributedDataParallel(
            _UpdateTerms(policy),
            device_ids=[device] if device.type == "cuda" else None,
            forward_sync_buffers=False,
        )

    def sampling_seed(self, seed: int, update: int) -> int | None:
        return rank_seed(seed, update, self.rank)

    def gather(self, obj: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj, group=self._host_group)
        return gathered


def rank_seed(seed: int, update: int, rank: int) -> int:
    """The seed of a rank's sampling at one update: a function of (seed, update, rank) alone,
    so a resume with the same world size replays every rank's stream exactly without saving
    K generator states, and a resume on another world size is still deterministic."""
    digest = hashlib.blake2b(f"{seed}/{update}/{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class _UpdateTerms(nn.Module):
    """The update's forward as a module: DDP averages gradients only for work done in its
    `forward`, and the head's log-prob and entropy use a parameter too (the Gaussian log-std)."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, obs: Tensor, actions: Tensor) -> Terms:
        return self.policy.update_terms(obs, actions)  # type: ignore[operator]
