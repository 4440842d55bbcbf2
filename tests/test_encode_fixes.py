"""Encode-side fixes: what the adapters send to the provider on the next request.

- Gemini ``generateContent`` declares a tool's full JSON Schema in
  ``functionDeclarations[].parametersJsonSchema`` (``parameters`` is Gemini's limited
  OpenAPI ``Schema`` and rejects e.g. ``additionalProperties``); the Interactions API's
  function tool documents ``parameters`` as the JSON Schema, so it keeps that field.
- OpenAI Responses asks for ``reasoning.encrypted_content`` only for reasoning models, and
  the stateless echo leaves out a reasoning item that has no ``encrypted_content``.
- The Responses echo puts the call's raw argument text back when the kept
  ``function_call`` item carried ``"arguments": null``.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from callgate.adapters import openai_responses
from callgate.adapters.gemini import ADAPTER as GEMINI
from callgate.adapters.gemini_interactions import ADAPTER as INTERACTIONS
from callgate.adapters.openai_responses import ADAPTER as RESPONSES
from callgate.adapters.render import RenderCall, render_turn
from callgate.engine.core.adapter import ToolDeclaration, load_adapter
from callgate.engine.core.decode import decode
from callgate.engine.core.events import ContinuationItem
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import OutcomeKind, ProposedCall, TurnOutcome
from callgate.engine.runtime.call_records import echoed_turn

from .conftest import FIXTURES
from .openai_responses_helpers import FAMILY

# A schema with the JSON Schema keywords Gemini's OpenAPI ``Schema`` does not know.
SCHEMA: dict[str, object] = {
    "title": "RefundDraftArgs",
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^[0-9]{3,12}$"},
        "amount_cents": {"type": "integer", "exclusiveMinimum": 0, "maximum": 10000000},
        "kind": {"const": "refund"},
        "line": {"$ref": "#/$defs/Line"},
    },
    "required": ["order_id", "amount_cents"],
    "additionalProperties": False,
    "$defs": {"Line": {"type": "object", "properties": {"sku": {"type": "string"}}}},
}
TOOLS = [
    ToolDeclaration("create_refund_draft", "Create a refund draft.", SCHEMA),
    ToolDeclaration("ping", "No arguments.", {"type": "object", "properties": {}}),
]


# --- 1. Gemini: parametersJsonSchema -----------------------------------------------------


def test_gemini_declares_the_json_schema_as_parameters_json_schema() -> None:
    body = GEMINI.build_request(model="gemini-2.5-flash", messages=[], tools=TOOLS).body
    wire = msgspec.json.decode(msgspec.json.encode(body))
    (tool,) = wire["tools"]
    assert tool["functionDeclarations"] == [
        {
            "name": "create_refund_draft",
            "description": "Create a refund draft.",
            "parametersJsonSchema": SCHEMA,
        },
        {
            "name": "ping",
            "description": "No arguments.",
            "parametersJsonSchema": {"type": "object", "properties": {}},
        },
    ]
    # Mutually exclusive with the OpenAPI-subset field: that one is never sent.
    assert all("parameters" not in d for d in tool["functionDeclarations"])


def test_interactions_function_tool_keeps_its_documented_parameters_field() -> None:
    # The Interactions ``Function`` tool has one schema field, ``parameters``: "The JSON
    # Schema for the function's parameters" (js-genai interactions types; the docs'
    # function-calling example). Unchanged; this guards against copying the Gemini fix.
    body = INTERACTIONS.build_request(model="gemini-3-flash-preview", messages=[], tools=TOOLS)
    assert body.body["tools"] == [
        {"type": "function", "name": t.name, "description": t.description, "parameters": p}
        for t, p in zip(TOOLS, [SCHEMA, {"type": "object", "properties": {}}], strict=True)
    ]


# --- 2. Responses: include only for reasoning models; no id-only reasoning echo ----------

REASONING = [
    "o1",
    "o1-mini",
    "o3",
    "o3-mini-2025-01-31",
    "o4-mini",
    "gpt-5",
    "gpt-5-mini",
    "gpt-5-nano",
    "gpt-5.1",
    "gpt-5.1-chat-latest",
    "gpt-5-codex",
    "codex-mini-latest",
    "GPT-5",
    "O3",
    "openai/gpt-5",
    "openai/o4-mini",
]
NOT_REASONING = [
    "gpt-4o",
    "gpt-4o-mini",
    "gpt-4.1",
    "gpt-4.1-nano",
    "gpt-5-chat-latest",
    "GPT-5-Chat-Latest",
    "openai/gpt-5-chat-latest",
    "openai/gpt-4o",
    "omni-moderation-latest",
    "m",
    "",
]


@pytest.mark.parametrize("model", REASONING)
def test_reasoning_models_ask_for_encrypted_reasoning(model: str) -> None:
    assert openai_responses.is_reasoning_model(model)
    body = RESPONSES.build_request(model=model, messages=[], tools=[]).body
    assert body["store"] is False
    assert body["include"] == ["reasoning.encrypted_content"]


@pytest.mark.parametrize("model", NOT_REASONING)
def test_other_models_send_no_include(model: str) -> None:
    # gpt-4o / gpt-4.1 / gpt-5-chat-latest: 400 "Encrypted content is not supported with
    # this model" when asked for it.
    body = RESPONSES.build_request(model=model, messages=[], tools=[]).body
    assert body["store"] is False
    assert "include" not in body
    assert not openai_responses.is_reasoning_model(model)


def test_each_request_gets_its_own_include_list() -> None:
    body = RESPONSES.build_request(model="o3", messages=[], tools=[]).body
    body["include"].append("x")  # type: ignore[attr-defined]
    assert RESPONSES.build_request(model="o3", messages=[], tools=[]).body["include"] == [
        "reasoning.encrypted_content"
    ]


def _outcome(
    *items: tuple[str, int, dict[str, Any]], calls: tuple[ProposedCall, ...] = ()
) -> TurnOutcome:
    return TurnOutcome(
        kind=OutcomeKind.TOOL_PROPOSALS if calls else OutcomeKind.FINAL_TEXT,
        raw_reason="completed",
        stop_reason="",
        calls=calls,
        continuation=tuple(ContinuationItem(k, i, item) for k, i, item in items),
    )


def test_echo_drops_the_recorded_reasoning_item_without_encrypted_content() -> None:
    # The repro: this recording's reasoning item has an id but no encrypted_content; under
    # store:false the server cannot resolve it ("Item with id rs_… not found").
    name = "parallel_function_calls_with_reasoning.converted.sse"
    outcome = decode("openai_responses", [(FAMILY / name).read_bytes()])
    kept = [c for c in outcome.continuation if c.kind == "reasoning"]
    assert kept and "encrypted_content" not in kept[0].item
    echo = RESPONSES.assistant_echo(outcome)
    assert [item["type"] for item in echo] == ["function_call", "function_call"]
    body = RESPONSES.build_request(
        model="gpt-5", messages=[*RESPONSES.initial_messages("weather?"), *echo], tools=[]
    ).body
    assert all(item.get("type") != "reasoning" for item in body["input"])  # type: ignore[attr-defined]


_MESSAGE = {
    "type": "message",
    "id": "msg_1",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "Hi.", "annotations": []}],
}
_CUSTOM = {"type": "custom_tool_call", "id": "ct_1", "call_id": "c", "name": "t", "input": ""}


def test_echo_drops_only_reasoning_without_encrypted_content() -> None:
    message, custom = dict(_MESSAGE), dict(_CUSTOM)
    outcome = _outcome(
        ("reasoning", 0, {"type": "reasoning", "id": "rs_a", "summary": []}),
        ("reasoning", 1, {"type": "reasoning", "id": "rs_b", "encrypted_content": None}),
        ("reasoning", 2, {"type": "reasoning", "id": "rs_c", "encrypted_content": ""}),
        ("reasoning", 3, {"type": "reasoning", "id": "rs_d", "encrypted_content": "gAAA"}),
        ("message", 4, message),
        ("custom_tool_call", 5, custom),
    )
    assert RESPONSES.assistant_echo(outcome) == [
        {"type": "reasoning", "id": "rs_d", "encrypted_content": "gAAA", "summary": []},
        message,
        custom,
    ]


# --- 3. Responses: "arguments": null gets the raw text back ------------------------------


def _ev(kind: str, **fields: object) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"


def _null_arguments_stream(text: str) -> bytes:
    item = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "f",
        "arguments": "",
        "status": "in_progress",
    }
    return "".join(
        [
            _ev("response.created", response={"id": "resp_1", "model": "m"}),
            _ev("response.output_item.added", output_index=0, item=item),
            _ev(
                "response.function_call_arguments.delta", item_id="fc_1", output_index=0, delta=text
            ),
            _ev(
                "response.function_call_arguments.done",
                item_id="fc_1",
                output_index=0,
                arguments=text,
            ),
            _ev(
                "response.output_item.done",
                output_index=0,
                item={**item, "status": "completed", "arguments": None},
            ),
            _ev("response.completed", response={"id": "resp_1", "status": "completed"}),
        ]
    ).encode()


@pytest.mark.parametrize("text", ['{"a":1}', '{ "a" : 1,\n  "s": "\\u00e9" }'])
def test_echo_puts_the_raw_arguments_back_for_null_arguments(text: str) -> None:
    outcome = decode("openai_responses", [_null_arguments_stream(text)])
    assert outcome.kind is OutcomeKind.TOOL_PROPOSALS
    assert RESPONSES.assistant_echo(outcome) == [
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": text}
    ]


def test_echo_null_arguments_from_a_kept_item() -> None:
    call = ProposedCall(
        index=0,
        call_id="call_1",
        name="f",
        arguments={},
        raw_arguments=b'{"x": [1]}',
        item_id="fc_1",
    )
    item = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "f",
        "arguments": None,
    }
    (echoed,) = RESPONSES.assistant_echo(_outcome(("function_call", 0, item), calls=(call,)))
    assert echoed["arguments"] == '{"x": [1]}'
    assert item["arguments"] is None  # the outcome's own item is not modified


@pytest.mark.parametrize(
    "model", ["prod-o3-mini", "ft:o4-mini:org::abc", "gpt-oss-120b", "my-o3-deployment"]
)
def test_reasoning_models_under_other_names_ask_too(model: str) -> None:
    # Azure deployments, fine-tunes and open-weight names that contain a reasoning family.
    assert openai_responses.is_reasoning_model(model)


def test_a_turn_that_produced_reasoning_makes_the_next_request_ask() -> None:
    from callgate.engine.core.outcome import ContinuationItem, OutcomeKind, TurnOutcome

    previous = TurnOutcome(
        kind=OutcomeKind.TOOL_PROPOSALS,
        raw_reason="completed",
        stop_reason="x",
        continuation=(ContinuationItem("reasoning", 0, {"type": "reasoning", "id": "rs_1"}),),
    )
    body = RESPONSES.build_request(model="house-model", messages=[], tools=[], previous=previous)
    assert body.body["include"] == ["reasoning.encrypted_content"]
    plain = RESPONSES.build_request(model="house-model", messages=[], tools=[]).body
    assert "include" not in plain


@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses"])
def test_a_call_refused_for_its_size_is_echoed_with_no_arguments(provider: str) -> None:
    # It holds no bytes: "{}" is how both OpenAI APIs spell no arguments ("" is not).
    big = json.dumps({"x": "y" * 100})
    body = render_turn(
        provider, calls=[RenderCall("c_small", "t", '{"a":1}'), RenderCall("c_big", "t", big)]
    )
    outcome = decode(provider, [body], Limits(max_call_argument_bytes=20))
    assert [c.error is None for c in outcome.calls] == [True, False]
    echo = load_adapter(provider).assistant_echo(outcome)
    calls = echo[0]["tool_calls"] if provider == "openai_chat" else echo
    arguments = [c["function"]["arguments"] if "function" in c else c["arguments"] for c in calls]
    assert arguments == ['{"a":1}', "{}"]


# --- a rejected call's text never goes back; calls of a dropped reasoning item go by call_id


@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses"])
def test_a_rejected_calls_text_is_never_echoed(provider: str) -> None:
    # Servers that parse the history (vLLM, proxies) refuse a request echoing malformed
    # or non-object argument text with a 400, after the turn's valid calls ran. The
    # rejected call goes back as "{}" (its error result says why), as Anthropic's and
    # Gemini's echoes already did; a valid call keeps its exact bytes.
    calls = [
        RenderCall("call_ok", "get_weather", '{"city": "Paris"}'),
        RenderCall("call_cut", "get_weather", '{"city": "Par'),
        RenderCall("call_arr", "get_weather", '["Paris"]'),
    ]
    body = render_turn(provider, text="", calls=calls, model="gpt-5")
    outcome = decode(provider, [body])
    assert [c.arguments is None for c in outcome.calls] == [False, True, True]
    echo = load_adapter(provider).assistant_echo(echoed_turn(outcome))
    if provider == "openai_chat":
        sent = [tc["function"]["arguments"] for tc in echo[0]["tool_calls"]]
    else:
        sent = [item["arguments"] for item in echo if item.get("type") == "function_call"]
    assert sent == ['{"city": "Paris"}', "{}", "{}"]


def test_calls_after_a_reasoning_item_that_cannot_go_back_are_echoed_without_their_ids() -> None:
    # A reasoning item without encrypted_content (the first request of a model name the
    # reasoning rule does not know) is not echoed; the API then refuses a function_call
    # item naming its id "without its required 'reasoning' item": call_id pairs them.
    name = "parallel_function_calls_with_reasoning.converted.sse"
    outcome = decode("openai_responses", [(FIXTURES / "openai_responses" / name).read_bytes()])
    kept = [c for c in outcome.continuation if c.kind == "reasoning"]
    assert kept and not any(c.item.get("encrypted_content") for c in kept)
    echo = load_adapter("openai_responses").assistant_echo(outcome)
    calls = [item for item in echo if item.get("type") == "function_call"]
    assert [c["call_id"] for c in calls] == [c.call_id for c in outcome.calls]
    assert len(calls) == 2 and all("id" not in c for c in calls)
    assert not any(item.get("type") == "reasoning" for item in echo)


def test_a_message_after_a_reasoning_item_that_cannot_go_back_is_plain_assistant_input() -> None:
    # The API refuses "Item 'msg_…' of type 'message' was provided without its required
    # 'reasoning' item" too: such a message goes back without its id (and so without the
    # status only the id form takes); a custom tool call without its id. Items after a
    # reasoning item that does go back keep theirs.
    message, custom = dict(_MESSAGE), dict(_CUSTOM)
    later = {**message, "id": "msg_2"}
    outcome = _outcome(
        ("reasoning", 0, {"type": "reasoning", "id": "rs_a", "summary": []}),
        ("message", 1, message),
        ("custom_tool_call", 2, custom),
        ("reasoning", 3, {"type": "reasoning", "id": "rs_b", "encrypted_content": "gAAA"}),
        ("message", 4, later),
    )
    plain = {k: v for k, v in message.items() if k not in ("id", "status")}
    assert RESPONSES.assistant_echo(outcome) == [
        plain,
        {k: v for k, v in custom.items() if k != "id"},
        {"type": "reasoning", "id": "rs_b", "encrypted_content": "gAAA", "summary": []},
        later,
    ]
