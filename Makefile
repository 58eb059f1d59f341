# servesim — `make run` runs the default scenario, `make test` runs the whole suite.
# Both create a local virtual environment (.venv) and install the project into it first.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run

.PHONY: run test bench bench-startup fidelity lint docs-check clean

# `make run` needs the package and its plot extra only; `make test` (and bench, fidelity, lint)
# the dev tools as well.
$(RUN_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[plot]'
	@touch $(RUN_STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP) $(RUN_STAMP)

run: $(RUN_STAMP)
	$(BIN)/servesim run

# The suite runs on every core (pytest-xdist); TEST_JOBS=0 runs it in one process.
TEST_JOBS ?= auto

test: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -n $(TEST_JOBS)

# `make bench` runs the speed and memory scenarios, then the start-up check (bench/startup.py:
# `servesim run` of a tiny scenario in under 0.2 s); `make bench-startup` runs the latter alone.
bench: $(STAMP)
	$(BIN)/python bench/run.py
	$(BIN)/python bench/startup.py

bench-startup: $(STAMP)
	$(BIN)/python bench/startup.py

fidelity: $(STAMP)
	$(BIN)/python bench/fidelity.py --refit

lint: $(STAMP)
	$(BIN)/ruff check servesim tests bench examples
	$(BIN)/mypy servesim/simcore

clean:
	rm -rf $(VENV) results .pytest_cache .hypothesis
