"""TorchRL in SAME_STEP mode: flat episode statistics for `torchrl.envs.GymWrapper`.

TorchRL 0.14's reader of `final_obs` infers the info specs from a dummy rollout and then
stacks the steps; a nested dict of tensors such as `info["episode"]` (Gymnasium's
convention, which FruitCatcher follows) comes out as a tensordict on some steps and a tensor
on others, and the stack fails (`'Tensor' object has no attribute 'batch_size'`). Flat keys
stack. This wrapper renames `info["episode"][k]` to `info["episode_k"]` and keeps everything
else; in SAME_STEP mode it also gives them as `info["final_info"]`, where Gymnasium's own
vector envs put an ended step's info and where TorchRL reads it (on an ended step TorchRL
replaces the step's entries by the final ones). So any vector env with nested episode
statistics runs under TorchRL's SAME_STEP path.
DISABLED mode needs no wrapper (TorchRL then resets ended sub-envs itself and reads no info).
"""

from __future__ import annotations

from typing import Any

from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper


class FlatEpisodeInfo(VectorWrapper):
    """`info["episode"]["r"]` becomes `info["episode_r"]`, and so on; `_episode` stays."""

    def __init__(self, env: VectorEnv) -> None:
        super().__init__(env)

    @property
    def autoreset_mode(self) -> AutoresetMode:
        """TorchRL reads the mode from this attribute, as Gymnasium's `SyncVectorEnv` has it."""
        return self.env.metadata["autoreset_mode"]

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        return obs, reward, terminated, truncated, _flat(info)

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return obs, _flat(info)


def _flat(info: dict[str, Any]) -> dict[str, Any]:
    episode = info.get("episode")
    if not isinstance(episode, dict):
        return info
    stats = {f"episode_{name}": value for name, value in episode.items()}
    flat = {k: v for k, v in info.items() if k != "episode"} | stats
    if "final_obs" in info:  # SAME_STEP: the ended step's info, as Gymnasium's envs give it
        flat["final_info"], flat["_final_info"] = dict(stats), info["_episode"]
    return flat
