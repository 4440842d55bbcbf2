"""Hostile provider streams through the public ``decode()``: each ends in an explicit
``failed`` or ``truncated`` outcome with bounded memory — never a crash, never a call."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator

import pytest

from callgate.engine import Limits, OutcomeKind, decode

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
