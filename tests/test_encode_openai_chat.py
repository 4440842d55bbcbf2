"""The OpenAI Chat Completions adapter, encode side: the assistant echo, the tool messages
and the request produce the shapes PROVIDERS.md §1 gives for the follow-up request."""

from __future__ import annotations

import json

import msgspec

from callgate.adapters.openai_chat import ADAPTER
from callgate.engine.core.adapter import HttpRequestSpec, ModelResult, ToolDeclaration
from callgate.engine.core.decode import decode
from callgate.engine.core.outcome import OutcomeKind, ProposedCall, TurnOutcome

from .openai_chat_helpers import FAMILY

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
