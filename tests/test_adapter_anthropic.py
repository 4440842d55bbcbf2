"""The Anthropic Messages adapter: every recorded stream decodes to the right engine events
(in all three feeding modes), non-tool blocks come back whole as continuation items,
protocol violations raise, buffers are capped, and the encode side produces the shapes
PROVIDERS.md §3 gives for the follow-up request."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from callgate.adapters.anthropic import ADAPTER, FINISH_REASONS
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

FAMILY = FIXTURES / "anthropic"


def body_of(name: str) -> bytes:
    """A recorded body, with a final blank line where the recording lacks one.

    Three SDK fixture files end right after the last ``data:`` line; per the SSE spec an
    unterminated event is discarded at end of stream, which would hide ``message_stop``.
    The adapter's behaviour is what these tests pin, so the frame is terminated here."""
    body = (FAMILY / name).read_bytes()
    return body if body.endswith(b"\n\n") else body.rstrip(b"\n") + b"\n\n"


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


def frame(kind: str, **fields: Any) -> SSEEvent:
    return SSEEvent(event=kind, data=json.dumps({"type": kind, **fields}).encode())


START = frame("message_start", message={"id": "msg_1", "model": "claude-x", "usage": {}})


def run_events(*events: SSEEvent, limits: Limits = DEFAULT_LIMITS) -> list[EngineEvent]:
    stream = ADAPTER.new_stream(limits)
    out: list[EngineEvent] = []
    for event in events:
        out.extend(stream.decode(event))
    out.extend(stream.end())
    return out


def block_start(index: int, **block: Any) -> SSEEvent:
    return frame("content_block_start", index=index, content_block=block)


def block_delta(index: int, **delta: Any) -> SSEEvent:
    return frame("content_block_delta", index=index, delta=delta)


def stop_with(reason: str | None) -> list[SSEEvent]:
    return [
        frame("message_delta", delta={"stop_reason": reason}, usage={"output_tokens": 3}),
        frame("message_stop"),
    ]


def of(events: list[EngineEvent], kind: type) -> list[Any]:
    return [ev for ev in events if isinstance(ev, kind)]


def joined_arguments(events: list[EngineEvent]) -> dict[int, str]:
    out: dict[int, str] = {}
    for ev in of(events, ArgumentsDelta):
        out[ev.index] = out.get(ev.index, "") + ev.fragment
    return out


def recorded_signature(name: str) -> str:
    """The signature_delta value in a recording, read independently of the adapter."""
    for line in (FAMILY / name).read_text().splitlines():
        if '"signature_delta"' in line:
            return str(json.loads(line[len("data: ") :])["delta"]["signature"])
    raise AssertionError("no signature_delta in the recording")


# --- the adapter seam ----------------------------------------------------------------------


def test_adapter_is_registered_and_satisfies_the_protocol() -> None:
    assert load_adapter("anthropic") is ADAPTER
    assert isinstance(ADAPTER, Adapter)
    assert (ADAPTER.name, ADAPTER.family, ADAPTER.revision) == (
        "anthropic",
        "anthropic_messages",
        "anthropic/1",
    )
    assert ADAPTER.sse_unframed is False
    assert ADAPTER.finish_reasons is FINISH_REASONS


def test_stop_reason_table() -> None:
    assert FINISH_REASONS == {
        "end_turn": OutcomeKind.FINAL_TEXT,
        "stop_sequence": OutcomeKind.FINAL_TEXT,
        "tool_use": OutcomeKind.TOOL_PROPOSALS,
        "max_tokens": OutcomeKind.TRUNCATED,
        "model_context_window_exceeded": OutcomeKind.TRUNCATED,
        "refusal": OutcomeKind.REFUSAL,
        "pause_turn": OutcomeKind.PAUSED,
    }


# --- recorded streams ----------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(FAMILY.glob("*.sse")), ids=lambda p: p.name)
def test_every_feeding_mode_gives_the_same_events(path: Path) -> None:
    body = body_of(path.name)
    results = [run(chunks) for _, chunks in chunkings(body)]
    assert results[0] == results[1] == results[2]
    started: set[int] = set()
    for ev in results[0]:
        if isinstance(ev, CallStarted):
            assert ev.index not in started
            started.add(ev.index)
        elif isinstance(ev, (ArgumentsDelta, CallDone)):
            assert ev.index in started
    # At most one Completion, and nothing after it.
    completions = of(results[0], Completion)
    assert len(completions) <= 1
    if completions:
        assert results[0][-1] is completions[0]


def test_text_then_tool_use() -> None:
    events = run([body_of("text_then_tool_use.sse")])
    text = "I'll check the current weather in Paris for you."
    assert events == [
        ResponseMeta("msg_019Q1hrJbZG26Fb9BQhrkHEr", "claude-sonnet-4-20250514"),
        UsageReport(Usage(input_tokens=377, cached_input_tokens=0)),
        TextDelta("I"),
        TextDelta("'ll check the current weather in Paris for you."),
        ContinuationItem("text", 0, {"type": "text", "text": text}),
        CallStarted(1, "get_weather", call_id="toolu_01NRLabsLyVHZPKxbKvkfSMn"),
        # The leading "" fragment is dropped; the joined text is unchanged.
        ArgumentsDelta(1, '{"locati'),
        ArgumentsDelta(1, 'on": "P'),
        ArgumentsDelta(1, "ar"),
        ArgumentsDelta(1, 'is"}'),
        CallDone(1),
        # Merged count by count with message_start's (the delta repeats only output).
        UsageReport(Usage(input_tokens=377, output_tokens=65, cached_input_tokens=0)),
        Completion(OutcomeKind.TOOL_PROPOSALS, "tool_use"),
    ]


def test_parallel_no_argument_tool_uses() -> None:
    events = run([body_of("parallel_tool_use_no_args.sse")])
    assert of(events, CallStarted) == [
        CallStarted(0, "pelican_name_generator", call_id="toolu_01LtHJmixrs9NcWQkK8hu8hj"),
        CallStarted(1, "pelican_name_generator", call_id="toolu_01N8a4jWyf116qKTMqKKmjyt"),
    ]
    # Only "" was sent: no fragment at all, which the assembler reads as {}.
    assert joined_arguments(events) == {}
    assert of(events, CallDone) == [CallDone(0), CallDone(1)]
    assert events[-1] == Completion(OutcomeKind.TOOL_PROPOSALS, "tool_use")
    outcome = decode("anthropic", [body_of("parallel_tool_use_no_args.sse")])
    assert outcome.kind is OutcomeKind.TOOL_PROPOSALS
    assert [c.arguments for c in outcome.calls] == [{}, {}]


def test_thinking_block_is_kept_whole_with_its_signature() -> None:
    name = "thinking_signature_then_tool_use.sse"
    events = run([body_of(name)])
    items = of(events, ContinuationItem)
    assert items == [
        ContinuationItem(
            "thinking",
            0,
            {
                "type": "thinking",
                "thinking": "The user wants me to:\n1. Use the fixed_version tool\n2. Tell them "
                "the version\n3. Make a short joke about it\n\nLet me first call the "
                "fixed_version tool to see what version it returns.",
                "signature": recorded_signature(name),
            },
        )
    ]
    assert not of(events, TextDelta)  # thinking is never assistant text
    assert of(events, CallStarted) == [
        CallStarted(1, "fixed_version", call_id="toolu_01825dXWLSoJwCst1qTsiWdb")
    ]
    assert events[-1] == Completion(OutcomeKind.TOOL_PROPOSALS, "tool_use")


def test_max_tokens_mid_tool_input_leaves_the_call_open() -> None:
    events = run([body_of("max_tokens_mid_tool_input.sse")])
    assert of(events, CallStarted) == [
        CallStarted(1, "make_file", call_id="toolu_01EKqbqmZrGRXy18eN7m9kvY")
    ]
    assert not of(events, CallDone)
    assert joined_arguments(events)[1].startswith('{"filename": "taxes.txt", "lines_of_text": [')
    assert events[-1] == Completion(OutcomeKind.TRUNCATED, "max_tokens")
    outcome = decode("anthropic", [body_of("max_tokens_mid_tool_input.sse")])
    assert outcome.kind is OutcomeKind.TRUNCATED and outcome.raw_reason == "max_tokens"
    assert outcome.calls == () and [c.index for c in outcome.incomplete_calls] == [1]


def test_pause_turn_keeps_every_server_block_in_index_order() -> None:
    events = run([body_of("pause_turn_web_search.trimmed.sse")])
    items = of(events, ContinuationItem)
    assert [item.index for item in items] == list(range(25))
    kinds = [item.kind for item in items]
    assert kinds[0] == "thinking" and kinds.count("text") == 3
    assert kinds.count("server_tool_use") == 11 and kinds.count("web_search_tool_result") == 10
    # Server tool input is built from its input_json_delta fragments and parsed.
    last = items[24].item
    assert last == {
        "type": "server_tool_use",
        "id": "srvtoolu_01NKrV3hGbcHeBVtaTKBHRuA",
        "name": "web_search",
        "input": {"query": "latest news on the air quality in San Francisco today"},
    }
    # Result blocks arrive whole in content_block_start and are kept verbatim.
    result = items[20].item
    assert result["type"] == "web_search_tool_result"
    assert result["tool_use_id"] == "srvtoolu_01Ewz8JuxwuYL5wDNADGeEFL"
    assert result["content"][0]["encrypted_content"].endswith("...TRIMMED")
    assert items[0].item["signature"].startswith("EuwJCm4IDxgCKkBjID0")
    assert not of(events, CallStarted)  # server tools are not client calls
    assert events[-1] == Completion(OutcomeKind.PAUSED, "pause_turn")


def test_refusal_keeps_stop_details() -> None:
    events = run([body_of("refusal_stop_details.synthetic.sse")])
    assert (
        ProviderDetail(
            "stop_details",
            {
                "type": "refusal",
                "category": "cyber",
                "explanation": "This request was refused due to policy.",
            },
        )
        in events
    )
    assert events[-1] == Completion(OutcomeKind.REFUSAL, "refusal")
    outcome = decode("anthropic", [body_of("refusal_stop_details.synthetic.sse")])
    assert outcome.kind is OutcomeKind.REFUSAL and outcome.raw_reason == "refusal"


def test_in_stream_error_event() -> None:
    events = run([body_of("error_overloaded.docs-example.sse")])
    assert events == [
        ProviderError(
            ProviderErrorInfo(code="overloaded_error", message="Overloaded", retryable=True)
        )
    ]
    outcome = decode("anthropic", [body_of("error_overloaded.docs-example.sse")])
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.error is not None and outcome.error.code == "overloaded_error"


@pytest.mark.parametrize(
    ("code", "retryable"),
    [
        ("overloaded_error", True),
        ("api_error", True),
        ("rate_limit_error", True),
        ("invalid_request_error", False),
        ("authentication_error", False),
    ],
)
def test_error_retryability(code: str, retryable: bool) -> None:
    [event] = run_events(frame("error", error={"type": code, "message": "m"}))
    assert event == ProviderError(ProviderErrorInfo(code=code, message="m", retryable=retryable))


def test_outcomes_through_decode() -> None:
    expected = {
        "text_then_tool_use.sse": (OutcomeKind.TOOL_PROPOSALS, "tool_use"),
        "single_tool_use_no_args.sse": (OutcomeKind.TOOL_PROPOSALS, "tool_use"),
        "thinking_signature_then_tool_use.sse": (OutcomeKind.TOOL_PROPOSALS, "tool_use"),
        "pause_turn_web_search.trimmed.sse": (OutcomeKind.PAUSED, "pause_turn"),
    }
    for name, (kind, raw) in expected.items():
        outcome = decode("anthropic", [body_of(name)])
        assert (outcome.kind, outcome.raw_reason) == (kind, raw), name
    outcome = decode("anthropic", [body_of("text_then_tool_use.sse")])
    assert outcome.response_id == "msg_019Q1hrJbZG26Fb9BQhrkHEr"
    assert outcome.text == "I'll check the current weather in Paris for you."
    [call] = outcome.calls
    assert (call.call_id, call.name, call.arguments) == (
        "toolu_01NRLabsLyVHZPKxbKvkfSMn",
        "get_weather",
        {"location": "Paris"},
    )
    assert outcome.usage == Usage(input_tokens=377, output_tokens=65, cached_input_tokens=0)


def test_initial_text_in_block_start_and_citations_are_kept() -> None:
    citation = {"type": "char_location", "cited_text": "x"}
    events = run_events(
        START,
        block_start(0, type="text", text="Hello"),
        block_delta(0, type="text_delta", text=" world"),
        block_delta(0, type="citations_delta", citation=citation),
        frame("content_block_stop", index=0),
        *stop_with("end_turn"),
    )
    assert of(events, TextDelta) == [TextDelta("Hello"), TextDelta(" world")]
    assert of(events, ContinuationItem) == [
        ContinuationItem(
            "text", 0, {"type": "text", "text": "Hello world", "citations": [citation]}
        )
    ]
    assert events[-1] == Completion(OutcomeKind.FINAL_TEXT, "end_turn")


def test_citations_count_against_the_continuation_cap() -> None:
    # Citations were held uncounted (64 MB held past every 16 MiB cap; a MemoryError
    # under a 1 GiB address-space limit): they are buffered content like any other.
    citation = {"type": "char_location", "cited_text": "x" * 100}
    size = len(json.dumps(citation))  # as frame() encodes it
    deltas = [block_delta(0, type="citations_delta", citation=citation)] * 4

    def fits_in(cap: int, *events: SSEEvent) -> bool:
        try:
            run_events(
                START,
                block_start(0, type="text", text=""),
                *events,
                limits=Limits(max_continuation_bytes=cap),
            )
        except LimitExceeded:
            return False
        return True

    base = next(cap for cap in range(4096) if fits_in(cap))  # the block's own share
    assert fits_in(base + 4 * size, *deltas) and not fits_in(base + 4 * size - 1, *deltas)
    out = run_events(
        START, block_start(0, type="text", text=""), *deltas, frame("content_block_stop", index=0)
    )
    [item] = of(out, ContinuationItem)
    assert item.item["citations"] == [citation] * 4
    with pytest.raises(StreamProtocolError, match="citation is not an object"):
        run_events(
            START, block_start(0, type="text"), block_delta(0, type="citations_delta", citation=[1])
        )


def test_redacted_thinking_and_unknown_blocks_pass_through() -> None:
    events = run_events(
        START,
        block_start(0, type="redacted_thinking", data="opaque"),
        frame("content_block_stop", index=0),
        block_start(1, type="future_block", payload={"a": 1}),
        frame("content_block_stop", index=1),
        frame("future_event", whatever=True),
        *stop_with("end_turn"),
    )
    assert of(events, ContinuationItem) == [
        ContinuationItem("redacted_thinking", 0, {"type": "redacted_thinking", "data": "opaque"}),
        ContinuationItem("future_block", 1, {"type": "future_block", "payload": {"a": 1}}),
    ]


def test_unknown_stop_reason_is_failed_with_the_raw_reason() -> None:
    events = run_events(START, *stop_with("brand_new_reason"))
    assert events[-1] == Completion(OutcomeKind.FAILED, "brand_new_reason")


# --- protocol violations -------------------------------------------------------------------

TOOL = block_start(0, type="tool_use", id="toolu_1", name="f", input={})


@pytest.mark.parametrize(
    "events",
    [
        pytest.param([SSEEvent(event="message_start", data=b"{not json")], id="bad-json"),
        pytest.param([SSEEvent(event="x", data=b'{"index":0}')], id="no-type"),
        pytest.param([START, START], id="second-message-start"),
        pytest.param([TOOL], id="block-before-message-start"),
        pytest.param([START, frame("message_stop")], id="stop-without-reason"),
        pytest.param([START, *stop_with("end_turn"), START], id="event-after-stop"),
        pytest.param([START, TOOL, TOOL], id="block-started-twice"),
        pytest.param(
            [START, block_delta(3, type="text_delta", text="x")], id="delta-for-unknown-block"
        ),
        pytest.param(
            [START, TOOL, frame("content_block_stop", index=0), block_delta(0, type="x")],
            id="delta-after-stop",
        ),
        pytest.param([START, frame("content_block_stop", index=0)], id="stop-unknown-block"),
        pytest.param(
            [START, TOOL, block_delta(0, type="text_delta", text="x")], id="text-into-tool-use"
        ),
        pytest.param(
            [
                START,
                block_start(0, type="text", text=""),
                block_delta(0, type="thinking_delta", thinking="x"),
            ],
            id="thinking-into-text",
        ),
        pytest.param(
            [
                START,
                block_start(0, type="text", text=""),
                block_delta(0, type="input_json_delta", partial_json="{"),
            ],
            id="json-into-text",
        ),
        pytest.param([START, TOOL, block_delta(0, type="mystery_delta")], id="unknown-delta-type"),
        pytest.param(
            [START, block_start(0, type="tool_use", id="toolu_1", input={})], id="tool-no-name"
        ),
        pytest.param(
            [
                START,
                block_start(0, type="server_tool_use", id="s", name="web_search", input={}),
                block_delta(0, type="input_json_delta", partial_json='{"q": '),
                frame("content_block_stop", index=0),
            ],
            id="server-tool-input-not-json",
        ),
    ],
)
def test_protocol_violations_raise(events: list[SSEEvent]) -> None:
    with pytest.raises(StreamProtocolError):
        run_events(*events)


def test_ping_and_padding_are_harmless() -> None:
    stream = ADAPTER.new_stream(DEFAULT_LIMITS)
    assert stream.decode(SSEEvent(event="ping", data=b'{"type": "ping"}')) == []
    padded = b'{"type":"message_start","message":{"id":"m","model":"c"}}          '
    assert stream.decode(SSEEvent(event="message_start", data=padded)) == [ResponseMeta("m", "c")]


# --- limits on what the adapter buffers ----------------------------------------------------


def test_thinking_text_is_capped() -> None:
    limits = Limits(max_call_argument_bytes=10)
    events = [
        START,
        block_start(0, type="thinking", thinking="", signature=""),
        block_delta(0, type="thinking_delta", thinking="123456"),
        block_delta(0, type="thinking_delta", thinking="7890é"),  # 6 bytes: 12 in total
    ]
    with pytest.raises(LimitExceeded) as info:
        run_events(*events, limits=limits)
    assert info.value.limit == "max_call_argument_bytes"
    # Exactly at the cap is accepted.
    run_events(*events[:3], block_delta(0, type="thinking_delta", thinking="7890"), limits=limits)


def test_number_of_buffered_blocks_is_capped() -> None:
    limits = Limits(max_continuation_items=2)
    blocks = []
    for i in range(3):
        blocks += [block_start(i, type="text", text=""), frame("content_block_stop", index=i)]
    with pytest.raises(LimitExceeded) as info:
        run_events(START, *blocks, limits=limits)
    assert info.value.limit == "max_continuation_items"
    run_events(START, *blocks[:4], limits=limits)


def test_buffered_text_is_capped() -> None:
    limits = Limits(max_text_bytes=4)
    with pytest.raises(LimitExceeded) as info:
        run_events(
            START,
            block_start(0, type="text", text="abc"),
            block_delta(0, type="text_delta", text="de"),
            limits=limits,
        )
    assert info.value.limit == "max_text_bytes"


# --- encode side ---------------------------------------------------------------------------


def test_initial_messages() -> None:
    assert ADAPTER.initial_messages("hi") == [{"role": "user", "content": "hi"}]


def test_echo_puts_thinking_with_signature_before_the_tool_use() -> None:
    name = "thinking_signature_then_tool_use.sse"
    outcome = decode("anthropic", [body_of(name)])
    [message] = ADAPTER.assistant_echo(outcome)
    assert message["role"] == "assistant"
    content = message["content"]
    assert isinstance(content, list)
    assert [block["type"] for block in content] == ["thinking", "tool_use"]
    assert content[0]["signature"] == recorded_signature(name)
    assert content[0]["thinking"].startswith("The user wants me to:")
    assert content[1] == {
        "type": "tool_use",
        "id": "toolu_01825dXWLSoJwCst1qTsiWdb",
        "name": "fixed_version",
        "input": {},
    }


def test_echo_text_then_tool_use_with_parsed_input() -> None:
    outcome = decode("anthropic", [body_of("text_then_tool_use.sse")])
    assert ADAPTER.assistant_echo(outcome) == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "I'll check the current weather in Paris for you."},
                {
                    "type": "tool_use",
                    "id": "toolu_01NRLabsLyVHZPKxbKvkfSMn",
                    "name": "get_weather",
                    "input": {"location": "Paris"},
                },
            ],
        }
    ]


def test_echo_of_a_paused_turn_replays_every_block_and_skips_empty_text() -> None:
    outcome = decode("anthropic", [body_of("pause_turn_web_search.trimmed.sse")])
    assert outcome.kind is OutcomeKind.PAUSED
    [message] = ADAPTER.assistant_echo(outcome)
    content = message["content"]
    assert isinstance(content, list)
    expected = [item.item for item in outcome.continuation if item.item.get("text", "x") != ""]
    assert content == expected
    assert content[0]["type"] == "thinking"
    assert content[-1]["type"] == "server_tool_use"
    assert all(block.get("text", "x") for block in content)


def test_echo_of_an_empty_turn_is_nothing() -> None:
    outcome = decode("anthropic", [body_of("refusal_stop_details.synthetic.sse")])
    assert ADAPTER.assistant_echo(outcome) == []


def test_results_are_tool_result_blocks_in_order_and_only_errors_are_marked() -> None:
    outcome = decode("anthropic", [body_of("parallel_tool_use_no_args.sse")])
    results = [
        ModelResult("toolu_01N8a4jWyf116qKTMqKKmjyt", "pelican_name_generator", '"Sammy"'),
        ModelResult("toolu_01LtHJmixrs9NcWQkK8hu8hj", "pelican_name_generator", "boom", True),
    ]
    assert ADAPTER.encode_results(outcome, results) == [
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01N8a4jWyf116qKTMqKKmjyt",
                    "content": '"Sammy"',
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01LtHJmixrs9NcWQkK8hu8hj",
                    "content": "boom",
                    "is_error": True,
                },
            ],
        }
    ]
    assert ADAPTER.encode_results(outcome, []) == []


def test_build_request_and_auth() -> None:
    tool = ToolDeclaration("get_weather", "Weather by city", {"type": "object"})
    messages = ADAPTER.initial_messages("hi")
    spec = ADAPTER.build_request(model="claude-x", messages=messages, tools=[tool], system="sys")
    assert spec == HttpRequestSpec(
        path="/v1/messages",
        body={
            "model": "claude-x",
            "messages": messages,
            "stream": True,
            "max_tokens": 4096,
            "tools": [
                {
                    "name": "get_weather",
                    "description": "Weather by city",
                    "input_schema": {"type": "object"},
                }
            ],
            "system": "sys",
        },
    )
    bare = ADAPTER.build_request(model="m", messages=[], tools=[], max_tokens=10)
    assert bare.body == {"model": "m", "messages": [], "stream": True, "max_tokens": 10}
    assert ADAPTER.auth_headers("k") == {"x-api-key": "k", "anthropic-version": "2023-06-01"}


def test_echo_leaves_out_whitespace_only_text_blocks() -> None:
    # The API answers 400 "text content blocks must contain non-whitespace text"; a model
    # (or a server tool turn) can still stream a block that is only line breaks.
    body = text_then_tool_use_body("\n\n")
    outcome = decode("anthropic", [body])
    assert outcome.kind is OutcomeKind.TOOL_PROPOSALS and outcome.text == "\n\n"
    [message] = ADAPTER.assistant_echo(outcome)
    assert [block["type"] for block in message["content"]] == ["tool_use"]
    kept = decode("anthropic", [text_then_tool_use_body(" ok ")])
    [message] = ADAPTER.assistant_echo(kept)
    assert message["content"][0] == {"type": "text", "text": " ok "}


def text_then_tool_use_body(text: str) -> bytes:
    events = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-x",
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": 3, "output_tokens": 1},
                },
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"a": 1}'},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use"},
                "usage": {"output_tokens": 5},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events
    )  # fmt: skip
