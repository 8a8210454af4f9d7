# Two commands do all the set-up: `make run` and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.PHONY: run test lint typecheck check proto bench bench-load demo clean deps-system deps-browser deps-fuse mutate

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark]'
	touch $(STAMP)

# Byte-compiled first: an editable install under PYTHONDONTWRITEBYTECODE=1 (set on some
# machines, this one included) would otherwise compile every module at every start, 0.6-0.8 s
# of CPU before the broker listens instead of 0.2-0.35 s. Up-to-date files are skipped.
run: $(STAMP)
	@$(PY) -m compileall -q src >/dev/null
	$(VENV)/bin/keyshared standalone $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

check: lint typecheck

# Debian packages the suite needs, only those missing, in one apt-get run (CI is root; two runs
# at once would fight over dpkg's lock): headless Chromium for the dashboard's browser test,
# fuse3 for the power-loss tests' FUSE layer.
deps-system:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  missing="$$missing chromium"; \
	command -v fusermount3 >/dev/null 2>&1 || missing="$$missing fuse3"; \
	[ -z "$$missing" ] || \
	  { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; } || \
	  echo "deps-system: could not install$$missing; the dashboard and power-loss tests need them"

deps-browser deps-fuse: deps-system

# Three workers on a 2-core machine: with two, a third of the CPU sat idle while tests waited on
# timers (ack timeouts, expiry checks, the Spark cluster's start), and a third worker fills it:
# 875 s to 720 s of tests on this 2-core machine. Spark tests share one worker (one
# SparkSession, one JVM).
# The set-up runs in parallel (-j3): apt-get fetches and unpacks while pip installs the venv and
# then ruff and mypy run, instead of one after the other.
# Byte-compiled first, as for `make run`: the suite starts hundreds of broker and client
# processes, and under PYTHONDONTWRITEBYTECODE=1 each would compile every module again.
test:
	@$(MAKE) --no-print-directory -j3 check deps-system
	@$(PY) -m compileall -q src tests >/dev/null
	$(PY) -m pytest -q -n 3 --dist loadgroup $(PYTEST_ARGS)

proto: $(STAMP)
	$(PY) -m keyshared.protocol.regen

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[dev,bench]'
	$(PY) bench/run_e2e.py $(ARGS)

# The load test (bench/bench_load.py; not part of `make test`): idle connections, slow topics,
# fast and misbehaving clients, niced so it does not starve whatever else runs. ARGS e.g.
# `--connections 10000 --topics 10000`, or `--minutes 30` for the soak.
bench-load: $(STAMP)
	nice -n 10 $(PY) bench/bench_load.py $(ARGS)

# Mutation testing of the dispatch, cursor, range-set and dedup code (offline; not part of test).
# Resumable: each result is kept in ./mutants as it comes; run it again to go on. Hours on two
# cores, so it runs niced. ARGS go to bench/mutation/run.py (modules, --workers, --seeds, --rerun).
mutate: $(STAMP)
	nice -n 19 $(PY) bench/mutation/run.py $(ARGS)
	$(PY) bench/mutation/report.py

demo: $(STAMP)
	$(PY) -m keyshared.spark.demo $(ARGS)

clean:
	rm -rf $(VENV) mutants build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
