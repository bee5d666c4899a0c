# coevo: `make run` runs the quickstart scenario, `make test` runs the tests.
# Both set up the virtualenv .venv from pyproject.toml first if it is missing or stale.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ENVS_STAMP := $(VENV)/.installed-envs
SCENARIO ?= scenarios/quickstart.toml
PYTEST_ARGS ?=

.PHONY: install install-envs run test test-slow test-faults lint format bench results headline model clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# the extras for the real environments (ScienceWorld, TextWorld): their tests run in `make test`
# once installed, and are skipped otherwise
install-envs: $(ENVS_STAMP)

$(ENVS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,scienceworld,textworld]'
	touch $(ENVS_STAMP)

run: install
	$(BIN)/coevo run $(SCENARIO)

test: install
	$(BIN)/pytest $(PYTEST_ARGS)

test-slow: install
	$(BIN)/pytest -m slow $(PYTEST_ARGS)

# the fault and bad-input sweeps (docs/RELIABILITY.md): every page of a log overwritten or cut,
# every record flipped, the scenario fuzz with ten times its cases, and runs killed (SIGKILL) or
# stopped (SIGINT) at random points and resumed (the slow sweeps included; tens of minutes)
test-faults: install
	$(BIN)/pytest -m faults --ignore=tests/faults $(PYTEST_ARGS)
	COEVO_FUZZ_SCALE=10 $(BIN)/pytest tests/property/test_scenario_fuzz.py $(PYTEST_ARGS)
	$(BIN)/pytest tests/faults -m '' -s $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: install
	$(BIN)/python bench/bench_log.py
	$(BIN)/python bench/world_baselines.py

# the evidence in docs/RESULTS.md: GRPO curves over 3 seeds, rollout throughput, coevo vs a
# synchronous loop (about an hour on 2 cores)
results: install
	$(BIN)/python bench/grpo_results.py

# the headline table of docs/RESULTS.md: GRPO, EMPO2, Complementary RL, its frozen control and
# the combination, 5 seeds each, final figures with 95% bootstrap intervals (runs/headline; a
# finished run is read, not rerun; hours on 2 cores)
headline: install
	$(BIN)/python bench/headline.py --seeds 0 1 2 3 4 --parallel 2

# build (or find in the cache) the embedded default model and print its report
model: install
	$(BIN)/python -m agents.embedded

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
