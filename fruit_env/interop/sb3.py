"""A Stable-Baselines3 `VecEnv` over a torch vector env such as `FruitCatcherVectorEnv`.

SB3 speaks numpy and the pre-Gymnasium `done` API: when an episode ends, `step` returns the
*first* observation of the next episode and puts the last one in
`infos[i]["terminal_observation"]`. That is Gymnasium's SAME_STEP autoreset, so the adapter
requires an env in that mode (`SB3VecEnv.make(n)` builds one).

Per step the adapter makes one device-to-host transfer. Every output it needs (observation,
reward, the two flags, the final observation, the episode statistics) is packed byte-wise into
one preallocated device buffer, copied in one go into a preallocated host buffer (pinned on
CUDA), and unpacked there with numpy. On a CPU env the packing *is* the copy.

    from stable_baselines3 import PPO
    from fruit_env.interop.sb3 import SB3VecEnv

    venv = SB3VecEnv.make(16, device="cpu")
    PPO("MlpPolicy", venv).learn(100_000)
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv

try:
    from stable_baselines3.common.vec_env import VecEnv
    from stable_baselines3.common.vec_env.base_vec_env import (
        VecEnvIndices,
        VecEnvObs,
        VecEnvStepReturn,
    )
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "fruit_env.interop.sb3 needs stable-baselines3: pip install -e '.[sb3]'"
    ) from err

from fruit_env.games.fruit_catcher.env import FruitCatcherVectorEnv
from fruit_env.interop.wrappers import env_device, to_torch
from fruit_env.kit.inputs import parse_autoreset_mode

__all__ = ["SB3VecEnv"]


def _described(env: VectorEnv) -> str:
    """The env as its user knows it: its registered id, else its class (and game)."""
    spec = getattr(env, "spec", None) or getattr(env.unwrapped, "spec", None)
    inner = env.unwrapped
    game = getattr(inner, "game", None)
    name = type(inner).__name__ + (f" of {type(game).__name__}" if game is not None else "")
    return f"{spec.id!r} ({name})" if getattr(spec, "id", None) else name


def _same_step_hint(env: VectorEnv) -> str:
    """How to build this env in SAME_STEP mode: the user's own constructor call."""
    spec = getattr(env, "spec", None) or getattr(env.unwrapped, "spec", None)
    if getattr(spec, "id", None):
        return f"gym.make_vec({spec.id!r}, num_envs, autoreset_mode='SAME_STEP')"
    inner = env.unwrapped
    if isinstance(inner, FruitCatcherVectorEnv):
        return "FruitCatcherVectorEnv(n, autoreset_mode='SAME_STEP') or SB3VecEnv.make(n)"
    game = getattr(inner, "game", None)
    if game is not None:
        return f"{type(inner).__name__}({type(game).__name__}(...), n, autoreset_mode='SAME_STEP')"
    return f"{type(inner).__name__}(..., autoreset_mode='SAME_STEP')"


class _Field(NamedTuple):
    """Where one output lives in a row of the packed buffer, and how to read it back."""

    start: int
    stop: int
    dtype: np.dtype
    shape: tuple[int, ...]  # per sub-env


class _Packer:
    """Packs `(N, ...)` tensors byte-wise into one `(N, row_bytes)` buffer; unpacks on the host.

    Packing bytes (not casting to one dtype) keeps every output exact: uint8 pixels, float32
    rewards and int32 counters travel as they are.
    """

    def __init__(self, tensors: dict[str, torch.Tensor], device: torch.device) -> None:
        self.signature = _signature(tensors)
        self.num_envs = next(iter(tensors.values())).shape[0]
        self.fields: dict[str, _Field] = {}
        offset = 0
        for name, tensor in tensors.items():
            nbytes = tensor[0].numel() * tensor.element_size()
            dtype = _numpy_dtype(tensor.dtype, name)
            self.fields[name] = _Field(offset, offset + nbytes, dtype, tuple(tensor.shape[1:]))
            offset += nbytes
        pin = device.type == "cuda"
        self.host = torch.empty((self.num_envs, offset), dtype=torch.uint8, pin_memory=pin)
        self.staging = (
            self.host
            if device.type == "cpu"
            else torch.empty((self.num_envs, offset), dtype=torch.uint8, device=device)
        )
        self.host_array = self.host.numpy()

    def transfer(self, tensors: dict[str, torch.Tensor]) -> None:
        """Pack on the device, then the step's single device-to-host copy."""
        n = self.num_envs
        parts = [t.detach().reshape(n, -1).contiguous().view(torch.uint8) for t in tensors.values()]
        torch.cat(parts, dim=1, out=self.staging)
        if self.staging is not self.host:
            self.host.copy_(self.staging)  # synchronous: the host reads it next

    def read(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        """A fresh array (SB3 keeps references across steps) with `name` for all or some rows."""
        field = self.fields[name]
        block = self.host_array[:, field.start : field.stop]
        if rows is not None:
            block = block[rows]
        flat = np.ascontiguousarray(block).view(field.dtype)
        return flat.reshape((block.shape[0], *field.shape))


def _signature(tensors: dict[str, torch.Tensor]) -> tuple[Any, ...]:
    return tuple((name, t.dtype, tuple(t.shape)) for name, t in tensors.items())


def _numpy_dtype(dtype: torch.dtype, name: str) -> np.dtype:
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        raise TypeError(f"SB3VecEnv cannot hand {name} of dtype {dtype} to numpy") from None


class SB3VecEnv(VecEnv):
    """Stable-Baselines3 `VecEnv` over a torch Gymnasium vector env in SAME_STEP autoreset mode.

    * Observations, rewards and dones are numpy arrays; actions may be numpy or torch and go
      to the env's device.
    * `infos[i]` is empty for sub-envs still playing. For a sub-env whose episode ended it has
      `terminal_observation` (its last observation), `TimeLimit.truncated` (truncated and not
      terminated) and `episode` in SB3's Monitor format: `r`, `l`, `t` (seconds since this
      adapter was built), plus the env's own statistics (`caught`, `missed`). SB3's logger
      reads `ep_rew_mean` / `ep_len_mean` from it, so no `VecMonitor` is needed.
    * The sub-envs share one vector env object: `get_attr` returns its attribute for each
      index, `set_attr` and `env_method` act on the whole vector env.
    """

    def __init__(self, env: VectorEnv) -> None:
        if not isinstance(env, VectorEnv):
            raise TypeError(f"SB3VecEnv wraps a gymnasium.vector.VectorEnv, got {type(env)}")
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        if parse_autoreset_mode(mode) != AutoresetMode.SAME_STEP:
            raise ValueError(
                "SB3VecEnv needs an env with autoreset_mode=SAME_STEP (SB3 expects the reset "
                f"observation on the step an episode ends), got {mode!r} from "
                f"{_described(env)}; build it with {_same_step_hint(env)}"
            )
        self.env = env
        self.device = env_device(env)
        super().__init__(env.num_envs, env.single_observation_space, env.single_action_space)
        self._packer: _Packer | None = None
        self._actions: torch.Tensor | None = None
        self._t_start = time.perf_counter()

    @classmethod
    def make(cls, num_envs: int, **env_kwargs: Any) -> SB3VecEnv:
        """`SB3VecEnv(FruitCatcherVectorEnv(num_envs, autoreset_mode=SAME_STEP, **env_kwargs))`."""
        mode = env_kwargs.pop("autoreset_mode", AutoresetMode.SAME_STEP)
        if parse_autoreset_mode(mode) != AutoresetMode.SAME_STEP:
            raise ValueError(f"SB3VecEnv needs autoreset_mode=SAME_STEP, got {mode!r}")
        return cls(
            FruitCatcherVectorEnv(num_envs, autoreset_mode=AutoresetMode.SAME_STEP, **env_kwargs)
        )

    # -- stepping --------------------------------------------------------------------------

    @property
    def host_buffer(self) -> np.ndarray | None:
        """The one host buffer every step's outputs come through (None before the first
        step): SB3 gets views of it, never a tensor copied on its own."""
        return self._packer.host_array if self._packer is not None else None

    def reset(self) -> VecEnvObs:
        """Reset every sub-env with the seeds from `seed()` (used once, as in SB3)."""
        if any(self._options):
            raise ValueError(
                f"SB3VecEnv: the env takes no per-env reset options, got {self._options!r}"
            )
        seeds = self._seeds
        seed = (
            None
            if all(s is None for s in seeds)
            else [None if s is None else int(s) for s in seeds]
        )
        obs, _ = self.env.reset(seed=seed)
        _check_tensor(obs, "reset observation")
        self._reset_seeds()
        self._reset_options()
        self.reset_infos = [{} for _ in range(self.num_envs)]
        self._actions = None
        return obs.detach().to("cpu").numpy().copy()

    def step_async(self, actions: np.ndarray | torch.Tensor) -> None:
        self._actions = to_torch(actions, self.device)

    def step_wait(self) -> VecEnvStepReturn:
        if self._actions is None:
            raise RuntimeError("SB3VecEnv.step_wait() called without step_async(actions)")
        actions, self._actions = self._actions, None
        obs, reward, terminated, truncated, info = self.env.step(actions)
        _check_tensor(obs, "step observation")
        final_obs = info.get("final_obs")
        outputs = {
            "obs": obs,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "final_obs": obs if final_obs is None else final_obs,
        }
        episode = info.get("episode") if "_episode" in info else None
        if episode is not None:
            outputs["_episode"] = info["_episode"]
            outputs.update({f"episode/{key}": value for key, value in episode.items()})
        packer = self._packer
        if packer is None or packer.signature != _signature(outputs):
            packer = self._packer = _Packer(outputs, self.device)
        packer.transfer(outputs)

        terminated_np = packer.read("terminated").astype(bool, copy=False)
        truncated_np = packer.read("truncated").astype(bool, copy=False)
        dones = terminated_np | truncated_np
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        ended = np.flatnonzero(dones)
        if ended.size:
            if final_obs is None:
                raise RuntimeError("the env ended episodes but gave no info['final_obs']")
            self._fill_ended(infos, ended, terminated_np, truncated_np, episode)
        rewards = packer.read("reward").astype(np.float32, copy=False)
        return packer.read("obs"), rewards, dones, infos

    def _fill_ended(
        self,
        infos: list[dict[str, Any]],
        ended: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        episode: dict[str, Any] | None,
    ) -> None:
        """SB3's terminal observation, time-limit flag and Monitor episode dict, ended envs only."""
        packer = self._packer
        assert packer is not None
        final = packer.read("final_obs", ended)
        stats: dict[str, np.ndarray] = {}
        has_stats = np.zeros(ended.size, dtype=bool)
        if episode is not None:
            has_stats = packer.read("_episode", ended).astype(bool, copy=False)
            stats = {key: packer.read(f"episode/{key}", ended) for key in episode}
        elapsed = round(time.perf_counter() - self._t_start, 6)
        for j, i in enumerate(ended.tolist()):
            info = infos[i]
            info["terminal_observation"] = final[j]
            info["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            if has_stats[j]:
                values = {key: column[j].item() for key, column in stats.items()}
                values["r"] = float(values.get("r", 0.0))
                info["episode"] = {**values, "t": elapsed}

    def close(self) -> None:
        self.env.close()

    # -- attributes and methods: one vector env serves every index --------------------------

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """The vector env's attribute (searched through its wrappers), once per index."""
        owner = self._owner(attr_name)
        if owner is None:
            raise AttributeError(f"{type(self.env).__name__} has no attribute {attr_name!r}")
        value = getattr(owner, attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set the attribute on the vector env; it is shared, so `indices` must cover every env."""
        self._require_all(indices, "set_attr")
        setattr(self._owner(attr_name) or self.env, attr_name, value)

    def env_method(
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        """Call the method once on the vector env.

        A result with one entry per sub-env (as from `render`) is split by index; any other
        result is repeated for each index.
        """
        owner = self._owner(method_name)
        if owner is None:
            raise AttributeError(f"{type(self.env).__name__} has no method {method_name!r}")
        result = getattr(owner, method_name)(*method_args, **method_kwargs)
        chosen = list(self._get_indices(indices))
        if isinstance(result, (list, tuple)) and len(result) == self.num_envs:
            return [result[i] for i in chosen]
        return [result for _ in chosen]

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None
    ) -> list[bool]:
        """Whether the vector env's wrapper chain holds `wrapper_class` (no per-env wrappers)."""
        wrapped = any(isinstance(env, wrapper_class) for env in self._chain())
        return [wrapped for _ in self._get_indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"the render mode is {self.render_mode!r}; get_images needs 'rgb_array'",
                stacklevel=2,
            )
            return [None for _ in range(self.num_envs)]
        return list(self.env.render())  # type: ignore[arg-type]

    # -- helpers -------------------------------------------------------------------------------

    def _chain(self) -> list[Any]:
        """The env and everything it wraps, outermost first."""
        chain, env = [], self.env
        while env is not None and not any(env is seen for seen in chain):
            chain.append(env)
            env = getattr(env, "env", None)
        return chain

    def _owner(self, name: str) -> Any:
        return next((env for env in self._chain() if hasattr(env, name)), None)

    def _require_all(self, indices: VecEnvIndices, what: str) -> None:
        chosen = sorted(set(self._get_indices(indices)))
        if chosen != list(range(self.num_envs)):
            raise ValueError(
                f"SB3VecEnv.{what}: the {self.num_envs} sub-envs share one vector env, so "
                f"indices must be None or all of them, got {indices!r}"
            )


def _check_tensor(value: Any, what: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"SB3VecEnv wraps a torch vector env, but its {what} is a {type(value).__name__}; "
            "pass the env itself, not a NumpyView/DLPackView of it"
        )
