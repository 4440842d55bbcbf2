"""The Gemini generateContent adapter: every recorded stream decodes to the right engine
events (in all three feeding modes), Vertex streamed arguments are assembled into one
object, thought signatures are kept for the part they came on, the Completion waits for
the end of the stream (an unframed error body may follow STOP), protocol violations
raise, and the encode side produces the shapes PROVIDERS.md §4a gives."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from callgate.adapters.gemini import ADAPTER, FINISH_REASONS
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

FAMILY = FIXTURES / "gemini"


def run(chunks: Iterable[bytes], limits: Limits = DEFAULT_LIMITS) -> list[EngineEvent]:
    sse = SSEDecoder(limits, collect_unframed=True)
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


def recorded_chunks(name: str) -> list[dict[str, Any]]:
    """The recorded chunks as JSON, read independently of the adapter."""
    text = read(name).decode()
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line]


def candidate(*parts: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}}
    if finish is not None:
        cand["finishReason"] = finish
    return {"candidates": [cand]}


def run_chunks(
    *chunks: dict[str, Any] | SSEEvent, limits: Limits = DEFAULT_LIMITS
) -> list[EngineEvent]:
    stream = ADAPTER.new_stream(limits)
    out: list[EngineEvent] = []
    for chunk in chunks:
        event = chunk if isinstance(chunk, SSEEvent) else SSEEvent(data=json.dumps(chunk).encode())
        out.extend(stream.decode(event))
    out.extend(stream.end())
    return out


def fc(**fields: Any) -> dict[str, Any]:
    return {"functionCall": fields}


def piece(path: str, **value: Any) -> dict[str, Any]:
    return {"jsonPath": path, **value}


def streamed_call(name: str, *pieces: dict[str, Any]) -> list[dict[str, Any]]:
    """A Vertex streamed call: open, one chunk per piece, empty terminator."""
    return [
        candidate(fc(name=name, willContinue=True)),
        *(candidate(fc(partialArgs=[p], willContinue=True)) for p in pieces),
        candidate(fc()),
    ]


def of(events: list[EngineEvent], kind: type) -> list[Any]:
    return [ev for ev in events if isinstance(ev, kind)]


def joined_arguments(events: list[EngineEvent]) -> dict[int, str]:
    """Each call's argument text: streamed fragments, or the bytes of a whole call."""
    out: dict[int, str] = {}
    for ev in events:
        if isinstance(ev, ArgumentsDelta):
            out[ev.index] = out.get(ev.index, "") + ev.fragment
        elif isinstance(ev, CallDone) and ev.raw is not None:
            out[ev.index] = out.get(ev.index, "") + ev.raw.decode()
    return out


STOP = candidate({"text": ""}, finish="STOP")


# --- the adapter seam ----------------------------------------------------------------------


def test_adapter_is_registered_and_satisfies_the_protocol() -> None:
    assert load_adapter("gemini") is ADAPTER
    assert isinstance(ADAPTER, Adapter)
    assert (ADAPTER.name, ADAPTER.family, ADAPTER.revision) == (
        "gemini",
        "gemini_generate_content",
        "gemini/1",
    )
    assert ADAPTER.sse_unframed is True
    assert ADAPTER.finish_reasons is FINISH_REASONS


def test_finish_reason_table() -> None:
    refusal = {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
    }
    assert FINISH_REASONS["STOP"] is OutcomeKind.FINAL_TEXT
    assert FINISH_REASONS["MAX_TOKENS"] is OutcomeKind.TRUNCATED
    assert {r for r, k in FINISH_REASONS.items() if k is OutcomeKind.REFUSAL} == refusal
    for reason in (
        "MALFORMED_FUNCTION_CALL",
        "UNEXPECTED_TOOL_CALL",
        "TOO_MANY_TOOL_CALLS",
        "OTHER",
        "LANGUAGE",
        "FINISH_REASON_UNSPECIFIED",
    ):
        assert FINISH_REASONS[reason] is OutcomeKind.FAILED
    assert set(FINISH_REASONS.values()) <= {
        OutcomeKind.FINAL_TEXT,
        OutcomeKind.TRUNCATED,
        OutcomeKind.REFUSAL,
        OutcomeKind.FAILED,
    }


# --- recorded streams ----------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(FAMILY.glob("*.sse")), ids=lambda p: p.name)
def test_every_feeding_mode_gives_the_same_events(path: Path) -> None:
    body = path.read_bytes()
    results = [run(chunks) for _, chunks in chunkings(body)]
    assert results[0] == results[1] == results[2]
    started: list[int] = [ev.index for ev in of(results[0], CallStarted)]
    assert started == list(range(len(started)))  # a running call counter
    assert [ev.index for ev in of(results[0], CallDone)] == started
    assert of(results[0], Completion) == [results[0][-1]]


def test_whole_args_call_in_the_stop_chunk() -> None:
    events = run([read("single_function_call_gemini20.sse")])
    assert events == [
        ResponseMeta("1lpeaMTxIpW1nvgP-O3vwQY", "gemini-2.0-flash"),
        # No id on Gemini 2.0: the assembler derives one.
        CallStarted(0, "get_capital", call_id=None),
        # The exact bytes of `args`, whitespace included, with the done signal.
        CallDone(0, raw=b'{"country": "France"}'),
        UsageReport(Usage(input_tokens=52, output_tokens=5)),
        Completion(OutcomeKind.FINAL_TEXT, "STOP"),
    ]
    outcome = decode("gemini", [read("single_function_call_gemini20.sse")])
    assert outcome.kind is OutcomeKind.TOOL_PROPOSALS
    [call] = outcome.calls
    assert call.call_id_derived and call.arguments == {"country": "France"}


def test_thought_signature_on_the_call_part_then_empty_stop_chunk() -> None:
    name = "function_call_thought_signature_then_empty_stop_chunk.sse"
    sig = recorded_chunks(name)[0]["candidates"][0]["content"]["parts"][0]["thoughtSignature"]
    events = run([read(name)])
    assert events == [
        ResponseMeta("QUVVadTSNJ6_qtsPvN7J8Q0", "gemini-3-pro-preview"),
        CallStarted(0, "get_country", call_id=None),
        CallDone(0, raw=b"{}"),
        ContinuationItem("thought_signature", 0, {"thoughtSignature": sig}),
        UsageReport(Usage(input_tokens=29, output_tokens=10, reasoning_tokens=202)),
        Completion(OutcomeKind.FINAL_TEXT, "STOP"),
    ]


def test_gemini3_call_id_is_kept() -> None:
    events = run([read("function_call_with_id_gemini3flash.sse")])
    assert of(events, CallStarted) == [CallStarted(0, "get_user_country", call_id="96c1su3s")]
    assert [item.kind for item in of(events, ContinuationItem)] == ["thought_signature"]
    # The second chunk repeats the same usage: reported once.
    assert len(of(events, UsageReport)) == 1


def test_max_tokens() -> None:
    events = run([read("max_tokens.converted.sse")])
    assert of(events, TextDelta) == [TextDelta("Let")]
    assert events[-1] == Completion(OutcomeKind.TRUNCATED, "MAX_TOKENS")
    assert of(events, UsageReport) == [
        UsageReport(Usage(input_tokens=37, output_tokens=1, reasoning_tokens=95))
    ]


def test_vertex_streamed_arguments_two_calls() -> None:
    events = run([read("vertex_partial_args_two_calls.converted.sse")])
    assert of(events, CallStarted) == [
        CallStarted(0, "getWeather", call_id=None),
        CallStarted(1, "getWeather", call_id=None),
    ]
    assert joined_arguments(events) == {
        0: '{"location":"Boston"}',
        1: '{"location":"San Francisco"}',
    }
    items = of(events, ContinuationItem)
    assert [(item.kind, item.index) for item in items] == [("thought_signature", 0)]
    assert items[0].item["thoughtSignature"].startswith("CiMBjz1rX25KieIB4d4")
    outcome = decode("gemini", [read("vertex_partial_args_two_calls.converted.sse")])
    assert outcome.kind is OutcomeKind.TOOL_PROPOSALS
    assert [c.arguments for c in outcome.calls] == [
        {"location": "Boston"},
        {"location": "San Francisco"},
    ]


def test_vertex_four_calls_with_a_no_args_call_and_a_thought() -> None:
    name = "vertex_partial_args_four_calls_incl_no_args.converted.sse"
    thought = recorded_chunks(name)[0]["candidates"][0]["content"]["parts"][0]["text"]
    events = run([read(name)])
    assert [(ev.index, ev.name) for ev in of(events, CallStarted)] == [
        (0, "read_theme"),
        (1, "read_screen"),
        (2, "read_screen"),
        (3, "read_screen"),
    ]
    # read_theme has neither args nor willContinue: no fragment, which means {}.
    assert joined_arguments(events) == {1: '{"id":"A"}', 2: '{"id":"B"}', 3: '{"id":"C"}'}
    items = of(events, ContinuationItem)
    assert items[0] == ContinuationItem("thought", 0, {"text": thought, "thought": True})
    assert (items[1].kind, items[1].index) == ("thought_signature", 0)
    assert not of(events, TextDelta)  # thought text is not assistant text
    outcome = decode("gemini", [read(name)])
    assert [c.arguments for c in outcome.calls] == [{}, {"id": "A"}, {"id": "B"}, {"id": "C"}]


# --- end of stream and errors --------------------------------------------------------------


def test_completion_waits_for_the_end_of_the_stream() -> None:
    stream = ADAPTER.new_stream(DEFAULT_LIMITS)
    events = stream.decode(SSEEvent(data=json.dumps(STOP).encode()))
    assert not of(events, Completion)
    assert stream.end() == [Completion(OutcomeKind.FINAL_TEXT, "STOP")]


def test_no_finish_reason_means_no_completion() -> None:
    events = run_chunks(candidate({"text": "partial"}))
    assert not of(events, Completion)
    assert decode(
        "gemini", [b'data: {"candidates":[{"content":{"parts":[{"text":"a"}]}}]}\r\n\r\n']
    ).kind is (OutcomeKind.TRUNCATED)


UNFRAMED_AFTER_STOP = (
    b'data: {"candidates": [{"content": {"parts": [{"text": "Hi"}],"role": "model"},'
    b'"finishReason": "STOP","index": 0}],"responseId": "r1","modelVersion": "gemini-x"}\r\n\r\n'
    b'{"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}\n'
)


def test_unframed_error_after_stop_fails_the_turn() -> None:
    for _, chunks in chunkings(UNFRAMED_AFTER_STOP):
        events = run(chunks)
        assert (
            ProviderError(
                ProviderErrorInfo(
                    code="UNAVAILABLE",
                    message="The model is overloaded.",
                    status=503,
                    retryable=True,
                )
            )
            in events
        )
    outcome = decode("gemini", [UNFRAMED_AFTER_STOP])
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.error is not None and outcome.error.retryable
    assert outcome.text == "Hi"


def test_pretty_printed_unframed_error_body() -> None:
    body = (
        b'data: {"candidates":[{"content":{"parts":[{"text":"x"}]},"finishReason":"STOP"}]}\r\n\r\n'
        b'{\n  "error": {\n    "code": 400,\n    "message": "bad",\n'
        b'    "status": "INVALID_ARGUMENT"\n  }\n}\n'
    )
    outcome = decode("gemini", [body])
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.error == ProviderErrorInfo(code="INVALID_ARGUMENT", message="bad", status=400)
    # The same body split one line per unframed event is reassembled.
    stream = ADAPTER.new_stream(DEFAULT_LIMITS)
    out: list[EngineEvent] = []
    for line in body.split(b"\r\n\r\n")[1].splitlines():
        out += stream.decode(SSEEvent(event="", data=line, unframed=True))
    assert of(out, ProviderError)[0].error.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        ({"code": 429, "status": "RESOURCE_EXHAUSTED"}, True),
        ({"code": 500, "status": "INTERNAL"}, True),
        ({"code": 503}, True),
        ({"code": 400, "status": "INVALID_ARGUMENT"}, False),
        ({"code": 403, "status": "PERMISSION_DENIED"}, False),
    ],
)
def test_error_retryability(error: dict[str, Any], retryable: bool) -> None:
    [event] = run_chunks({"error": {**error, "message": "m"}})
    assert isinstance(event, ProviderError) and event.error.retryable is retryable


@pytest.mark.parametrize(
    "text",
    [b"garbage", b'{"candidates": []}', b"[1, 2]"],
    ids=["not-json", "not-an-error", "array-without-error"],
)
def test_unframed_text_that_is_not_an_error_body_raises(text: bytes) -> None:
    with pytest.raises(StreamProtocolError):
        run_chunks(SSEEvent(event="", data=text, unframed=True))


def test_unframed_body_that_never_completes_raises_at_end() -> None:
    with pytest.raises(StreamProtocolError):
        run_chunks(SSEEvent(event="", data=b'{"error": {', unframed=True))


def test_blocked_prompt_is_a_refusal() -> None:
    events = run_chunks({"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {}})
    assert events == [Completion(OutcomeKind.REFUSAL, "SAFETY")]


def test_unknown_finish_reason_is_failed_with_the_raw_reason() -> None:
    events = run_chunks(candidate({"text": "x"}, finish="NEW_REASON"))
    assert events[-1] == Completion(OutcomeKind.FAILED, "NEW_REASON")


# --- parts ---------------------------------------------------------------------------------


def test_consecutive_thoughts_merge_and_a_signature_closes_the_thought() -> None:
    events = run_chunks(
        candidate({"text": "a", "thought": True}),
        candidate({"text": "b", "thought": True, "thoughtSignature": "S1"}),
        candidate({"text": "c", "thought": True}),
        candidate({"text": "answer", "thoughtSignature": "S2"}),
        STOP,
    )
    assert of(events, ContinuationItem) == [
        ContinuationItem("thought", 0, {"text": "ab", "thought": True, "thoughtSignature": "S1"}),
        ContinuationItem("thought", 2, {"text": "c", "thought": True}),
        ContinuationItem("text_signature", 3, {"thoughtSignature": "S2"}),
    ]
    assert of(events, TextDelta) == [TextDelta("answer")]


def test_other_part_kinds_become_provider_details() -> None:
    code = {"language": "PYTHON", "code": "print(1)"}
    events = run_chunks(candidate({"executableCode": code}), STOP)
    assert ProviderDetail("gemini_part", {"executableCode": code}) in events


def test_usage_is_reported_only_when_it_changes() -> None:
    usage = {"promptTokenCount": 1, "candidatesTokenCount": 2}
    events = run_chunks(
        {**candidate({"text": "a"}), "usageMetadata": usage},
        {**candidate({"text": "b"}), "usageMetadata": usage},
        {
            **STOP,
            "usageMetadata": {**usage, "candidatesTokenCount": 3, "cachedContentTokenCount": 1},
        },
    )
    assert of(events, UsageReport) == [
        UsageReport(Usage(input_tokens=1, output_tokens=2)),
        UsageReport(Usage(input_tokens=1, output_tokens=3, cached_input_tokens=1)),
    ]


def test_vertex_nested_paths_and_scalar_values() -> None:
    events = run_chunks(
        *streamed_call(
            "f",
            piece("$.place.city", stringValue="Bos", willContinue=True),
            piece("$.place.city", stringValue="ton"),
            piece("$.tags[0]", stringValue="a"),
            piece("$.tags[1]", stringValue="b"),
            piece("$.days", numberValue=3),
            piece("$.ratio", numberValue=0.5),
            piece("$.metric", boolValue=False),
            piece("$.note", nullValue=None),
            piece("$.rows[0].id", numberValue=7),
        ),
        STOP,
    )
    [(index, text)] = joined_arguments(events).items()
    assert index == 0
    assert json.loads(text) == {
        "place": {"city": "Boston"},
        "tags": ["a", "b"],
        "days": 3,
        "ratio": 0.5,
        "metric": False,
        "note": None,
        "rows": [{"id": 7}],
    }
    assert [ev.index for ev in of(events, CallDone)] == [0]


def test_vertex_call_cut_before_its_terminator_stays_open() -> None:
    events = run_chunks(*streamed_call("f", piece("$.a", stringValue="x"))[:-1], STOP)
    assert of(events, CallStarted) == [CallStarted(0, "f")]
    assert not of(events, CallDone) and not of(events, ArgumentsDelta)


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param([SSEEvent(data=b"{nope")], id="bad-json"),
        pytest.param(
            [candidate(fc(partialArgs=[piece("$.a", stringValue="x")]))],
            id="piece-without-open-call",
        ),
        pytest.param([candidate(fc())], id="terminator-without-open-call"),
        pytest.param(
            [candidate(fc(name="f", willContinue=True)), candidate(fc(name="g", args={}))],
            id="new-call-while-streaming",
        ),
        pytest.param(
            [candidate(fc(name="f", willContinue=True, args={"a": 1}))], id="args-and-continue"
        ),
        pytest.param(
            [candidate(fc(name="f", partialArgs=[piece("$.a", stringValue="x")]))],
            id="pieces-without-continue",
        ),
        pytest.param(streamed_call("f", piece("$['a']", stringValue="x")), id="quoted-path"),
        pytest.param(streamed_call("f", piece("a", stringValue="x")), id="path-without-root"),
        pytest.param(streamed_call("f", piece("$", stringValue="x")), id="root-path"),
        pytest.param(streamed_call("f", piece("$.a[*]", stringValue="x")), id="wildcard"),
        pytest.param(streamed_call("f", piece("$.a[1]", stringValue="x")), id="skipped-index"),
        pytest.param(
            streamed_call("f", piece("$.a", stringValue="x"), piece("$.a.b", stringValue="y")),
            id="scalar-then-object",
        ),
        pytest.param(
            streamed_call("f", piece("$.a.b", stringValue="x"), piece("$.a", stringValue="y")),
            id="object-then-scalar",
        ),
        pytest.param(
            streamed_call("f", piece("$.a", stringValue="x"), piece("$.a", stringValue="y")),
            id="string-repeated-after-end",
        ),
        pytest.param(
            streamed_call("f", piece("$.a", numberValue=1), piece("$.a", numberValue=2)),
            id="number-repeated",
        ),
        pytest.param(streamed_call("f", piece("$.a")), id="piece-without-value"),
        pytest.param(
            streamed_call("f", piece("$.a[0]", stringValue="x"), piece("$.a.b", stringValue="y")),
            id="array-then-key",
        ),
    ],
)
def test_protocol_violations_raise(chunks: list[Any]) -> None:
    with pytest.raises(StreamProtocolError):
        run_chunks(*chunks)


# --- limits on what the adapter buffers ----------------------------------------------------


def test_streamed_arguments_are_capped() -> None:
    limits = Limits(max_call_argument_bytes=12)
    ok = [piece("$.ab", stringValue="1234", willContinue=True), piece("$.ab", stringValue="1234")]
    run_chunks(*streamed_call("f", *ok), limits=limits)  # 4 + 4 + 4 bytes: exactly the cap
    with pytest.raises(LimitExceeded) as info:
        run_chunks(*streamed_call("f", *ok, piece("$.c", stringValue="")), limits=limits)
    assert info.value.limit == "max_call_argument_bytes"


def test_streamed_argument_depth_is_capped() -> None:
    with pytest.raises(LimitExceeded) as info:
        run_chunks(
            *streamed_call("f", piece("$.a.b.c", numberValue=1)), limits=Limits(max_json_depth=2)
        )
    assert info.value.limit == "max_json_depth"


def test_thought_text_is_capped() -> None:
    with pytest.raises(LimitExceeded) as info:
        run_chunks(
            candidate({"text": "12345", "thought": True}),
            candidate({"text": "6é", "thought": True}),
            limits=Limits(max_call_argument_bytes=7),
        )
    assert info.value.limit == "max_call_argument_bytes"


def test_continuation_items_are_capped() -> None:
    parts = [{"text": "", "thoughtSignature": f"S{i}"} for i in range(3)]
    run_chunks(candidate(*parts[:2]), limits=Limits(max_continuation_items=2))
    with pytest.raises(LimitExceeded) as info:
        run_chunks(candidate(*parts), limits=Limits(max_continuation_items=2))
    assert info.value.limit == "max_continuation_items"


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
                            "parameters": {"type": "object"},
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
