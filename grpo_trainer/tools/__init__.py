"""Commands on top of everything: the CLI, Optuna sweeps, and the vector-env checker with its
host-sync counter."""
