"""What one update reports: its metrics over all ranks, copied to the host once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from grpo_trainer.algorithm.advantages import Advantages
from grpo_trainer.algorithm.rollout import Rollout
from grpo_trainer.base.collective import Collective
from grpo_trainer.base.metrics import cross_rank, to_host
from grpo_trainer.envs.episodes import summarise


class UpdateResult(NamedTuple):
    """What one update reports, on the host."""

    metrics: dict[str, float]
    stop: bool  # some rank was asked to stop (SIGINT/SIGTERM): every rank stops after this


def update_report(
    rollout: Rollout,
    adv: Advantages,
    losses: Mapping[str, torch.Tensor],
    stop_requested: bool,
    collective: Collective,
    ratios: Mapping[str, Any],
) -> UpdateResult:
    """The update's metrics over all ranks, copied to the host once (the design's one
    device-to-host copy per update).

    Episode figures are reduced as sums and only then turned into means, so they are those of
    the whole batch; an update in which no episode ended reports none.
    """
    device = rollout.rewards.device
    episodes = dict(rollout.episodes)
    for name in collective.agree_names(list(episodes)):  # fields some rank lacks
        episodes.setdefault(name, torch.zeros((), dtype=torch.float64, device=device))
    counts = {
        "valid_steps": rollout.valid[: rollout.obs.shape[0]].sum(),
        "zero_spread": adv.zero_spread.sum(),
        "compared": adv.compared.sum(),
    }
    stop = torch.full((), float(stop_requested), device=device)
    raw = {**episodes, **counts, "length_max": rollout.length_max, **losses, "stop": stop}
    reduced = collective.reduce(raw, {name: cross_rank(name) for name in raw})
    metrics = {
        **summarise(reduced, ratios),
        **{name: reduced[name] for name in ("episodes", "return_min", "return_max")},
        "valid_steps": reduced["valid_steps"],
        "frac_zero_std_groups": reduced["zero_spread"] / reduced["compared"],
        "length_max": reduced["length_max"],
        "compared": reduced["compared"],
        **{name: reduced[name] for name in losses},
        "stop": reduced["stop"],
    }
    host = to_host(metrics)
    stop_agreed = bool(host.pop("stop"))
    if not host["episodes"]:  # a mean over no episode is undefined: leave it out
        for name in per_episode_metrics(host, ratios):
            del host[name]
    if not host.pop("compared"):  # no group step to compare (the first rows of a run)
        del host["frac_zero_std_groups"]
    return UpdateResult(host, stop_agreed)


def per_episode_metrics(metrics: Mapping[str, float], ratios: Mapping[str, Any]) -> list[str]:
    """The metrics that are means or extremes over the update's ended episodes."""
    fixed = ("return_mean", "return_std", "return_min", "return_max", "length_mean")
    return [n for n in metrics if n in fixed or n.startswith("episode_") or n in ratios]
