"""The run around the algorithm: the loop to a budget, and its services as callbacks
(files and checkpoints, evaluation during training, progress, Weights & Biases).
Imports `base`, `envs` and `algorithm`; nothing below imports it."""
