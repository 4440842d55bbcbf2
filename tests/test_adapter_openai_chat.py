"""The OpenAI Chat Completions adapter: every recorded stream decodes to the right engine
events (in all three feeding modes), protocol violations raise, and the encode side
produces the shapes PROVIDERS.md §1 gives for the follow-up request."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import msgspec
import pytest

from callgate.adapters.openai_chat import ADAPTER, FINISH_REASONS
from callgate.engine.core.adapter import (
    Adapter,
    HttpRequestSpec,
    ModelResult,
    ToolDeclaration,
    load_adapter,
)
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
    RefusalDelta,
    ResponseMeta,
    TextDelta,
    UsageReport,
)
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits
from callgate.engine.core.outcome import OutcomeKind, ProposedCall, TurnOutcome, Usage
from callgate.engine.core.sse import SSEDecoder, SSEEvent

from .conftest import FIXTURES, chunkings

FAMILY = FIXTURES / "openai_chat"


def run(chunks: Iterable[bytes], limits: Limits = DEFAULT_LIMITS) -> list[EngineEvent]:
    """SSE-decode ``chunks`` and feed every event through one adapter stream."""
    sse = SSEDecoder(limits)
    stream = ADAPTER.new_stream(limits)
    out: list[EngineEvent] = []
    for chunk in chunks:
        for event in sse.feed(chunk):
            out.extend(stream.decode(event))
    for event in sse.close():
        out.extend(stream.decode(event))
    out.extend(stream.end())
    return out


def run_data(*payloads: object) -> list[EngineEvent]:
    """Feed JSON payloads (or raw bytes) as ``data:`` events, then end the stream."""
    stream = ADAPTER.new_stream(DEFAULT_LIMITS)
    out: list[EngineEvent] = []
    for payload in payloads:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        out.extend(stream.decode(SSEEvent(data=data)))
    out.extend(stream.end())
    return out


def chunk(delta: dict[str, object] | None = None, finish: str | None = None, **extra: object):
    body: dict[str, object] = {
        "id": "chatcmpl-x",
        "model": "m",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }
    body.update(extra)
    return body


def tool(index: int | None, **fields: object) -> dict[str, object]:
    fragment: dict[str, object] = dict(fields)
    if index is not None:
        fragment["index"] = index
    return {"tool_calls": [fragment]}


def check_call_order(events: list[EngineEvent]) -> None:
    """Every fragment and done refers to a started call; nothing follows a call's done."""
    started: set[int] = set()
    done: set[int] = set()
    for ev in events:
        if isinstance(ev, CallStarted):
            assert ev.index not in started
            started.add(ev.index)
        elif isinstance(ev, ArgumentsDelta):
            assert ev.index in started and ev.index not in done
        elif isinstance(ev, CallDone):
            assert ev.index in started
            done.add(ev.index)
    assert started == done


def joined_arguments(events: list[EngineEvent]) -> dict[int, str]:
    out: dict[int, str] = {}
    for ev in events:
        if isinstance(ev, ArgumentsDelta):
            out[ev.index] = out.get(ev.index, "") + ev.fragment
    return out


def of(events: list[EngineEvent], kind: type) -> list:
    return [ev for ev in events if isinstance(ev, kind)]


# --- the adapter seam ----------------------------------------------------------------------


def test_adapter_is_registered_and_satisfies_the_protocol() -> None:
    assert load_adapter("openai_chat") is ADAPTER
    assert isinstance(ADAPTER, Adapter)
    assert (ADAPTER.name, ADAPTER.family, ADAPTER.revision) == (
        "openai_chat",
        "openai_chat",
        "openai_chat/1",
    )
    assert ADAPTER.sse_unframed is False
    assert ADAPTER.finish_reasons is FINISH_REASONS


def test_finish_reason_table() -> None:
    assert FINISH_REASONS == {
        "stop": OutcomeKind.FINAL_TEXT,
        "tool_calls": OutcomeKind.TOOL_PROPOSALS,
        "function_call": OutcomeKind.TOOL_PROPOSALS,
        "length": OutcomeKind.TRUNCATED,
        "content_filter": OutcomeKind.REFUSAL,
    }


# --- recorded streams ----------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(FAMILY.glob("*.sse")), ids=lambda p: p.name)
def test_every_feeding_mode_gives_the_same_events(path: Path) -> None:
    body = path.read_bytes()
    results = [run(chunks) for _, chunks in chunkings(body)]
    assert results[0] == results[1] == results[2]
    check_call_order(results[0])
    if path.name == "compat_anthropic_text_then_tool_index1.sse":
        # Recorded without the blank line after "data: [DONE]": the terminator is never
        # dispatched, so the turn has no Completion (it is truncated, like a cut stream).
        assert not of(results[0], Completion)
        return
    # The turn ends with exactly one Completion, and it is the last event.
    assert len(of(results[0], Completion)) == 1
    assert isinstance(results[0][-1], Completion)


def test_single_tool_call() -> None:
    events = run([(FAMILY / "single_tool_call_get_weather.sse").read_bytes()])
    assert events[0] == ResponseMeta("chatcmpl-ABfwERreu9s99xXsVuOWtIB2UOx62", "gpt-4o-2024-08-06")
    assert events[1] == CallStarted(0, "get_weather", "call_4XzlGBLtUe9dy3GVNV4jhq7h")
    assert joined_arguments(events) == {0: '{"city":"New York City"}'}
    assert len(of(events, ArgumentsDelta)) == 7
    # CallDone comes from the finish chunk, after every fragment and before the usage.
    done_at = events.index(CallDone(0))
    assert all(not isinstance(ev, ArgumentsDelta) for ev in events[done_at:])
    assert events[done_at + 1 :] == [
        UsageReport(Usage(input_tokens=44, output_tokens=16, reasoning_tokens=0)),
        Completion(OutcomeKind.TOOL_PROPOSALS, "tool_calls"),
    ]
    assert not of(events, TextDelta) and not of(events, RefusalDelta)


def test_parallel_calls_are_keyed_by_tool_call_index() -> None:
    events = run([(FAMILY / "parallel_tool_calls_two_functions.sse").read_bytes()])
    assert of(events, CallStarted) == [
        CallStarted(0, "GetWeatherArgs", "call_JMW1whyEaYG438VE1OIflxA2"),
        CallStarted(1, "get_stock_price", "call_DNYTawLBoN8fj3KN6qU9N1Ou"),
    ]
    args = joined_arguments(events)
    assert json.loads(args[0]) == {"city": "Edinburgh", "country": "GB", "units": "c"}
    assert json.loads(args[1]) == {"ticker": "AAPL", "exchange": "NASDAQ"}
    assert of(events, CallDone) == [CallDone(0), CallDone(1)]


def test_no_argument_calls_send_one_empty_object_fragment() -> None:
    events = run([(FAMILY / "parallel_tool_calls_no_args.sse").read_bytes()])
    assert [ev.name for ev in of(events, CallStarted)] == ["get_country", "get_product_name"]
    assert joined_arguments(events) == {0: "{}", 1: "{}"}
    assert of(events, UsageReport) == [
        UsageReport(
            Usage(input_tokens=364, output_tokens=40, reasoning_tokens=0, cached_input_tokens=0)
        )
    ]


def test_refusal_streams_refusal_deltas_and_finishes_stop() -> None:
    events = run([(FAMILY / "refusal_deltas_finish_stop.sse").read_bytes()])
    refusal = "".join(ev.text for ev in of(events, RefusalDelta))
    assert refusal == "I'm sorry, I can't assist with that request."
    assert "" not in [ev.text for ev in of(events, RefusalDelta)]  # the empty first is skipped
    assert not of(events, TextDelta)
    assert events[-1] == Completion(OutcomeKind.FINAL_TEXT, "stop")


def test_length_finish_is_truncation() -> None:
    events = run([(FAMILY / "truncated_finish_length.sse").read_bytes()])
    assert of(events, TextDelta) == [TextDelta('{"')]
    assert events[-1] == Completion(OutcomeKind.TRUNCATED, "length")


def test_compat_anthropic_call_at_index_one_after_text() -> None:
    events = run([(FAMILY / "compat_anthropic_text_then_tool_index1.sse").read_bytes()])
    assert "".join(ev.text for ev in of(events, TextDelta)) == "Reading it."
    assert of(events, CallStarted) == [CallStarted(1, "read_file", "toolu_sanitized")]
    assert joined_arguments(events) == {1: '{"path": "a.txt"}'}
    assert of(events, CallDone) == [CallDone(1)]
    # This recording has no blank line after "data: [DONE]", so the SSE parser drops it:
    # without the terminator the turn is not complete (no Completion is emitted).
    assert not of(events, Completion)


def test_compat_openrouter_name_without_arguments_key() -> None:
    events = run([(FAMILY / "compat_openrouter_kimi_split_name_args.sse").read_bytes()])
    # The first frame starts with a space, so the SSE parser ignores it: the meta comes
    # from the next chunk.
    assert events[0] == ResponseMeta("gen-1753248108-FGOxpkEzFEwhNKSPpI4a", "moonshotai/kimi-k2")
    assert of(events, CallStarted) == [CallStarted(0, "llm_version", "llm_version:0")]
    assert joined_arguments(events) == {0: "{}"}
    assert of(events, UsageReport)[0].usage == Usage(
        input_tokens=56, output_tokens=12, reasoning_tokens=0, cached_input_tokens=0
    )
    assert events[-1] == Completion(OutcomeKind.TOOL_PROPOSALS, "tool_calls")


@pytest.mark.parametrize(
    ("name", "kind", "calls"),
    [
        ("single_tool_call_get_weather.sse", OutcomeKind.TOOL_PROPOSALS, ["get_weather"]),
        ("single_tool_call_strict.sse", OutcomeKind.TOOL_PROPOSALS, ["get_weather"]),
        (
            "parallel_tool_calls_two_functions.sse",
            OutcomeKind.TOOL_PROPOSALS,
            ["GetWeatherArgs", "get_stock_price"],
        ),
        (
            "parallel_tool_calls_no_args.sse",
            OutcomeKind.TOOL_PROPOSALS,
            ["get_country", "get_product_name"],
        ),
        ("refusal_deltas_finish_stop.sse", OutcomeKind.REFUSAL, []),
        ("truncated_finish_length.sse", OutcomeKind.TRUNCATED, []),
        ("compat_anthropic_text_then_tool_index1.sse", OutcomeKind.TRUNCATED, ["read_file"]),
        ("compat_openrouter_kimi_split_name_args.sse", OutcomeKind.TOOL_PROPOSALS, ["llm_version"]),
    ],
)
def test_outcome_through_the_pipeline(name: str, kind: OutcomeKind, calls: list[str]) -> None:
    body = (FAMILY / name).read_bytes()
    for _, chunks in chunkings(body):
        outcome = decode("openai_chat", chunks)
        assert outcome.kind is kind, outcome.stop_reason
        assert [call.name for call in outcome.calls] == calls
        assert all(call.arguments is not None for call in outcome.calls)


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


# --- encode side ---------------------------------------------------------------------------

ARGS = '{"location":"San Francisco, CA"}'


def tool_outcome(text: str = "", raw: bytes = ARGS.encode()) -> TurnOutcome:
    call = ProposedCall(
        index=0,
        call_id="call_1",
        name="get_weather",
        arguments=json.loads(raw) if raw else {},
        raw_arguments=raw,
    )
    return TurnOutcome(
        kind=OutcomeKind.TOOL_PROPOSALS,
        raw_reason="tool_calls",
        stop_reason="",
        text=text,
        calls=(call,),
    )


def test_initial_messages() -> None:
    assert ADAPTER.initial_messages("hi") == [{"role": "user", "content": "hi"}]


def test_assistant_echo_matches_the_followup_shape() -> None:
    assert ADAPTER.assistant_echo(tool_outcome()) == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ARGS},
                }
            ],
        }
    ]


def test_assistant_echo_keeps_text_and_orders_calls_by_index() -> None:
    calls = tuple(
        ProposedCall(index=i, call_id=f"c{i}", name=f"t{i}", arguments={}, raw_arguments=b"{}")
        for i in (2, 0)
    )
    outcome = msgspec.structs.replace(tool_outcome(text="Sure."), calls=calls)
    [message] = ADAPTER.assistant_echo(outcome)
    assert message["content"] == "Sure."
    assert [tc["id"] for tc in message["tool_calls"]] == ["c0", "c2"]  # type: ignore[attr-defined]


def test_assistant_echo_without_calls_omits_tool_calls() -> None:
    outcome = TurnOutcome(kind=OutcomeKind.FINAL_TEXT, raw_reason="stop", stop_reason="", text="ok")
    assert ADAPTER.assistant_echo(outcome) == [{"role": "assistant", "content": "ok"}]


def test_assistant_echo_of_a_call_with_no_argument_text_sends_an_empty_object() -> None:
    [message] = ADAPTER.assistant_echo(tool_outcome(raw=b""))
    assert message["tool_calls"][0]["function"]["arguments"] == "{}"  # type: ignore[index]


def test_encode_results_one_tool_message_per_result_in_order() -> None:
    results = [
        ModelResult(call_id="call_2", name="b", content='{"ok":2}'),
        ModelResult(call_id="call_1", name="a", content="boom", is_error=True),
    ]
    assert ADAPTER.encode_results(tool_outcome(), results) == [
        {"role": "tool", "tool_call_id": "call_2", "content": '{"ok":2}'},
        {"role": "tool", "tool_call_id": "call_1", "content": "boom"},
    ]


def test_build_request_full() -> None:
    messages = ADAPTER.initial_messages("weather?")
    params = {"type": "object", "properties": {"location": {"type": "string"}}}
    spec = ADAPTER.build_request(
        model="gpt-4o",
        messages=messages,
        tools=[ToolDeclaration(name="get_weather", description="Weather.", parameters=params)],
        system="Be brief.",
        max_tokens=256,
    )
    assert spec == HttpRequestSpec(
        path="/v1/chat/completions",
        body={
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "weather?"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "description": "Weather.",
                        "parameters": params,
                    },
                }
            ],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_completion_tokens": 256,
        },
    )
    assert messages == [{"role": "user", "content": "weather?"}]  # the caller's list is untouched


def test_build_request_minimal_omits_optional_fields() -> None:
    spec = ADAPTER.build_request(model="m", messages=[], tools=[])
    assert spec.body == {
        "model": "m",
        "messages": [],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_auth_headers() -> None:
    assert ADAPTER.auth_headers("sk-test") == {"Authorization": "Bearer sk-test"}


def test_echo_round_trip_from_a_decoded_turn() -> None:
    body = (FAMILY / "parallel_tool_calls_two_functions.sse").read_bytes()
    outcome = decode("openai_chat", [body])
    [message] = ADAPTER.assistant_echo(outcome)
    calls = message["tool_calls"]
    assert [c["id"] for c in calls] == [call.call_id for call in outcome.calls]  # type: ignore[attr-defined]
    for echoed, call in zip(calls, outcome.calls, strict=True):  # type: ignore[call-overload]
        assert json.loads(echoed["function"]["arguments"]) == call.arguments
