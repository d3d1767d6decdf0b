"""GRPO itself: the policy, rollouts, advantages, the loss, the optimiser step, and `GRPO`,
which composes them into `update = collect + learn`. Imports `base` and `envs` only."""
