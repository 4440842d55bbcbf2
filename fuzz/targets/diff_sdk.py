# Invariant: on valid streams callgate and the official SDK accumulators agree on complete calls.
#   OpenAI Chat / Responses / Anthropic fixtures rewritten only by meaning-preserving mutations, at
#   hash-drawn chunk boundaries: same ids, names, parsed arguments (OpenAI text byte for byte).
"""Differential fuzz target: ``callgate.engine.core.decode.decode`` against the official
``openai`` and ``anthropic`` SDKs' streaming helpers (``chat.completions.stream``,
``responses.stream``, ``messages.stream`` and their ``get_final_*``), offline.

The SDK side follows ``tests/test_differential_sdk.py``: a real client whose HTTP client
is an ``httpx2.MockTransport`` serving the chunks. Clients are built once per process
and read the chunks of the current input. The custom mutator applies only
``fuzz.mutators.VALID`` rewrites (JSON whitespace and escaping, argument fragments split
elsewhere, one line-end style, SSE comments, ``data:`` with or without its space), so
every input stays a valid stream with the seed's meaning. A disagreement raises
``InvariantViolation``; ``fuzz/run.py`` saves it to ``fuzz/findings/diff_sdk/`` and
writes a minimized reproducer beside it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec

from callgate.engine.core.decode import decode
from fuzz.harness import chunk_plan, expect, fuzz_main
from fuzz.mutators import atheris_mutator, guess_provider
from fuzz.targets.arguments import same_json

__all__ = ["SDK_PROVIDERS", "SdkCall", "SdkResult", "check", "sdk_decode"]

SDK_PROVIDERS = ("openai_chat", "openai_responses", "anthropic")
# What the SDKs report as a completed turn (callgate's "complete").
_SDK_DONE = frozenset({"stop", "tool_calls", "completed", "end_turn", "tool_use", "stop_sequence"})


class SdkCall(msgspec.Struct, frozen=True):
    call_id: str
    name: str
    arguments: dict[str, Any]
    text: str | None  # the argument text as the SDK accumulated it (OpenAI only)


class SdkResult(msgspec.Struct, frozen=True):
    stop: str | None
    calls: list[SdkCall]
    refused: bool = False  # the message carries refusal content (callgate: ``refusal``)


_current: list[bytes] = []
_clients: dict[str, Any] = {}


def _client(kind: str) -> Any:
    client = _clients.get(kind)
    if client is not None:
        return client
    import anthropic
    import httpx2
    import openai

    def serve(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=iter(list(_current))
        )

    http = httpx2.Client(transport=httpx2.MockTransport(serve))
    if kind == "openai":
        client = openai.OpenAI(
            api_key="sk-offline", base_url="http://sdk.invalid/v1", http_client=http
        )
    else:
        client = anthropic.Anthropic(
            api_key="sk-offline", base_url="http://sdk.invalid", http_client=http
        )
    _clients[kind] = client
    return client


def _parsed(text: str) -> dict[str, Any]:
    value = json.loads(text) if text.strip() else {}
    expect(isinstance(value, dict), "the SDK accumulated arguments that are not an object")
    result: dict[str, Any] = value
    return result


def _openai_chat() -> SdkResult:
    with _client("openai").chat.completions.stream(model="gpt-4o", messages=[]) as stream:
        completion = stream.get_final_completion()
    choice = completion.choices[0]
    calls = [
        SdkCall(tc.id, tc.function.name, _parsed(tc.function.arguments), tc.function.arguments)
        for tc in choice.message.tool_calls or ()
    ]
    return SdkResult(choice.finish_reason, calls, bool(choice.message.refusal))


def _openai_responses() -> SdkResult:
    with _client("openai").responses.stream(model="gpt-5", input="hi") as stream:
        response = stream.get_final_response()
    calls = [
        SdkCall(item.call_id, item.name, _parsed(item.arguments), item.arguments)
        for item in response.output
        if item.type == "function_call"
    ]
    refused = any(
        part.type == "refusal"
        for item in response.output
        if item.type == "message"
        for part in item.content
    )
    return SdkResult(response.status, calls, refused)


def _anthropic() -> SdkResult:
    client = _client("anthropic")
    with client.messages.stream(model="claude-offline", messages=[], max_tokens=64) as stream:
        message = stream.get_final_message()
    calls = [
        SdkCall(block.id, block.name, dict(block.input), None)
        for block in message.content
        if block.type == "tool_use"
    ]
    return SdkResult(message.stop_reason, calls)


_SDK: dict[str, Callable[[], SdkResult]] = {
    "openai_chat": _openai_chat,
    "openai_responses": _openai_responses,
    "anthropic": _anthropic,
}


def sdk_decode(provider: str, chunks: list[bytes]) -> SdkResult:
    """The SDK's reading of ``chunks`` (raises whatever the SDK raises)."""
    _current[:] = chunks
    return _SDK[provider]()


def _unterminated(body: bytes) -> bool:
    return not body.rstrip(b" ").endswith((b"\n\n", b"\r\r", b"\r\n\r\n"))


def check(data: bytes) -> None:
    provider = guess_provider(data)
    if provider not in SDK_PROVIDERS:
        return
    chunks = chunk_plan(data, 128)
    outcome = decode(provider, chunks)
    try:
        sdk: SdkResult | None = sdk_decode(provider, chunks)
    except Exception as exc:  # the SDK's own refusal: a finding only if callgate completed
        expect(not outcome.complete, f"callgate completed; the SDK raised {exc!r}")
        sdk = None
    if sdk is None:
        return
    sdk_done = sdk.stop in _SDK_DONE and not sdk.refused
    if _unterminated(data):
        # Documented difference: the SDK dispatches an event that lacks its blank line at
        # the end of the body; the event-stream rules (and callgate) discard it.
        expect(not outcome.complete or sdk_done, "callgate completed an unterminated stream")
    else:
        expect(
            outcome.complete == sdk_done,
            f"callgate {outcome.kind.value} ({outcome.stop_reason}); the SDK stopped with "
            f"{sdk.stop} (refusal: {sdk.refused})",
        )
    if not sdk_done:
        return
    ours = [(c.call_id, c.name) for c in outcome.calls]
    theirs = [(c.call_id, c.name) for c in sdk.calls]
    expect(ours == theirs, f"calls differ: callgate {ours}, SDK {theirs}")
    for mine, their in zip(outcome.calls, sdk.calls, strict=True):
        expect(mine.arguments is not None, f"callgate rejected {mine.call_id}: {mine.error}")
        expect(same_json(mine.arguments, their.arguments), f"arguments of {mine.call_id} differ")
        if their.text is not None:
            expect(mine.raw_arguments == their.text.encode(), f"argument text of {mine.call_id}")


custom_mutator = atheris_mutator(None, valid_only=True)

if __name__ == "__main__":
    fuzz_main(check, custom_mutator)
