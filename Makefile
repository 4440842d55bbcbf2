PYTHON ?= python3
PYTEST ?= $(PYTHON) -m pytest
FUZZ_SECONDS ?= 600
TYPECHECK_ROOT := build/typecheck

.PHONY: install installed test lint typecheck demo bench bench-smoke bench-huge bench-store bench-report fuzz fuzz-smoke clean

install:
	$(PYTHON) -m pip install -e '.[dev,fuzz,bench]'

# `make demo` and `make test` work on a fresh clone: when `callgate` is not importable
# from this checkout (not installed, or installed from another clone, whose code the
# tests would then run), install this one first (editable, with the test extras).
installed:
	@$(PYTHON) -c "import pathlib, sys, callgate.engine as e; \
	sys.exit(pathlib.Path(e.__file__).resolve().parent != pathlib.Path('engine').resolve())" \
	2>/dev/null || $(PYTHON) -m pip install -e '.[dev]'

test: installed
	$(PYTEST) -q

# mypy does not follow setuptools' editable import hook, so type-check through a link
# tree that mirrors the installed layout (callgate/engine -> engine, callgate/adapters -> adapters).
typecheck:
	@mkdir -p $(TYPECHECK_ROOT)/callgate
	@ln -sfn $(CURDIR)/engine $(TYPECHECK_ROOT)/callgate/engine
	@ln -sfn $(CURDIR)/adapters $(TYPECHECK_ROOT)/callgate/adapters
	cd $(TYPECHECK_ROOT) && MYPYPATH=. $(PYTHON) -m mypy --config-file $(CURDIR)/pyproject.toml -p callgate.engine -p callgate.adapters

lint: typecheck
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check engine adapters

demo: installed
	$(PYTHON) -m callgate.engine.cli demo

bench:
	$(PYTEST) bench -q --benchmark-only --benchmark-columns=median,ops --benchmark-sort=name -p no:randomly

# The 100 MB stream and the 10 MiB memory case of every kind (minutes); bench-report folds
# its JSON into the report when it exists.
bench-huge:
	@mkdir -p build
	CALLGATE_BENCH_HUGE=1 $(PYTEST) bench/test_bench_scaling.py -q --benchmark-only -p no:randomly \
		-k "stream_size or peak_memory" --benchmark-json=build/bench-huge.json

# The store rows with PostgreSQL too: a throwaway server on loopback (as CI starts one).
bench-store:
	@mkdir -p build
	bash -c 'set -euo pipefail; source .ci/postgres.sh; $(PYTEST) bench/test_bench_store.py -q \
		--benchmark-only -p no:randomly --benchmark-json=build/bench-store.json'

bench-report:
	$(PYTHON) bench/report.py --readme --also build/bench-huge.json build/bench-store.json

fuzz:
	$(PYTHON) fuzz/run.py --seconds $(FUZZ_SECONDS)

# Every benchmark body once, untimed: the suite's own correctness checks (CI).
bench-smoke:
	$(PYTEST) bench -q --benchmark-disable -p no:randomly

fuzz-smoke:
	$(PYTHON) fuzz/run.py --seconds 60 --seed 1

clean:
	rm -rf build .mypy_cache .pytest_cache .ruff_cache .benchmarks
