"""The invariants of the adapter and full-decode targets, shared by their per-provider
modules (``fuzz/targets/adapter_*.py`` and ``decode_*.py``).

``check_adapter``: SSE events through one adapter stream. Only ``StreamProtocolError``
and ``LimitExceeded`` may escape; at most one ``Completion``, and no call event after it;
call events are well formed (no empty fragment, a named call); the adapter's own
continuation items stay within ``max_continuation_items``.

``check_decode``: the whole pipeline. ``decode()`` never raises; the outcome is the same
whole and re-chunked; a complete outcome has every started call done and no incomplete
call; every size in the outcome is within its cap; accepted arguments are exactly what
the strict parser makes of the raw bytes; and for one input in sixteen (a quarter of
those drawn with tight limits) the traced memory peak of a chunked decode stays under a
fixed budget.
"""

from __future__ import annotations

import contextlib
import sys
import tracemalloc
from typing import Any

import msgspec

from callgate.engine.core.adapter import Adapter, load_adapter
from callgate.engine.core.arguments import parse_arguments
from callgate.engine.core.decode import StreamDecoder, decode
from callgate.engine.core.errors import LimitExceeded, StreamProtocolError
from callgate.engine.core.events import (
    ArgumentsDelta,
    CallDone,
    CallStarted,
    Completion,
    ContinuationItem,
    EngineEvent,
    ProviderDetail,
    ProviderError,
    RefusalDelta,
    ResponseMeta,
    TextDelta,
    UsageReport,
)
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import OutcomeKind, TurnOutcome
from callgate.engine.core.sse import SSEDecoder, SSEEvent

from .harness import ROOMY_LIMITS, TIGHT_LIMITS, chunk_plan, expect, pick_limits, stream_seed

__all__ = ["MEMORY_BUDGET", "RecordingAdapter", "check_adapter", "check_decode", "check_outcome"]

_EVENT_TYPES = (
    ResponseMeta,
    TextDelta,
    RefusalDelta,
    CallStarted,
    ArgumentsDelta,
    CallDone,
    UsageReport,
    Completion,
    ProviderError,
    ContinuationItem,
    ProviderDetail,
)
_CALL_EVENTS = (CallStarted, ArgumentsDelta, CallDone)
# Traced bytes a chunked decode under TIGHT_LIMITS may peak at: the caps sum to under
# 2 KiB of payload; Python objects, decoder views and the outcome need far less than this.
# An input can be up to 64 KiB, so a buffer that grows with the stream instead of its cap
# shows up here.
MEMORY_BUDGET = 96 * 1024


class _RecordingStream:
    __slots__ = ("_inner", "events")

    def __init__(self, inner: Any, events: list[EngineEvent]) -> None:
        self._inner = inner
        self.events = events

    def decode(self, event: SSEEvent) -> list[EngineEvent]:
        out: list[EngineEvent] = self._inner.decode(event)
        self.events.extend(out)
        return out

    def end(self) -> list[EngineEvent]:
        out: list[EngineEvent] = self._inner.end()
        self.events.extend(out)
        return out


class RecordingAdapter:
    """An adapter that records every engine event its streams emit (including those of
    ``end()``, which ``StreamDecoder`` does not return)."""

    def __init__(self, inner: Adapter) -> None:
        self.name = inner.name
        self.family = inner.family
        self.revision = inner.revision
        self.sse_unframed = inner.sse_unframed
        self.finish_reasons = inner.finish_reasons
        self._inner = inner
        self.events: list[EngineEvent] = []

    def new_stream(self, limits: Limits) -> _RecordingStream:
        return _RecordingStream(self._inner.new_stream(limits), self.events)


# --- adapters -----------------------------------------------------------------------------


def _sse_events(data: bytes, collect: bool) -> list[SSEEvent]:
    """The SSE events of ``data`` under roomy caps (an SSE error keeps what came before)."""
    decoder = SSEDecoder(ROOMY_LIMITS, collect_unframed=collect)
    events: list[SSEEvent] = []
    for chunk in chunk_plan(data, 256):
        try:
            events.extend(decoder.feed(chunk))
        except (StreamProtocolError, LimitExceeded):
            return events
    with contextlib.suppress(StreamProtocolError, LimitExceeded):
        events.extend(decoder.close())
    return events


def check_adapter(provider: str, data: bytes) -> None:
    adapter = load_adapter(provider)
    limits = pick_limits(data)
    stream = adapter.new_stream(limits)
    emitted: list[EngineEvent] = []
    try:
        for sse in _sse_events(data, adapter.sse_unframed):
            emitted.extend(stream.decode(sse))
        emitted.extend(stream.end())
    except (StreamProtocolError, LimitExceeded):
        pass  # documented: the pipeline turns these into a failed outcome
    completed = False
    items = 0
    for event in emitted:
        expect(isinstance(event, _EVENT_TYPES), f"not an engine event: {type(event).__name__}")
        if isinstance(event, Completion):
            expect(not completed, f"{provider}: a second Completion")
            completed = True
        elif isinstance(event, _CALL_EVENTS):
            expect(not completed, f"{provider}: {type(event).__name__} after the Completion")
        if isinstance(event, CallStarted):
            expect(isinstance(event.name, str), f"{provider}: call name is not text")
        elif isinstance(event, ArgumentsDelta):
            expect(event.fragment, f"{provider}: empty argument fragment")
        elif isinstance(event, TextDelta | RefusalDelta):
            expect(event.text, f"{provider}: empty text delta")
        elif isinstance(event, ContinuationItem):
            items += 1
    expect(
        items <= limits.max_continuation_items,
        f"{provider}: {items} continuation items > {limits.max_continuation_items}",
    )


# --- full decode ----------------------------------------------------------------------------


def _decode_recorded(
    provider: str, chunks: list[bytes], limits: Limits
) -> tuple[TurnOutcome, list[EngineEvent]]:
    adapter = RecordingAdapter(load_adapter(provider))
    decoder = StreamDecoder(adapter, limits)
    for chunk in chunks:
        decoder.feed(chunk)
    return decoder.finish(), adapter.events


def check_outcome(outcome: TurnOutcome, events: list[EngineEvent], limits: Limits) -> None:
    """The invariants of one outcome given every engine event its adapter emitted."""
    started = {e.index for e in events if isinstance(e, CallStarted)}
    done = {e.index for e in events if isinstance(e, CallDone)}
    if outcome.complete:
        expect(started <= done, f"complete turn with calls never done: {sorted(started - done)}")
        expect(not outcome.incomplete_calls, "complete turn with incomplete calls")
        expect({c.index for c in outcome.calls} == started, "complete turn lost a call")
        expect(outcome.error is None, "complete turn carrying a provider error")
    if outcome.kind is OutcomeKind.TOOL_PROPOSALS:
        expect(outcome.calls, "tool_proposals without a call")
    if outcome.kind is OutcomeKind.FINAL_TEXT:
        expect(not outcome.calls, "final_text with calls")
    for call in outcome.calls:
        expect(call.index in done, f"call {call.index} proposed without its done signal")
        size = len(call.raw_arguments)
        expect(size <= limits.max_call_argument_bytes, f"call {call.index} holds {size} bytes")
        if call.arguments is not None:
            expect(call.error is None, "accepted arguments with an error")
            parsed = parse_arguments(call.raw_arguments, limits.max_json_depth)
            expect(parsed == call.arguments, "arguments differ from a re-parse of raw_arguments")
        else:
            expect(call.error, f"call {call.index} rejected without a reason")
    total = sum(len(c.raw_arguments) for c in outcome.calls)
    expect(total <= limits.max_response_argument_bytes, f"{total} argument bytes in the turn")
    n_calls = len(outcome.calls) + len(outcome.incomplete_calls)
    expect(n_calls <= limits.max_calls_per_response, f"{n_calls} calls in the turn")
    text = len(outcome.text) + len(outcome.refusal)
    expect(text <= limits.max_text_bytes, f"{text} characters of text in the turn")
    for name, items in (
        ("continuation", outcome.continuation),
        ("details", outcome.provider_details),
    ):
        expect(len(items) <= limits.max_continuation_items, f"{len(items)} {name} items")
    item_cap = 6 * (limits.max_event_bytes + limits.max_call_argument_bytes) + 64
    for item in outcome.continuation:
        weight = len(msgspec.json.encode(item.item))  # provider JSON: any integer size
        expect(weight <= item_cap, f"a {item.kind} continuation item of {weight} bytes")
    kept = (*outcome.continuation, *outcome.provider_details)
    held = sum(len(msgspec.json.encode(x)) for x in kept)
    expect(held <= limits.max_continuation_bytes, f"{held} bytes of continuation and details")


def _peak(provider: str, chunks: list[bytes]) -> int:
    tracemalloc.start()
    try:
        decode(provider, chunks, TIGHT_LIMITS)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# What every nesting-guard reason says (adapters and ``decode()`` alike).
_TOO_DEEP = "nests too deeply to decode"
# Extra recursion allowed while a difference is re-checked (see ``_guard_explains``).
_HEADROOM = 4000


def _guard_explains(
    provider: str, data: bytes, chunks: list[bytes], limits: Limits, reasons: tuple[str, ...]
) -> bool:
    """Whether a difference between the whole and the recorded decode is the nesting
    guard's doing: one side's reason is the guard's, and with the recursion limit raised
    the two decodes agree exactly. msgspec's nesting guard is the interpreter's
    recursion limit, which CPython 3.11 shares with Python frames, so how deep an event
    may nest depends on the caller's stack, and the recorded decode runs a few frames
    deeper than ``decode()``: an event nested to within those frames of the limit trips
    the guard on one side only (failing a valid turn there, or reporting the nesting
    instead of a later defect). A difference the raised limit does not remove is a
    finding like any other."""
    if not any(_TOO_DEEP in r for r in reasons):
        return False
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(old + _HEADROOM)
    try:
        whole = decode(provider, [data], limits)
        chunked, _ = _decode_recorded(provider, chunks, limits)
    finally:
        sys.setrecursionlimit(old)
    return whole == chunked


def check_decode(provider: str, data: bytes) -> None:
    limits = pick_limits(data)
    whole = decode(provider, [data], limits)
    chunks = chunk_plan(data)
    chunked, events = _decode_recorded(provider, chunks, limits)
    expect(
        whole == chunked
        or _guard_explains(
            provider, data, chunks, limits, (whole.stop_reason, chunked.stop_reason)
        ),
        f"re-chunking changed the outcome: {whole!r} != {chunked!r}",
    )
    check_outcome(chunked, events, limits)
    if limits is TIGHT_LIMITS and stream_seed(data) % 16 == 4:
        peak = _peak(provider, chunks)
        expect(peak <= MEMORY_BUDGET, f"chunked decode peaked at {peak} traced bytes")
