"""The OpenAI Responses adapter, encode side: the stateless echo of the continuation items,
the tool results and the request produce the shapes PROVIDERS.md §2 gives for the
follow-up request."""

from __future__ import annotations

import msgspec

from callgate.adapters.openai_responses import ADAPTER
from callgate.engine.core.adapter import HttpRequestSpec, ModelResult, ToolDeclaration
from callgate.engine.core.decode import decode
from callgate.engine.core.events import ContinuationItem
from callgate.engine.core.outcome import OutcomeKind, ProposedCall, TurnOutcome

from .openai_responses_helpers import FAMILY, FC, added, item_done, of, send, wire_events

# --- encode side ---------------------------------------------------------------------------


def test_initial_messages() -> None:
    assert ADAPTER.initial_messages("hi") == [{"role": "user", "content": "hi"}]


def test_stateless_echo_matches_the_followup_shape() -> None:
    name = "reasoning_text_then_function_call.sse"
    outcome = decode("openai_responses", [(FAMILY / name).read_bytes()])
    done = {
        e["output_index"]: e["item"]
        for e in wire_events(name)
        if e["type"] == "response.output_item.done"
    }
    echo = ADAPTER.assistant_echo(outcome)
    # PROVIDERS.md §2 (pai interaction #1): reasoning with id + summary + encrypted_content,
    # the message with id/phase/status, the function_call; no output-only status where the
    # API rejects it.
    assert echo == [
        {
            "type": "reasoning",
            "id": done[0]["id"],
            "summary": [],
            "encrypted_content": done[0]["encrypted_content"],
        },
        done[1],
        {
            "type": "function_call",
            "id": done[2]["id"],
            "call_id": "call_LabG58Uhrq9kZvR52BYKjToD",
            "name": "get_capital",
            "arguments": '{"country":"PotatoLand"}',
        },
    ]
    assert echo[1]["phase"] == "commentary" and echo[1]["status"] == "completed"
    # The outcome's own items are not modified by the echo.
    assert outcome.continuation[2].item["status"] == "completed"


def test_echo_uses_the_final_encrypted_content() -> None:
    name = "reasoning_encrypted_content_function_call.converted.sse"
    outcome = decode("openai_responses", [(FAMILY / name).read_bytes()])
    done = next(e for e in wire_events(name) if e["type"] == "response.output_item.done")
    reasoning = ADAPTER.assistant_echo(outcome)[0]
    assert reasoning["encrypted_content"] == done["item"]["encrypted_content"]
    assert reasoning["summary"] == done["item"]["summary"]


def test_echo_normalises_reasoning_items() -> None:
    item = {"type": "reasoning", "id": "rs_1", "status": "completed", "encrypted_content": "e"}
    outcome = TurnOutcome(
        kind=OutcomeKind.FINAL_TEXT,
        raw_reason="completed",
        stop_reason="",
        continuation=(ContinuationItem("reasoning", 0, item),),
    )
    assert ADAPTER.assistant_echo(outcome) == [
        {"type": "reasoning", "id": "rs_1", "encrypted_content": "e", "summary": []}
    ]
    # Without encrypted_content the item is left out (store:false cannot resolve its id).
    bare = TurnOutcome(
        kind=OutcomeKind.FINAL_TEXT,
        raw_reason="completed",
        stop_reason="",
        continuation=(ContinuationItem("reasoning", 0, item | {"encrypted_content": None}),),
    )
    assert ADAPTER.assistant_echo(bare) == []


def test_echo_rebuilds_calls_and_text_without_items() -> None:
    call = ProposedCall(
        index=1,
        call_id="call_9",
        name="f",
        arguments={},
        raw_arguments=b"{}",
        item_id="fc_9",
    )
    outcome = TurnOutcome(
        kind=OutcomeKind.TOOL_PROPOSALS,
        raw_reason="completed",
        stop_reason="",
        text="Looking.",
        calls=(call,),
    )
    assert ADAPTER.assistant_echo(outcome) == [
        {"role": "assistant", "content": "Looking."},
        {
            "type": "function_call",
            "id": "fc_9",
            "call_id": "call_9",
            "name": "f",
            "arguments": "{}",
        },
    ]


def test_echo_gives_an_item_without_call_id_the_derived_one() -> None:
    item = {"type": "function_call", "id": "fc_1", "name": "f", "arguments": "{}"}
    call = ProposedCall(
        index=0,
        call_id="cgcall_derived",
        name="f",
        arguments={},
        raw_arguments=b"{}",
        item_id="fc_1",
        call_id_derived=True,
    )
    outcome = TurnOutcome(
        kind=OutcomeKind.TOOL_PROPOSALS,
        raw_reason="completed",
        stop_reason="",
        calls=(call,),
        continuation=(ContinuationItem("function_call", 0, item),),
    )
    assert ADAPTER.assistant_echo(outcome) == [item | {"call_id": "cgcall_derived"}]
    assert "call_id" not in item  # the outcome's item is not modified


def test_echo_orders_items_by_output_index() -> None:
    items = (
        ContinuationItem("function_call", 2, FC | {"call_id": "b", "status": "completed"}),
        ContinuationItem(
            "reasoning",
            0,
            {"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "e"},
        ),
        ContinuationItem("function_call", 1, FC | {"call_id": "a", "status": "completed"}),
    )
    outcome = TurnOutcome(
        kind=OutcomeKind.TOOL_PROPOSALS, raw_reason="completed", stop_reason="", continuation=items
    )
    assert [e.get("call_id", e["type"]) for e in ADAPTER.assistant_echo(outcome)] == [
        "reasoning",
        "a",
        "b",
    ]


def test_encode_results_function_call_output_in_order() -> None:
    outcome = TurnOutcome(kind=OutcomeKind.TOOL_PROPOSALS, raw_reason="completed", stop_reason="")
    results = [
        ModelResult(call_id="call_2", name="g", content="Potato City"),
        ModelResult(call_id="call_1", name="f", content="failed: timeout", is_error=True),
    ]
    assert ADAPTER.encode_results(outcome, results) == [
        {"type": "function_call_output", "call_id": "call_2", "output": "Potato City"},
        {"type": "function_call_output", "call_id": "call_1", "output": "failed: timeout"},
    ]


def test_build_request_full() -> None:
    params = {"type": "object", "properties": {"country": {"type": "string"}}}
    messages = ADAPTER.initial_messages("capital?")
    spec = ADAPTER.build_request(
        model="gpt-5",
        messages=messages,
        tools=[ToolDeclaration(name="get_capital", description="Capital.", parameters=params)],
        system="Be brief.",
        max_tokens=512,
    )
    assert spec == HttpRequestSpec(
        path="/v1/responses",
        body={
            "model": "gpt-5",
            "input": [{"role": "user", "content": "capital?"}],
            "tools": [
                {
                    "type": "function",
                    "name": "get_capital",
                    "description": "Capital.",
                    "parameters": params,
                    "strict": False,
                }
            ],
            "stream": True,
            "store": False,
            "include": ["reasoning.encrypted_content"],
            "instructions": "Be brief.",
            "max_output_tokens": 512,
        },
    )


def test_build_request_minimal_omits_optional_fields() -> None:
    # "m" is not a reasoning model: no include (see test_encode_fixes.py).
    body = ADAPTER.build_request(model="m", messages=[], tools=[]).body
    assert body == {"model": "m", "input": [], "stream": True, "store": False}
    # Each request gets its own list: mutating one body cannot leak into the next.
    body = ADAPTER.build_request(model="gpt-5", messages=[], tools=[]).body
    body["include"].append("x")  # type: ignore[attr-defined]
    assert ADAPTER.build_request(model="gpt-5", messages=[], tools=[]).body["include"] == [
        "reasoning.encrypted_content"
    ]


def test_auth_headers() -> None:
    assert ADAPTER.auth_headers("sk-test") == {"Authorization": "Bearer sk-test"}


def test_full_followup_input_round_trips_as_json() -> None:
    name = "parallel_function_calls_with_reasoning.converted.sse"
    outcome = decode("openai_responses", [(FAMILY / name).read_bytes()])
    results = [
        ModelResult(call_id=c.call_id, name=c.name, content="71 degrees") for c in outcome.calls
    ]
    messages = [
        *ADAPTER.initial_messages("weather?"),
        *ADAPTER.assistant_echo(outcome),
        *ADAPTER.encode_results(outcome, results),
    ]
    body = ADAPTER.build_request(model="m", messages=messages, tools=[]).body
    wire = msgspec.json.decode(msgspec.json.encode(body))
    # The recording's reasoning item has no encrypted_content: it is not echoed.
    assert [item.get("type", "user") for item in wire["input"]] == [
        "user",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
    ]
    calls = [i for i in wire["input"] if i.get("type") == "function_call"]
    outputs = [i for i in wire["input"] if i.get("type") == "function_call_output"]
    assert [c["call_id"] for c in calls] == [o["call_id"] for o in outputs]


def test_a_kept_item_keeps_its_members_in_wire_order() -> None:
    """Items other than a completed function call are kept whole, member order included
    (an ``arguments`` member among them stays where it came)."""
    item = {"type": "custom_tool_call", "arguments": {"q": 1}, "name": "t", "id": "ct_1"}
    events = send(item_done(0, item))
    (kept,) = of(events, ContinuationItem)
    assert list(kept.item) == ["type", "arguments", "name", "id"] and kept.item == item
    cut = FC | {"arguments": None, "status": "completed"}
    (kept,) = of(send(added(0, FC), item_done(0, cut)), ContinuationItem)
    assert list(kept.item) == list(cut) and kept.item == cut
