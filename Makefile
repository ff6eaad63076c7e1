# Two entry points: `make demo` (install + the whole pipeline) and `make test` (install + lint + tests).
# Both create .venv on a fresh clone; nothing needs to be preinstalled but python3 (>= 3.11).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Stage commands in dvc.yaml call `python`: run them with the venv first on PATH.
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: demo test test-fast install install-dev install-gpu lint browser clean-outputs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The marker files are rebuilt when pyproject.toml changes, so `make test` also updates an old .venv.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# On a machine with an NVIDIA GPU: the same install plus JAX's CUDA 12 build (pyproject.toml's `cuda` extra), then
# the devices JAX sees. torch is left as `make install` installs it: the pipeline runs it on the CPU only.
install-gpu: | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[cuda]'
	touch $(VENV)/.installed
	$(BIN)/python -c 'import jax; print("JAX", jax.__version__, "sees:", jax.devices())'

demo: install
	$(BIN)/dvc repro
	@$(BIN)/python -m vlmgym.cli.demo_summary

lint: install-dev
	$(BIN)/ruff check src stages tests

# tests/pipeline/test_report_browser.py opens reports/eval.html in Debian's chromium (headless). A fresh CI machine
# runs as root, so the package installs here; a non-root user without chromium is told what to install.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" != 0 ]; then echo "make test: chromium is missing; as root: apt-get install chromium" >&2; exit 1; fi; \
	  command -v apt-get >/dev/null || { echo "make test: chromium is missing and there is no apt-get" >&2; exit 1; }; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get -qq -o DPkg::Lock::Timeout=600 update && \
	  apt-get -qq -o DPkg::Lock::Timeout=600 install -y --no-install-recommends chromium >/dev/null; \
	  command -v chromium >/dev/null || { echo "make test: apt-get did not install chromium" >&2; exit 1; }; }

# One pytest worker per core (pytest-xdist, worksteal: each worker starts on half the suite, ordered by
# tests/conftest.py so the micro pipeline runs start at once on both, and an idle worker takes tests from the other's
# queue); the micro pipeline runs are built once per session whichever worker asks first (tests/shared_setup.py).
# A test whose worker process crashed runs once more in a fresh worker (XLA:CPU aborted inside a compile in some full
# runs); a test that fails, or crashes again, fails (pytest-rerunfailures; --only-rerun matches the worker-crash
# report only).
# --durations: the 30 longest setups and tests close the output, to see where the suite's time goes.
PYTEST := $(BIN)/python -m pytest -n auto --dist worksteal --reruns 1 --only-rerun "crashed" --durations=30
test: install-dev lint browser
	$(PYTEST)

# The inner loop: no micro pipeline run (tests/pipeline/) and no module marked slow (no browser needed).
test-fast: install-dev lint
	$(PYTEST) -m "not slow" --ignore=tests/pipeline

clean-outputs:
	rm -rf data models outputs metrics reports mlflow.db mlartifacts
