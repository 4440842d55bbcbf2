"""Question: where does the time of one decode go, stage by stage, next to the floor?

For every stream kind at sizes S and M (``bench/streams.py``), the stages of
``decode()`` are timed one at a time on the same bytes, each stage fed what the one
before it produced (prepared outside the timing):

- ``setup``: ``StreamDecoder(adapter, limits)`` (SSE decoder, adapter stream, assembler);
- ``sse``: ``SSEDecoder.feed`` over the chunks, then ``close``;
- ``adapter``: a fresh adapter stream's ``decode_batch`` over those SSE events;
- ``assembler``: a fresh ``TurnAssembler`` applying the adapter's events (runs of
  fragments included), without the final outcome;
- ``outcome``: assembling as above, then ``TurnAssembler.outcome()`` (the one strict
  parse of each call's arguments, the outcome values): the report shows it net of the
  ``assembler`` row;
- ``total``: ``decode()`` itself (the baseline row), and ``floor``: the naive floor.

The stages add up to about the total (the total also pays each chunk's hand-over).
Ratios are medians relative to ``total``; the floor's ratio says how much of callgate's
time the floor takes (< 1: the floor is faster). This is the profile behind every decode
target the headline table reports as missed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import pytest

from bench import peers
from bench.harness import record, run_budgeted
from bench.streams import KINDS, SyntheticStream, make_stream
from callgate.engine.core.adapter import load_adapter
from callgate.engine.core.decode import StreamDecoder, TurnAssembler, decode
from callgate.engine.core.events import ArgumentsRun, BatchEvent
from callgate.engine.core.limits import DEFAULT_LIMITS
from callgate.engine.core.sse import SSEDecoder, SSEEvent

STAGES = ("setup", "sse", "adapter", "assembler", "outcome", "total", "floor")
SIZES = ("S", "M")


@cache
def stream(kind: str, size: str) -> SyntheticStream:
    return make_stream(kind, size)


def _sse(s: SyntheticStream) -> list[SSEEvent]:
    decoder = SSEDecoder(DEFAULT_LIMITS, collect_unframed=load_adapter(s.provider).sse_unframed)
    events: list[SSEEvent] = []
    for chunk in s.chunks:
        events += decoder.feed(chunk)
    return events + decoder.close()


def _adapter(s: SyntheticStream, events: list[SSEEvent]) -> list[BatchEvent]:
    out: list[BatchEvent] = []
    load_adapter(s.provider).new_stream(DEFAULT_LIMITS).decode_batch(events, out)  # type: ignore[attr-defined]
    return out


def _assemble(batch: list[BatchEvent]) -> TurnAssembler:
    turn = TurnAssembler(DEFAULT_LIMITS)
    calls = turn._calls
    for event in batch:
        if type(event) is ArgumentsRun:
            calls.fragments(event.indexes, event.pieces)
        else:
            turn.apply(event)  # type: ignore[arg-type]
    return turn


@cache
def _prepared(kind: str, size: str) -> tuple[list[SSEEvent], list[BatchEvent]]:
    s = stream(kind, size)
    events = _sse(s)
    return events, _adapter(s, events)


def _runner(stage: str, s: SyntheticStream, size: str) -> Callable[[], Any]:
    adapter = load_adapter(s.provider)
    events, batch = _prepared(s.kind, size)
    if stage == "setup":
        return lambda: StreamDecoder(adapter, DEFAULT_LIMITS)
    if stage == "sse":
        return lambda: _sse(s)
    if stage == "adapter":
        return lambda: _adapter(s, events)
    if stage == "assembler":
        return lambda: _assemble(batch)
    if stage == "outcome":
        # A fresh assembler per round: outcome() parses each call's arguments once.
        def outcome() -> Any:
            return _assemble(batch).outcome()

        return outcome
    if stage == "total":
        return lambda: decode(s.provider, s.chunks)
    return lambda: peers.floor(s.kind, s.body)


PARAMS = [
    pytest.param(kind, size, stage, id=f"{kind}-{size}-{stage}")
    for kind in KINDS
    for size in SIZES
    for stage in STAGES
]


@pytest.mark.parametrize(("kind", "size", "stage"), PARAMS)
def test_stage(benchmark: Any, kind: str, size: str, stage: str) -> None:
    s = stream(kind, size)
    benchmark.group = f"stages {kind} {size}"
    run_budgeted(benchmark, _runner(stage, s, size), budget=0.3, min_rounds=5)
    record(
        benchmark,
        events=s.events,
        body_bytes=len(s.body),
        arg_bytes=s.arg_bytes,
        baseline=stage == "total",
        per_event=False,
        note="assembler + outcome" if stage == "outcome" else "",
        impl=stage,
        kind=kind,
        size=size,
    )
