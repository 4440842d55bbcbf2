"""The OpenAI Chat Completions adapter, decode side: every recorded stream decodes to the
right engine events (in all three feeding modes). Synthetic streams and protocol
violations are in tests/test_adapter_openai_chat_protocol.py, the encode side in
tests/test_encode_openai_chat.py."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pytest

from callgate.adapters.openai_chat import ADAPTER, FINISH_REASONS
from callgate.engine.core.adapter import Adapter, load_adapter
from callgate.engine.core.decode import decode
from callgate.engine.core.events import (
    ArgumentsDelta,
    CallDone,
    CallStarted,
    Completion,
    EngineEvent,
    RefusalDelta,
    ResponseMeta,
    TextDelta,
    UsageReport,
)
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits
from callgate.engine.core.outcome import OutcomeKind, Usage
from callgate.engine.core.sse import SSEDecoder

from .conftest import chunkings
from .openai_chat_helpers import FAMILY, joined_arguments, of


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
