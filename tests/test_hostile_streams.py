"""Hostile provider streams through the public ``decode()``: each ends in an explicit
``failed`` or ``truncated`` outcome with bounded memory — never a crash, never a call."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator

import msgspec
import pytest

from callgate.adapters.render import RenderCall, render_turn
from callgate.engine import ConfigError, Limits, OutcomeKind, decode
from callgate.engine.core.footprint import footprint

from .conftest import FAMILIES, chunkings

MiB = 1024 * 1024


def _chat_chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
    chunk = {
        "id": "c1",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def test_sixteen_mib_line_is_refused_with_bounded_memory() -> None:
    def body() -> Iterator[bytes]:
        yield b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"'
        for _ in range(16 * 16):
            yield b"x" * (64 * 1024)  # 16 MiB, never a line end

    tracemalloc.start()
    try:
        out = decode("openai_chat", body())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.kind is OutcomeKind.FAILED
    assert "max_line_bytes" in out.stop_reason
    assert peak < 3 * Limits().max_line_bytes  # held at most about one capped line


def test_ten_thousand_calls_hit_the_calls_cap() -> None:
    def body() -> Iterator[bytes]:
        for i in range(10_000):
            yield _chat_chunk(
                {
                    "tool_calls": [
                        {"index": i, "id": f"c{i}", "function": {"name": "f", "arguments": "{}"}}
                    ]
                }
            )
        yield _chat_chunk({}, "tool_calls") + b"data: [DONE]\n\n"

    out = decode("openai_chat", body())
    assert out.kind is OutcomeKind.FAILED
    assert "max_calls_per_response" in out.stop_reason
    assert out.calls == ()


@pytest.mark.parametrize("provider", FAMILIES)
def test_ten_thousand_calls_fail_the_turn_in_every_family(provider: str) -> None:
    calls = [RenderCall(f"call_{i}", "f", f'{{"i":{i}}}') for i in range(10_000)]
    body = render_turn(provider, calls=calls)
    limits = Limits()
    for mode, chunks in chunkings(body, seed=7):
        out = decode(provider, chunks)
        assert out.kind is OutcomeKind.FAILED, mode
        assert "max_calls_per_response" in out.stop_reason, mode
        # Never more calls than the cap, and none of them complete past it.
        assert len(out.calls) <= limits.max_calls_per_response, mode
    # Exactly at the cap the same turn is fine.
    at_cap = render_turn(provider, calls=calls[: limits.max_calls_per_response])
    out = decode(provider, [at_cap])
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    assert len(out.calls) == limits.max_calls_per_response


def test_deeply_nested_arguments_are_rejected_not_executed() -> None:
    args = '{"a":' + "[" * 5000 + "]" * 5000 + "}"
    body = (
        _chat_chunk(
            {"tool_calls": [{"index": 0, "id": "c0", "function": {"name": "f", "arguments": args}}]}
        )
        + _chat_chunk({}, "tool_calls")
        + b"data: [DONE]\n\n"
    )
    out = decode("openai_chat", [body])
    assert out.kind is OutcomeKind.TOOL_PROPOSALS  # the turn completed; the call is invalid
    (call,) = out.calls
    assert call.arguments is None and call.error and "deeper" in call.error


@pytest.mark.parametrize(
    "provider", ["openai_chat", "openai_responses", "anthropic", "gemini", "gemini_interactions"]
)
def test_invalid_utf8_in_an_event_fails_the_turn(provider: str) -> None:
    body = b'event: message\ndata: {"type":"x\xff\xfe"}\n\n'
    out = decode(provider, [body])
    assert out.kind in (OutcomeKind.FAILED, OutcomeKind.TRUNCATED)
    assert not out.complete and out.calls == ()


def test_invalid_utf8_inside_arguments_never_yields_a_call() -> None:
    body = (
        b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
        b'"id":"c0","function":{"name":"f","arguments":"{\\"a\\":\\"\xff\\"}"}}]},"finish_reason":null}]}\n\n'
        + _chat_chunk({}, "tool_calls")
        + b"data: [DONE]\n\n"
    )
    out = decode("openai_chat", [body])
    assert out.kind is OutcomeKind.FAILED
    assert out.calls == ()


# An event whose JSON nests 1,000 deep, in a field no adapter view reads: msgspec's own
# nesting guard fires while skipping it (a RecursionError, not a DecodeError).
_DEEP = b"[" * 1000 + b"]" * 1000
_DEEP_EVENTS = {
    "openai_chat": b'data: {"x":' + _DEEP + b"}\n\n",
    "openai_responses": b'event: response.created\ndata: {"type":"response.created","x":'
    + _DEEP
    + b"}\n\n",
    "anthropic": b'event: ping\ndata: {"type":"ping","x":' + _DEEP + b"}\n\n",
    "gemini": b'data: {"candidates":[],"x":' + _DEEP + b"}\r\n\r\n",
    "gemini_interactions": b'event: step.delta\ndata: {"index":0,"x":'
    + _DEEP
    + b',"event_type":"step.delta"}\n\n',
}


@pytest.mark.parametrize("provider", sorted(_DEEP_EVENTS))
def test_an_event_nested_past_the_json_decoders_guard_fails_the_turn(provider: str) -> None:
    out = decode(provider, [_DEEP_EVENTS[provider]])
    assert out.kind is OutcomeKind.FAILED
    assert "nests too deeply" in out.stop_reason
    assert out.calls == ()


@pytest.mark.parametrize("provider", sorted(_DEEP_EVENTS))
def test_an_adapter_reports_a_too_deep_event_as_a_protocol_error(provider: str) -> None:
    from callgate.engine.core.adapter import load_adapter
    from callgate.engine.core.errors import StreamProtocolError
    from callgate.engine.core.sse import SSEDecoder

    adapter = load_adapter(provider)
    (event,) = SSEDecoder(collect_unframed=adapter.sse_unframed).feed(_DEEP_EVENTS[provider])
    with pytest.raises(StreamProtocolError, match="nests too deeply"):
        adapter.new_stream(Limits()).decode(event)


def test_long_arguments_nested_past_the_cap_are_rejected_at_once() -> None:
    """A long string under many levels of arrays is not scanned once per level: the
    piecewise parse gives way to one decode, which rejects the depth."""
    from callgate.engine.core.arguments import ArgumentsRejected, parse_arguments

    raw = b'{"a":' + b"[" * 300 + b'"' + b"x" * (1 << 20) + b'"' + b"]" * 300 + b"}"
    with pytest.raises(ArgumentsRejected, match="deeper than 64"):
        parse_arguments(raw, 64)
    shallow = b'{"a":' + b"[" * 3 + b'"' + b"x" * (1 << 20) + b'"' + b"]" * 3 + b"}"
    assert parse_arguments(shallow, 64) == {"a": [[["x" * (1 << 20)]]]}


def test_decode_stops_reading_an_endless_source_once_it_failed() -> None:
    read = 0

    def endless() -> Iterator[bytes]:
        nonlocal read
        while True:
            read += 1
            yield b"\x00" * (64 * 1024)  # no line end, ever

    out = decode("anthropic", endless())
    assert out.kind is OutcomeKind.FAILED and "max_line_bytes" in out.stop_reason
    assert read <= Limits().max_line_bytes // (64 * 1024) + 2


# --- continuation and detail bytes ------------------------------------------------------


def _inline_parts(n: int, size: int) -> bytes:
    """n Gemini chunks, each with an inlineData part (a detail the adapter keeps), then
    STOP."""
    chunks = [
        {"candidates": [{"content": {"role": "model", "parts": [
            {"inlineData": {"mimeType": "image/png", "data": "A" * size}}]}}]}
        for _ in range(n)
    ]  # fmt: skip
    chunks.append(
        {"candidates": [{"content": {"parts": [{"text": "ok"}]}, "finishReason": "STOP"}]}
    )
    return b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)


def test_held_continuation_and_detail_bytes_are_capped_at_the_limit() -> None:
    # A count cap alone would let 1024 items of an event's size each be held.
    body = _inline_parts(3, 1000)
    whole = decode("gemini", [body])
    # Each item's charge: its JSON and its nodes (core.footprint; its own tests measure it).
    held = sum(
        footprint(x.item, len(msgspec.json.encode(x)), 1 << 40) for x in whole.continuation
    ) + sum(footprint(x.data, len(msgspec.json.encode(x)), 1 << 40) for x in whole.provider_details)
    assert held > 3000 and whole.kind is OutcomeKind.FINAL_TEXT
    for cap, ok in ((held - 1, False), (held, True), (held + 1, True)):
        for _, chunks in chunkings(body):
            out = decode("gemini", chunks, Limits(max_continuation_bytes=cap))
            if ok:
                assert out == whole
            else:
                assert out.kind is OutcomeKind.FAILED
                assert out.stop_reason == f"limit exceeded: max_continuation_bytes={cap}"


def _open_thinking_blocks(n: int, size: int) -> bytes:
    def ev(kind: str, **fields: object) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"

    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
               "content": [], "stop_reason": None, "usage": {"input_tokens": 1}}  # fmt: skip
    out = [ev("message_start", message=message)]
    block = {"type": "thinking", "thinking": ""}
    delta = {"type": "thinking_delta", "thinking": "t" * size}
    for i in range(n):  # started and fed, never stopped: held by the adapter
        out.append(ev("content_block_start", index=i, content_block=block))
        out.append(ev("content_block_delta", index=i, delta=delta))
    return "".join(out).encode()


def test_open_blocks_an_adapter_holds_count_against_the_continuation_bytes() -> None:
    # Before their stop, blocks are the adapter's to hold: bounded all the same.
    body = _open_thinking_blocks(8, 1000)
    for _, chunks in chunkings(body):
        out = decode("anthropic", chunks, Limits(max_continuation_bytes=4000))
        assert out.kind is OutcomeKind.FAILED
        assert out.stop_reason == "limit exceeded: max_continuation_bytes=4000"
        # 8 x 1000 bytes of thought, and each block's head (its JSON and its 5 nodes).
        assert decode("anthropic", chunks, Limits(max_continuation_bytes=11000)).kind is (
            OutcomeKind.TRUNCATED
        )


def test_open_interaction_steps_count_against_the_continuation_bytes() -> None:
    def ev(kind: str, **fields: object) -> str:
        return f"event: {kind}\ndata: {json.dumps({'event_type': kind, **fields})}\n\n"

    created = {"id": "v1_x", "status": "in_progress", "object": "interaction", "model": "m"}
    out = [ev("interaction.created", interaction=created)]
    for i in range(8):  # steps the adapter keeps as details at their stop, never stopped
        step = {"type": "google_search_result", "data": "d" * 1000}
        out.append(ev("step.start", index=i, step=step))
    body = "".join(out).encode()
    for _, chunks in chunkings(body):
        failed = decode("gemini_interactions", chunks, Limits(max_continuation_bytes=4000))
        assert failed.stop_reason == "limit exceeded: max_continuation_bytes=4000"
        held = decode("gemini_interactions", chunks, Limits(max_continuation_bytes=20000))
        assert held.kind is OutcomeKind.TRUNCATED


@pytest.mark.parametrize("provider", FAMILIES)
@pytest.mark.parametrize("bad", ["\x00", "\n", "\x1f", "\x7f"])
def test_a_call_id_with_a_control_character_fails_the_turn(provider: str, bad: str) -> None:
    # An id travels back to the provider and into the stores (PostgreSQL text holds no
    # NUL): the same stream must not complete on one backend and escalate on another.
    call = RenderCall(f"call_{bad}x", "get_weather", '{"city":"Paris"}')
    body = render_turn(provider, calls=[call])
    fine = render_turn(provider, calls=[RenderCall("call_x", "get_weather", '{"city":"Paris"}')])
    assert decode(provider, [fine]).kind is OutcomeKind.TOOL_PROPOSALS
    for how, chunks in chunkings(body):
        out = decode(provider, chunks)
        assert out.kind is OutcomeKind.FAILED, how
        assert "control character" in out.stop_reason and out.calls == ()


# --- response bytes -----------------------------------------------------------------------


@pytest.mark.parametrize("provider", FAMILIES)
def test_response_bytes_are_capped_at_limit_minus_one_limit_and_plus_one(provider: str) -> None:
    body = render_turn(provider, text="Hello.", calls=[RenderCall("c1", "get_order", '{"a":1}')])
    free = decode(provider, [body])
    assert free.kind is OutcomeKind.TOOL_PROPOSALS
    for cap, within in ((len(body) + 1, True), (len(body), True), (len(body) - 1, False)):
        outcomes = {
            how: decode(provider, chunks, Limits(max_response_bytes=cap))
            for how, chunks in chunkings(body)
        }
        assert len(set(map(msgspec.json.encode, outcomes.values()))) == 1, (cap, outcomes)
        out = outcomes["whole"]
        if within:
            assert out == free
        else:
            assert out.kind is OutcomeKind.FAILED  # (never executed, whatever it holds)
            assert "max_response_bytes" in out.stop_reason


def test_an_endless_stream_of_keep_alive_comments_stops_at_the_response_cap() -> None:
    read = 0

    def pings() -> Iterator[bytes]:
        nonlocal read
        while True:
            read += 1
            yield b": keep-alive\n\n" * 4096

    out = decode("anthropic", pings(), Limits(max_response_bytes=4 * MiB))
    assert out.kind is OutcomeKind.FAILED and "max_response_bytes" in out.stop_reason
    assert read * len(b": keep-alive\n\n") * 4096 <= 4 * MiB + 64 * 1024


@pytest.mark.parametrize(
    "field",
    sorted(Limits.__struct_fields__),
)
@pytest.mark.parametrize("bad", [-1, True, "4MiB", 1.5, None])
def test_every_limit_must_be_a_non_negative_int(field: str, bad: object) -> None:
    with pytest.raises(ConfigError, match=f"Limits.{field} must be an int >= 0"):
        Limits(**{field: bad})  # type: ignore[arg-type]
