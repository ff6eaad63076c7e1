# Two entry points: `make demo` (install + the whole pipeline) and `make test` (install + lint + tests).
# Both create .venv on a fresh clone; nothing needs to be preinstalled but python3 (>= 3.11).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Stage commands in dvc.yaml call `python`: run them with the venv first on PATH.
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: demo test install install-dev lint clean-outputs

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

demo: install
	$(BIN)/dvc repro
	@$(BIN)/python -m vlmgym.demo_summary

lint: install-dev
	$(BIN)/ruff check src stages tests

test: install-dev lint
	$(BIN)/python -m pytest

clean-outputs:
	rm -rf data models outputs metrics reports mlflow.db mlartifacts
