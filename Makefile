# sweep — `make help` lists the targets. Every target installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install test test-fast perf check fmt lint types demo clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install sweep with its dev extras

test: $(STAMP) ## run the whole test suite (what CI runs)
	$(BIN)/pytest

test-fast: $(STAMP) ## run the tests not marked slow
	$(BIN)/pytest -m "not slow"

perf: $(STAMP) ## run the benchmarks; prints figures and writes perf-results.json
	$(BIN)/python -m tests.perf

check: $(STAMP) ## format check, lint, types, tests
	$(BIN)/ruff format --check sweep analysis tests
	$(BIN)/ruff check sweep analysis tests
	$(BIN)/mypy
	$(BIN)/pytest

fmt: $(STAMP) ## format the code
	$(BIN)/ruff format sweep analysis tests
	$(BIN)/ruff check --fix sweep analysis tests

demo: $(STAMP) ## run the demo on the simulated server (placeholder until studies land)
	@echo "The demo study arrives with 'sweep run'; meanwhile, the simulator's truth for 1-10 steps:"
	@for s in 1 2 3 5 10; do \
	  printf "steps %-3s" $$s; \
	  $(BIN)/sweep sim --model-path demo --tp-size 8 --speculative-algorithm EAGLE3 \
	    --speculative-num-steps $$s --speculative-eagle-topk 1 --speculative-num-draft-tokens $$((s+1)) \
	    --predict 2>/dev/null | $(BIN)/python -c "import json,sys; d=json.load(sys.stdin); print(f\"accept length {d['accept_length']:.2f}  {d['levels']['1']['decode_tok_s']:.1f} tok/s\")"; \
	done

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache perf-results.json
