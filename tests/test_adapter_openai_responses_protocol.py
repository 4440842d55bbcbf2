"""The OpenAI Responses adapter on synthetic streams: what the protocol allows decodes to
the right engine events, and protocol violations raise."""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.adapters.openai_responses import ADAPTER
from callgate.engine.core.decode import decode
from callgate.engine.core.errors import LimitExceeded, StreamProtocolError
from callgate.engine.core.events import (
    ArgumentsDelta,
    CallDone,
    CallStarted,
    Completion,
    ContinuationItem,
    ProviderError,
    RefusalDelta,
    ResponseMeta,
    TextDelta,
)
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits
from callgate.engine.core.outcome import OutcomeKind, ProviderErrorInfo
from callgate.engine.core.sse import SSEEvent

from .openai_responses_helpers import FC, added, dones, item_done, of, send


def completed(**response: Any) -> dict[str, Any]:
    return {
        "type": "response.completed",
        "response": {"id": "resp_1", "status": "completed"} | response,
    }


# --- synthetic streams ---------------------------------------------------------------------


def test_delta_without_output_index_is_keyed_by_item_id() -> None:
    events = send(
        added(3, FC),
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": "{}"},
        {"type": "response.function_call_arguments.done", "item_id": "fc_1", "arguments": "{}"},
    )
    assert of(events, ArgumentsDelta) == [ArgumentsDelta(3, "{}")]
    assert dones(events) == [(3, "{}")]


def test_unknown_item_id_raises() -> None:
    with pytest.raises(StreamProtocolError, match="output_index or item_id"):
        send({"type": "response.function_call_arguments.delta", "item_id": "fc_x", "delta": "{"})


def test_incomplete_function_call_item_gets_no_done() -> None:
    events = send(
        added(0, FC),
        {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": '{"a'},
        item_done(0, FC | {"arguments": '{"a', "status": "incomplete"}),
        {
            "type": "response.incomplete",
            "response": {"incomplete_details": {"reason": "max_output_tokens"}},
        },
    )
    assert not of(events, CallDone)
    assert [c.kind for c in of(events, ContinuationItem)] == ["function_call"]
    assert events[-1] == Completion(OutcomeKind.TRUNCATED, "max_output_tokens")


@pytest.mark.parametrize(
    ("details", "kind", "raw"),
    [
        ({"reason": "content_filter"}, OutcomeKind.REFUSAL, "content_filter"),
        (None, OutcomeKind.TRUNCATED, "incomplete"),
        ({"reason": "something_new"}, OutcomeKind.TRUNCATED, "something_new"),
    ],
)
def test_incomplete_reasons(details: Any, kind: OutcomeKind, raw: str) -> None:
    events = send({"type": "response.incomplete", "response": {"incomplete_details": details}})
    assert events[-1] == Completion(kind, raw)


def test_text_and_refusal_deltas() -> None:
    events = send(
        {"type": "response.output_text.delta", "delta": "Hi", "obfuscation": "xx"},
        {"type": "response.output_text.delta", "delta": ""},
        {"type": "response.refusal.delta", "delta": "No."},
        completed(),
    )
    assert of(events, TextDelta) == [TextDelta("Hi")]
    assert of(events, RefusalDelta) == [RefusalDelta("No.")]
    assert events[-1] == Completion(OutcomeKind.FINAL_TEXT, "completed")


def test_flat_error_event() -> None:
    events = send({"type": "error", "code": "server_error", "message": "oops", "param": None})
    assert events == [
        ProviderError(ProviderErrorInfo(code="server_error", message="oops", retryable=True))
    ]


def test_failed_without_error_object_still_fails() -> None:
    events = send({"type": "response.failed", "response": {"id": "r", "error": None}})
    assert events == [
        ResponseMeta("r", None),
        ProviderError(ProviderErrorInfo()),
        Completion(OutcomeKind.FAILED, "failed"),
    ]


def test_meta_is_emitted_once_and_unknown_events_are_quiet() -> None:
    events = send(
        {"type": "response.created", "response": {"id": "r", "model": "m"}},
        {"type": "response.in_progress", "response": {"id": "r", "model": "m"}},
        {"type": "response.content_part.added", "part": {}},
        {"type": "response.something_new", "whatever": [1, 2]},
        {"type": "response.reasoning_summary_text.delta", "delta": "think"},
    )
    assert events == [ResponseMeta("r", "m")]


def test_events_without_an_event_name_dispatch_on_the_json_type() -> None:
    events = send(
        added(0, FC),
        {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "{}"},
        {"type": "response.unknown"},
        completed(),
        named=False,
    )
    assert [type(ev) for ev in events] == [CallStarted, ArgumentsDelta, ResponseMeta, Completion]


def test_non_function_items_start_no_call() -> None:
    events = send(added(0, {"type": "message", "id": "msg_1", "role": "assistant"}))
    assert events == []


# A status in the table that is not success, one the API uses before the end, and one
# it has never sent: none of them is read as a completed answer.
@pytest.mark.parametrize("status", ["cancelled", "in_progress", "a_status_added_later"])
def test_completed_with_unexpected_status_is_not_success(status: str) -> None:
    events = send(completed(status=status))
    assert events[-1] == Completion(OutcomeKind.FAILED, status)


# --- protocol violations -------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        {"type": "response.output_item.added", "output_index": 0},
        {"type": "response.output_item.added", "output_index": "0", "item": FC},
        {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": 5},
        {"type": "response.output_item.done", "output_index": 0, "item": {"id": "x"}},
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": FC | {"arguments": 1, "status": "completed"},
        },
        {"type": "response.output_text.delta"},
        {"type": "response.completed", "response": {"usage": {"input_tokens": "many"}}},
        {"type": "error", "code": ["not", "a", "code"]},
    ],
)
def test_mistyped_events_raise(payload: dict[str, Any]) -> None:
    with pytest.raises(StreamProtocolError):
        send(payload)


def test_invalid_json_raises() -> None:
    stream = ADAPTER.new_stream(DEFAULT_LIMITS)
    with pytest.raises(StreamProtocolError):
        stream.decode(SSEEvent(event="response.output_text.delta", data=b"{nope"))
    with pytest.raises(StreamProtocolError):
        stream.decode(SSEEvent(data=b"[1, 2]"))  # unnamed and not an object with a type


def test_invalid_utf8_in_item_id_of_a_delta_raises() -> None:
    # Fuzz finding (long adapter run): the delta's lean view skips item_id, so its
    # invalid UTF-8 surfaced only in the second decode, which escaped as a DecodeError.
    stream = ADAPTER.new_stream(DEFAULT_LIMITS)
    data = b'{"delta":"}","item_id":"\xff"}'
    event = SSEEvent(event="response.function_call_arguments.delta", data=data)
    with pytest.raises(StreamProtocolError, match="undecodable"):
        stream.decode(event)


def test_function_call_without_name_raises() -> None:
    with pytest.raises(StreamProtocolError, match="no name"):
        send(added(0, FC | {"name": ""}))


def test_second_terminal_event_raises() -> None:
    with pytest.raises(StreamProtocolError, match="second terminal"):
        send(completed(), completed())


def test_too_many_calls_hit_the_limit() -> None:
    stream = ADAPTER.new_stream(Limits(max_calls_per_response=1))
    stream.decode(
        SSEEvent(event="response.output_item.added", data=json.dumps(added(0, FC)).encode())
    )
    second = json.dumps(added(1, FC | {"id": "fc_2"})).encode()
    with pytest.raises(LimitExceeded):
        stream.decode(SSEEvent(event="response.output_item.added", data=second))


def test_pipeline_turns_a_violation_into_failed() -> None:
    body = b'event: response.output_item.added\ndata: {"output_index":"x","item":{}}\n\n'
    assert decode("openai_responses", [body]).kind is OutcomeKind.FAILED
