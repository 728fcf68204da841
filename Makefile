# Every target wraps one command; `make test` is what .ci/run calls.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= config.example.yaml
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test lint type bench browser-deps clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/goclaw serve --config $(CONFIG)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

type: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
