# Two commands do everything on a fresh machine: `make train` and `make test`.
# Each creates (or reuses) .venv and installs the project with the tested torch pinned.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
EXTRAS ?= dev,sb3,jax,video,tensorboard,torchrl,wandb,sweep,box2d,minatar,envpool,gymnax
GYMNAX := gymnax==1.0.1
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
CORE_STAMP := $(VENV)/.installed-core
comma := ,
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: venv test train lint format bench bench-quick gpu-check clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -e '.[$(EXTRAS)]'
	$(if $(findstring gymnax,$(EXTRAS)),$(PIP) --no-deps $(GYMNAX))
	@rm -f $(VENV)/.installed-*
	@touch $@ $(CORE_STAMP)

# `make train` needs only the core (torch, gymnasium, numpy, rich): on a GPU machine pip
# resolves the pinned torch to its CUDA build, and no optional extra (a library without a
# wheel for that Python, say) stands in the way of training.
$(CORE_STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -e .
	@touch $@

venv: $(STAMP)

test: venv
	$(PY) -m pytest

# A new run directory each time, so that a second `make train` never touches the first's.
ifndef RUN_DIR
RUN_DIR := runs/fruit_catcher-$(shell date +%Y%m%d-%H%M%S)
endif

train: $(CORE_STAMP)
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
