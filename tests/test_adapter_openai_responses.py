"""The OpenAI Responses adapter, decode side: every recorded stream decodes to the right
engine events (in all three feeding modes), and continuation items are the final
``output_item.done`` items. Synthetic streams and protocol violations are in
tests/test_adapter_openai_responses_protocol.py, the encode side in
tests/test_encode_openai_responses.py."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from callgate.adapters.openai_responses import ADAPTER, FINISH_REASONS
from callgate.engine.core.adapter import Adapter, load_adapter
from callgate.engine.core.decode import decode
from callgate.engine.core.events import (
    ArgumentsDelta,
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
from callgate.engine.core.outcome import OutcomeKind, Usage
from callgate.engine.core.sse import SSEDecoder

from .conftest import chunkings
from .openai_responses_helpers import FAMILY, dones, of, wire_events


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


def fixture(name: str) -> list[EngineEvent]:
    return run([(FAMILY / name).read_bytes()])


def joined_arguments(events: list[EngineEvent]) -> dict[int, str]:
    out: dict[int, str] = {}
    for ev in events:
        if isinstance(ev, ArgumentsDelta):
            out[ev.index] = out.get(ev.index, "") + ev.fragment
    return out


def check_call_order(events: list[EngineEvent]) -> None:
    """Fragments only for started calls and before their first done; every call done."""
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
    assert load_adapter("openai_responses") is ADAPTER
    assert isinstance(ADAPTER, Adapter)
    assert (ADAPTER.name, ADAPTER.family, ADAPTER.revision) == (
        "openai_responses",
        "openai_responses",
        "openai_responses/1",
    )
    assert ADAPTER.sse_unframed is False
    assert ADAPTER.finish_reasons is FINISH_REASONS


def test_terminal_reason_table() -> None:
    assert FINISH_REASONS == {
        "completed": OutcomeKind.FINAL_TEXT,
        "incomplete": OutcomeKind.TRUNCATED,
        "max_output_tokens": OutcomeKind.TRUNCATED,
        "content_filter": OutcomeKind.REFUSAL,
        "failed": OutcomeKind.FAILED,
        "cancelled": OutcomeKind.FAILED,
    }


# --- recorded streams ----------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(FAMILY.glob("*.sse")), ids=lambda p: p.name)
def test_every_feeding_mode_gives_the_same_events(path: Path) -> None:
    body = path.read_bytes()
    results = [run(chunks) for _, chunks in chunkings(body)]
    assert results[0] == results[1] == results[2]
    events = results[0]
    check_call_order(events)
    assert len(of(events, Completion)) == 1 and isinstance(events[-1], Completion)
    assert isinstance(events[0], ResponseMeta)
    # One continuation item per output_item.done, verbatim, in output order, except a
    # completed function call's arguments: they are the call's own bytes (the echo puts
    # them back), kept once rather than twice.
    wire = [ev for ev in wire_events(path.name) if ev["type"] == "response.output_item.done"]
    assert [(c.index, c.item) for c in of(events, ContinuationItem)] == [
        (ev["output_index"], _kept(ev["item"])) for ev in wire
    ]


def _kept(item: dict[str, Any]) -> dict[str, Any]:
    if item["type"] == "function_call" and item.get("status", "completed") == "completed":
        return {k: v for k, v in item.items() if k != "arguments"}
    return item


def test_single_function_call_without_sequence_numbers() -> None:
    events = fixture("single_function_call_gpt4o.sse")
    args = '{"country":"France"}'
    assert events[0] == ResponseMeta(
        "resp_67e554a155508191900ee113293c4c830794405d35281ae2", "gpt-4o-2024-08-06"
    )
    assert of(events, CallStarted) == [
        CallStarted(
            0,
            "get_capital",
            "call_kL0PCQV7M2WMoVX8V8OtYSAL",
            "fc_67e554a1de488191af0831d35cbe082e0794405d35281ae2",
        )
    ]
    assert joined_arguments(events) == {0: args}
    # arguments.done, then output_item.done repeats it (the assembler treats it as a no-op).
    assert dones(events) == [(0, args), (0, args)]
    assert events[-2:] == [
        UsageReport(
            Usage(input_tokens=255, output_tokens=16, reasoning_tokens=0, cached_input_tokens=0)
        ),
        Completion(OutcomeKind.FINAL_TEXT, "completed"),
    ]


def test_obfuscation_and_sequence_numbers_are_ignored() -> None:
    events = fixture("function_call_sequence_obfuscation.sse")
    assert [(c.name, c.call_id) for c in of(events, CallStarted)] == [
        ("multiply", "call_sVidsfFJ6zlzRpelrPkTPlpd")
    ]
    assert joined_arguments(events) == {0: '{"a":1231,"b":2331}'}
    assert dones(events)[0] == (0, '{"a":1231,"b":2331}')


def test_parallel_calls_after_a_reasoning_item() -> None:
    events = fixture("parallel_function_calls_with_reasoning.converted.sse")
    assert [(c.index, c.name, c.call_id) for c in of(events, CallStarted)] == [
        (1, "get_weather", "call_0xi8hXSApey3her10vjUIx0j"),
        (2, "get_weather", "call_8fhPkmx5g5wyqqsTFMvzVtJw"),
    ]
    assert joined_arguments(events) == {
        1: '{"location":"San Francisco, CA"}',
        2: '{"location":"New York, NY"}',
    }
    assert [(c.kind, c.index) for c in of(events, ContinuationItem)] == [
        ("reasoning", 0),
        ("function_call", 1),
        ("function_call", 2),
    ]
    assert of(events, UsageReport)[0].usage.reasoning_tokens == 576


def test_incomplete_max_output_tokens_is_truncation() -> None:
    events = fixture("incomplete_max_output_tokens.converted.sse")
    assert not of(events, CallStarted)
    assert [c.kind for c in of(events, ContinuationItem)] == ["reasoning"]
    assert events[-2:] == [
        UsageReport(
            Usage(input_tokens=38, output_tokens=64, reasoning_tokens=64, cached_input_tokens=0)
        ),
        Completion(OutcomeKind.TRUNCATED, "max_output_tokens"),
    ]


def test_nested_error_event_then_failed() -> None:
    events = fixture("error_then_failed_insufficient_quota.converted.sse")
    errors = of(events, ProviderError)
    assert len(errors) == 2  # the error event and response.failed
    for ev in errors:
        assert ev.error.code == "insufficient_quota"
        assert ev.error.message.startswith("You exceeded your current quota")
        assert ev.error.retryable is False
    assert events[-1] == Completion(OutcomeKind.FAILED, "insufficient_quota")


def test_encrypted_content_is_taken_from_output_item_done() -> None:
    name = "reasoning_encrypted_content_function_call.converted.sse"
    wire = wire_events(name)
    at_added = next(e for e in wire if e["type"] == "response.output_item.added")["item"]
    at_done = next(e for e in wire if e["type"] == "response.output_item.done")["item"]
    assert at_added["encrypted_content"] != at_done["encrypted_content"]  # the recording
    [reasoning] = [c for c in of(fixture(name), ContinuationItem) if c.kind == "reasoning"]
    assert reasoning.item["encrypted_content"] == at_done["encrypted_content"]
    assert reasoning.item == at_done


def test_reasoning_message_with_phase_and_call() -> None:
    events = fixture("reasoning_text_then_function_call.sse")
    text = "".join(ev.text for ev in of(events, TextDelta))
    assert text == "I’ll check the capital lookup tool for “PotatoLand.”"
    items = of(events, ContinuationItem)
    assert [(c.kind, c.index) for c in items] == [
        ("reasoning", 0),
        ("message", 1),
        ("function_call", 2),
    ]
    assert items[1].item["phase"] == "commentary"
    assert of(events, CallStarted)[0].index == 2


@pytest.mark.parametrize(
    ("name", "kind", "calls"),
    [
        ("single_function_call_gpt4o.sse", OutcomeKind.TOOL_PROPOSALS, ["get_capital"]),
        ("function_call_sequence_obfuscation.sse", OutcomeKind.TOOL_PROPOSALS, ["multiply"]),
        (
            "parallel_function_calls_with_reasoning.converted.sse",
            OutcomeKind.TOOL_PROPOSALS,
            ["get_weather", "get_weather"],
        ),
        ("incomplete_max_output_tokens.converted.sse", OutcomeKind.TRUNCATED, []),
        ("error_then_failed_insufficient_quota.converted.sse", OutcomeKind.FAILED, []),
        (
            "reasoning_encrypted_content_function_call.converted.sse",
            OutcomeKind.TOOL_PROPOSALS,
            ["calculator"],
        ),
        ("reasoning_text_then_function_call.sse", OutcomeKind.TOOL_PROPOSALS, ["get_capital"]),
        (
            "reasoning_then_function_call_final_result.sse",
            OutcomeKind.TOOL_PROPOSALS,
            ["final_result"],
        ),
    ],
)
def test_outcome_through_the_pipeline(name: str, kind: OutcomeKind, calls: list[str]) -> None:
    for _, chunks in chunkings((FAMILY / name).read_bytes()):
        outcome = decode("openai_responses", chunks)
        assert outcome.kind is kind, outcome.stop_reason
        assert [call.name for call in outcome.calls] == calls
        assert all(call.arguments is not None and call.error is None for call in outcome.calls)
