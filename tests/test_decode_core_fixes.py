"""Review findings in the shared decode path, each stream fed whole, one byte at a time and
at seeded random chunk boundaries: a call index beyond 64 bits (a derived call id digests
it) fails the turn instead of raising out of ``decode``; ``max_text_bytes`` counts UTF-8
bytes in every family (it counted code points for the OpenAI ones); Anthropic usage is
merged count by count, so a ``message_delta`` that repeats only ``input_tokens`` keeps the
cache counts of ``message_start``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.engine import OutcomeKind, TurnOutcome, decode
from callgate.engine.core.limits import Limits

from .conftest import chunkings


def _sse(*events: dict[str, Any], named: bool = False, done: bool = False) -> bytes:
    out = []
    for ev in events:
        head = f"event: {ev['type']}\n" if named else ""
        out.append(f"{head}data: {json.dumps(ev)}\n\n".encode())
    if done:
        out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def _all_ways(provider: str, body: bytes, limits: Limits | None = None) -> TurnOutcome:
    outcomes = [decode(provider, chunks, limits) for _, chunks in chunkings(body)]
    assert all(o == outcomes[0] for o in outcomes[1:])
    return outcomes[0]


def _chat(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice]}


BIG = 2**64


def _chat_big_index() -> bytes:
    call = {"index": BIG, "function": {"name": "f", "arguments": "{}"}}
    return _sse(_chat({"tool_calls": [call]}), _chat({}, "tool_calls"), done=True)


def _responses_big_index() -> bytes:
    item = {"type": "function_call", "id": "fc_1", "name": "f", "arguments": ""}
    return _sse(
        {"type": "response.created", "response": {"id": "resp_1", "model": "m"}},
        {"type": "response.output_item.added", "output_index": BIG, "item": item},
        {
            "type": "response.function_call_arguments.done",
            "output_index": BIG,
            "item_id": "fc_1",
            "arguments": "{}",
        },
        {"type": "response.completed", "response": {"id": "resp_1", "status": "completed"}},
        named=True,
    )


@pytest.mark.parametrize(
    ("provider", "body"),
    [("openai_chat", _chat_big_index()), ("openai_responses", _responses_big_index())],
    ids=["openai_chat", "openai_responses"],
)
def test_a_call_index_beyond_64_bits_fails_the_turn(provider: str, body: bytes) -> None:
    out = _all_ways(provider, body)
    assert out.kind is OutcomeKind.FAILED
    assert "out of range" in out.stop_reason
    assert out.calls == ()


EMOJI = "\U0001f600" * 10  # 10 code points, 40 UTF-8 bytes


def _anthropic(*events: dict[str, Any]) -> bytes:
    return _sse(*events, named=True)


def _anthropic_text(text: str, usage: dict[str, int]) -> bytes:
    return _anthropic(
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "model": "claude",
                "usage": {"input_tokens": 10, "cache_read_input_tokens": 100, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage},
        {"type": "message_stop"},
    )


def _text_streams(text: str) -> list[tuple[str, bytes]]:
    chat = _sse(_chat({"content": text}), _chat({}, "stop"), done=True)
    responses = _sse(
        {"type": "response.created", "response": {"id": "resp_1", "model": "m"}},
        {
            "type": "response.output_text.delta",
            "output_index": 0,
            "content_index": 0,
            "delta": text,
        },
        {"type": "response.completed", "response": {"id": "resp_1", "status": "completed"}},
        named=True,
    )
    return [
        ("openai_chat", chat),
        ("openai_responses", responses),
        ("anthropic", _anthropic_text(text, {"output_tokens": 5})),
    ]


@pytest.mark.parametrize("case", range(3), ids=["openai_chat", "openai_responses", "anthropic"])
def test_max_text_bytes_counts_utf8_bytes_in_every_family(case: int) -> None:
    provider, body = _text_streams(EMOJI)[case]
    at_cap = _all_ways(provider, body, Limits(max_text_bytes=40))
    assert at_cap.kind is OutcomeKind.FINAL_TEXT and at_cap.text == EMOJI
    over = _all_ways(provider, body, Limits(max_text_bytes=39))
    assert over.kind is OutcomeKind.FAILED
    assert "max_text_bytes" in over.stop_reason


def test_anthropic_usage_merges_count_by_count() -> None:
    body = _anthropic_text("hi", {"input_tokens": 10, "output_tokens": 5})
    out = _all_ways("anthropic", body)
    assert out.kind is OutcomeKind.FINAL_TEXT
    # input 10 + cache read 100 (from message_start, not repeated by message_delta).
    assert (out.usage.input_tokens, out.usage.output_tokens) == (110, 5)
    assert out.usage.cached_input_tokens == 100
    # A message_delta that repeats every count changes nothing.
    full = {"input_tokens": 10, "cache_read_input_tokens": 100, "output_tokens": 5}
    assert _all_ways("anthropic", _anthropic_text("hi", full)).usage == out.usage
