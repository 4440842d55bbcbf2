"""The OpenAI Chat Completions adapter on synthetic streams: what the protocol allows
decodes to the right engine events, and protocol violations raise."""

from __future__ import annotations

import json

import pytest

from callgate.adapters.openai_chat import ADAPTER
from callgate.engine.core.decode import decode
from callgate.engine.core.errors import LimitExceeded, StreamProtocolError
from callgate.engine.core.events import (
    ArgumentsDelta,
    CallDone,
    CallStarted,
    Completion,
    EngineEvent,
    ProviderDetail,
    ProviderError,
    ResponseMeta,
    TextDelta,
    UsageReport,
)
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits
from callgate.engine.core.outcome import OutcomeKind, Usage
from callgate.engine.core.sse import SSEEvent

from .openai_chat_helpers import chunk, joined_arguments, of


def run_data(*payloads: object) -> list[EngineEvent]:
    """Feed JSON payloads (or raw bytes) as ``data:`` events, then end the stream."""
    stream = ADAPTER.new_stream(DEFAULT_LIMITS)
    out: list[EngineEvent] = []
    for payload in payloads:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        out.extend(stream.decode(SSEEvent(data=data)))
    out.extend(stream.end())
    return out


def tool(index: int | None, **fields: object) -> dict[str, object]:
    fragment: dict[str, object] = dict(fields)
    if index is not None:
        fragment["index"] = index
    return {"tool_calls": [fragment]}


# --- synthetic streams: what the protocol allows -------------------------------------------


def test_arguments_missing_null_or_empty_are_skipped() -> None:
    events = run_data(
        chunk(tool(0, id="c1", function={"name": "f"})),
        chunk(tool(0, function={"arguments": None})),
        chunk(tool(0, function={"arguments": ""})),
        chunk(tool(0, function={})),
        chunk(tool(0)),
        chunk(tool(0, function={"arguments": "{}"})),
        chunk(finish="tool_calls"),
        b"[DONE]",
    )
    assert of(events, ArgumentsDelta) == [ArgumentsDelta(0, "{}")]
    assert events[-1] == Completion(OutcomeKind.TOOL_PROPOSALS, "tool_calls")


def test_whole_arguments_in_the_first_fragment() -> None:
    events = run_data(
        chunk(tool(0, id="c1", type="function", function={"name": "f", "arguments": '{"a":1}'})),
        chunk(finish="tool_calls"),
        b"[DONE]",
    )
    assert of(events, CallStarted) == [CallStarted(0, "f", "c1")]
    assert of(events, ArgumentsDelta) == [ArgumentsDelta(0, '{"a":1}')]


def test_repeated_id_and_name_are_accepted() -> None:
    events = run_data(
        chunk(tool(0, id="c1", function={"name": "f", "arguments": '{"a"'})),
        chunk(tool(0, id="c1", function={"name": "f", "arguments": ":1}"})),
        chunk(finish="tool_calls"),
        b"[DONE]",
    )
    assert len(of(events, CallStarted)) == 1
    assert joined_arguments(events) == {0: '{"a":1}'}


def test_call_without_id_has_none_call_id() -> None:
    events = run_data(chunk(tool(0, function={"name": "f"})), chunk(finish="tool_calls"))
    assert of(events, CallStarted) == [CallStarted(0, "f", None)]


def test_fragments_without_index_are_keyed_by_id() -> None:
    events = run_data(
        chunk(tool(None, id="a", function={"name": "f", "arguments": "{}"})),
        chunk(tool(None, id="b", function={"name": "g", "arguments": "{"})),
        chunk(tool(None, id="b", function={"arguments": "}"})),
        chunk(finish="tool_calls"),
    )
    assert of(events, CallStarted) == [CallStarted(0, "f", "a"), CallStarted(1, "g", "b")]
    assert joined_arguments(events) == {0: "{}", 1: "{}"}


def test_finish_closes_calls_after_processing_its_own_delta() -> None:
    events = run_data(
        chunk(tool(0, id="c", function={"name": "f", "arguments": "{}"}), finish="tool_calls"),
        b"[DONE]",
    )
    assert [type(ev) for ev in events] == [
        ResponseMeta,
        CallStarted,
        ArgumentsDelta,
        CallDone,
        Completion,
    ]


def test_text_and_empty_content_skipped() -> None:
    events = run_data(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hi"}),
        chunk({"content": None, "refusal": None}),
        chunk(finish="stop"),
        b"[DONE]",
    )
    assert of(events, TextDelta) == [TextDelta("Hi")]
    assert events[-1] == Completion(OutcomeKind.FINAL_TEXT, "stop")


def test_meta_is_emitted_once() -> None:
    events = run_data(chunk({"content": "a"}), chunk({"content": "b"}))
    assert of(events, ResponseMeta) == [ResponseMeta("chatcmpl-x", "m")]


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("content_filter", OutcomeKind.REFUSAL),
        ("function_call", OutcomeKind.TOOL_PROPOSALS),
        ("something_new", OutcomeKind.FAILED),
    ],
)
def test_finish_reasons_map_through_the_table(reason: str, kind: OutcomeKind) -> None:
    events = run_data(chunk(finish=reason), b"[DONE]")
    assert events[-1] == Completion(kind, reason)


def test_done_without_finish_emits_no_completion() -> None:
    events = run_data(chunk({"content": "partial"}), b"[DONE]")
    assert not of(events, Completion)


def test_finish_without_done_is_not_a_completion() -> None:
    events = run_data(chunk({"content": "x"}, finish="stop"))
    assert not of(events, Completion)


def test_stream_cut_before_finish_emits_no_completion() -> None:
    events = run_data(chunk(tool(0, id="c", function={"name": "f", "arguments": "{"})))
    assert not of(events, Completion)
    assert not of(events, CallDone)


def test_chunks_after_finish_are_still_read() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2}
    events = run_data(
        chunk({"content": "x"}, finish="stop"),
        chunk({"content": ""}),
        {"id": "chatcmpl-x", "choices": [], "usage": usage},
        b"[DONE]",
    )
    assert of(events, UsageReport) == [UsageReport(Usage(input_tokens=3, output_tokens=2))]
    assert events[-1] == Completion(OutcomeKind.FINAL_TEXT, "stop")


def test_other_choices_are_ignored_with_one_detail() -> None:
    other = {"index": 1, "delta": {"content": "other"}, "finish_reason": None}
    events = run_data(
        {"id": "x", "choices": [{"index": 0, "delta": {"content": "mine"}}, other]},
        {"id": "x", "choices": [other]},
        chunk(finish="stop"),
        b"[DONE]",
    )
    assert of(events, TextDelta) == [TextDelta("mine")]
    details = of(events, ProviderDetail)
    assert len(details) == 1 and details[0].kind == "ignored_choices"


def test_error_object_becomes_provider_error() -> None:
    error = {"message": "The server had an error", "type": "server_error", "code": None}
    events = run_data({"error": error})
    assert [type(ev) for ev in events] == [ProviderError]  # no meta: the object has no id
    info = events[0].error
    assert (info.code, info.message, info.retryable) == (
        "server_error",
        "The server had an error",
        True,
    )


@pytest.mark.parametrize(
    ("error", "code", "status", "retryable"),
    [
        (
            {"type": "insufficient_quota", "code": "insufficient_quota", "message": "m"},
            "insufficient_quota",
            None,
            False,
        ),
        (
            {"type": "invalid_request_error", "code": "invalid_prompt", "message": "m"},
            "invalid_prompt",
            None,
            False,
        ),
        (
            {"type": "requests", "code": "rate_limit_exceeded", "message": "m"},
            "rate_limit_exceeded",
            None,
            True,
        ),
        ({"code": 502, "message": "upstream"}, "502", 502, True),
        ({"code": 400, "message": "bad"}, "400", 400, False),
        ("plain text error", None, None, False),
    ],
)
def test_error_retryability(
    error: object, code: str | None, status: int | None, retryable: bool
) -> None:
    [ev] = of(run_data({"error": error}), ProviderError)
    assert (ev.error.code, ev.error.status, ev.error.retryable) == (code, status, retryable)


# --- protocol violations -------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"{not json",
        b'"a string"',
        b'{"choices": "nope"}',
        b'{"choices": [{"index": "0"}]}',
        b'{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "1"}]}}]}',
        b'{"choices": [{"index": 0, "delta": {"content": 5}}]}',
        b'{"usage": {"prompt_tokens": "many"}}',
    ],
)
def test_undecodable_or_mistyped_chunks_raise(data: bytes) -> None:
    stream = ADAPTER.new_stream(DEFAULT_LIMITS)
    with pytest.raises(StreamProtocolError):
        stream.decode(SSEEvent(data=data))


def test_first_fragment_without_name_raises() -> None:
    with pytest.raises(StreamProtocolError, match="no name"):
        run_data(chunk(tool(0, id="c", function={"arguments": "{}"})))


def test_fragment_without_index_or_id_raises() -> None:
    with pytest.raises(StreamProtocolError, match="neither index nor id"):
        run_data(chunk(tool(None, function={"name": "f"})))


def test_changed_id_raises() -> None:
    with pytest.raises(StreamProtocolError, match="changed its id"):
        run_data(
            chunk(tool(0, id="c1", function={"name": "f"})),
            chunk(tool(0, id="c2", function={"arguments": "{}"})),
        )


def test_changed_name_raises() -> None:
    with pytest.raises(StreamProtocolError, match="changed its name"):
        run_data(
            chunk(tool(0, id="c1", function={"name": "f"})),
            chunk(tool(0, function={"name": "g"})),
        )


def test_data_after_done_raises() -> None:
    with pytest.raises(StreamProtocolError, match="after the"):
        run_data(chunk(finish="stop"), b"[DONE]", chunk({"content": "late"}))


def test_too_many_calls_hit_the_limit() -> None:
    limits = Limits(max_calls_per_response=2)
    stream = ADAPTER.new_stream(limits)
    for i in range(2):
        stream.decode(SSEEvent(data=json.dumps(chunk(tool(i, function={"name": "f"}))).encode()))
    with pytest.raises(LimitExceeded):
        stream.decode(SSEEvent(data=json.dumps(chunk(tool(2, function={"name": "f"}))).encode()))


def test_pipeline_turns_a_violation_into_failed() -> None:
    body = b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}\n\n'
    outcome = decode("openai_chat", [body])
    assert outcome.kind is OutcomeKind.FAILED
    assert "no name" in outcome.stop_reason
