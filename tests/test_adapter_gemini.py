"""The Gemini generateContent adapter, decode side: every recorded stream decodes to the
right engine events (in all three feeding modes), and the Completion waits for the end of
the stream (an unframed error body may follow STOP). Parts, protocol violations and
buffer limits are in tests/test_adapter_gemini_parts.py, the encode side in
tests/test_encode_gemini.py."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from callgate.adapters.gemini import ADAPTER, FINISH_REASONS
from callgate.engine.core.adapter import Adapter, load_adapter
from callgate.engine.core.decode import decode
from callgate.engine.core.errors import StreamProtocolError
from callgate.engine.core.events import (
    CallDone,
    CallStarted,
    Completion,
    ContinuationItem,
    EngineEvent,
    ProviderError,
    ResponseMeta,
    TextDelta,
    UsageReport,
)
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits
from callgate.engine.core.outcome import OutcomeKind, ProviderErrorInfo, Usage
from callgate.engine.core.sse import SSEDecoder, SSEEvent

from .conftest import chunkings
from .gemini_helpers import FAMILY, STOP, candidate, joined_arguments, of, read, run_chunks


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


def recorded_chunks(name: str) -> list[dict[str, Any]]:
    """The recorded chunks as JSON, read independently of the adapter."""
    text = read(name).decode()
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line]


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
        UsageReport(
            Usage(input_tokens=29, output_tokens=212, reasoning_tokens=202)
        ),  # 10 + 202 thoughts
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
        UsageReport(Usage(input_tokens=37, output_tokens=96, reasoning_tokens=95))
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


def test_an_unframed_body_sent_line_by_line_is_decoded_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Decoding the held text on every line was O(n^2): seconds of a blocked event loop
    # for an open body sent one short line per event, well under max_event_bytes.
    from callgate.adapters import _gemini_unframed

    tries: list[int] = []
    real = _gemini_unframed.ERROR_DECODER

    class Counting:
        def decode(self, text: bytes) -> object:
            tries.append(len(text))
            return real.decode(text)

    monkeypatch.setattr(_gemini_unframed, "ERROR_DECODER", Counting())
    lines = 50_000  # ~200 KB: each line closes a bracket, the list never does
    stream = ADAPTER.new_stream(DEFAULT_LIMITS)
    out: list[EngineEvent] = []
    for data in [b"[{}", *([b",{}"] * lines)]:
        out += stream.decode(SSEEvent(event="", data=data, unframed=True))
    assert out == []
    # Linear: the eager first 4 KiB (a fixed ~2 MB of decoding), then the doubling.
    assert sum(tries) < 3 * 1024 * 1024 + 4 * 4 * lines
    with pytest.raises(StreamProtocolError, match="not a JSON error body"):
        stream.end()
