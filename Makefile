# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# `make run` installs the service's own dependencies only; the development tools (pytest, mypy,
# Playwright, schemathesis, testcontainers) come with `make install`, which the other targets use.
RUNTIME_STAMP := $(VENV)/.runtime-stamp
DEV_STAMP := $(VENV)/.dev-stamp
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: install run test test-fast faults simulate test-model lint unit schemas bench clean screenshots eval

$(RUNTIME_STAMP): pyproject.toml
	@echo "mao-memory: installing the service's dependencies into $(VENV) (once; pip lists each package)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e .
	touch $@

$(DEV_STAMP): $(RUNTIME_STAMP)
	@echo "mao-memory: installing the development tools into $(VENV) (once)"
	$(BIN)/pip install -e '.[dev]'
	touch $@

install: $(DEV_STAMP)

## Run the service on its embedded defaults: SQLite under ./data, the embedded broker on 127.0.0.1:9092.
run: $(RUNTIME_STAMP)
	$(BIN)/mao-memory migrate
	$(BIN)/mao-memory run

## Lint, type-check and the whole test suite (unit, integration on MariaDB and SQLite, end to end).
test: install
	scripts/ensure-mariadb
	scripts/ensure-tools
	$(BIN)/ruff check service tests scripts migrations bench
	$(BIN)/ruff format --check service tests scripts migrations bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest

## The fault suite (crashes, SIGTERM, database outage, broker restart, poison input, LLM faults, the
## record and model fuzz at a larger example count); writes tests/faults/REPORT.md. A few minutes.
faults: install
	scripts/ensure-mariadb
	MEMORY_FUZZ_EXAMPLES=150 $(BIN)/pytest tests/faults

## The long-horizon simulation: 5 users × 2,000 events over a simulated year on MariaDB and on
## SQLite, one process per dialect side by side; writes tests/simulation/REPORT.md.
SIM := MEMORY_SIM_USERS=5 MEMORY_SIM_EVENTS=2000 $(BIN)/pytest -p no:cacheprovider tests/simulation/test_simulation.py
simulate: install
	scripts/ensure-mariadb
	rm -f tests/output/simulation-*.json
	$(SIM) -k mysql & mysql=$$!; $(SIM) -k sqlite; sqlite=$$?; wait $$mysql && test $$sqlite -eq 0
	$(BIN)/python -m tests.simulation.report

## Opt-in: the extraction path against a real model server (llama.cpp serving SmolLM2-135M);
## the first run builds llama-cpp-python (7-12 minutes on 2 cores). Writes tests/output/model-run.json.
test-model: install
	scripts/ensure-mariadb
	scripts/ensure-model-server
	MEMORY_TEST_MODEL=1 $(BIN)/pytest -p no:cacheprovider tests/model -s

## Extraction quality on the labelled set (eval/cases) with real models, reached through the
## MEMORY_LLM_* settings: `make eval MODELS="openai/gpt-4o-mini openai/gpt-4.1-mini"` (default
## MEMORY_DEFAULT_MODEL). Prints the comparison table; writes tests/output/eval.json.
MODELS ?=
eval: $(RUNTIME_STAMP)
	@mkdir -p tests/output
	$(BIN)/mao-memory eval $(foreach m,$(MODELS),--model $(m)) --out tests/output/eval.json $(EVAL_ARGS)

lint: install
	$(BIN)/ruff check --fix service tests scripts migrations
	$(BIN)/ruff format service tests scripts migrations

unit: install
	$(BIN)/pytest tests/unit

## The fast loop, without MariaDB or a broker, in under a minute: the unit tests and the integration
## tests on SQLite, but those marked slow (markers: tests/conftest.py, docs/testing.md).
test-fast: install
	$(BIN)/pytest tests/unit tests/integration -m "(unit or sqlite) and not mysql and not broker and not slow"

## The console's and /docs' screenshots in docs/screenshots (needs MariaDB and Chromium, like `make test`).
screenshots: install
	scripts/ensure-mariadb
	scripts/ensure-tools
	MEMORY_SCREENSHOTS_DIR=docs/screenshots $(BIN)/pytest -p no:cacheprovider tests/e2e/test_console.py -k screenshots
	MEMORY_SCREENSHOTS_DIR=docs/screenshots $(BIN)/pytest -p no:cacheprovider tests/e2e/test_api_docs.py

schemas: install
	$(BIN)/python scripts/generate_schemas.py

clean:
	rm -rf $(VENV) data tests/output

## Benchmarks: writes bench/results.json and bench/RESULTS.md (a few minutes; needs MariaDB).
bench: install
	scripts/ensure-mariadb
	scripts/ensure-tools
	$(BIN)/python -m bench.run
