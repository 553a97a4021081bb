# Frontier: the two commands on a fresh machine are `make demo` and `make test`.
PY      ?= python3.11
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: install system-packages test test-fast demo lint fmt bench clean

install: $(STAMP)

$(STAMP): pyproject.toml runtime/pyproject.toml gateway/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU wheel of torch lies on local disk; pin it first so nothing pulls a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e './runtime' -e './gateway' -e '.[dev]'
	touch $(STAMP)

system-packages:
	bash scripts/system-packages.sh

test: install system-packages
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not e2e and not slow"

demo: install system-packages
	$(BIN)/python -m frontier.local.demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install
	$(BIN)/python bench/engine_throughput.py

clean:
	rm -rf build dist .pytest_cache .frontier
