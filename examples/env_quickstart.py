"""FruitCatcher-v0 in a nutshell: a batch of games, a scripted policy, stats kept on device."""

import gymnasium as gym
import torch

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from fruit_env.cli import chase_policy

device = "cuda" if torch.cuda.is_available() else "cpu"
envs = gym.make_vec("FruitCatcher-v0", num_envs=256, device=device)
obs, info = envs.reset(seed=0)
totals = torch.zeros(4, device=device)  # episodes, return, caught, missed
for _ in range(1000):
    obs, reward, terminated, truncated, info = envs.step(chase_policy(obs))
    ended, ep = info["_episode"], info["episode"]  # tensors on `device`: no host sync here
    stats = torch.stack([torch.ones_like(ep["r"]), ep["r"], ep["caught"], ep["missed"]])
    totals += torch.where(ended, stats, 0).sum(1)
episodes, ret, caught, missed = totals.tolist()  # the one copy to the host
rate = caught / (caught + missed)
print(f"{episodes:.0f} episodes, mean return {ret / episodes:+.2f}, catch rate {rate:.3f}")
envs.close()
