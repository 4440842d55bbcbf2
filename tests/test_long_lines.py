"""Long lines and long argument texts are held once: a ``data:`` line that spans many
chunks is gathered in place and handed over as the event's data (never joined from its
pieces), whatever the chunk size; and a Responses call's repeated argument text is not
kept twice (the kept ``function_call`` item leaves it out and the echo restores it from
the call's own bytes)."""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from callgate.adapters.openai_responses import ADAPTER as RESPONSES
from callgate.engine.core.decode import StreamDecoder, decode
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import OutcomeKind, TurnOutcome
from callgate.engine.core.sse import SSEDecoder, SSEEvent

from .conftest import chunkings

KiB = 1024
MiB = 1024 * KiB
LINE = 3 * MiB


def _payload(size: int) -> bytes:
    """``size`` bytes of JSON-ish text without a line end (varied, so a wrong offset or
    a dropped piece shows)."""
    unit = b'{"k":"0123456789abcdefghijklmnopqrstuvwxyz\\u00e9 \xc3\xa9 ", "n": [1, 2, 3]}, '
    return (unit * (size // len(unit) + 1))[:size]


PAYLOAD = _payload(LINE)
# An event named by an `event:` line, the long `data:` line, then a short event after it.
BODY = b"event: big\ndata: " + PAYLOAD + b"\n\ndata: after\n\n"


def _feed(chunks: Iterator[bytes] | list[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder(Limits())
    events: list[SSEEvent] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    events += decoder.close()
    return events


def _pieces(body: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i : i + size]


def test_a_three_mib_data_line_is_one_event_held_once() -> None:
    """Fed in 64 KiB chunks, the line's bytes are the event's data (a read-only view of
    the buffer they were gathered in), and the traced memory peak while feeding is
    about one line (the buffer's growth slack of 1/16 + 256 KiB), not the pieces plus
    their join, nor a bytearray's slack of 1/8."""
    body = b"data: " + PAYLOAD + b"\n\n"
    chunks = list(_pieces(body, 64 * KiB))  # built before tracing starts
    assert len(chunks) > 40
    decoder = SSEDecoder(Limits())
    events: list[SSEEvent] = []
    gc.collect()
    tracemalloc.start()
    try:
        for chunk in chunks:
            events += decoder.feed(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(events) == 1
    (event,) = events
    assert event.event == "message"
    assert len(event.data) == LINE
    assert event.data == PAYLOAD
    assert isinstance(event.data, memoryview) and event.data.readonly
    assert peak < 1.0625 * LINE + 256 * KiB, peak
    assert decoder.close() == []


@pytest.mark.parametrize("size", [1, 7, 4096, 65536])
def test_the_long_line_gives_the_same_events_at_every_chunk_size(size: int) -> None:
    """The long line (with its ``event:`` name) and the short event after it come out the
    same, whole or cut at any chunk size, including one byte at a time."""
    expected = _feed([BODY])
    assert [(e.event, bytes(e.data)) for e in expected] == [("big", PAYLOAD), ("message", b"after")]
    events = _feed(_pieces(BODY, size))
    assert events == expected
    assert [(e.event, e.data, e.id, e.retry, e.unframed) for e in events] == [
        (e.event, e.data, e.id, e.retry, e.unframed) for e in expected
    ]


# --- Responses: the repeated argument text is kept once ------------------------------------


def _ev(kind: str, body: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **body})}\n\n".encode()


def responses_stream(text: str, fragment: int, *, item_done: bool = True) -> bytes:
    """One function call whose argument ``text`` streams in ``fragment``-code-point
    deltas, then its done events (both repeating the whole text) and completion."""
    item = {"id": "fc_1", "type": "function_call", "status": "in_progress", "arguments": ""}
    item |= {"call_id": "call_1", "name": "write_file"}
    out = [
        _ev("response.created", {"response": {"id": "resp_1", "model": "gpt-x"}}),
        _ev(
            "response.output_item.added",
            {"output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": []}},
        ),
        _ev(
            "response.output_item.done",
            {"output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": []}},
        ),
        _ev("response.output_item.added", {"output_index": 1, "item": item}),
    ]
    for i in range(0, len(text), fragment):
        delta = {"item_id": "fc_1", "output_index": 1, "delta": text[i : i + fragment]}
        out.append(_ev("response.function_call_arguments.delta", delta))
    out.append(
        _ev(
            "response.function_call_arguments.done",
            {"item_id": "fc_1", "output_index": 1, "arguments": text},
        )
    )
    if item_done:
        done = {**item, "status": "completed", "arguments": text}
        out.append(_ev("response.output_item.done", {"output_index": 1, "item": done}))
    out.append(_ev("response.completed", {"response": {"id": "resp_1", "status": "completed"}}))
    return b"".join(out)


def _arguments(size: int) -> dict[str, Any]:
    words = ["line", 'say "hi"', "back\\slash", "café", "😀", "tab\there", "\n"]
    content = " ".join(words[i % len(words)] for i in range(size // 6))
    return {"path": "src/notes.txt", "mode": "overwrite", "content": content}


@pytest.mark.parametrize("size", [200, 100 * KiB], ids=["short", "long"])
def test_responses_keeps_the_call_item_without_arguments_and_the_echo_restores_them(
    size: int,
) -> None:
    """The kept ``function_call`` item has no ``arguments`` (the call's bytes are the same
    text); the echo puts back exactly the streamed text, and the call's arguments are
    the object the text spells, in every feeding mode."""
    args = _arguments(size)
    text = json.dumps(args)  # escapes: \" \\ \n \t \u00e9 \ud83d\ude00
    assert "\\ud83d\\ude00" in text and "\\u00e9" in text
    body = responses_stream(text, 8)
    for mode, chunks in chunkings(body, seed=size):
        outcome = decode("openai_responses", chunks)
        assert outcome.kind is OutcomeKind.TOOL_PROPOSALS, mode
        (call,) = outcome.calls
        assert call.error is None, mode
        assert call.arguments == args, mode
        assert call.raw_arguments == text.encode(), mode
        _check_item_and_echo(outcome, text)


def _check_item_and_echo(outcome: TurnOutcome, text: str) -> None:
    kinds = [(c.kind, c.index) for c in outcome.continuation]
    assert kinds == [("reasoning", 0), ("function_call", 1)]
    item = outcome.continuation[1].item
    assert "arguments" not in item
    assert item["call_id"] == "call_1" and item["name"] == "write_file"
    echo = RESPONSES.assistant_echo(outcome)
    # The reasoning item has no encrypted_content: under store:false it is not echoed.
    assert [e.get("type") for e in echo] == ["function_call"]
    echoed = echo[0]
    assert echoed["arguments"] == outcome.calls[0].raw_arguments.decode() == text
    assert echoed["call_id"] == "call_1" and echoed["name"] == "write_file"
    assert "status" not in echoed  # an output-only field


def test_responses_echo_of_a_call_item_repeats_the_text_exactly_as_streamed() -> None:
    """Whatever spelling the wire used (raw UTF-8 here, not escapes), the echo carries
    the argument text byte for byte, not a re-serialisation of the parsed object."""
    text = '{ "s" : "é😀",\n  "n": 1.50 }'
    outcome = decode("openai_responses", [responses_stream(text, 3)])
    assert outcome.calls[0].arguments == {"s": "é😀", "n": 1.5}
    _check_item_and_echo(outcome, text)


def test_responses_feed_in_long_chunks_gives_the_same_outcome_as_whole() -> None:
    """The long stream through ``StreamDecoder.feed`` in 64 KiB chunks (the events'
    literals and the deltas cut across chunks) gives the outcome of one whole chunk."""
    text = json.dumps(_arguments(200 * KiB))
    body = responses_stream(text, 8)
    whole = decode("openai_responses", [body])
    decoder = StreamDecoder(RESPONSES, Limits())
    for chunk in _pieces(body, 64 * KiB):
        decoder.feed(chunk)
    assert decoder.finish() == whole
    assert whole.calls[0].raw_arguments == text.encode()


def test_a_long_data_line_without_the_space_is_a_view_too() -> None:
    """``data:<value>`` (no space after the colon) spanning chunks is handed over as a
    view of its buffer like ``data: <value>``, not copied out of it."""
    events = _feed(_pieces(b"data:" + PAYLOAD + b"\n\n", 64 * KiB))
    assert len(events) == 1
    assert isinstance(events[0].data, memoryview)
    assert events[0].data == PAYLOAD


@pytest.mark.parametrize("size", [0, 1, 4096])
def test_chat_done_marker_padded_with_whitespace_ends_the_stream_at_any_chunking(
    size: int,
) -> None:
    """``[DONE]`` padded with whitespace (over 4 KiB of it) ends a Chat stream whether
    its line arrives whole (bytes) or gathered across chunks (a view)."""
    done = b"data: " + b" " * 5000 + b"[DONE]" + b" " * 5000 + b"\n\n"
    stop = (
        b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"hi"},'
        b'"finish_reason":"stop"}]}\n\n'
    )
    body = stop + done
    chunks = [body] if size == 0 else list(_pieces(body, size))
    outcome = decode("openai_chat", chunks)
    assert outcome.kind is OutcomeKind.FINAL_TEXT, outcome.stop_reason
    assert outcome.text == "hi"
