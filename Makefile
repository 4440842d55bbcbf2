PYTHON ?= python3
PYTEST ?= $(PYTHON) -m pytest
FUZZ_SECONDS ?= 600
TYPECHECK_ROOT := build/typecheck

.PHONY: install test lint typecheck demo bench bench-smoke bench-huge bench-store bench-report fuzz fuzz-smoke clean

install:
	$(PYTHON) -m pip install -e '.[dev,fuzz,bench]'

test:
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

demo:
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
