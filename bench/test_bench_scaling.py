"""Questions: does callgate's decode stay linear, and how much memory does it hold?

1. Stream size: one call streamed in 8-byte fragments, body ~1 MB and ~10 MB (~100 MB
   too with ``CALLGATE_BENCH_HUGE=1``), per stream kind. Growth factor = median(10 MB) /
   median(1 MB); target <= 11x (linear). The summary's ratio column for these groups is
   that factor (median against the 1 MB row); the exact body sizes are in ``extra_info``.
   The naive floor runs the same streams side by side (its own groups, ``(floor)``), so
   the growth the machine adds for big values shows beside callgate's.
2. Parallel calls: 128 KiB of arguments in total, in 8-byte fragments, spread over 1, 8
   and 64 calls (interleaved where the wire allows). Same argument bytes in every row
   (and the same number of fragments, except Gemini's whole parts), so per-call
   bookkeeping is the only difference; the target is a flat ratio (median against 1 call).
3. Peak memory: one call with 1 MiB and 10 MiB of arguments in 8-byte fragments (the L
   shape), ``tracemalloc`` peak above the baseline during one ``decode`` (the input
   chunks are built before tracing starts; the returned outcome is included). Target:
   peak <= 2 x argument bytes + 1 MiB. The row's time is a separate, untraced run (a
   second linearity point: 10 MiB vs 1 MiB of arguments). The 10 MiB case runs for
   ``anthropic`` and ``gemini`` by default (tracemalloc slows a 1.3 M-event decode to
   ~40 s) and for every kind with ``CALLGATE_BENCH_HUGE=1``.

Limits are raised for the big streams (a 10 MiB call is over the 4 MiB default cap).
Every row also checks that the call came back complete and equal to what was streamed.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from functools import cache
from typing import Any

import pytest

from bench.harness import record, run_budgeted
from bench.peers import floor
from bench.streams import KINDS, Shape, SyntheticStream, make_stream, stream_of_body_size
from callgate.engine.core.decode import decode
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import OutcomeKind, TurnOutcome

HUGE = os.environ.get("CALLGATE_BENCH_HUGE") == "1"
MB = 1_000_000
MiB = 1024 * 1024
BIG = Limits(
    max_line_bytes=256 * MiB,
    max_event_bytes=256 * MiB,
    max_call_argument_bytes=128 * MiB,
    max_response_argument_bytes=128 * MiB,
)

BODY_SIZES = {"1MB": 1 * MB, "10MB": 10 * MB, **({"100MB": 100 * MB} if HUGE else {})}
CALL_COUNTS = (1, 8, 64)
TOTAL_PARALLEL_ARGS = 128 * 1024
MEMORY_CASES = [
    (kind, mib)
    for kind in KINDS
    for mib in (1, 10)
    if mib == 1 or HUGE or kind in ("anthropic", "gemini")
]


def _check(s: SyntheticStream, outcome: TurnOutcome) -> None:
    assert outcome.kind is OutcomeKind.TOOL_PROPOSALS, outcome.stop_reason
    got = [(c.name, c.arguments) for c in outcome.calls]
    assert got == [(c.name, c.arguments) for c in s.calls]


@cache
def sized(kind: str, label: str) -> SyntheticStream:
    return stream_of_body_size(kind, BODY_SIZES[label])


@pytest.mark.parametrize("label", list(BODY_SIZES))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("impl", ("callgate", "floor"))
def test_stream_size(benchmark: Any, impl: str, kind: str, label: str) -> None:
    s = sized(kind, label)
    provider, chunks, body = s.provider, s.chunks, s.body
    if impl == "callgate":
        benchmark.group = f"scaling size {kind}"
        outcome = run_budgeted(
            benchmark, lambda: decode(provider, chunks, BIG), budget=2.0, min_rounds=3
        )
        _check(s, outcome)
    else:
        # The naive floor on the same bytes: how much of the growth the machine itself
        # adds (a 10-100 MB value leaves the caches and needs fresh pages).
        benchmark.group = f"scaling size {kind} (floor)"
        got = run_budgeted(benchmark, lambda: floor(kind, body), budget=2.0, min_rounds=3)
        assert got == [(c.call_id, c.name, c.arguments) for c in s.calls]
    record(
        benchmark,
        events=s.events,
        body_bytes=len(s.body),
        arg_bytes=s.arg_bytes,
        baseline=label == "1MB",
        per_event=False,
        kind=kind,
        case=label,
        impl=impl,
    )


@pytest.mark.parametrize("calls", CALL_COUNTS)
@pytest.mark.parametrize("kind", KINDS)
def test_parallel_calls(benchmark: Any, kind: str, calls: int) -> None:
    shape = Shape(calls=calls, arg_bytes=TOTAL_PARALLEL_ARGS // calls, fragment=8, interleave=True)
    s = make_stream(kind, shape)
    benchmark.group = f"scaling calls {kind}"
    provider, chunks = s.provider, s.chunks
    outcome = run_budgeted(benchmark, lambda: decode(provider, chunks, BIG), budget=0.8)
    _check(s, outcome)
    record(
        benchmark,
        events=s.events,
        body_bytes=len(s.body),
        arg_bytes=s.arg_bytes,
        baseline=calls == 1,
        per_event=False,
        kind=kind,
        case=f"{calls} calls",
    )


def _traced_peak(provider: str, chunks: list[bytes]) -> tuple[int, TurnOutcome]:
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        outcome = decode(provider, chunks, BIG)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak - base, outcome


@pytest.mark.parametrize(
    ("kind", "mib"), MEMORY_CASES, ids=[f"{k}-{m}MiB" for k, m in MEMORY_CASES]
)
def test_peak_memory(benchmark: Any, kind: str, mib: int) -> None:
    s = make_stream(kind, Shape(calls=1, arg_bytes=mib * MiB, fragment=8))
    benchmark.group = "memory: one call, 8-byte fragments"
    provider, chunks = s.provider, s.chunks
    outcome = benchmark.pedantic(
        lambda: decode(provider, chunks, BIG), rounds=1, iterations=1, warmup_rounds=0
    )
    _check(s, outcome)
    del outcome
    peak, outcome = _traced_peak(provider, chunks)
    _check(s, outcome)
    target = 2 * s.arg_bytes + MiB
    record(
        benchmark,
        events=s.events,
        body_bytes=len(s.body),
        arg_bytes=s.arg_bytes,
        baseline=False,
        note=f"peak {peak / MiB:.1f} MiB, target {target / MiB:.1f} MiB",
        kind=kind,
        case=f"{mib} MiB args",
        peak_bytes=peak,
        target_bytes=target,
        meets_target=peak <= target,
    )
