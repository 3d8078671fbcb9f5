# Two commands on a fresh machine: `make demo` and `make test`.
# Both create and fill .venv on first use (pinned by constraints.txt).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit soak fleet chaos bench dist clean

# Two stages, so a first `make demo` installs only what the demo runs: the library
# with its `local` extra (moto's SQS and DynamoDB backends and its server), about
# 150 MB. `make test` (and every other target) adds the rest: the other extras, the
# test and lint tools, and the CDK constructs (cdk/, a sibling package) with what
# their tests need (aws-cdk-lib, cdk-nag, cfn-lint): tests/test_cdk.py runs in
# `make test`. Both pinned by constraints.txt.
DEMO_STAMP := $(VENV)/.demo-installed
PIP_INSTALL := $(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt
$(DEMO_STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP_INSTALL) -e '.[local]'
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP) pyproject.toml constraints.txt cdk/pyproject.toml
	$(PIP_INSTALL) -e '.[dev]' -e './cdk[test]'
	touch $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check --exclude '*.md' .

typecheck: $(STAMP)
	$(BIN)/mypy

# pytest includes tests/test_packaging.py: it builds the sdist and the wheel and
# runs the wheel from a fresh virtualenv. --durations keeps the slow ones in view.
# Six worker processes (pytest-xdist) on two cores: most tests spend their time
# waiting (leases lapsing, long polls, worker processes starting), not computing,
# so six overlap their waits. Measured on a calm 2-core machine: 4 workers 349 s,
# 6 workers 290 s, with the two cores then about 90% busy (more workers would only
# stretch the CPU-bound tests and the lease timings beside them).
# loadgroup keeps each file marked xdist_group on one worker (its module fixture,
# e.g. the wheel build or the CDK synth, is built once); every other test goes
# wherever a worker is free. A test run alone (pytest tests/x.py) stays serial.
# mypy (one core, minutes from a cold cache) runs beside pytest rather than before
# it: its report is printed after pytest's only if it found something, so pytest's
# summary stays the closing line; either failing fails the target.
# Bytecode is cached under .venv/pycache even where PYTHONDONTWRITEBYTECODE is set
# (nothing lands in the tree): without it every worker process recompiles and
# pytest re-rewrites the asserts of every test module at collection, about 7
# CPU-seconds per process, and every worker, CLI and emulator subprocess the tests
# start compiles the package afresh.
TEST_WORKERS ?= 6
PYCACHE := env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(CURDIR)/$(VENV)/pycache
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check --exclude '*.md' .
	$(BIN)/mypy > $(VENV)/mypy.out 2>&1 & mypy=$$!; \
	$(PYCACHE) $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --durations=10 -m 'not long'; \
	tests=$$?; \
	if wait $$mypy; then typed=0; else typed=1; echo "mypy:"; cat $(VENV)/mypy.out; fi; \
	test $$tests -eq 0 -a $$typed -eq 0

# The long checks first (the mutation search, the long seed batches), then the soak.
soak: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 -m long
	$(BIN)/python -m simtools soak --seeds 100000
	$(MAKE) fleet

# 500 workers, a burst of 100,000 jobs, on a new table and on one warmed to its quota
fleet: $(STAMP)
	$(BIN)/python -m simtools fleet --table new --json fleet-new.json
	$(BIN)/python -m simtools fleet --table quota --json fleet-quota.json

chaos: $(STAMP)
	$(BIN)/python benchmarks/chaos.py

bench: $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[bench]'
	$(BIN)/python benchmarks/run.py

# The sdist, and the wheel built from it, in dist/.
dist: $(STAMP)
	$(BIN)/python -m build --no-isolation --outdir dist .

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache *.egg-info build dist cdk/cdk.out cdk/*.egg-info
