"""callgate's decode against the official SDKs' own stream accumulators, on the recorded
OpenAI Chat, OpenAI Responses and Anthropic fixtures.

Each fixture body is served, offline, to a real ``openai.OpenAI`` / ``anthropic.Anthropic``
client through ``httpx2.MockTransport`` (the HTTP client both SDKs use) and read with the
SDK's streaming helper: ``client.chat.completions.stream(...).get_final_completion()``,
``client.responses.stream(...).get_final_response()``,
``client.messages.stream(...).get_final_message()``. The same bytes, whole and at seeded
random chunk boundaries, go to ``callgate.engine.decode``.

Where both finish, every call callgate reports complete (``outcome.calls``) has the SDK's
call id, name and arguments (parsed, and byte-identical where the SDK keeps the text), in
the same order, and the SDK reports no other call. Where the SDK differs by design, the
difference itself is asserted:

- the SDK raises where callgate returns an explicit outcome (a provider error event, a
  Responses stream without ``response.completed``, Chat ``finish_reason: length``, and a
  compatible server's first tool call at ``index: 1``, which the SDK looks up by list
  position);
- Anthropic ``max_tokens`` in the middle of a ``tool_use`` block: the SDK keeps the block
  with its partially parsed input, callgate lists the call only as incomplete;
- a body whose last event lacks its terminating blank line: the SDK's decoder flushes it at
  end of stream, the event-stream rules discard it, so callgate reports ``truncated``
  while its done calls still agree with the SDK's.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from callgate.engine.core.decode import decode
from callgate.engine.core.outcome import OutcomeKind, TurnOutcome

from .conftest import FIXTURES

SDK_FAMILIES = ("openai_chat", "openai_responses", "anthropic")
FILES = [(fam, p) for fam in SDK_FAMILIES for p in sorted((FIXTURES / fam).glob("*.sse"))]
IDS = [f"{fam}/{p.name}" for fam, p in FILES]


@dataclass(frozen=True)
class SdkCall:
    call_id: str
    name: str
    arguments: dict[str, Any]
    text: str | None  # the argument text as the SDK accumulated it (OpenAI only)


@dataclass(frozen=True)
class SdkResult:
    stop: str | None
    calls: list[SdkCall]


# --- the SDK side ------------------------------------------------------------------------


def _http_client(chunks: list[bytes]) -> httpx2.Client:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=iter(chunks)
        )

    return httpx2.Client(transport=httpx2.MockTransport(handler))


def _parsed(text: str) -> dict[str, Any]:
    value = json.loads(text) if text.strip() else {}
    assert isinstance(value, dict)
    return value


def sdk_openai_chat(chunks: list[bytes]) -> SdkResult:
    client = openai.OpenAI(
        api_key="sk-test", base_url="http://sdk.invalid/v1", http_client=_http_client(chunks)
    )
    with client.chat.completions.stream(model="gpt-4o", messages=[]) as stream:
        completion = stream.get_final_completion()
    choice = completion.choices[0]
    calls = [
        SdkCall(tc.id, tc.function.name, _parsed(tc.function.arguments), tc.function.arguments)
        for tc in choice.message.tool_calls or ()
    ]
    return SdkResult(choice.finish_reason, calls)


def sdk_openai_responses(chunks: list[bytes]) -> SdkResult:
    client = openai.OpenAI(
        api_key="sk-test", base_url="http://sdk.invalid/v1", http_client=_http_client(chunks)
    )
    with client.responses.stream(model="gpt-5", input="hi") as stream:
        response = stream.get_final_response()
    calls = [
        SdkCall(item.call_id, item.name, _parsed(item.arguments), item.arguments)
        for item in response.output
        if item.type == "function_call"
    ]
    return SdkResult(response.status, calls)


def sdk_anthropic(chunks: list[bytes]) -> SdkResult:
    client = anthropic.Anthropic(
        api_key="sk-test", base_url="http://sdk.invalid", http_client=_http_client(chunks)
    )
    with client.messages.stream(model="claude-offline-test", messages=[], max_tokens=64) as stream:
        message = stream.get_final_message()
    calls = [
        SdkCall(block.id, block.name, dict(block.input), None)
        for block in message.content
        if block.type == "tool_use"
    ]
    return SdkResult(message.stop_reason, calls)


SDK: dict[str, Callable[[list[bytes]], SdkResult]] = {
    "openai_chat": sdk_openai_chat,
    "openai_responses": sdk_openai_responses,
    "anthropic": sdk_anthropic,
}


# --- documented differences --------------------------------------------------------------


@dataclass(frozen=True)
class Raises:
    """The SDK raises ``error``; callgate returns ``kind`` and lists ``calls`` (call id,
    name, arguments) as complete."""

    error: type[BaseException]
    message: str
    kind: OutcomeKind
    calls: tuple[tuple[str, str, dict[str, Any]], ...] = ()


RAISES: dict[str, Raises] = {
    # The SDK indexes the snapshot's tool_calls list by the wire index: a first call at
    # index 1 (after text) is out of range. callgate keys calls by index and lists the
    # call as done (finish_reason arrived); the turn is truncated because the recording's
    # "data: [DONE]" lacks its blank line.
    "openai_chat/compat_anthropic_text_then_tool_index1.sse": Raises(
        IndexError,
        "list index out of range",
        OutcomeKind.TRUNCATED,
        (("toolu_sanitized", "read_file", {"path": "a.txt"}),),
    ),
    "openai_chat/truncated_finish_length.sse": Raises(
        openai.LengthFinishReasonError, "length limit was reached", OutcomeKind.TRUNCATED
    ),
    "openai_responses/error_then_failed_insufficient_quota.converted.sse": Raises(
        openai.APIError, "exceeded your current quota", OutcomeKind.FAILED
    ),
    "openai_responses/incomplete_max_output_tokens.converted.sse": Raises(
        RuntimeError, "response.completed", OutcomeKind.TRUNCATED
    ),
    "anthropic/error_overloaded.docs-example.sse": Raises(
        anthropic.APIStatusError, "Overloaded", OutcomeKind.FAILED
    ),
}

# Anthropic stop_reason max_tokens inside a tool_use block (no content_block_stop): the
# SDK keeps the block, its input parsed from the cut JSON in partial mode.
PARTIAL_TOOL_USE = "anthropic/max_tokens_mid_tool_input.sse"


def _unterminated(body: bytes) -> bool:
    """The last event has no blank line after it (WHATWG: it is never dispatched)."""
    return not body.rstrip(b" ").endswith((b"\n\n", b"\r\r", b"\r\n\r\n"))


# --- helpers -----------------------------------------------------------------------------


def _feedings(body: bytes) -> Iterator[tuple[str, list[bytes]]]:
    yield "whole", [body]
    rng = random.Random(len(body))
    chunks, i = [], 0
    while i < len(body):
        n = rng.randint(1, 211)
        chunks.append(body[i : i + n])
        i += n
    yield "random", chunks


def _assert_same_calls(outcome: TurnOutcome, sdk: SdkResult) -> None:
    ours = [(c.call_id, c.name, c.arguments) for c in outcome.calls]
    theirs = [(c.call_id, c.name, c.arguments) for c in sdk.calls]
    assert ours == theirs
    for mine, their in zip(outcome.calls, sdk.calls, strict=True):
        assert mine.error is None
        if their.text is not None:
            assert mine.raw_arguments == their.text.encode()


def _case(fam: str, path: Path) -> str:
    return f"{fam}/{path.name}"


# --- tests -------------------------------------------------------------------------------


@pytest.mark.parametrize(("family", "path"), FILES, ids=IDS)
def test_callgate_agrees_with_the_sdk_accumulator(family: str, path: Path) -> None:
    case = _case(family, path)
    body = path.read_bytes()
    for mode, chunks in _feedings(body):
        outcome = decode(family, chunks)
        if case in RAISES:
            expected = RAISES[case]
            with pytest.raises(expected.error, match=expected.message):
                SDK[family](chunks)
            assert outcome.kind is expected.kind, mode
            got = tuple((c.call_id, c.name, c.arguments) for c in outcome.calls)
            assert got == expected.calls, mode
            continue
        sdk = SDK[family](chunks)
        if case == PARTIAL_TOOL_USE:
            assert sdk.stop == "max_tokens"
            assert outcome.kind is OutcomeKind.TRUNCATED
            assert outcome.calls == ()
            (partial,) = sdk.calls
            (incomplete,) = outcome.incomplete_calls
            assert (incomplete.call_id, incomplete.name) == (partial.call_id, partial.name)
            # The SDK's input is a repair of a cut object; callgate never parses it.
            assert partial.arguments
            continue
        _assert_same_calls(outcome, sdk)
        if _unterminated(body):
            # The SDK saw the flushed last event and an explicit stop; callgate did not.
            assert sdk.stop in ("tool_calls", "tool_use", "refusal", "end_turn"), mode
            assert outcome.kind is OutcomeKind.TRUNCATED, mode
        elif sdk.calls:
            assert outcome.kind is OutcomeKind.TOOL_PROPOSALS, mode
        else:
            assert not outcome.calls
            assert outcome.kind is not OutcomeKind.TOOL_PROPOSALS, mode


def test_every_sdk_family_fixture_is_compared() -> None:
    # 8 + 8 + 8 recorded bodies; none is left out of the differential test.
    assert len(FILES) == 24
    assert set(RAISES) | {PARTIAL_TOOL_USE} <= set(IDS)


def test_the_unterminated_fixtures_are_the_known_four() -> None:
    # The three of tests/test_decode_fixtures.py, plus the max_tokens recording (already
    # truncated by its stop reason).
    unterminated = [
        case for (_, p), case in zip(FILES, IDS, strict=True) if _unterminated(p.read_bytes())
    ]
    assert sorted(unterminated) == [
        "anthropic/max_tokens_mid_tool_input.sse",
        "anthropic/refusal_stop_details.synthetic.sse",
        "anthropic/text_then_tool_use.sse",
        "openai_chat/compat_anthropic_text_then_tool_index1.sse",
    ]


def test_terminated_copies_of_the_unterminated_fixtures_complete_like_the_sdk() -> None:
    # Adding the missing blank line is all it takes for callgate to reach the SDK's stop.
    body = (FIXTURES / "anthropic" / "text_then_tool_use.sse").read_bytes() + b"\n\n"
    outcome = decode("anthropic", [body])
    sdk = sdk_anthropic([body])
    assert sdk.stop == "tool_use"
    assert outcome.kind is OutcomeKind.TOOL_PROPOSALS
    _assert_same_calls(outcome, sdk)
    refusal = (FIXTURES / "anthropic" / "refusal_stop_details.synthetic.sse").read_bytes()
    outcome = decode("anthropic", [refusal + b"\n"])
    assert sdk_anthropic([refusal + b"\n"]).stop == "refusal"
    assert outcome.kind is OutcomeKind.REFUSAL
