"""What a turn keeps decoded is charged for its structure, not only its JSON bytes.

A memory review found lists of empty lists held at about 22 times their JSON size, so
``max_continuation_bytes`` (16 MiB) let some 350 MB through. These tests measure what
the hostile shapes really hold (tracemalloc) against what ``footprint`` charges, and run
such a shape through every adapter that keeps opaque provider JSON.
"""

from __future__ import annotations

import gc
import json
import random
import tracemalloc
from typing import Any

import msgspec
import pytest

from callgate.engine import Limits, OutcomeKind, decode
from callgate.engine.core.footprint import NODE_BYTES, footprint

from .conftest import chunkings

N = 4000
SHAPES = {
    "empty lists": [[] for _ in range(N)],
    "empty objects": [{} for _ in range(N)],
    "nested lists": [[[]] for _ in range(N)],
    "one-member objects": [{"a": 1} for _ in range(N)],
    "objects of empty objects": {str(i): {} for i in range(N)},
    "one-character strings": ["a"] * N,
    "short strings": [f"{i % 100:02d}" for i in range(N)],
    "floats": [1.5] * N,
    "large ints": [10**6 + i for i in range(N)],
    "literals": [True, None] * (N // 2),
    "many keys": {f"k{i}": 0 for i in range(N)},
    "a long string": "x" * (64 * N),
}


def _held(raw: bytes) -> tuple[Any, int]:
    """The value ``raw`` decodes to, and the bytes it holds once decoded."""
    gc.collect()
    tracemalloc.start()
    try:
        value = msgspec.json.decode(raw)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return value, held


@pytest.mark.parametrize("shape", SHAPES)
def test_a_decoded_value_holds_at_most_twice_its_charge(shape: str) -> None:
    raw = msgspec.json.encode(SHAPES[shape])
    value, held = _held(raw)
    charge = footprint(value, len(raw), 1 << 40)
    assert held <= 2 * charge, (shape, held, charge)


def test_the_charge_of_text_is_its_size_whatever_its_characters() -> None:
    # Commas, quotes and brackets inside a string are not structure (a thought of prose).
    text = {"thinking": '[{"a":1},' * 1000}
    raw = msgspec.json.encode(text)
    assert footprint(text, len(raw), 1 << 40) == len(raw) + 3 * NODE_BYTES


def test_counting_stops_past_the_budget() -> None:
    value = [[] for _ in range(100_000)]
    # Over the budget: known to be more, found without counting every member.
    assert footprint(value, 10, 1000) > 1000
    assert footprint(value, 10, 1 << 40) == 10 + NODE_BYTES * 100_001
    # A charge exactly at the budget is within it (the caps accept their limit).
    exact = 10 + NODE_BYTES * 100_001
    assert footprint(value, 10, exact) == exact


def test_counting_stops_at_the_first_node_past_the_budget() -> None:
    # A chain of nested lists, each level one node: the walk stops at the first node
    # that takes the charge past the budget (the JSON size counted in), so refusing a
    # hostile value costs the budget's worth of nodes, not the value's.
    chain: list[Any] = []
    for _ in range(100_000):
        chain = [chain]
    size = 1_000_000  # most of the budget is the JSON size itself
    budget = size + NODE_BYTES * 10
    charge = footprint(chain, size, budget)
    assert budget < charge <= budget + NODE_BYTES
    # Within the budget, every node counts.
    assert footprint([[[]]], 7, 7 + NODE_BYTES * 3) == 7 + NODE_BYTES * 3


# --- the adapters that keep opaque JSON -----------------------------------------------

BULK = [[] for _ in range(30_000)]  # 90 KB of JSON, about 2 MB decoded
CAP = 1024 * 1024  # well above the JSON (Responses sends it twice), below what it holds


def _sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return "".join(f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in events).encode()


def _anthropic() -> bytes:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
               "content": [], "stop_reason": None, "usage": {"input_tokens": 1}}  # fmt: skip
    block = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": BULK}
    return _sse([
        ("message_start", {"type": "message_start", "message": message}),
        ("content_block_start",
         {"type": "content_block_start", "index": 0, "content_block": block}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                           "usage": {"output_tokens": 1}}),
        ("message_stop", {"type": "message_stop"}),
    ])  # fmt: skip


def _responses() -> bytes:
    item = {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": BULK}
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "model": "m",
                "output": []}  # fmt: skip
    done = {**response, "status": "completed", "output": [item]}
    return _sse([
        ("response.created", {"type": "response.created", "response": response}),
        ("response.output_item.done",
         {"type": "response.output_item.done", "output_index": 0, "item": item}),
        ("response.completed", {"type": "response.completed", "response": done}),
    ])  # fmt: skip


def _interactions() -> bytes:
    created = {"id": "v1_x", "status": "in_progress", "object": "interaction", "model": "m"}
    step = {"type": "google_search_result", "data": BULK}
    return "".join(
        f"event: {e}\ndata: {json.dumps({'event_type': e, **d})}\n\n"
        for e, d in [
            ("interaction.created", {"interaction": created}),
            ("step.start", {"index": 0, "step": step}),
            ("step.stop", {"index": 0}),
            ("interaction.completed", {"interaction": {**created, "status": "completed"}}),
        ]
    ).encode()


def _gemini() -> bytes:
    parts = [{"executableCode": {"language": "PYTHON", "code": "x", "extra": BULK}}]
    chunk = {"candidates": [{"content": {"role": "model", "parts": parts},
                             "finishReason": "STOP"}], "responseId": "r1"}  # fmt: skip
    return b"data: " + json.dumps(chunk).encode() + b"\r\n\r\n"


STREAMS = {
    "anthropic": _anthropic,
    "openai_responses": _responses,
    "gemini_interactions": _interactions,
    "gemini": _gemini,
}


@pytest.mark.parametrize("provider", STREAMS)
def test_structure_kept_from_a_stream_is_charged_for_its_nodes(provider: str) -> None:
    body = STREAMS[provider]()
    assert len(body) < CAP // 4  # the JSON alone fits the cap many times over
    assert decode(provider, [body]).kind is OutcomeKind.FINAL_TEXT  # within the defaults
    for how, chunks in chunkings(body):
        out = decode(provider, chunks, Limits(max_continuation_bytes=CAP))
        assert out.kind is OutcomeKind.FAILED, how
        assert out.stop_reason == f"limit exceeded: max_continuation_bytes={CAP}", how


@pytest.mark.parametrize("provider", ["anthropic", "gemini_interactions"])
def test_structure_an_adapter_holds_open_is_charged_for_its_nodes(provider: str) -> None:
    # Cut after the block's (step's) start: the adapter holds it, not yet the assembler.
    body = STREAMS[provider]()
    cut = body.index(
        b"event: content_block_stop" if provider == "anthropic" else b"event: step.stop"
    )
    assert decode(provider, [body[:cut]]).kind is OutcomeKind.TRUNCATED
    for how, chunks in chunkings(body[:cut]):
        out = decode(provider, chunks, Limits(max_continuation_bytes=CAP))
        assert out.stop_reason == f"limit exceeded: max_continuation_bytes={CAP}", how


def _logprobs_turn(tokens: int, top: int) -> bytes:
    """A Responses text turn asked for with ``include=["message.output_text.logprobs"]``
    (each token's logprob with ``top`` alternatives: the SDK's ``Logprob`` shape), which
    the adapter keeps whole in the message item for the echo."""
    words = ["the", " answer", " is", ",", " data"]
    toks = [words[i % len(words)] for i in range(tokens)]

    def logprob(token: str, i: int) -> dict[str, Any]:
        alternatives = [
            {"token": w, "bytes": list(w.encode()), "logprob": -0.5 - j}
            for j, w in enumerate((words * 8)[i % 5 : i % 5 + top])
        ]
        return {"token": token, "bytes": list(token.encode()), "logprob": -0.25,
                "top_logprobs": alternatives}  # fmt: skip

    lps = [logprob(t, i) for i, t in enumerate(toks)]
    text = "".join(toks)
    ids = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": lps}
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
            "content": [part]}  # fmt: skip
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "model": "m",
                "output": []}  # fmt: skip
    added = {**item, "status": "in_progress", "content": []}
    return _sse([
        ("response.created", {"type": "response.created", "response": response}),
        ("response.output_item.added",
         {"type": "response.output_item.added", "output_index": 0, "item": added}),
        *(("response.output_text.delta",
           {"type": "response.output_text.delta", **ids, "delta": t, "logprobs": [lp]})
          for t, lp in zip(toks, lps, strict=True)),
        ("response.output_item.done",
         {"type": "response.output_item.done", "output_index": 0, "item": item}),
        ("response.completed", {"type": "response.completed",
                                "response": {**response, "status": "completed", "output": [item]}}),
    ])  # fmt: skip


def test_a_message_item_with_top_logprobs_fits_the_default_cap() -> None:
    # Logprobs are structure: ~13 KB charged per token at top_logprobs=20 (what they hold,
    # decoded). 1,500 such tokens (a 12 MB body) failed the first charge's 16 MiB default.
    # (Not fed byte by byte: 12 MB; chunk invariance has its own tests.)
    body = _logprobs_turn(1500, 20)
    rng = random.Random(0)
    cuts = sorted(rng.sample(range(1, len(body)), 400))
    random_chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    for chunks in ([body], random_chunks):
        out = decode("openai_responses", chunks)
        assert out.kind is OutcomeKind.FINAL_TEXT, out.stop_reason
        [message] = out.continuation
        assert len(message.item["content"][0]["logprobs"]) == 1500
