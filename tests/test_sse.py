"""The SSE decoder: WHATWG event-stream rules, byte caps, chunking independence.

Every stream is fed three ways (whole, byte by byte, random chunks) and must give the
same result; a small line-by-line reference decoder written straight from the spec
checks the fast block-splitting path.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.engine.core.errors import (
    CallgateError,
    ConfigError,
    LimitExceeded,
    SSEEventTooLarge,
    SSELineTooLong,
    StreamProtocolError,
)
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits
from callgate.engine.core.sse import SSEDecoder, SSEEvent

from .conftest import chunkings, fixture_files

BOM = b"\xef\xbb\xbf"
MiB = 1024 * 1024


def run(
    chunks: Iterable[bytes], limits: Limits = DEFAULT_LIMITS, collect: bool = False
) -> tuple[list[SSEEvent], type[CallgateError] | None]:
    """Feed chunks then close; return the events and the error type raised, if any."""
    decoder = SSEDecoder(limits, collect_unframed=collect)
    out: list[SSEEvent] = []
    try:
        for chunk in chunks:
            out += decoder.feed(chunk)
        out += decoder.close()
    except CallgateError as exc:
        return out, type(exc)
    return out, None


def decode3(
    body: bytes, limits: Limits = DEFAULT_LIMITS, collect: bool = False, seed: int = 0
) -> list[SSEEvent]:
    """Events of ``body`` fed whole, byte by byte and in random chunks (all equal)."""
    results = {mode: run(chunks, limits, collect) for mode, chunks in chunkings(body, seed)}
    whole = results["whole"]
    assert whole[1] is None, f"unexpected {whole[1]}"
    for mode, result in results.items():
        assert result == whole, mode
    return whole[0]


def raises3(
    body: bytes, error: type[CallgateError], limits: Limits = DEFAULT_LIMITS, collect: bool = False
) -> None:
    """Every feeding mode of ``body`` raises ``error``."""
    for mode, chunks in chunkings(body):
        assert run(chunks, limits, collect)[1] is error, mode


def ev(
    data: bytes, event: str = "message", id: str | None = None, retry: int | None = None
) -> SSEEvent:
    return SSEEvent(event, data, id, retry)


def unframed(data: bytes) -> SSEEvent:
    return SSEEvent("", data, None, None, True)


# ---------------------------------------------------------------- reference decoder


def reference(body: bytes, collect: bool = False) -> list[SSEEvent]:
    """The WHATWG algorithm, line by line, on the whole body (no caps)."""
    if body.startswith(BOM):
        body = body[3:]
    *lines, tail = re.split(rb"\r\n|\r|\n", body)
    out: list[SSEEvent] = []
    data: list[bytes] = []
    loose: list[bytes] = []
    etype, last_id, retry = "", None, None
    for line in lines:
        if not line:
            if data:
                out.append(SSEEvent(etype or "message", b"\n".join(data), last_id, retry))
            if loose:
                out.append(unframed(b"\n".join(loose)))
            data, loose, etype, retry = [], [], "", None
            continue
        if line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event":
            etype = value.decode()
        elif name == b"id":
            if b"\0" not in value:
                last_id = value.decode()
        elif name == b"retry":
            if re.fullmatch(rb"[0-9]+", value):
                retry = int(value)
        elif collect:
            loose.append(line)
    if collect:
        if (
            tail
            and not tail.startswith(b":")
            and tail.partition(b":")[0]
            not in {
                b"data",
                b"event",
                b"id",
                b"retry",
            }
        ):
            loose.append(tail)
        if loose:
            out.append(unframed(b"\n".join(loose)))
    return out


# ---------------------------------------------------------------- line ends


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"], ids=["LF", "CR", "CRLF"])
def test_each_line_end_frames_events(eol: bytes) -> None:
    body = eol.join([b"data: a", b"data: b", b"", b"data: c", b"", b""])
    assert decode3(body) == [ev(b"a\nb"), ev(b"c")]


def test_mixed_line_ends_in_one_stream() -> None:
    body = b"data: a\rdata: b\r\n\ndata: c\n\r\n"
    assert decode3(body) == [ev(b"a\nb"), ev(b"c")]


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    # Were the CR and LF two line ends, the LF would be a blank line dispatching "a".
    chunks = [b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]
    assert run(chunks) == ([ev(b"a\nb")], None)


def test_crlf_split_with_empty_chunk_between() -> None:
    assert run([b"data: a\r", b"", b"\ndata: b\r\n\r\n"]) == ([ev(b"a\nb")], None)


def test_lone_cr_at_chunk_end_dispatches_without_waiting() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\r") == [ev(b"a")]
    assert decoder.close() == []


def test_lone_cr_at_end_of_stream_is_a_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r\r") == [ev(b"a")]
    assert decoder.close() == []


def test_many_blank_lines_between_events() -> None:
    for n in range(1, 7):
        body = b"data: a" + b"\n" * n + b"data: b\n\n"
        expected = [ev(b"a\nb")] if n == 1 else [ev(b"a"), ev(b"b")]
        assert decode3(body) == expected, n


# ---------------------------------------------------------------- BOM


def test_leading_bom_is_stripped() -> None:
    assert decode3(BOM + b"data: a\n\n") == [ev(b"a")]


def test_bom_split_across_chunks() -> None:
    assert run([b"\xef", b"\xbb", b"\xbfdata: a\n\n"]) == ([ev(b"a")], None)
    assert run([b"\xef\xbb", b"\xbf", b"data: a\n\n"]) == ([ev(b"a")], None)


def test_only_one_bom_is_stripped() -> None:
    # The second BOM makes the field name "\ufeffdata": an unknown field, so no event.
    assert decode3(BOM + BOM + b"data: a\n\ndata: b\n\n") == [ev(b"b")]


def test_bom_later_in_stream_is_not_stripped() -> None:
    assert decode3(b"data: a\n\n" + BOM + b"data: b\n\n") == [ev(b"a")]


def test_bom_prefix_that_is_not_a_bom_is_kept() -> None:
    assert decode3(b"\xefdata: a\n\ndata: b\n\n", collect=True) == [
        unframed(b"\xefdata: a"),
        ev(b"b"),
    ]


# ---------------------------------------------------------------- fields


def test_comment_lines_are_ignored() -> None:
    assert decode3(b": hi\ndata: a\n:\n\n: only a comment\n\n") == [ev(b"a")]


def test_field_without_colon_has_empty_value() -> None:
    assert decode3(b"data\n\n") == [ev(b"")]
    assert decode3(b"data\ndata\n\n") == [ev(b"\n")]
    assert decode3(b"event\ndata: x\n\n") == [ev(b"x")]


def test_only_one_leading_space_is_stripped() -> None:
    assert decode3(b"data:  two\n\n") == [ev(b" two")]
    assert decode3(b"data:none\n\n") == [ev(b"none")]
    assert decode3(b"data: trailing \n\n") == [ev(b"trailing ")]
    assert decode3(b"data: a: b\n\n") == [ev(b"a: b")]


def test_data_lines_join_with_lf_and_stay_bytes() -> None:
    body = b'data: {"a":\ndata: 1}\ndata: \xff\xfe\n\n'
    (event,) = decode3(body)
    assert event.data == b'{"a":\n1}\n\xff\xfe'
    assert isinstance(event.data, bytes)


def test_utf8_character_split_across_chunks_stays_intact() -> None:
    text = "data: h\u00e9llo \U0001f600 \u4e16\n\n".encode()
    assert decode3(text) == [ev("h\u00e9llo \U0001f600 \u4e16".encode())]
    cut = text.index(b"\xf0") + 2  # inside the 4-byte emoji
    assert run([text[:cut], text[cut:]])[0][0].data.decode() == "h\u00e9llo \U0001f600 \u4e16"


def test_event_sets_type_and_resets_after_dispatch() -> None:
    body = b"event: ping\ndata: 1\n\ndata: 2\n\nevent:\ndata: 3\n\n"
    assert decode3(body) == [ev(b"1", "ping"), ev(b"2"), ev(b"3")]


def test_event_name_is_decoded_utf8() -> None:
    assert decode3("event: caf\u00e9\ndata: x\n\n".encode()) == [ev(b"x", "caf\u00e9")]


def test_blank_line_without_data_does_not_dispatch_and_resets_type() -> None:
    assert decode3(b"event: x\n\ndata: y\n\n") == [ev(b"y")]
    assert decode3(b"retry: 5\n\ndata: y\n\n") == [ev(b"y")]


def test_id_persists_across_events() -> None:
    body = b"id: 1\ndata: a\n\ndata: b\n\nid: 2\ndata: c\n\nid\ndata: d\n\n"
    assert decode3(body) == [ev(b"a", id="1"), ev(b"b", id="1"), ev(b"c", id="2"), ev(b"d", id="")]


def test_id_set_without_dispatch_applies_to_later_events() -> None:
    assert decode3(b"id: 7\n\ndata: a\n\n") == [ev(b"a", id="7")]


def test_id_with_nul_is_ignored() -> None:
    assert decode3(b"id: 1\n\ndata: a\n\nid: 2\x003\ndata: b\n\n") == [
        ev(b"a", id="1"),
        ev(b"b", id="1"),
    ]


def test_retry_only_when_all_ascii_digits() -> None:
    assert decode3(b"retry: 1500\ndata: a\n\n") == [ev(b"a", retry=1500)]
    for bad in (b"1a", b"", b" 1", b"-1", b"1.5", "\u0661".encode()):
        assert decode3(b"retry: " + bad + b"\ndata: a\n\n") == [ev(b"a")], bad


def test_retry_too_long_for_int_is_ignored_not_a_crash() -> None:
    assert decode3(b"retry: " + b"9" * 5000 + b"\ndata: a\n\n") == [ev(b"a")]


def test_unknown_fields_are_ignored_by_default() -> None:
    assert decode3(b"foo: bar\ndata: a\nbaz\n\n{raw}\n\n") == [ev(b"a")]


def test_leading_space_before_field_name_makes_it_unknown() -> None:
    # The OpenRouter recording has such a line; a conformant parser drops it.
    assert decode3(b" data: a\n\ndata: b\n\n") == [ev(b"b")]


# ---------------------------------------------------------------- end of stream


def test_close_discards_an_unfinished_event() -> None:
    assert decode3(b"data: a\n") == []
    assert decode3(b"data: a\n\ndata: b") == [ev(b"a")]
    assert decode3(b"data: a\n\nevent: x\ndata: b\n") == [ev(b"a")]


def test_close_twice_and_feed_after_close() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\n") == [ev(b"a")]
    assert decoder.close() == []
    assert decoder.close() == []
    with pytest.raises(ConfigError):
        decoder.feed(b"data: b\n\n")


def test_bytearray_and_memoryview_chunks_are_accepted() -> None:
    decoder = SSEDecoder()
    out = decoder.feed(bytearray(b"data: a\n")) + decoder.feed(memoryview(b"\n"))  # type: ignore[arg-type]
    assert out == [ev(b"a")]
    assert type(out[0].data) is bytes


# ---------------------------------------------------------------- unframed text


GEMINI_ERROR = b'{\n  "error": {\n    "code": 503,\n    "status": "UNAVAILABLE"\n  }\n}'


def test_unframed_body_after_events_is_collected_at_close() -> None:
    head = b'data: {"candidates":[]}\r\n\r\n'
    for end in (b"", b"\n", b"\r\n"):
        body = head + GEMINI_ERROR.replace(b"\n", b"\r\n") + end
        assert decode3(body, collect=True) == [ev(b'{"candidates":[]}'), unframed(GEMINI_ERROR)]
        assert decode3(body) == [ev(b'{"candidates":[]}')]


def test_unframed_text_is_emitted_at_blank_line_after_the_framed_event() -> None:
    body = b"raw one\ndata: a\nraw: two\n\ndata: b\n\n"
    assert decode3(body, collect=True) == [ev(b"a"), unframed(b"raw one\nraw: two"), ev(b"b")]


def test_unframed_ignores_comments_and_known_fields() -> None:
    body = b": c\nid: 1\nevent: e\nretry: 3\nraw\n\n"
    assert decode3(body, collect=True) == [unframed(b"raw")]


def test_unfinished_framed_tail_is_not_unframed_text() -> None:
    assert decode3(b"raw\n\ndata: partial", collect=True) == [unframed(b"raw")]


def test_unframed_text_is_capped_by_max_event_bytes() -> None:
    limits = Limits(max_line_bytes=64, max_event_bytes=10)
    assert decode3(b"12345\n1234\n\n", limits, collect=True) == [unframed(b"12345\n1234")]
    raises3(b"12345\n12345\n\n", SSEEventTooLarge, limits, collect=True)
    raises3(b"12345\n12345", SSEEventTooLarge, limits, collect=True)  # at close()


# ---------------------------------------------------------------- caps


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_line_cap_boundaries(eol: bytes) -> None:
    limits = Limits(max_line_bytes=16, max_event_bytes=64)
    for size in (15, 16):
        line = b"data:" + b"x" * (size - 5)
        assert decode3(line + eol + eol, limits) == [ev(b"x" * (size - 5))], size
        assert decode3(line, limits) == []  # unterminated at the cap: still fine
    line = b"data:" + b"x" * 12
    raises3(line + eol + eol, SSELineTooLong, limits)
    raises3(line, SSELineTooLong, limits)
    raises3(b"data: ok\n\n: " + b"c" * 15 + eol, SSELineTooLong, limits)  # comments too


def test_line_cap_error_carries_limit_name_and_value() -> None:
    decoder = SSEDecoder(Limits(max_line_bytes=8))
    with pytest.raises(SSELineTooLong) as info:
        decoder.feed(b"123456789")
    assert (info.value.limit, info.value.value) == ("max_line_bytes", 8)
    assert isinstance(info.value, LimitExceeded)


def test_line_cap_raises_as_soon_as_buffer_passes_it() -> None:
    decoder = SSEDecoder(Limits(max_line_bytes=8))
    assert decoder.feed(b"data:") == []
    assert decoder.feed(b"123") == []  # exactly 8 buffered
    with pytest.raises(SSELineTooLong):
        decoder.feed(b"4")


@pytest.mark.parametrize("lines", [1, 3])
def test_event_cap_boundaries(lines: int) -> None:
    cap = 20
    limits = Limits(max_line_bytes=64, max_event_bytes=cap)
    for size in (cap - 1, cap, cap + 1):
        # ``lines`` data lines whose joined size (LFs included) is ``size``.
        piece, extra = divmod(size - (lines - 1), lines)
        parts = [b"y" * (piece + (1 if i < extra else 0)) for i in range(lines)]
        data = b"\n".join(parts)
        assert len(data) == size
        body = b"".join(b"data: " + p + b"\n" for p in parts) + b"\n"
        if size <= cap:
            assert decode3(body, limits) == [ev(data)], size
        else:
            raises3(body, SSEEventTooLarge, limits)


def test_event_cap_counts_joined_size_not_line_count() -> None:
    limits = Limits(max_line_bytes=64, max_event_bytes=3)
    assert decode3(b"data\ndata\ndata\ndata\n\n", limits) == [ev(b"\n\n\n")]
    raises3(b"data\ndata\ndata\ndata\ndata\n\n", SSEEventTooLarge, limits)


def test_decoder_is_poisoned_after_an_error() -> None:
    decoder = SSEDecoder(Limits(max_line_bytes=4))
    with pytest.raises(SSELineTooLong):
        decoder.feed(b"data: 12345")
    with pytest.raises(SSELineTooLong):
        decoder.feed(b"\n\n")
    with pytest.raises(SSELineTooLong):
        decoder.close()


def test_errors_surface_in_stream_order_whatever_the_chunking() -> None:
    # Bad UTF-8 in an event name comes before an over-long line: every mode must
    # report the protocol error, not the line cap checked on the whole chunk.
    limits = Limits(max_line_bytes=16, max_event_bytes=16)
    raises3(b"event: \xff\ndata: " + b"x" * 40 + b"\n\n", StreamProtocolError, limits)
    raises3(b"event: \xff\n" + b"x" * 40, StreamProtocolError, limits)
    raises3(b"data: " + b"x" * 40 + b"\nevent: \xff\n\n", SSELineTooLong, limits)


def test_hostile_16mib_line_is_rejected_with_bounded_buffering() -> None:
    decoder = SSEDecoder()
    chunk = b"x" * (64 * 1024)
    fed = 0
    with pytest.raises(SSELineTooLong):
        for _ in range(16 * MiB // len(chunk)):
            decoder.feed(chunk)
            fed += len(chunk)
    # It stopped right after the cap, not after buffering all 16 MiB.
    assert fed <= DEFAULT_LIMITS.max_line_bytes
    assert fed + len(chunk) > DEFAULT_LIMITS.max_line_bytes


def test_httpx_sse_buffers_an_unterminated_line_without_limit() -> None:
    # Why callgate has its own decoder: httpx-sse's line splitter (used by aiter_sse)
    # keeps every byte of a line that never ends.
    from httpx_sse._decoders import SSELineDecoder

    chunk = "x" * (64 * 1024)
    lines = SSELineDecoder()
    for _ in range(16 * MiB // len(chunk)):
        assert lines.decode(chunk) == []
    assert sum(map(len, lines.buffer)) == 16 * MiB

    ours = SSEDecoder()
    with pytest.raises(SSELineTooLong):
        for _ in range(16 * MiB // len(chunk)):
            ours.feed(chunk.encode())


# ---------------------------------------------------------------- UTF-8 in names


def test_invalid_utf8_in_event_name_is_a_protocol_error() -> None:
    raises3(b"event: \xc3\x28\ndata: a\n\n", StreamProtocolError)
    raises3(b"event: \xed\xa0\x80\ndata: a\n\n", StreamProtocolError)  # a surrogate


def test_invalid_utf8_in_id_is_a_protocol_error() -> None:
    raises3(b"id: \xff\ndata: a\n\n", StreamProtocolError)


def test_protocol_error_poisons_the_decoder() -> None:
    decoder = SSEDecoder()
    with pytest.raises(StreamProtocolError):
        decoder.feed(b"event: \xff\n")
    with pytest.raises(StreamProtocolError):
        decoder.feed(b"data: a\n\n")


# ---------------------------------------------------------------- recorded fixtures


@pytest.mark.parametrize(("family", "path"), fixture_files(), ids=lambda v: getattr(v, "name", v))
def test_recorded_fixture_decodes_identically_in_every_mode(family: str, path: object) -> None:
    from pathlib import Path

    assert isinstance(path, Path)
    body = path.read_bytes()
    collect = family == "gemini"
    events = decode3(body, collect=collect)
    assert events == reference(body, collect)
    framed = [e for e in events if not e.unframed]
    assert len(framed) > 0
    # Each recorded frame's data line starts a JSON value or is the [DONE] sentinel.
    assert all(e.data[:1] in (b"{", b"[") or e.data == b"[DONE]" for e in framed)


# ---------------------------------------------------------------- properties

_NAMES = [b"data", b"data", b"data", b"event", b"id", b"retry", b"", b"dat", b"foo", b" data"]
_VALUE = st.lists(
    st.sampled_from(
        [
            b"a",
            b"{",
            b"}",
            b" ",
            b":",
            b"0",
            b"7",
            b"\x00",
            "\u00e9".encode(),
            "\U0001f600".encode(),
            BOM,
        ]
    ),
    max_size=6,
).map(b"".join)
_LINE = st.one_of(
    st.just(b""),
    st.tuples(st.sampled_from(_NAMES), st.sampled_from([b":", b": ", b""]), _VALUE).map(b"".join),
    _VALUE.map(lambda v: b":" + v),
)


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(_LINE, max_size=30))
    body = b"".join(line + draw(st.sampled_from([b"\n", b"\r", b"\r\n"])) for line in lines)
    if draw(st.booleans()):
        body = BOM + body
    return body + draw(_LINE)  # maybe an unterminated tail


@settings(max_examples=400, deadline=None)
@given(
    body=streams(), cuts=st.lists(st.integers(min_value=0, max_value=400)), collect=st.booleans()
)
def test_any_chunking_gives_the_events_of_whole_feeding(
    body: bytes, cuts: list[int], collect: bool
) -> None:
    points = sorted({c % (len(body) + 1) for c in cuts})
    chunks = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    whole = run([body], collect=collect)
    assert run(chunks, collect=collect) == whole
    assert run([body[i : i + 1] for i in range(len(body))], collect=collect) == whole
    assert whole == (reference(body, collect), None)


@settings(max_examples=200, deadline=None)
@given(
    body=streams(), seed=st.integers(0, 2**32), line=st.integers(1, 24), event=st.integers(0, 40)
)
def test_caps_do_not_depend_on_chunking(body: bytes, seed: int, line: int, event: int) -> None:
    limits = Limits(max_line_bytes=line, max_event_bytes=event)
    results = {mode: run(chunks, limits) for mode, chunks in chunkings(body, seed)}
    errors = {result[1] for result in results.values()}
    assert len(errors) == 1, results
    if errors == {None}:
        assert results["whole"] == results["bytewise"] == results["random"]
        assert results["whole"][0] == reference(body)


def test_random_streams_in_random_chunks_match_the_reference() -> None:
    rng = random.Random(1234)
    pieces = [b"data: {}", b"data:x", b"event: e", b"id: 9", b": c", b"", b"retry: 3", b"raw"]
    for _ in range(200):
        body = b"".join(rng.choice(pieces) + rng.choice([b"\n", b"\r", b"\r\n"]) for _ in range(40))
        assert decode3(body, seed=rng.randrange(1000)) == reference(body)


# Streams that look like the shapes the decoder splits with a few C-level calls (a chunk
# of `data: <value>` events, LF or CRLF; a chunk of `event:` + `data:` pairs) but are
# not quite: each must go the line-by-line way and give what the rules give.
NEAR_FAST_SHAPES = [
    # A pair block with a third, non-blank line: one event of type b, data "x\ny".
    b"event: a\ndata: x\n: keep\nevent: b\ndata: y\n\nevent: c\ndata: z\n\n",
    b"event: a\ndata: x\nid: 7\n\nevent: b\ndata: y\n\n",
    # A later data line without the space after its colon.
    b"event: a\ndata: x\n\nevent: b\ndata:y\n\nevent: c\ndata: z\n\n",
    b"event: a\ndata: x\n\nevent: b\nid: 3\n\nevent: c\ndata: z\n\n",
    # A value hiding another line (LF, then CRLF framing with a bare CR inside).
    b"data: x\ndata: y\n\ndata: z\n\n",
    b"data: x\rdata: y\r\n\r\ndata: z\r\n\r\n",
    # CRLF events, then a complete line of an event still arriving.
    b"data: a\r\n\r\ndata: b\r\nid: 3\r\n\r\ndata: c\r\n\r\n",
    b"data: a\r\n\r\ndata: b\rid: 3\r\n\r\ndata: c\r\n\r\n",
    b"retry: 5\r\ndata: a\r\n\r\n: c\r\ndata: b\r\n\r\n",
    # Mixed line ends, and a comment block before the pairs.
    b"event: a\r\ndata: x\r\n\r\nevent: b\ndata: y\n\n",
    b": ping\n\nevent: a\ndata: x\n\nevent: a\ndata: y\n\n",
]


@pytest.mark.parametrize("body", NEAR_FAST_SHAPES)
def test_near_fast_shapes_follow_the_rules_at_every_split(body: bytes) -> None:
    expected = (reference(body), None)
    assert decode3(body) == expected[0]
    for i in range(len(body) + 1):
        assert run([body[:i], body[i:]]) == expected, i
        for j in range(i, len(body) + 1):
            assert run([body[:i], body[i:j], body[j:]]) == expected, (i, j)


def _fast_shaped_stream(rng: random.Random) -> bytes:
    """Blocks of the shapes real streams use (event + data pairs, or data alone), one
    line end throughout, with at most one perturbation of a kind the fast paths must
    hand to the line-by-line rules."""
    end = rng.choice([b"\n", b"\r\n"])
    paired = rng.random() < 0.5
    blocks = []
    for i in range(rng.randint(1, 8)):
        lines = [b'data: {"n":%d}' % i]
        if paired:
            lines.insert(0, b"event: " + rng.choice([b"a", b"b", b"content_block_delta"]))
        blocks.append(lines)
    kinds = ["none", "third", "merged", "nospace", "bare_cr", "comment", "id", "crlf"]
    perturb = rng.choice(kinds)
    block = rng.choice(blocks)
    if perturb == "merged" and len(blocks) > 1:
        # Two blocks made one by a line between them instead of the blank line: one event.
        i = rng.randrange(len(blocks) - 1)
        blocks[i : i + 2] = [[*blocks[i], rng.choice([b"id: 7", b": keep"]), *blocks[i + 1]]]
    elif perturb == "third":
        block.append(rng.choice([b"id: 7", b": keep", b"retry: 5", b"data: more"]))
    elif perturb == "nospace":
        block[-1] = block[-1].replace(b"data: ", b"data:")
    elif perturb == "bare_cr":
        block[-1] = block[-1] + b"\rdata: cr"
    elif perturb == "comment":
        blocks.insert(rng.randrange(len(blocks) + 1), [b": ping"])
    elif perturb == "id":
        block.insert(0, b"id: 42")
    elif perturb == "crlf":
        block[0] = block[0] + (b"\r\n" if end == b"\n" else b"\n")
    return b"".join(end.join(lines) + end + end for lines in blocks)


def test_fast_shaped_streams_with_one_perturbation_match_the_reference() -> None:
    rng = random.Random(2026)
    for _ in range(300):
        body = _fast_shaped_stream(rng)
        expected = (reference(body), None)
        assert decode3(body, seed=rng.randrange(1000)) == expected[0], body
        for _ in range(8):
            i, j = sorted(rng.randrange(len(body) + 1) for _ in range(2))
            assert run([body[:i], body[i:j], body[j:]]) == expected, (body, i, j)
