# The two set-up commands of the README:
#   make quickstart   install, then run the quickstart
#   make test         install everything, then run the whole test suite (what CI runs: .ci/run)
# Everything installs into .venv with the versions pinned in constraints.txt (torch: the CPU build).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Two test processes (pytest-xdist): most tests wait on subprocesses, servers and Ray for part of their time.
# Measured 2026-11-24 on 2 cores, a clean clone of the same commit: 640 s with two (the cores 92% busy), 647 s with
# three (98% busy, and 80 CPU-seconds more: each process has its own Ray); on slower machines of the same size,
# 906-1,144 s with two (96% busy: docs/dev/setup-times.md and docs/dev/test-suite.md). worksteal: a process that runs out of tests takes the tail of the
# other's queue (tests/conftest.py deals the long tests out between the processes, longest first, so what is
# stolen at the end is short); xdist's default hands out fixed chunks (849 s against 591 s, on a faster machine).
PYTEST_WORKERS ?= 2
PYTEST_DIST ?= worksteal

.PHONY: install tools quickstart test test-fast lint format bench constraints clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

quickstart: install
	$(BIN)/ablate sweep ablations/studies/quickstart.yaml
	$(BIN)/ablate report quickstart
	@echo "Browse it in MLflow: $(BIN)/ablate ui quickstart   (it prints the link to open: the experiment 'quickstart';"
	@echo "the report is an artifact of its parent run: report/report.html). Other commands: source $(VENV)/bin/activate"

# Test tools from Debian packages: headless Chromium + chromedriver (browser tests) and docker-compose (it
# validates docker-compose.yml without an engine). Tests that need a missing one skip and say why.
tools:
	@missing=""; command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium chromium-driver"; \
	command -v docker-compose >/dev/null 2>&1 || missing="$$missing docker-compose"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing (Debian packages) for the tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || true; \
	  else echo "note: missing$$missing: the tests that need them will skip (Debian: sudo apt-get install$$missing)"; fi; \
	fi

test: install tools
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist $(PYTEST_DIST) $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist $(PYTEST_DIST) -m 'not slow' $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,bench]'
	$(BIN)/python benchmarks/run.py

# Re-pin every version after changing dependencies in pyproject.toml.
constraints:
	rm -rf /tmp/ablate-pin && $(PYTHON) -m venv /tmp/ablate-pin
	/tmp/ablate-pin/bin/pip install --quiet 'torch==2.13.0' -e '.[dev,bench]'
	(echo '# Every version that setup and CI install (make install). torch: the CPU build 2.13.0. Regenerate with: make constraints'; \
	 /tmp/ablate-pin/bin/pip freeze --exclude-editable | grep -v '^-e' | sed 's/^torch==\(.*\)+cpu$$/torch==\1/') > constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
