# Invariant: SSEDecoder matches a naive reference parser whole, chunked and bytewise; caps hold.
#   Same events (and first error class; with take_salvaged(), every event before it); only
#   SSELineTooLong/SSEEventTooLarge/StreamProtocolError escape; buffers within the line/event caps.
#   Same events (and first error class; with take_salvaged(), every event before it); only
#   SSELineTooLong/SSEEventTooLarge/StreamProtocolError escape; buffers within the line/event caps.
"""Fuzz target: ``callgate.engine.core.sse.SSEDecoder``.

The input is a raw byte stream. Limits and unframed collection are drawn from the
input's hash; the stream is decoded in one chunk, in hash-drawn chunks and (when short)
one byte at a time, and each run is compared with ``fuzz.sse_reference``. After every
successful ``feed`` the decoder's own buffers are measured against the caps (white box:
the carried line, the pending event's data and unframed text, the event-name caches).
"""

from __future__ import annotations

import callgate.engine.core.sse as sse_module
from callgate.engine.core.errors import CallgateError, LimitExceeded
from callgate.engine.core.limits import Limits
from callgate.engine.core.sse import SSEDecoder, SSEEvent
from fuzz.harness import chunk_plan, expect, fuzz_main, stream_seed
from fuzz.mutators import atheris_mutator
from fuzz.sse_reference import reference_decode

__all__ = ["check"]

_LINE_CAPS = (16, 64, 300, 8192)
_BYTEWISE_MAX = 512


def _limits(data: bytes) -> tuple[Limits, bool]:
    seed = stream_seed(data)
    line = _LINE_CAPS[seed % len(_LINE_CAPS)]
    event = line * (1 + (seed >> 4) % 3)
    return Limits(max_line_bytes=line, max_event_bytes=event), bool(seed & 0x100)


def _check_buffers(decoder: SSEDecoder, limits: Limits) -> None:
    # Internal names on purpose: the caps are about what the decoder holds between feeds.
    held = len(decoder._carry) + len(decoder._parts)
    expect(
        held <= 2 * limits.max_line_bytes + 2,
        f"decoder holds {held} bytes of lines (cap {limits.max_line_bytes})",
    )
    expect(decoder._tail_len <= limits.max_line_bytes, "unterminated line longer than its cap")
    expect(decoder._data_len <= limits.max_event_bytes, "pending data longer than its cap")
    expect(decoder._unframed_len <= limits.max_event_bytes, "unframed text longer than its cap")
    for cache in ("_TYPES", "_LINE_TYPES"):  # the event-name caches (module level)
        expect(len(getattr(sse_module, cache, ())) <= 256, f"{cache} grew past its bound")


def _run(
    chunks: list[bytes], limits: Limits, collect: bool
) -> tuple[list[SSEEvent], CallgateError | None]:
    decoder = SSEDecoder(limits, collect_unframed=collect)
    events: list[SSEEvent] = []
    try:
        for chunk in chunks:
            events.extend(decoder.feed(chunk))
            _check_buffers(decoder, limits)
        events.extend(decoder.close())
    except CallgateError as exc:
        events.extend(decoder.take_salvaged())
        expect(not decoder.take_salvaged(), "salvaged events were handed out twice")
        # A poisoned decoder repeats its error instead of decoding on.
        try:
            decoder.feed(b"data: more\n\n")
        except CallgateError as again:
            expect(type(again) is type(exc), "a poisoned decoder raised a different error")
        else:
            raise AssertionError("a decoder fed after an error did not raise") from None
        return events, exc
    return events, None


def _check_events(events: list[SSEEvent], limits: Limits) -> None:
    for ev in events:
        expect(len(ev.data) <= limits.max_event_bytes, "an event's data exceeds max_event_bytes")
        expect(ev.unframed == (ev.event == ""), "unframed flag and empty event name disagree")


def check(data: bytes) -> None:
    limits, collect = _limits(data)
    ref = reference_decode(data, limits, collect_unframed=collect)
    runs = {"whole": [data], "chunked": chunk_plan(data, 32)}
    if len(data) <= _BYTEWISE_MAX:
        runs["bytewise"] = [data[i : i + 1] for i in range(len(data))]
    for mode, chunks in runs.items():
        events, error = _run(chunks, limits, collect)
        _check_events(events, limits)
        if ref.error is None:
            expect(error is None, f"{mode}: raised {error!r}; the reference decodes the stream")
            expect(events == ref.events, f"{mode}: events differ from the reference")
            continue
        expect(error is not None, f"{mode}: no error; the reference raises {ref.error.__name__}")
        assert error is not None
        expect(
            type(error) is ref.error,
            f"{mode}: raised {type(error).__name__}, reference {ref.error.__name__}",
        )
        if isinstance(error, LimitExceeded):
            expect(error.value in (limits.max_line_bytes, limits.max_event_bytes), "bad cap value")
        # Events returned before the error plus those salvaged from the chunk that
        # raised it: exactly the reference's events before the error.
        expect(events == ref.events, f"{mode}: events before the error differ")


custom_mutator = atheris_mutator(None)

if __name__ == "__main__":
    fuzz_main(check, custom_mutator)
