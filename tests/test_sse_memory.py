"""What the SSE decoder keeps alive: bounded event-name caches, no copy of a line past
its cap, nothing buffered by a poisoned decoder, and the line cap on a stream that
ends inside a possible BOM.

Every stream is fed whole, one byte at a time and at seeded random chunk boundaries
(plus, where a finding depends on it, a split of its own) with identical results.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterable, Iterator

import pytest

from callgate.engine.core import sse_fields
from callgate.engine.core.errors import CallgateError, SSEEventTooLarge, SSELineTooLong
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits
from callgate.engine.core.sse import SSEDecoder, SSEEvent

from .conftest import chunkings

# Longest event name the shared caches may keep, and the same bound on a whole
# `event: <name>` line (the key of the line cache).
NAME_BOUND = 64
LINE_BOUND = len(b"event: ") + NAME_BOUND


def _run(
    chunks: Iterable[bytes], limits: Limits = DEFAULT_LIMITS, collect: bool = False
) -> tuple[list[SSEEvent], type[CallgateError] | None]:
    """Feed chunks then close: the events (salvaged ones included) and the error type."""
    decoder = SSEDecoder(limits, collect_unframed=collect)
    out: list[SSEEvent] = []
    try:
        for chunk in chunks:
            out += decoder.feed(chunk)
        out += decoder.close()
    except CallgateError as exc:
        return out + decoder.take_salvaged(), type(exc)
    return out, None


def _assert_poisoned(decoder: SSEDecoder, error: CallgateError) -> None:
    """Whatever is called next, the decoder raises ``error`` again."""
    with pytest.raises(CallgateError) as fed:
        decoder.feed(b"data: z\n\n")
    with pytest.raises(CallgateError) as closed:
        decoder.close()
    assert fed.value is error and closed.value is error


def _clear_type_caches() -> None:
    sse_fields.TYPES.clear()
    sse_fields.LINE_TYPES.clear()


def _assert_type_caches_bounded() -> None:
    for name, etype in sse_fields.TYPES.items():
        assert len(name) <= NAME_BOUND and len(etype) <= NAME_BOUND, len(name)
    for line, etype in sse_fields.LINE_TYPES.items():
        assert len(line) <= LINE_BOUND and len(etype) <= NAME_BOUND, len(line)


def _names(sizes: Iterable[int]) -> Iterator[bytes]:
    """Distinct event names of the given byte sizes (ASCII, then two-byte UTF-8)."""
    for i, size in enumerate(sizes):
        tag = b"%05d." % i
        fill = b"" if i % 2 else "é".encode() * ((size - len(tag)) // 2)
        yield (tag + fill).ljust(size, b"n")


def test_event_name_caches_keep_only_short_names() -> None:
    _clear_type_caches()
    long_names = list(_names([65, 66, 71, 72, 100, 257, 1000, 4096] * 5))
    assert len(set(long_names)) == len(long_names)
    assert all(len(name) > NAME_BOUND for name in long_names)
    # Event + data pairs only (the per-chunk pairs path), then the same names with
    # another block shape between them (the block path).
    pairs = b"".join(b"event: " + name + b"\ndata: {}\n\n" for name in long_names)
    mixed = b"".join(b"event: " + name + b"\ndata: 1\n\ndata: 2\n\n" for name in long_names)
    for body, per_name in ((pairs, [b"{}"]), (mixed, [b"1", b"2"])):
        expected = [
            SSEEvent(name.decode() if value != b"2" else "message", value)
            for name in long_names
            for value in per_name
        ]
        for mode, chunks in chunkings(body, seed=7):
            assert _run(chunks) == (expected, None), mode
            _assert_type_caches_bounded()
    assert not sse_fields.TYPES and not sse_fields.LINE_TYPES  # every name was too long to keep

    # Short names (real ones, and one of exactly the bound) are still decoded right
    # and cached, by name and by line.
    short = [
        b"content_block_delta",
        b"response.function_call_arguments.delta",
        "café".encode(),
        next(_names([NAME_BOUND])),
        b"",
    ]
    assert len(short[3]) == NAME_BOUND
    body = b"".join(b"event: " + name + b"\ndata: {}\n\n" for name in short)
    expected = [SSEEvent(name.decode() or "message", b"{}") for name in short]
    for mode, chunks in chunkings(body, seed=11):
        assert _run(chunks) == (expected, None), mode
        _assert_type_caches_bounded()
    for name in short:
        assert sse_fields.TYPES[name] == (name.decode() or "message")
        assert sse_fields.LINE_TYPES[b"event: " + name] == (name.decode() or "message")


def test_an_over_cap_line_is_never_copied_and_a_poisoned_decoder_keeps_nothing() -> None:
    cap = 1024
    limits = Limits(max_line_bytes=cap)
    # An event, then a pending event (more data than the cap, in lines under it), then
    # a line far past the cap with no line end.
    early = b"data: early\n\n"
    pending = b"data: " + b"v" * 900 + b"\n"
    head = early + pending * 3 + b"data: "
    body = head + b"x" * (64 * cap)
    modes = list(chunkings(body, seed=3))
    # A short first piece of the line, then the rest in one chunk (the rest copied into
    # the line buffer before the cap was checked), or in two.
    modes.append(("split", [head + b"x" * 10, body[len(head) + 10 :]]))
    modes.append(("split3", [head + b"x", b"x" * 10, body[len(head) + 11 :]]))
    for mode, chunks in modes:
        decoder = SSEDecoder(limits)
        events: list[SSEEvent] = []
        with pytest.raises(SSELineTooLong) as caught:
            for chunk in chunks:
                events += decoder.feed(chunk)
        events += decoder.take_salvaged()
        assert events == [SSEEvent("message", b"early")], mode
        retained = (
            len(decoder._parts)
            + len(decoder._carry)
            + sum(map(len, decoder._data))
            + sum(map(len, decoder._unframed))
        )
        assert retained <= cap, (mode, retained)
        _assert_poisoned(decoder, caught.value)
        assert decoder.take_salvaged() == []

    # The over-cap chunk is not copied at all: the peak stays far below its size.
    big = b"y" * (16 * 1024 * 1024)
    decoder = SSEDecoder(limits)
    assert decoder.feed(b"data: " + b"x" * 10) == []
    tracemalloc.start()
    try:
        with pytest.raises(SSELineTooLong):
            decoder.feed(big)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 4 * cap and current <= 4 * cap, (current, peak)


@pytest.mark.parametrize("collect", [False, True], ids=["framed", "collect"])
def test_a_stream_that_is_only_a_partial_bom_is_capped_like_any_other_line(
    collect: bool,
) -> None:
    for partial in (b"\xef", b"\xef\xbb"):
        plain = b"ab"[: len(partial)]  # the same line without the look of a BOM
        for max_line in (0, 1, 2, 3, 16):
            for max_event in (0, 1, 16):
                limits = Limits(max_line_bytes=max_line, max_event_bytes=max_event)
                plain_events, error = _run([plain], limits, collect)
                for mode, chunks in chunkings(partial, seed=5):
                    got, got_error = _run(chunks, limits, collect)
                    case = (partial, max_line, max_event, mode)
                    assert got_error is error, case
                    assert [e.data for e in got] == [partial for _ in plain_events], case
    # The reviewer's cases, exactly.
    body = b"\xef\xbb"
    for mode, chunks in chunkings(body, seed=5):
        got = _run(chunks, Limits(max_line_bytes=1, max_event_bytes=16), collect)
        assert got == ([], SSELineTooLong), mode
    for mode, chunks in chunkings(b"\xef", seed=5):
        got = _run(chunks, Limits(max_line_bytes=0, max_event_bytes=0), collect)
        assert got == ([], SSELineTooLong), mode
    # Within the caps the bytes are still an unframed line when collecting; an event cap
    # below them is still the event error.
    expected = [SSEEvent("", body, None, None, True)] if collect else []
    assert _run([body], Limits(max_line_bytes=2, max_event_bytes=16), collect) == (expected, None)
    error = SSEEventTooLarge if collect else None
    assert _run([body], Limits(max_line_bytes=2, max_event_bytes=1), collect) == ([], error)
    # Closing raised: the decoder is poisoned with that error.
    decoder = SSEDecoder(Limits(max_line_bytes=1), collect_unframed=collect)
    assert decoder.feed(body) == []
    with pytest.raises(SSELineTooLong) as caught:
        decoder.close()
    _assert_poisoned(decoder, caught.value)


def _held_while_pending(chunks: list[bytes], collect: bool = False) -> int:
    """Bytes the decoder holds after ``chunks`` (an event still pending), the chunks'
    own memory excluded."""
    decoder = SSEDecoder(collect_unframed=collect)
    tracemalloc.start()
    try:
        for chunk in chunks:
            assert decoder.feed(chunk) == []
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return held


@pytest.mark.parametrize("collect", [False, True], ids=["data lines", "unframed lines"])
def test_an_event_of_many_short_lines_is_held_near_what_its_cap_counts(collect: bool) -> None:
    # Each line was its own object until the dispatch: ~40 bytes beside a 2-byte value
    # (~250 for a line gathered across chunks), while max_event_bytes counts 3 per line.
    n = 20_000
    line = b"xy\n" if collect else b"data: xy\n"
    body = line * n
    counted = 3 * n  # what the cap counts: each value and its line end
    for how, chunks in chunkings(body):
        held = _held_while_pending(chunks, collect)
        assert held <= 3 * counted, (how, held, counted)
        events, error = _run([*chunks, b"\n"], collect=collect)
        assert error is None
        [event] = events
        assert bytes(event.data) == b"\n".join([b"xy"] * n), how
        assert event.unframed is collect


def test_packed_runs_keep_every_line_and_a_long_line_stays_a_view() -> None:
    # Runs of short lines around long ones (which are never copied into a run).
    long = b"L" * 40_000
    values = [b"%d" % i for i in range(150)] + [long] + [b"y"] * 130 + [long, b"", b"z"]
    body = b"".join(b"data: " + v + b"\n" for v in values) + b"\n"
    for how, chunks in chunkings(body):
        events, error = _run(chunks)
        assert error is None
        [event] = events
        assert bytes(event.data) == b"\n".join(values), how
