# Every target wraps one command; `make test` is what .ci/run calls.
# `make run` installs the runtime dependencies only; test, lint, type and bench add the dev extra.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= config.yaml
SUM := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
RUN_STAMP := $(VENV)/.installed-run-$(SUM)
DEV_STAMP := $(VENV)/.installed-dev-$(SUM)

.PHONY: run test lint type bench browser-deps clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(RUN_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	rm -f $(VENV)/.installed-run-*
	touch $(RUN_STAMP)

$(DEV_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-dev-*
	touch $(DEV_STAMP)

# The operator's config: made once from the example, never overwritten (edit it freely).
config.yaml:
	cp config.example.yaml config.yaml

run: $(RUN_STAMP) $(CONFIG)
	$(BIN)/goclaw serve --config $(CONFIG)

test: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

type: $(DEV_STAMP)
	$(BIN)/mypy

bench: $(DEV_STAMP)
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
