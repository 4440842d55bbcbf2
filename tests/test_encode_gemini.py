"""The Gemini generateContent adapter, encode side: thought signatures go back on the part
they came on, and the echo, the function responses and the request have the shapes
PROVIDERS.md §4a gives."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from callgate.adapters.gemini import ADAPTER
from callgate.engine.core.adapter import HttpRequestSpec, ModelResult, ToolDeclaration
from callgate.engine.core.decode import decode
from callgate.engine.core.outcome import OutcomeKind

from .conftest import FIXTURES
from .gemini_helpers import candidate, read

# --- encode side ---------------------------------------------------------------------------


def test_initial_messages() -> None:
    assert ADAPTER.initial_messages("hi") == [{"role": "user", "parts": [{"text": "hi"}]}]


def test_echo_puts_each_signature_back_on_its_call_part() -> None:
    outcome = decode("gemini", [read("function_call_with_id_gemini3flash.sse")])
    sig = outcome.continuation[0].item["thoughtSignature"]
    assert ADAPTER.assistant_echo(outcome) == [
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"name": "get_user_country", "args": {}, "id": "96c1su3s"},
                    "thoughtSignature": sig,
                }
            ],
        }
    ]


def test_echo_of_vertex_calls_thought_first_and_derived_ids_omitted() -> None:
    name = "vertex_partial_args_four_calls_incl_no_args.converted.sse"
    outcome = decode("gemini", [read(name)])
    [message] = ADAPTER.assistant_echo(outcome)
    parts = message["parts"]
    assert isinstance(parts, list)
    assert parts[0]["thought"] is True and parts[0]["text"].startswith("**Processing")
    calls = parts[1:]
    assert [p["functionCall"] for p in calls] == [
        {"name": "read_theme", "args": {}},
        {"name": "read_screen", "args": {"id": "A"}},
        {"name": "read_screen", "args": {"id": "B"}},
        {"name": "read_screen", "args": {"id": "C"}},
    ]
    # Only the first call carried a signature, and it stays on that part.
    assert "thoughtSignature" in calls[0]
    assert all("thoughtSignature" not in p for p in calls[1:])


def test_echo_keeps_a_text_signature_on_the_text_part() -> None:
    chunks = [
        candidate({"text": "think", "thought": True}),
        candidate({"text": "Hello"}),
        candidate({"text": "", "thoughtSignature": "SIG"}, finish="STOP"),
    ]
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)
    outcome = decode("gemini", [body])
    assert outcome.kind is OutcomeKind.FINAL_TEXT
    assert ADAPTER.assistant_echo(outcome) == [
        {
            "role": "model",
            "parts": [
                {"text": "think", "thought": True},
                {"text": "Hello", "thoughtSignature": "SIG"},
            ],
        }
    ]


_CALL_A = {"functionCall": {"name": "a", "args": {"x": 1}, "id": "c1"}, "thoughtSignature": "C1"}
_CALL_B = {"functionCall": {"name": "b", "args": {}, "id": "c2"}}


def _ordered_stream() -> bytes:
    """A thought, text, a call, text, a call: signatures on the thought, on each text
    run's last piece and on the first call."""
    chunks = [
        candidate({"text": "think", "thought": True, "thoughtSignature": "T"}),
        candidate({"text": "First "}, {"text": "I look.", "thoughtSignature": "S1"}),
        candidate(_CALL_A),
        candidate({"text": "Then "}),
        candidate({"text": "more.", "thoughtSignature": "S2"}, _CALL_B, finish="STOP"),
    ]
    return b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)


def test_echo_keeps_the_order_of_text_and_calls_and_each_text_signature() -> None:
    body = _ordered_stream()
    for feed in ([body], [body[i : i + 1] for i in range(len(body))]):
        outcome = decode("gemini", feed)
        assert outcome.kind is OutcomeKind.TOOL_PROPOSALS
        assert outcome.text == "First I look.Then more."
        assert ADAPTER.assistant_echo(outcome) == [
            {
                "role": "model",
                "parts": [
                    {"text": "think", "thought": True, "thoughtSignature": "T"},
                    {"text": "First I look.", "thoughtSignature": "S1"},
                    _CALL_A,
                    {"text": "Then more.", "thoughtSignature": "S2"},
                    _CALL_B,
                ],
            }
        ]


def test_echo_falls_back_to_the_usual_order_when_the_part_order_does_not_fit() -> None:
    chunks = [
        candidate({"text": "a", "thoughtSignature": "S1"}),
        candidate({"text": "b", "thoughtSignature": "S2"}, finish="STOP"),
    ]
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)
    outcome = decode("gemini", [body])
    assert ADAPTER.assistant_echo(outcome)[0]["parts"] == [
        {"text": "a", "thoughtSignature": "S1"},
        {"text": "b", "thoughtSignature": "S2"},
    ]
    # An outcome whose text no longer matches its order (edited, or from elsewhere).
    edited = msgspec.structs.replace(outcome, text="abc")
    assert ADAPTER.assistant_echo(edited)[0]["parts"] == [{"text": "abc", "thoughtSignature": "S2"}]


@pytest.mark.parametrize(
    "parts",
    [
        # The thought twice: the echo would repeat it.
        [
            ["thought", 0],
            ["thought", 0],
            ["text", 0, 13],
            ["call", 0],
            ["text", 13, 23],
            ["call", 1],
        ],
        # A call twice: the echo would propose it twice.
        [["thought", 0], ["text", 0, 13], ["call", 0], ["call", 0], ["text", 13, 23], ["call", 1]],
        # A text run that does not start where the one before ended.
        [["thought", 0], ["text", 0, 13], ["call", 0], ["text", 5, 23], ["call", 1]],
        # The thought left out: the echo would drop it (and its signature).
        [["text", 0, 13, "S1"], ["call", 0], ["text", 13, 23, "S2"], ["call", 1]],
        # A call left out: the echo would drop a call whose result the next request sends.
        [["thought", 0], ["text", 0, 13, "S1"], ["call", 0], ["text", 13, 23, "S2"]],
    ],
    ids=["thought_twice", "call_twice", "text_gap", "thought_missing", "call_missing"],
)
def test_a_part_order_that_does_not_account_for_each_part_once_falls_back(
    parts: list[list[Any]],
) -> None:
    """``gemini_part_order`` is followed only when it names every thought and call exactly
    once and covers the text without gaps; any other order (an outcome edited or read
    back from elsewhere) gives the usual order: thoughts, the text, the calls."""
    outcome = decode("gemini", [_ordered_stream()])
    [detail] = outcome.provider_details
    assert detail.kind == "gemini_part_order"
    tampered = msgspec.structs.replace(
        outcome, provider_details=(msgspec.structs.replace(detail, data={"parts": parts}),)
    )
    [message] = ADAPTER.assistant_echo(tampered)
    assert message["parts"] == [
        {"text": "think", "thought": True, "thoughtSignature": "T"},
        {"text": "First I look.Then more.", "thoughtSignature": "S2"},
        {"functionCall": {"name": "a", "args": {"x": 1}, "id": "c1"}, "thoughtSignature": "C1"},
        {"functionCall": {"name": "b", "args": {}, "id": "c2"}},
    ]


def test_echo_keeps_an_empty_text_part_that_carries_a_signature() -> None:
    """An empty text part before the calls that carries a ``thoughtSignature`` is echoed
    (empty text, its signature): dropping it would lose the signature the API asks back."""
    call = {"functionCall": {"name": "a", "args": {"x": 1}, "id": "c1"}, "thoughtSignature": "C1"}
    chunks = [candidate({"text": "", "thoughtSignature": "S"}), candidate(call, finish="STOP")]
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)
    outcome = decode("gemini", [body])
    assert outcome.kind is OutcomeKind.TOOL_PROPOSALS and outcome.text == ""
    assert ADAPTER.assistant_echo(outcome) == [
        {"role": "model", "parts": [{"text": "", "thoughtSignature": "S"}, call]}
    ]


def test_echo_of_a_call_without_arguments_sends_an_empty_object() -> None:
    """A call whose arguments were rejected (``arguments`` None) is echoed with
    ``"args": {}``, never ``null``: the API takes an object there."""
    outcome = decode("gemini", [read("function_call_with_id_gemini3flash.sse")])
    [call] = outcome.calls
    rejected = msgspec.structs.replace(call, arguments=None, error="rejected")
    edited = msgspec.structs.replace(outcome, calls=(rejected,))
    [message] = ADAPTER.assistant_echo(edited)
    [part] = message["parts"]
    assert part["functionCall"]["args"] == {}


def test_results_are_function_responses_with_ids_only_for_provider_ids() -> None:
    with_id = decode("gemini", [read("function_call_with_id_gemini3flash.sse")])
    [call] = with_id.calls
    assert ADAPTER.encode_results(
        with_id, [ModelResult(call.call_id, call.name, '{"country":"FR"}')]
    ) == [
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "name": "get_user_country",
                        "id": "96c1su3s",
                        "response": {"output": {"country": "FR"}},
                    }
                }
            ],
        }
    ]
    derived = decode("gemini", [read("single_function_call_gemini20.sse")])
    [call] = derived.calls
    results = [
        ModelResult(call.call_id, "get_capital", "not json, plain text"),
        ModelResult(call.call_id, "get_capital", '"tool failed"', is_error=True),
    ]
    assert ADAPTER.encode_results(derived, results) == [
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "name": "get_capital",
                        "response": {"output": "not json, plain text"},
                    }
                },
                {"functionResponse": {"name": "get_capital", "response": {"error": "tool failed"}}},
            ],
        }
    ]
    assert ADAPTER.encode_results(derived, []) == []


def test_build_request_and_auth() -> None:
    tool = ToolDeclaration("get_weather", "Weather by city", {"type": "object"})
    messages = ADAPTER.initial_messages("hi")
    spec = ADAPTER.build_request(
        model="gemini-2.5-flash", messages=messages, tools=[tool], system="sys", max_tokens=99
    )
    assert spec == HttpRequestSpec(
        path="/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        body={
            "contents": messages,
            "tools": [
                {
                    "functionDeclarations": [
                        {
                            "name": "get_weather",
                            "description": "Weather by city",
                            "parametersJsonSchema": {"type": "object"},
                        }
                    ]
                }
            ],
            "systemInstruction": {"parts": [{"text": "sys"}]},
            "generationConfig": {"maxOutputTokens": 99},
        },
    )
    bare = ADAPTER.build_request(model="m", messages=[], tools=[])
    assert bare.body == {"contents": []}
    assert ADAPTER.auth_headers("k") == {"x-goog-api-key": "k"}


def test_the_model_is_one_quoted_path_segment() -> None:
    # "#" would cut the method off into a fragment (another endpoint), "?" would start
    # the query, "/" another path: quoted, the API answers 404 for the unknown name.
    for model, segment in [
        ("gemini-2.5-flash-preview-05-20", "gemini-2.5-flash-preview-05-20"),
        ("gemini-2.5-flash#x", "gemini-2.5-flash%23x"),
        ("a?b=c", "a%3Fb%3Dc"),
        ("models/gemini-2.5-flash", "models%2Fgemini-2.5-flash"),
        ("tuned model 1", "tuned%20model%201"),
    ]:
        spec = ADAPTER.build_request(model=model, messages=[], tools=[])
        assert spec.path == f"/v1beta/models/{segment}:streamGenerateContent?alt=sse"


def test_callgate_envelopes_are_not_double_nested_in_function_responses() -> None:
    from callgate.adapters.gemini import ADAPTER as GEMINI
    from callgate.engine.core.adapter import ModelResult as _MR
    from callgate.engine.core.decode import decode as _decode

    body = (FIXTURES / "gemini" / "function_call_with_id_gemini3flash.sse").read_bytes()
    outcome = _decode("gemini", [body])
    call = outcome.calls[0]
    (content,) = GEMINI.encode_results(
        outcome,
        [
            _MR(call.call_id, call.name, '{"error":{"code":"denied","message":"no"}}', True),
            _MR(call.call_id, call.name, '{"result":{"country":"FR"}}'),
        ],
    )
    err, ok = (p["functionResponse"]["response"] for p in content["parts"])
    assert err == {"error": {"code": "denied", "message": "no"}}
    assert ok == {"output": {"country": "FR"}}
