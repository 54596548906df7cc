# The two commands of the README: `make demo` runs the main job, `make test` runs the whole test suite.
# Both build the virtualenv from the pinned requirements.lock first, so a fresh machine needs nothing else.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast bench lint clean

$(BIN)/.installed: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

demo: $(BIN)/.installed
	$(BIN)/ledgerview demo

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest

test-fast: $(BIN)/.installed
	$(BIN)/python -m pytest -m "not spark and not fault and not slow"

# The peers the benchmarks compare against; not needed to run or test ledgerview.
$(BIN)/.bench-installed: $(BIN)/.installed bench/requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check -r bench/requirements.lock
	touch $@

bench: $(BIN)/.bench-installed
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) demo-data
