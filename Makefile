# Two commands do everything on a fresh machine: `make train` and `make test`.
# Each creates (or reuses) .venv and installs the project with the tested torch pinned.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
EXTRAS ?= dev,sb3,jax,video,tensorboard,torchrl,wandb,sweep,box2d,minatar,envpool,gymnax
GYMNAX := gymnax==1.0.1
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
comma := ,

.PHONY: venv test train lint format bench bench-quick gpu-check clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[$(EXTRAS)]'
	$(if $(findstring gymnax,$(EXTRAS)),$(PY) -m pip install --quiet --disable-pip-version-check --no-deps $(GYMNAX))
	@rm -f $(VENV)/.installed-*
	@touch $@

venv: $(STAMP)

test: venv
	$(PY) -m pytest

RUN_DIR ?= runs/fruit_catcher

train: venv
	$(PY) -m grpo_trainer train --run-dir $(RUN_DIR) $(ARGS)
	$(PY) -m grpo_trainer eval --checkpoint $(RUN_DIR)/checkpoints/last.pt --episodes 1000

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: venv
	$(PY) benchmarks/env_throughput.py
	$(PY) benchmarks/train_throughput.py

bench-quick: venv
	$(PY) benchmarks/env_throughput.py --quick
	$(PY) benchmarks/train_throughput.py --quick

gpu-check: venv
	$(PY) scripts/gpu_check.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis *.egg-info
