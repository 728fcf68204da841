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

# The browser tests drive Debian's Chromium (Playwright's own download cannot work here).
test: $(DEV_STAMP)
	test -x /usr/bin/chromium || ! command -v apt-get >/dev/null \
		|| (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
		|| echo "warning: could not install chromium; the browser tests will say so" >&2
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

type: $(DEV_STAMP)
	$(BIN)/mypy

# Every benchmark in bench/, each with a quick setting (all of them in under 10 minutes on 2 cores);
# a benchmark not listed here runs on its own defaults. bench/README.md has the full runs and figures.
QUICK_turn_overhead := --requests 400 --runs 1
QUICK_provider_cpu := --calls 100 --runs 3
QUICK_startup := --runs 3
QUICK_model_load := --seconds 10
QUICK_memory_prompt := --records 20000 --runs 100
QUICK_consolidation := --notes 2000
QUICK_consolidation_load := --notes 2000
QUICK_match_words := --notes 8000 --runs 1 --conversations 100
QUICK_learning_delay := --runs 3
QUICK_dashboard_pages := --records 20000 --runs 10
QUICK_stream_ttft := --runs 15
QUICK_multi_process := --seconds 5 --runs 1
QUICK_turn_instructions := --turns 100 --sessions 3
QUICK_job_drain := --jobs 500 --runs 2 --postgres
QUICK_engine_checkout := --sessions 500 --runs 2
QUICK_memory_write := --records 20000 --users 500 --writes 100 --runs 1
QUICK_idle_sweep := --messages 100000 --sessions 500 --runs 1
QUICK_signal_routing := --signals 50000 --runs 1
QUICK_sop_hold := --obligations 40000 --runs 1
QUICK_history_reads := --history 50000 --runs 1
BENCHES := $(sort $(filter-out bench/ab.py,$(wildcard bench/*.py)))  # ab.py: the A/B harness, not a benchmark

# bench/turn_instructions.py counts instructions with Debian's valgrind (callgrind).
bench: $(DEV_STAMP)
	command -v valgrind >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null) \
		|| echo "warning: could not install valgrind; bench/turn_instructions.py will say so" >&2
	$(foreach b,$(BENCHES),echo "== $(b)" && $(BIN)/python $(b) $(QUICK_$(basename $(notdir $(b)))) && ) true

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
