"""What every layer uses: the config, checkpoint files, the metric registry, devices and
compilation, ranks, schedules. Imports nothing else of grpo_trainer."""
