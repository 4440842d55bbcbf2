"""Review fixes (findings F1, F2, F3, F6), each shown on whole streams fed whole, one byte at
a time and at seeded random chunk boundaries (identical outcomes required):

- F1 Interactions: a ``model_output`` step.start whose output comes whole in ``content``
  (python-genai ``ModelOutputStep.content: List[Content]``) gives its text items as text
  (counted against ``max_text_bytes``); its other items (image, audio, …) are kept as a
  ``ProviderDetail``, as unknown steps are;
- F2 Anthropic: a non-empty ``tool_use.input`` in ``content_block_start`` is the call's
  argument text, as its exact wire bytes (strictly parsed), when no ``input_json_delta``
  follows; with deltas the turn fails (two sources). ``input: {}`` stays a placeholder.
  A ``server_tool_use`` block's start input is kept the same way;
- F3 Anthropic: a ``signature_delta`` replaces the block's signature (the SDK assigns it);
- F6 usage: Gemini ``toolUsePromptTokenCount`` and Interactions ``total_tool_use_tokens``
  are billed prompt tokens, added to ``input_tokens``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.engine.core.adapter import load_adapter
from callgate.engine.core.decode import decode
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits
from callgate.engine.core.outcome import OutcomeKind, TurnOutcome, Usage

from .conftest import chunkings


def outcome(provider: str, body: bytes, limits: Limits = DEFAULT_LIMITS) -> TurnOutcome:
    """The outcome of ``body``, the same in all three feeding modes."""
    results = [decode(provider, chunks, limits) for _, chunks in chunkings(body, seed=7)]
    assert results[0] == results[1] == results[2]
    return results[0]


def frame(event_type: str, payload: bytes) -> bytes:
    return b"event: " + event_type.encode() + b"\ndata: " + payload + b"\n\n"


# --- F1: Interactions model_output content -------------------------------------------------


def iev(event_type: str, **data: Any) -> bytes:
    return frame(event_type, json.dumps({"event_type": event_type, **data}).encode())


CREATED = iev("interaction.created", interaction={"id": "v1_x", "status": "in_progress"})


def completed(status: str = "completed", **extra: Any) -> bytes:
    return iev("interaction.completed", interaction={"id": "v1_x", "status": status, **extra})


def output_step(index: int, content: Any, **extra: Any) -> bytes:
    step = {"type": "model_output", "content": content, **extra}
    return iev("step.start", index=index, step=step)


def istop(index: int) -> bytes:
    return iev("step.stop", index=index)


def text_delta(index: int, text: str) -> bytes:
    return iev("step.delta", index=index, delta={"type": "text", "text": text})


IMAGE = {"type": "image", "mime_type": "image/png", "data": "iVBORw0KGgo="}


def interactions(body: bytes, limits: Limits = DEFAULT_LIMITS) -> TurnOutcome:
    return outcome("gemini_interactions", body, limits)


def test_model_output_content_text_is_the_turn_text() -> None:
    out = interactions(
        CREATED
        + output_step(0, [{"type": "text", "text": "The refund was NOT issued."}])
        + istop(0)
        + completed()
    )
    assert out.kind is OutcomeKind.FINAL_TEXT
    assert out.text == "The refund was NOT issued."
    assert out.provider_details == () and out.continuation == ()


def test_model_output_content_text_joins_streamed_text_in_order() -> None:
    # Two text items whole in the start, then streamed text of the same step, then a
    # second output step: one text, in wire order.
    out = interactions(
        CREATED
        + output_step(0, [{"type": "text", "text": "Zürich: "}, {"type": "text", "text": "12"}])
        + text_delta(0, " °C")
        + istop(0)
        + output_step(1, [{"type": "text", "text": ", sunny"}])
        + istop(1)
        + completed()
    )
    assert out.text == "Zürich: 12 °C, sunny"


def test_model_output_non_text_content_is_kept_as_a_detail() -> None:
    annotated = {"type": "text", "text": "Here", "annotations": []}
    audio = {"type": "audio", "mime_type": "audio/wav", "data": "UklGRg=="}
    out = interactions(
        CREATED
        + output_step(0, [annotated, IMAGE, {"type": "text", "text": " it is"}, audio])
        + istop(0)
        + output_step(1, [IMAGE])
        + istop(1)
        + completed()
    )
    assert out.kind is OutcomeKind.FINAL_TEXT
    assert out.text == "Here it is"
    assert [(d.kind, d.data) for d in out.provider_details] == [
        ("interactions_step", {"type": "model_output", "content": [IMAGE, audio]}),
        ("interactions_step", {"type": "model_output", "content": [IMAGE]}),
    ]
    # An output step without content, or with only text, adds no detail.
    out = interactions(CREATED + output_step(0, []) + istop(0) + completed())
    assert (out.text, out.provider_details) == ("", ())


def test_model_output_content_text_is_counted_as_text() -> None:
    body = CREATED + output_step(0, [{"type": "text", "text": "x" * 40}]) + istop(0) + completed()
    out = interactions(body, Limits(max_text_bytes=39))
    assert out.kind is OutcomeKind.FAILED
    assert "max_text_bytes" in out.stop_reason
    assert interactions(body, Limits(max_text_bytes=40)).text == "x" * 40


# --- F2: Anthropic tool_use input in content_block_start -------------------------------------


def aev(event_type: str, payload: bytes) -> bytes:
    return frame(event_type, payload)


MESSAGE_START = aev(
    "message_start",
    b'{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",'
    b'"model":"claude-x","content":[],"stop_reason":null,'
    b'"usage":{"input_tokens":10,"output_tokens":1}}}',
)


def message_end(stop_reason: str = "tool_use") -> bytes:
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": 5},
    }
    return aev("message_delta", json.dumps(delta).encode()) + aev(
        "message_stop", b'{"type":"message_stop"}'
    )


def tool_start(index: int, input_wire: bytes, *, btype: str = "tool_use") -> bytes:
    """A content_block_start whose block's ``input`` is exactly ``input_wire``."""
    return aev(
        "content_block_start",
        b'{"type":"content_block_start","index":%d,"content_block":{"type":"%s",'
        b'"id":"toolu_%d","name":"refund","input":%s,"caller":{"type":"direct"}}}'
        % (index, btype.encode(), index, input_wire),
    )


def block_start(index: int, block: dict[str, Any]) -> bytes:
    data = {"type": "content_block_start", "index": index, "content_block": block}
    return aev("content_block_start", json.dumps(data).encode())


def block_delta(index: int, delta: dict[str, Any]) -> bytes:
    data = {"type": "content_block_delta", "index": index, "delta": delta}
    return aev("content_block_delta", json.dumps(data).encode())


def input_delta(index: int, fragment: str) -> bytes:
    return block_delta(index, {"type": "input_json_delta", "partial_json": fragment})


def block_stop(index: int) -> bytes:
    return aev("content_block_stop", b'{"type":"content_block_stop","index":%d}' % index)


def anthropic(body: bytes, limits: Limits = DEFAULT_LIMITS) -> TurnOutcome:
    return outcome("anthropic", body, limits)


@pytest.mark.parametrize(
    "wire",
    [
        pytest.param(b'{"order_id":"A1","amount":5}', id="compact"),
        pytest.param(b'{ "order_id" : "A1", "amount" : 1E2 }', id="exponent-and-spaces"),
        pytest.param(b'{"city":"Z\\u00fcrich","amount":1.50}', id="escape-and-trailing-zero"),
        pytest.param('{"city": "Zürich", "tags": ["a", {"b": null}]}'.encode(), id="utf8-nested"),
    ],
)
def test_start_input_alone_is_the_call_arguments(wire: bytes) -> None:
    out = anthropic(MESSAGE_START + tool_start(0, wire) + block_stop(0) + message_end())
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    [call] = out.calls
    assert (call.index, call.call_id, call.name, call.error) == (0, "toolu_0", "refund", None)
    assert call.raw_arguments == wire
    assert call.arguments == json.loads(wire)
    # The echo replays the parsed input.
    [message] = load_adapter("anthropic").assistant_echo(out)
    assert message["content"] == [
        {"type": "tool_use", "id": "toolu_0", "name": "refund", "input": json.loads(wire)}
    ]


def test_start_input_with_only_empty_deltas_is_the_call_arguments() -> None:
    # Anthropic's first input_json_delta is usually "": it brings no argument text.
    wire = b'{"order_id":"A1"}'
    body = MESSAGE_START + tool_start(0, wire) + input_delta(0, "") + input_delta(0, "")
    [call] = anthropic(body + block_stop(0) + message_end()).calls
    assert (call.arguments, call.raw_arguments, call.error) == ({"order_id": "A1"}, wire, None)


def test_start_input_is_parsed_strictly() -> None:
    wire = b'{"order_id":"A1","order_id":"B2"}'
    out = anthropic(MESSAGE_START + tool_start(0, wire) + block_stop(0) + message_end())
    [call] = out.calls
    assert call.arguments is None
    assert call.error == "arguments contain a duplicate key"
    assert call.raw_arguments == wire
    # Not an object: listed with the parser's error, never replaced by {}.
    [call] = anthropic(
        MESSAGE_START + tool_start(0, b'["A1"]') + block_stop(0) + message_end()
    ).calls
    assert call.arguments is None and call.error is not None
    assert "must be a JSON object" in call.error and call.raw_arguments == b'["A1"]'
    # The bytes are taken unread from the event: invalid UTF-8 in them fails the turn.
    out = anthropic(
        MESSAGE_START + tool_start(0, b'{"city":"Z\xfcrich"}') + block_stop(0) + message_end()
    )
    assert out.kind is OutcomeKind.FAILED and out.calls == ()
    assert "UTF-8" in out.stop_reason


def test_start_input_counts_against_the_argument_cap() -> None:
    wire = b'{"order_id":"A1"}'
    body = MESSAGE_START + tool_start(0, wire) + block_stop(0) + message_end()
    [call] = anthropic(body, Limits(max_call_argument_bytes=len(wire) - 1)).calls
    assert call.arguments is None
    assert call.error is not None and "max_call_argument_bytes" in call.error
    [call] = anthropic(body, Limits(max_call_argument_bytes=len(wire))).calls
    assert call.arguments == {"order_id": "A1"}


@pytest.mark.parametrize(
    "deltas",
    [
        pytest.param([input_delta(0, '{"order_id":"B2"}')], id="whole-text"),
        pytest.param([input_delta(0, ""), input_delta(0, " ")], id="after-an-empty-one"),
        pytest.param([input_delta(0, "}")], id="a-closing-brace"),
    ],
)
def test_start_input_followed_by_input_deltas_fails_the_turn(deltas: list[bytes]) -> None:
    body = b"".join([MESSAGE_START, tool_start(0, b'{"order_id":"A1"}'), *deltas, block_stop(0)])
    out = anthropic(body + message_end())
    assert out.kind is OutcomeKind.FAILED and out.calls == ()
    assert "its input came whole in content_block_start" in out.stop_reason


@pytest.mark.parametrize(
    "placeholder",
    # (Raw CR or LF would end the SSE data line: inside an event, JSON space is " " or tab.)
    [b"{}", b"{ }", b"{ \t }", b"null"],
    ids=["empty", "space", "tab", "null"],
)
def test_placeholder_input_with_deltas_is_unchanged(placeholder: bytes) -> None:
    body = (
        MESSAGE_START
        + tool_start(0, placeholder)
        + input_delta(0, "")
        + input_delta(0, '{"order_id"')
        + input_delta(0, ':"A1"}')
        + block_stop(0)
        + message_end()
    )
    [call] = anthropic(body).calls
    assert (call.arguments, call.raw_arguments, call.error) == (
        {"order_id": "A1"},
        b'{"order_id":"A1"}',
        None,
    )
    # Without deltas the placeholder is a call without arguments.
    [call] = anthropic(
        MESSAGE_START + tool_start(0, placeholder) + block_stop(0) + message_end()
    ).calls
    assert (call.arguments, call.error) == ({}, None)


def test_server_tool_use_start_input_is_kept() -> None:
    wire = b'{"query":"weather in Z\\u00fcrich"}'
    for deltas in (b"", input_delta(0, "")):
        body = (
            MESSAGE_START
            + tool_start(0, wire, btype="server_tool_use")
            + deltas
            + block_stop(0)
            + message_end("pause_turn")
        )
        out = anthropic(body)
        assert out.kind is OutcomeKind.PAUSED
        [item] = out.continuation
        assert (item.kind, item.index) == ("server_tool_use", 0)
        assert item.item["input"] == {"query": "weather in Zürich"}
    # Input in the start and in deltas: two sources, the turn fails.
    body = (
        MESSAGE_START
        + tool_start(0, wire, btype="server_tool_use")
        + input_delta(0, '{"query":"x"}')
        + block_stop(0)
        + message_end("pause_turn")
    )
    out = anthropic(body)
    assert out.kind is OutcomeKind.FAILED
    assert "its input came whole in content_block_start" in out.stop_reason
    # The recorded form (placeholder, then deltas) is unchanged.
    body = (
        MESSAGE_START
        + tool_start(0, b"{}", btype="server_tool_use")
        + input_delta(0, "")
        + input_delta(0, '{"query":"x"}')
        + block_stop(0)
        + message_end("pause_turn")
    )
    [item] = anthropic(body).continuation
    assert item.item["input"] == {"query": "x"}


# --- F3: Anthropic signature_delta replaces ------------------------------------------------


def thinking(signature: str, *deltas: dict[str, Any]) -> bytes:
    return b"".join(
        [
            MESSAGE_START,
            block_start(0, {"type": "thinking", "thinking": "", "signature": signature}),
            block_delta(0, {"type": "thinking_delta", "thinking": "Let me think."}),
            *(block_delta(0, d) for d in deltas),
            block_stop(0),
            message_end("end_turn"),
        ]
    )


def sig(value: str) -> dict[str, Any]:
    return {"type": "signature_delta", "signature": value}


@pytest.mark.parametrize(
    ("start", "deltas", "expected"),
    [
        pytest.param("", ["SIG_A"], "SIG_A", id="one-delta"),
        pytest.param("", ["SIG_A", "SIG_B"], "SIG_B", id="the-last-wins"),
        pytest.param("SIG_FULL", ["SIG_FULL"], "SIG_FULL", id="repeated-in-the-delta"),
        pytest.param("SIG_START", ["SIG_DELTA"], "SIG_DELTA", id="replaces-the-start"),
        pytest.param("SIG_START", [], "SIG_START", id="start-alone"),
    ],
)
def test_signature_delta_replaces_the_signature(
    start: str, deltas: list[str], expected: str
) -> None:
    out = anthropic(thinking(start, *(sig(d) for d in deltas)))
    assert out.kind is OutcomeKind.FINAL_TEXT
    [item] = out.continuation
    assert item.item == {"type": "thinking", "thinking": "Let me think.", "signature": expected}
    [message] = load_adapter("anthropic").assistant_echo(out)
    assert message["content"][0]["signature"] == expected


def test_a_replaced_signature_no_longer_counts_against_the_cap() -> None:
    cap = 100
    first, second = "A" * 60, "B" * 60
    # Text (13 bytes) and the last signature fit; the replaced one is not held.
    out = anthropic(thinking("", sig(first), sig(second)), Limits(max_call_argument_bytes=cap))
    assert out.continuation[0].item["signature"] == second
    # One signature over the cap still fails.
    out = anthropic(thinking("", sig("C" * cap)), Limits(max_call_argument_bytes=cap))
    assert out.kind is OutcomeKind.FAILED and "max_call_argument_bytes" in out.stop_reason


# --- F6: tool-use prompt tokens --------------------------------------------------------------


def gframe(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\r\n\r\n"


def gchunk(*parts: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}, "index": 0}
    if finish is not None:
        cand["finishReason"] = finish
    return {"candidates": [cand], "modelVersion": "gemini-3-pro", "responseId": "r1", **extra}


def usage_meta(**counts: int) -> dict[str, Any]:
    return {"usageMetadata": counts}


def test_gemini_tool_use_prompt_tokens_are_input_tokens() -> None:
    body = gframe(
        gchunk(
            {"text": "x"},
            finish="STOP",
            **usage_meta(
                promptTokenCount=10,
                candidatesTokenCount=2,
                thoughtsTokenCount=3,
                cachedContentTokenCount=4,
                toolUsePromptTokenCount=500,
                totalTokenCount=515,
            ),
        )
    )
    out = outcome("gemini", body)
    assert out.usage == Usage(
        input_tokens=510, output_tokens=5, reasoning_tokens=3, cached_input_tokens=4
    )


def test_gemini_a_change_of_the_tool_use_count_alone_is_reported() -> None:
    # The second chunk repeats every count but the tool-use one: it is a change.
    first = usage_meta(promptTokenCount=10, candidatesTokenCount=1)
    second = usage_meta(promptTokenCount=10, candidatesTokenCount=1, toolUsePromptTokenCount=7)
    body = gframe(gchunk({"text": "a"}, **first)) + gframe(
        gchunk({"text": "b"}, finish="STOP", **second)
    )
    out = outcome("gemini", body)
    assert out.text == "ab"
    assert out.usage == Usage(input_tokens=17, output_tokens=1)


@pytest.mark.parametrize(
    ("first", "continued", "input_tokens"),
    [
        pytest.param(
            {"promptTokenCount": 10},
            {"promptTokenCount": 10, "toolUsePromptTokenCount": 7},
            17,
            id="with-the-prompt-count",
        ),
        pytest.param(None, {"toolUsePromptTokenCount": 7}, 7, id="the-only-count"),
    ],
)
def test_gemini_vertex_continuation_with_a_new_tool_use_count_is_not_skipped(
    first: dict[str, int] | None, continued: dict[str, int], input_tokens: int
) -> None:
    # A Vertex continuation chunk normally takes a fast path that skips unchanged usage:
    # a new tool-use count is a change, read as such.
    def fc(**fields: Any) -> dict[str, Any]:
        return {"functionCall": fields}

    piece = {"jsonPath": "$.city", "stringValue": "Berlin"}
    body = b"".join(
        gframe(c)
        for c in [
            gchunk(fc(name="f", willContinue=True), **(usage_meta(**first) if first else {})),
            gchunk(fc(partialArgs=[piece], willContinue=True), **usage_meta(**continued)),
            gchunk(fc()),
            gchunk({"text": ""}, finish="STOP"),
        ]
    )
    out = outcome("gemini", body)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    [call] = out.calls
    assert call.arguments == {"city": "Berlin"}
    assert out.usage.input_tokens == input_tokens


def test_interactions_tool_use_tokens_are_input_tokens() -> None:
    usage = {
        "total_input_tokens": 10,
        "total_output_tokens": 2,
        "total_thought_tokens": 3,
        "total_cached_tokens": 4,
        "total_tool_use_tokens": 500,
        "total_tokens": 515,
    }
    out = interactions(
        CREATED
        + output_step(0, [{"type": "text", "text": "x"}])
        + istop(0)
        + completed(usage=usage)
    )
    assert out.usage == Usage(
        input_tokens=510, output_tokens=5, reasoning_tokens=3, cached_input_tokens=4
    )
    # Without the count, input_tokens is total_input_tokens as before.
    del usage["total_tool_use_tokens"]
    out = interactions(CREATED + completed(usage=usage))
    assert out.usage.input_tokens == 10
