# The two commands of the README: `make demo` runs the main job, `make test` runs the whole test suite.
# Both build the virtualenv from the pinned requirements.lock first, so a fresh machine needs nothing else.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast bench lint clean kcat chromium

$(BIN)/.installed: requirements.lock pyproject.toml
	@echo "Creating $(VENV) and installing the pinned packages of requirements.lock (a minute or two on a fresh machine)..."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@echo "$(VENV) is ready."
	touch $@

demo: $(BIN)/.installed
	$(BIN)/ledgerview demo

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy

# The tests run on TEST_WORKERS pytest-xdist workers: most of a test's time is spent waiting (Spark, service and
# endpoint processes starting, killed and restarted; fsync), so more workers than cores still shortens the run.
# Each test module is one unit of work, but the tests sharing the Spark session (tests/spark/) are one, and those
# sharing the local-cluster Spark (tests/spark_cluster/) one more, so each starts once (tests/conftest.py).
# Three, on this 2-core machine: with 4 the run was no shorter (18 min 22 s of pytest, 2026-11-27) and three Spark
# children passed their 90 and 120 s start and exit guards, the two cores being the limit by then.
# Python's bytecode cache is on for the tests even where PYTHONDONTWRITEBYTECODE is set: the suite starts hundreds of
# Python processes (commands, services, endpoints, Spark's workers), and each would compile the engine again (about
# 2 s of CPU here), as each worker would rewrite every test module's asserts again.
TEST_WORKERS ?= 3
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -n $(TEST_WORKERS) --no-loadscope-reorder

test: lint kcat chromium
	@echo "Running the tests on $(TEST_WORKERS) workers: Spark's and the slow ones first, the fast ones filling in."
	$(PYTEST)

# kcat, Debian's package, for the Kafka endpoint tests; where apt-get cannot install it those tests skip, saying so.
kcat:
	@command -v kcat >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		{ apt-get install -y -qq kcat >/dev/null 2>&1 || \
		  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq kcat >/dev/null 2>&1; }; }; } || \
		echo "kcat could not be installed with apt-get: the kcat tests will skip"

# Chromium, Debian's package, for the web console's test (headless); where apt-get cannot install it that test skips.
chromium:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		{ echo "Installing Debian's chromium for the console test..."; \
		  apt-get install -y -qq chromium >/dev/null 2>&1 || \
		  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; }; }; } || \
		echo "chromium could not be installed with apt-get: the console test will skip"

test-fast: $(BIN)/.installed
	$(PYTEST) -m "not spark and not fault and not slow"

# The peers the benchmarks compare against; not needed to run or test ledgerview.
$(BIN)/.bench-installed: $(BIN)/.installed bench/requirements.lock
	@echo "Installing the benchmarks' peers from bench/requirements.lock..."
	$(BIN)/pip install --quiet --disable-pip-version-check -r bench/requirements.lock
	touch $@

bench: $(BIN)/.bench-installed
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) demo-data
