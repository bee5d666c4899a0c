# coevo: `make run` runs the quickstart scenario, `make test` runs the tests.
# Both set up the virtualenv .venv from pyproject.toml first if it is missing or stale, with the
# versions pinned in constraints.txt (what CI tested; `make constraints` renews it).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ENVS_STAMP := $(VENV)/.installed-envs
SCENARIO ?= scenarios/quickstart.toml
PYTEST_ARGS ?=
CONSTRAINTS := constraints.txt
# the extras every developer and CI installs: the tools, the tracking sinks, the browser, frames
EXTRAS := dev,tracking,wandb,mlflow,frames,serve
LOCK_VENV := .venv-lock
# the wrapper asks PyPI for a newer pyright on every run; the version is pinned in constraints.txt
LINT_ENV := PYRIGHT_PYTHON_IGNORE_WARNINGS=1

.PHONY: install install-envs constraints run test test-slow test-faults lint format bench results \
	headline model clean

install: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel -c $(CONSTRAINTS)
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]' -c $(CONSTRAINTS)
	touch $(STAMP)

# the extras for the real environments (ScienceWorld, TextWorld) and for Ray (the backend that
# places actors on a cluster): their tests run in `make test` once installed, and are skipped
# otherwise (in CI, where .ci/run installs them, a skip fails the run)
install-envs: $(ENVS_STAMP)

$(ENVS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS),scienceworld,textworld,ray]' -c $(CONSTRAINTS)
	touch $(ENVS_STAMP)

# renew constraints.txt after a change of dependencies in pyproject.toml: resolve every extra
# afresh in a scratch virtualenv (the newest versions pyproject allows) and freeze it (the project
# itself left out; local version labels such as torch's +cpu dropped, so that PyPI's wheels match)
constraints:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet --upgrade pip setuptools wheel
	$(LOCK_VENV)/bin/python -m pip install --quiet -e '.[$(EXTRAS),scienceworld,textworld,ray]'
	{ echo "# The versions CI tested (make install uses them). Renew with make constraints."; \
	  $(LOCK_VENV)/bin/python -m pip freeze --all --exclude-editable | sed -E 's/\+[[:alnum:].]+$$//'; \
	} > $(CONSTRAINTS)
	rm -rf $(LOCK_VENV)

run: install
	$(BIN)/coevo run $(SCENARIO)

# Hypothesis profiles (tests/conftest.py): "ci" derandomized with no deadline, so a run is
# reproducible and does not depend on the machine's load; "faults" random with more examples.
# The default suite runs in TEST_WORKERS processes (pytest-xdist), each test file in one of them
# (its module fixtures built once); TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: install
	HYPOTHESIS_PROFILE=ci $(BIN)/pytest --durations=20 -n $(TEST_WORKERS) --dist loadfile \
		$(PYTEST_ARGS)

test-slow: install
	HYPOTHESIS_PROFILE=ci $(BIN)/pytest -m slow $(PYTEST_ARGS)

# the fault and bad-input sweeps (docs/RELIABILITY.md): every page of a log overwritten or cut,
# every record flipped, the scenario fuzz with ten times its cases, the property and stateful
# tests on fresh random examples, and runs killed (SIGKILL) or stopped (SIGINT) at random points
# and resumed (the slow sweeps included; tens of minutes)
test-faults: export HYPOTHESIS_PROFILE = faults
test-faults: install
	rm -f $${COEVO_FAULT_COUNTS:-runs/faults/counts.json}  # the counts of this sweep only
	$(BIN)/pytest -m faults --ignore=tests/faults $(PYTEST_ARGS)
	COEVO_FUZZ_SCALE=10 $(BIN)/pytest tests/property/test_scenario_fuzz.py $(PYTEST_ARGS)
	$(BIN)/pytest tests/property tests/stateful --ignore=tests/property/test_scenario_fuzz.py \
		$(PYTEST_ARGS)
	$(BIN)/pytest tests/faults -m '' -s $(PYTEST_ARGS)

# ruff (lint, format) and pyright ([tool.pyright] in pyproject.toml: strict on engine/, stores/,
# scenarios/, standard on agents/); pyright's PyPI wheel brings node as a wheel (nodejs extra)
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(LINT_ENV) $(BIN)/pyright

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# BASELINE=DIR (a checkout of the code before, e.g. `git worktree add DIR main`) adds the event
# log, rollout (the quickstart and a short EMPO2 run, each side with its own scenario file; the
# EMPO2 run also with a two-thread learner process) and inference rows, each measured against
# that checkout in the same run, alternating
BASELINE ?=
bench: install
	rm -rf runs/bench-learner
	$(BIN)/coevo run scenarios/quickstart.toml --out runs/bench-learner --quiet \
		--set run.episodes=192 --set eval.every=0 --set eval.final_episodes=0
	$(BIN)/python bench/bench_log.py --run runs/bench-learner
	$(BIN)/python bench/bench_state_growth.py
	$(BIN)/python bench/world_baselines.py
	$(BIN)/python bench/bench_learner.py --run runs/bench-learner --updates 6
ifneq ($(BASELINE),)
	$(BIN)/python bench/bench_log.py --baseline $(BASELINE) --repeats 3
	rm -rf runs/bench-rollout
	$(BIN)/python bench/bench_rollout.py --baseline $(BASELINE) --keep runs/bench-rollout
	$(BIN)/python bench/bench_inference.py runs/bench-rollout/new-0 --baseline $(BASELINE)
	$(BIN)/python bench/bench_rollout.py --baseline $(BASELINE) --no-rollout \
		--scenario scenarios/empo2.toml --set run.episodes=96 --set eval.every=0 \
		--set eval.final_episodes=0 --set eval.adapt_attempts=0
	$(BIN)/python bench/bench_rollout.py --baseline $(BASELINE) --no-rollout \
		--scenario scenarios/empo2.toml --set run.episodes=96 --set eval.every=0 \
		--set eval.final_episodes=0 --set eval.adapt_attempts=0 \
		--new-set policy.learner_threads=2
endif

# the evidence in docs/RESULTS.md: GRPO curves over 3 seeds, rollout throughput, coevo vs a
# synchronous loop (about an hour on 2 cores)
results: install
	$(BIN)/python bench/grpo_results.py

# the headline table of docs/RESULTS.md: GRPO, EMPO2, Complementary RL, its frozen control and
# the combination, 5 seeds each, final figures with 95% bootstrap intervals (runs/headline; a
# finished run is read, not rerun; hours on 2 cores); it publishes to docs/results
headline: install
	$(BIN)/python bench/headline.py --seeds 0 1 2 3 4 --parallel 2 --out docs/results

# build (or find in the cache) the embedded default model and print its report
model: install
	$(BIN)/python -m agents.models.embedded

clean:
	rm -rf $(VENV) $(LOCK_VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
