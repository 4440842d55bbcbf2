"""The Gemini Interactions adapter: both recorded event formats (steps and legacy content)
decode to the right engine events in all three feeding modes, protocol violations raise,
buffers are capped, and the encode side builds stateful continuation requests
(``previous_interaction_id`` + only the new ``function_result`` items) from the run loop's
plain "initial + echo + results + …" message list."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from callgate.adapters.gemini_interactions import ADAPTER, FINISH_REASONS, TURN_MARKER
from callgate.engine.core.adapter import (
    JSON,
    Adapter,
    HttpRequestSpec,
    ModelResult,
    ToolDeclaration,
    load_adapter,
)
from callgate.engine.core.decode import decode
from callgate.engine.core.errors import ConfigError, LimitExceeded, StreamProtocolError
from callgate.engine.core.events import (
    ArgumentsDelta,
    CallDone,
    CallStarted,
    Completion,
    ContinuationItem,
    EngineEvent,
    ProviderDetail,
    ProviderError,
    ResponseMeta,
    TextDelta,
    UsageReport,
)
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits
from callgate.engine.core.outcome import OutcomeKind, ProviderErrorInfo, Usage
from callgate.engine.core.sse import SSEDecoder, SSEEvent

from .conftest import FIXTURES, chunkings

FAMILY = FIXTURES / "gemini_interactions"
STEPS_CALL = "steps_api_function_call_requires_action.converted.sse"
LEGACY_CALL = "legacy_content_api_function_call_requires_action.converted.sse"


def run(chunks: Iterable[bytes], limits: Limits = DEFAULT_LIMITS) -> list[EngineEvent]:
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


def read(name: str) -> bytes:
    return (FAMILY / name).read_bytes()


def recorded(name: str, event_type: str) -> list[dict[str, Any]]:
    """The recorded payloads of one event type, read independently of the adapter."""
    out = []
    for line in read(name).decode().splitlines():
        if line.startswith("data: "):
            payload = json.loads(line[len("data: ") :])
            if payload.get("event_type") == event_type:
                out.append(payload)
    return out


def ev(event_type: str, **fields: Any) -> SSEEvent:
    return SSEEvent(
        event=event_type, data=json.dumps({"event_type": event_type, **fields}).encode()
    )


CREATED = ev(
    "interaction.created", interaction={"id": "v1_x", "status": "in_progress", "model": "g"}
)


def completed(status: str | None = "completed", **extra: Any) -> SSEEvent:
    interaction: dict[str, Any] = {"id": "v1_x", **extra}
    if status is not None:
        interaction["status"] = status
    return ev("interaction.completed", interaction=interaction)


def start(index: int, **step: Any) -> SSEEvent:
    return ev("step.start", index=index, step=step)


def delta(index: int, **body: Any) -> SSEEvent:
    return ev("step.delta", index=index, delta=body)


def stop(index: int) -> SSEEvent:
    return ev("step.stop", index=index)


def run_events(*events: SSEEvent, limits: Limits = DEFAULT_LIMITS) -> list[EngineEvent]:
    stream = ADAPTER.new_stream(limits)
    out: list[EngineEvent] = []
    for event in events:
        out.extend(stream.decode(event))
    out.extend(stream.end())
    return out


def of(events: list[EngineEvent], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


# --- the adapter seam ----------------------------------------------------------------------


def test_adapter_is_registered_and_satisfies_the_protocol() -> None:
    assert load_adapter("gemini_interactions") is ADAPTER
    assert isinstance(ADAPTER, Adapter)
    assert (ADAPTER.name, ADAPTER.family, ADAPTER.revision) == (
        "gemini_interactions",
        "gemini_interactions",
        "gemini_interactions/1",
    )
    assert ADAPTER.sse_unframed is False
    assert ADAPTER.finish_reasons is FINISH_REASONS


def test_status_table() -> None:
    assert FINISH_REASONS == {
        "requires_action": OutcomeKind.TOOL_PROPOSALS,
        "completed": OutcomeKind.FINAL_TEXT,
        "incomplete": OutcomeKind.TRUNCATED,
        "failed": OutcomeKind.FAILED,
        "cancelled": OutcomeKind.FAILED,
    }


# --- recorded streams ----------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(FAMILY.glob("*.sse")), ids=lambda p: p.name)
def test_every_feeding_mode_gives_the_same_events(path: Path) -> None:
    body = path.read_bytes()
    results = [run(chunks) for _, chunks in chunkings(body)]
    assert results[0] == results[1] == results[2]
    assert isinstance(results[0][0], ResponseMeta)
    assert of(results[0], Completion) == [results[0][-1]]
    assert [e.index for e in of(results[0], CallStarted)] == [
        e.index for e in of(results[0], CallDone)
    ]


def test_steps_format_function_call() -> None:
    events = run([read(STEPS_CALL)])
    [thought_delta] = [
        p for p in recorded(STEPS_CALL, "step.delta") if p["delta"]["type"] == "thought_signature"
    ]
    interaction_id = recorded(STEPS_CALL, "interaction.created")[0]["interaction"]["id"]
    assert events == [
        ResponseMeta(interaction_id, "gemini-2.5-flash"),
        ContinuationItem(
            "thought", 0, {"type": "thought", "signature": thought_delta["delta"]["signature"]}
        ),
        # The step's `arguments: {}` placeholder is ignored; the delta carries the text.
        CallStarted(1, "getWeather", call_id="61nzpsv4"),
        ArgumentsDelta(1, '{"location":"San Francisco"}'),
        CallDone(1),
        UsageReport(
            Usage(input_tokens=53, output_tokens=80, reasoning_tokens=65, cached_input_tokens=0)
        ),
        Completion(OutcomeKind.TOOL_PROPOSALS, "requires_action"),
    ]


def test_legacy_format_function_call_arrives_whole() -> None:
    events = run([read(LEGACY_CALL)])
    assert of(events, CallStarted) == [CallStarted(1, "getWeather", call_id="odkxni2w")]
    assert of(events, ArgumentsDelta) == [ArgumentsDelta(1, '{"location":"San Francisco"}')]
    assert of(events, CallDone) == [CallDone(1)]
    assert [(i.kind, i.index) for i in of(events, ContinuationItem)] == [("thought", 0)]
    assert events[-1] == Completion(OutcomeKind.TOOL_PROPOSALS, "requires_action")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        (
            "steps_api_after_function_result_completed.converted.sse",
            "The weather in San Francisco right now is sunny with a temperature of 27 degrees"
            " Celsius.",
        ),
        (
            "legacy_content_api_after_function_result.converted.sse",
            "The weather in San Francisco right now is sunny with a temperature of 16 degrees"
            " Celsius.",
        ),
        (
            "steps_api_text_only.converted.sse",
            "I'm doing great, thank you for asking!\n\nHow are you doing today? And what can I"
            " do for you?",
        ),
    ],
)
def test_text_turns_complete(name: str, text: str) -> None:
    events = run([read(name)])
    assert "".join(e.text for e in of(events, TextDelta)) == text
    assert events[-1] == Completion(OutcomeKind.FINAL_TEXT, "completed")
    outcome = decode("gemini_interactions", [read(name)])
    assert outcome.kind is OutcomeKind.FINAL_TEXT and outcome.text == text


@pytest.mark.parametrize("name", [STEPS_CALL, LEGACY_CALL])
def test_call_outcomes_through_decode(name: str) -> None:
    outcome = decode("gemini_interactions", [read(name)])
    assert outcome.kind is OutcomeKind.TOOL_PROPOSALS and outcome.raw_reason == "requires_action"
    [call] = outcome.calls
    assert call.name == "getWeather" and call.arguments == {"location": "San Francisco"}
    assert not call.call_id_derived
    assert outcome.response_id is not None and outcome.response_id.startswith("v1_")


# --- synthetic streams ---------------------------------------------------------------------


def test_thought_summary_and_call_signature_are_kept() -> None:
    events = run_events(
        CREATED,
        start(0, type="thought", summary=[{"type": "text", "text": "Plan: "}]),
        delta(0, type="thought_summary", content={"type": "text", "text": "call it"}),
        delta(0, type="thought_signature", signature="TS"),
        stop(0),
        start(1, type="function_call", id="c1", name="f", arguments={}, signature=""),
        delta(1, type="arguments_delta", arguments='{"a":', signature="FS"),
        delta(1, type="arguments_delta", arguments="1}"),
        stop(1),
        completed("requires_action"),
    )
    assert of(events, ContinuationItem) == [
        ContinuationItem(
            "thought",
            0,
            {
                "type": "thought",
                "signature": "TS",
                "summary": [{"type": "text", "text": "Plan: call it"}],
            },
        ),
        ContinuationItem("function_call_signature", 1, {"signature": "FS"}),
    ]
    assert [e.fragment for e in of(events, ArgumentsDelta)] == ['{"a":', "1}"]


def test_status_update_is_used_when_completion_has_no_status() -> None:
    events = run_events(
        CREATED,
        ev("interaction.status_update", interaction_id="v1_x", status="incomplete"),
        completed(None),
    )
    assert events[-1] == Completion(OutcomeKind.TRUNCATED, "incomplete")


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        ("failed", OutcomeKind.FAILED),
        ("cancelled", OutcomeKind.FAILED),
        ("brand_new", OutcomeKind.FAILED),
    ],
)
def test_failure_statuses(status: str, kind: OutcomeKind) -> None:
    assert run_events(CREATED, completed(status))[-1] == Completion(kind, status)


def test_unstored_interaction_has_no_id() -> None:
    events = run_events(ev("interaction.created", interaction={"id": "", "model": "g"}))
    assert events == [ResponseMeta(None, "g")]


def test_error_event() -> None:
    events = run_events(
        CREATED, ev("error", error={"code": 503, "message": "overloaded", "status": "UNAVAILABLE"})
    )
    assert events[-1] == ProviderError(
        ProviderErrorInfo(code="UNAVAILABLE", message="overloaded", status=503, retryable=True)
    )
    [event] = run_events(ev("error", error={"code": "INVALID_ARGUMENT", "message": "bad"}))
    assert event == ProviderError(ProviderErrorInfo(code="INVALID_ARGUMENT", message="bad"))


def test_builtin_steps_become_provider_details_and_unknown_events_are_ignored() -> None:
    events = run_events(
        CREATED,
        start(0, type="google_search_call", id="g1", arguments={"queries": ["x"]}),
        delta(0, type="google_search_call", arguments={"queries": ["x"]}),
        stop(0),
        ev("interaction.brand_new_event", foo=1),
        completed(),
    )
    assert (
        ProviderDetail(
            "interactions_step",
            {"type": "google_search_call", "id": "g1", "arguments": {"queries": ["x"]}},
        )
        in events
    )
    assert events[-1] == Completion(OutcomeKind.FINAL_TEXT, "completed")


def test_event_type_falls_back_to_the_sse_event_name() -> None:
    stream = ADAPTER.new_stream(DEFAULT_LIMITS)
    data = json.dumps({"interaction": {"id": "v1_y", "model": "g"}}).encode()
    assert stream.decode(SSEEvent(event="interaction.created", data=data)) == [
        ResponseMeta("v1_y", "g")
    ]


@pytest.mark.parametrize(
    "events",
    [
        pytest.param([SSEEvent(event="step.delta", data=b"{nope")], id="bad-json"),
        pytest.param([CREATED, CREATED], id="created-twice"),
        pytest.param([CREATED, delta(0, type="text", text="x")], id="delta-unknown-step"),
        pytest.param([CREATED, stop(0)], id="stop-unknown-step"),
        pytest.param(
            [CREATED, start(0, type="model_output"), start(0, type="thought")], id="start-twice"
        ),
        pytest.param(
            [CREATED, start(0, type="model_output"), stop(0), delta(0, type="text", text="x")],
            id="delta-after-stop",
        ),
        pytest.param(
            [CREATED, start(0, type="model_output"), stop(0), stop(0)], id="stopped-twice"
        ),
        pytest.param(
            [
                CREATED,
                start(0, type="function_call", id="c", name="f"),
                delta(0, type="text", text="x"),
            ],
            id="text-in-call-step",
        ),
        pytest.param(
            [
                CREATED,
                start(0, type="function_call", id="c", name="f"),
                delta(0, type="arguments_delta", arguments={"a": 1}),
            ],
            id="arguments-delta-not-text",
        ),
        pytest.param(
            [
                CREATED,
                start(0, type="function_call", id="c", name="f"),
                delta(0, type="function_call", id="c", name="f", arguments={}),
            ],
            id="call-delivered-twice",
        ),
        pytest.param(
            [CREATED, start(0, type="function_call", id="c"), stop(0)], id="legacy-call-never-came"
        ),
        pytest.param(
            [
                CREATED,
                start(0, type="function_call", id="c"),
                delta(0, type="arguments_delta", arguments="{}"),
            ],
            id="arguments-before-legacy-call",
        ),
        pytest.param([CREATED, start(0, type="function_call", name=7)], id="call-name-not-text"),
        pytest.param(
            [ev("interaction.created", interaction={"id": "v1_x"}), completed(None)],
            id="completed-without-any-status",
        ),
        pytest.param(
            [CREATED, completed(), start(0, type="model_output")], id="step-after-completed"
        ),
        pytest.param([ev("step.start", step={"type": "thought"})], id="start-without-index"),
    ],
)
def test_protocol_violations_raise(events: list[SSEEvent]) -> None:
    with pytest.raises(StreamProtocolError):
        run_events(*events)


def test_thought_summary_is_capped() -> None:
    events = [
        CREATED,
        start(0, type="thought"),
        delta(0, type="thought_summary", content={"type": "text", "text": "12345"}),
        delta(0, type="thought_summary", content={"type": "text", "text": "67é"}),
    ]
    run_events(*events[:3], limits=Limits(max_call_argument_bytes=5))
    with pytest.raises(LimitExceeded) as info:
        run_events(*events, limits=Limits(max_call_argument_bytes=8))
    assert info.value.limit == "max_call_argument_bytes"


def test_number_of_kept_steps_is_capped() -> None:
    steps = [e for i in range(3) for e in (start(i, type="thought"), stop(i))]
    run_events(CREATED, *steps[:4], limits=Limits(max_continuation_items=2))
    with pytest.raises(LimitExceeded) as info:
        run_events(CREATED, *steps, limits=Limits(max_continuation_items=2))
    assert info.value.limit == "max_continuation_items"


# --- encode side: stateful continuation ----------------------------------------------------

TOOL = ToolDeclaration("getWeather", "Weather by city", {"type": "object"})


def test_first_request_sends_the_user_text_without_a_previous_id() -> None:
    messages = ADAPTER.initial_messages("Weather in SF?")
    assert messages == [{"type": "text", "text": "Weather in SF?"}]
    spec = ADAPTER.build_request(
        model="gemini-2.5-flash", messages=messages, tools=[TOOL], system="sys", max_tokens=64
    )
    assert spec == HttpRequestSpec(
        path="/v1beta/interactions",
        body={
            "model": "gemini-2.5-flash",
            "input": [{"type": "text", "text": "Weather in SF?"}],
            "stream": True,
            "tools": [
                {
                    "type": "function",
                    "name": "getWeather",
                    "description": "Weather by city",
                    "parameters": {"type": "object"},
                }
            ],
            "system_instruction": "sys",
            "generation_config": {"max_output_tokens": 64},
        },
    )
    assert ADAPTER.auth_headers("k") == {"x-goog-api-key": "k"}


def test_follow_up_sends_only_the_new_results_and_the_previous_interaction_id() -> None:
    outcome = decode("gemini_interactions", [read(STEPS_CALL)])
    [call] = outcome.calls
    echo = ADAPTER.assistant_echo(outcome)
    assert echo == [{"type": TURN_MARKER, "interaction_id": outcome.response_id}]
    results = ADAPTER.encode_results(
        outcome,
        [
            ModelResult(call.call_id, call.name, '{"temp":16}'),
            ModelResult("other", "getWeather", "timeout", is_error=True),
        ],
    )
    assert results == [
        {
            "type": "function_result",
            "call_id": "61nzpsv4",
            "name": "getWeather",
            "result": '{"temp":16}',
        },
        {
            "type": "function_result",
            "call_id": "other",
            "name": "getWeather",
            "result": "timeout",
            "is_error": True,
        },
    ]
    messages: list[JSON] = [*ADAPTER.initial_messages("Weather in SF?"), *echo, *results]
    body = ADAPTER.build_request(model="m", messages=messages, tools=[TOOL]).body
    assert body["input"] == results
    assert body["previous_interaction_id"] == outcome.response_id
    # The run loop may also pass `previous` explicitly: same request.
    assert (
        ADAPTER.build_request(model="m", messages=messages, tools=[TOOL], previous=outcome).body
        == body
    )


def test_each_round_continues_from_the_latest_interaction() -> None:
    first = decode("gemini_interactions", [read(STEPS_CALL)])
    second = decode("gemini_interactions", [read(LEGACY_CALL)])
    r1 = ADAPTER.encode_results(first, [ModelResult("61nzpsv4", "getWeather", "1")])
    r2 = ADAPTER.encode_results(second, [ModelResult("odkxni2w", "getWeather", "2")])
    messages: list[JSON] = [
        *ADAPTER.initial_messages("hi"),
        *ADAPTER.assistant_echo(first),
        *r1,
        *ADAPTER.assistant_echo(second),
        *r2,
    ]
    body = ADAPTER.build_request(model="m", messages=messages, tools=[]).body
    assert body["input"] == r2
    assert body["previous_interaction_id"] == second.response_id
    assert TURN_MARKER not in json.dumps(body)  # markers are never sent
    assert "tools" not in body


def test_continuing_without_an_interaction_id_is_a_config_error() -> None:
    outcome = decode("gemini_interactions", [read(STEPS_CALL)])
    unstored = msgspec.structs.replace(outcome, response_id=None)
    messages = [*ADAPTER.initial_messages("hi"), *ADAPTER.assistant_echo(unstored)]
    with pytest.raises(ConfigError):
        ADAPTER.build_request(model="m", messages=messages, tools=[])


def test_unopened_legacy_call_steps_are_bounded() -> None:
    limits = Limits(max_continuation_items=1, max_calls_per_response=1)
    steps = [
        ev("content.start", index=i, content={"type": "function_call", "id": f"c{i}"})
        for i in range(3)
    ]
    run_events(CREATED, *steps[:2], limits=limits)
    with pytest.raises(LimitExceeded) as info:
        run_events(CREATED, *steps, limits=limits)
    assert info.value.limit == "max_calls_per_response"
