"""Transport under hostile or broken servers, over real loopback HTTP: a stream that
already failed keeps its own retry verdict when the connection is cut after it; the
transport stops reading once the decoder has failed; a compressed body (sent although
identity was asked for) is refused unread and a compressed error body is read raw within
its bound; a redirect is never followed (a provider key must not reach another origin)."""

from __future__ import annotations

import gzip
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from callgate.engine.core.adapter import HttpRequestSpec, load_adapter
from callgate.engine.core.errors import ConfigError
from callgate.engine.core.outcome import OutcomeKind
from callgate.engine.runtime import transport
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn
from callgate.engine.runtime.transport import (
    ProviderEndpoint,
    RetryPolicy,
    TransportTimeouts,
    TurnAttempt,
    stream_turn,
)

FIXTURES = Path(__file__).parent / "fixtures"
CHAT = HttpRequestSpec(path="/v1/chat/completions", body={"model": "m"}, headers={})
MESSAGES = HttpRequestSpec(path="/v1/messages", body={"model": "m"}, headers={})
THREE = RetryPolicy(max_attempts=3, base_delay=0.0, max_delay=0.0, jitter=0.0)


async def _no_sleep(_seconds: float) -> None:
    return None


async def _run(
    turns: list[ReplayTurn],
    *,
    provider: str = "openai_chat",
    spec: HttpRequestSpec = CHAT,
    timeouts: TransportTimeouts | None = None,
    client: dict[str, Any] | None = None,
) -> tuple[TurnAttempt, int]:
    async with ReplayServer(turns) as server, httpx.AsyncClient(**(client or {})) as http:
        endpoint = ProviderEndpoint(base_url=server.base_url, api_key="sk-test")
        attempt = await stream_turn(
            http,
            load_adapter(provider),
            spec,
            endpoint,
            retry=THREE,
            timeouts=timeouts,
            sleep=_no_sleep,
        )
        return attempt, len(server.requests)


_ERROR = (
    b'event: error\ndata: {"type":"error","error":{"type":"invalid_request_error",'
    b'"message":"prompt is too long"}}\n\n'
)


@pytest.mark.anyio
@pytest.mark.parametrize("cut", [False, True])
async def test_a_non_retryable_stream_error_is_not_retried_even_if_the_socket_is_cut(
    cut: bool,
) -> None:
    turn = ReplayTurn(body=_ERROR, disconnect_after=len(_ERROR) if cut else None)
    attempt, requests = await _run([turn] * 3, provider="anthropic", spec=MESSAGES)
    assert attempt.outcome.kind is OutcomeKind.FAILED
    assert attempt.outcome.error is not None
    assert attempt.outcome.error.code == "invalid_request_error"
    assert (attempt.attempts, requests) == (1, 1)


@pytest.mark.anyio
async def test_a_retryable_stream_error_cut_afterwards_is_still_retried() -> None:
    overloaded = (
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
        b'"message":"busy"}}\n\n'
    )
    turn = ReplayTurn(body=overloaded, disconnect_after=len(overloaded))
    attempt, requests = await _run([turn] * 3, provider="anthropic", spec=MESSAGES)
    assert attempt.outcome.kind is OutcomeKind.FAILED
    assert (attempt.attempts, requests) == (3, 3)


@pytest.mark.anyio
async def test_a_cap_failure_stops_the_download_and_is_not_retried() -> None:
    # One line far past max_line_bytes (4 MiB), then the server keeps dripping bytes.
    line = b"data: " + b"a" * (5 * 1024 * 1024)
    drip = ReplayTurn(body=line + b"a" * 40_000_000, chunk_size=1 << 20, delay_s=0.3)
    started = time.monotonic()
    attempt, requests = await _run(
        [drip] * 3, timeouts=TransportTimeouts(connect=5, idle_stream=5, total=30.0)
    )
    elapsed = time.monotonic() - started
    assert attempt.outcome.kind is OutcomeKind.FAILED
    assert "max_line_bytes" in attempt.outcome.stop_reason
    assert (attempt.attempts, requests) == (1, 1)
    assert elapsed < 8  # read to its end, the 45 MB drip takes ~13 s


@pytest.mark.anyio
async def test_a_compressed_stream_is_refused_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    fed: list[int] = []
    real = transport.StreamDecoder

    class Spy(real):  # type: ignore[misc, valid-type]
        def feed(self, data: bytes) -> Any:
            fed.append(len(data))
            return super().feed(data)

    monkeypatch.setattr(transport, "StreamDecoder", Spy)
    body = gzip.compress(b"data: " + b"x" * 50_000_000, 9)  # 50 MB in ~50 KB
    turn = ReplayTurn(body=body, headers={"content-encoding": "gzip"}, chunk_size=1 << 16)
    attempt, requests = await _run([turn] * 3)
    assert attempt.outcome.kind is OutcomeKind.FAILED
    assert attempt.outcome.error is not None
    assert attempt.outcome.error.code == "unexpected_content_encoding"
    assert fed == [] and (attempt.attempts, requests) == (1, 1)


@pytest.mark.anyio
async def test_a_compressed_error_body_is_read_raw_within_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inflated: list[int] = []
    real = httpx.Response.aiter_bytes

    async def spy(self: httpx.Response, *args: Any, **kw: Any) -> Any:
        async for chunk in real(self, *args, **kw):
            inflated.append(len(chunk))
            yield chunk

    monkeypatch.setattr(httpx.Response, "aiter_bytes", spy)
    body = gzip.compress(b"<html>" + b" " * 50_000_000, 9)
    turn = ReplayTurn(
        status=502, body=body, content_type="text/html", headers={"content-encoding": "gzip"}
    )
    async with ReplayServer([turn]) as server, httpx.AsyncClient() as http:
        endpoint = ProviderEndpoint(base_url=server.base_url, api_key="sk-test")
        attempt = await stream_turn(
            http,
            load_adapter("openai_chat"),
            CHAT,
            endpoint,
            retry=RetryPolicy(max_attempts=1),
            sleep=_no_sleep,
        )
    assert attempt.outcome.error is not None and attempt.outcome.error.status == 502
    assert inflated == []  # never inflated


@pytest.mark.anyio
async def test_a_redirect_is_not_followed_even_by_a_client_that_follows_them() -> None:
    recorded = (FIXTURES / "anthropic" / "single_tool_use_no_args.sse").read_bytes()
    async with ReplayServer([ReplayTurn(body=recorded)]) as other:
        turn = ReplayTurn(status=307, headers={"location": other.base_url + "/v1/messages"})
        attempt, _ = await _run(
            [turn], provider="anthropic", spec=MESSAGES, client={"follow_redirects": True}
        )
        leaked = other.requests
    assert leaked == []  # the other origin never saw the request (nor its x-api-key)
    assert attempt.outcome.kind is OutcomeKind.FAILED
    assert attempt.outcome.error is not None and attempt.outcome.error.status == 307


def test_a_scripted_header_outside_latin1_is_refused() -> None:
    with pytest.raises(ConfigError, match="x-note"):
        ReplayTurn(body=b"", headers={"x-note": "price \u20ac5"})


@pytest.mark.anyio
async def test_a_retry_is_announced_and_the_discarded_attempts_usage_is_kept() -> None:
    # (The recording lacks the blank line that dispatches its last event.)
    body = (FIXTURES / "anthropic" / "text_then_tool_use.sse").read_bytes() + b"\n\n"
    cut_at = body.index(b"content_block_delta")  # after message_start (input usage), no call
    retries: list[tuple[int, str]] = []

    async def on_retry(attempt: int, reason: str) -> None:
        retries.append((attempt, reason))

    turns = [ReplayTurn(body=body, disconnect_after=cut_at), ReplayTurn(body=body)]
    async with ReplayServer(turns) as server, httpx.AsyncClient() as http:
        endpoint = ProviderEndpoint(base_url=server.base_url, api_key="sk-test")
        attempt = await stream_turn(
            http,
            load_adapter("anthropic"),
            MESSAGES,
            endpoint,
            retry=THREE,
            on_retry=on_retry,
            sleep=_no_sleep,
        )
    assert attempt.attempts == 2 and attempt.outcome.kind is OutcomeKind.TOOL_PROPOSALS
    assert [n for n, _ in retries] == [1]
    assert attempt.discarded_usage.input_tokens == attempt.outcome.usage.input_tokens == 377


@pytest.mark.anyio
async def test_the_run_loop_tells_progress_to_discard_a_retried_attempts_text() -> None:
    from callgate.engine.core.registry import Registry
    from callgate.engine.runtime.progress import TextChunk, TurnRetried

    from .loop_helpers import make_runner, turn

    provider = "openai_chat"
    full = turn(provider, text="the answer is forty-two")
    first_event = full.body.index(b"\n\n") + 2
    second_event = full.body.index(b"\n\n", first_event) + 2
    cut = ReplayTurn(body=full.body, disconnect_after=second_event)
    async with ReplayServer([cut, full]) as server:
        runner, progress = make_runner(provider, server.base_url, Registry([]))
        result = await runner.start("go")
    assert result.text == "the answer is forty-two"
    kinds = [type(e) for e in progress.events if isinstance(e, TextChunk | TurnRetried)]
    at = kinds.index(TurnRetried)
    assert TextChunk in kinds[:at]  # the cut attempt's text was shown...
    after = progress.events[progress.events.index(progress.of(TurnRetried)[0]) + 1 :]
    shown = "".join(e.text for e in after if isinstance(e, TextChunk))
    assert shown == result.text  # ...and what follows the retry notice is the answer


@pytest.mark.anyio
async def test_an_api_key_an_endpoint_echoes_is_masked_in_the_outcome() -> None:
    # "Incorrect API key provided: sk-..." is kept as the error message and persisted.
    body = b'{"error":{"message":"Incorrect API key provided: sk-test-0123456789","code":"x"}}'
    turn = ReplayTurn(status=401, body=body, content_type="application/json")
    async with ReplayServer([turn]) as server, httpx.AsyncClient() as http:
        endpoint = ProviderEndpoint(base_url=server.base_url, api_key="sk-test-0123456789")
        attempt = await stream_turn(
            http, load_adapter("openai_chat"), CHAT, endpoint, retry=THREE, sleep=_no_sleep
        )
    error = attempt.outcome.error
    assert error is not None and error.status == 401
    assert error.message == "Incorrect API key provided: ***"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "content_type"), [(400, "application/json"), (200, "text/html")]
)
async def test_an_error_body_still_arriving_when_the_attempt_time_ends_keeps_its_status(
    status: int, content_type: str
) -> None:
    # The answer is the status (or the content type), not "no response": never retried.
    turn = ReplayTurn(
        status=status,
        body=b'{"error":{"message":"bad request"}}' * 20,
        content_type=content_type,
        chunk_size=4,
        delay_s=0.05,
    )
    attempt, requests = await _run([turn], timeouts=TransportTimeouts(total=0.3, idle_stream=1))
    assert (attempt.attempts, requests) == (1, 1)
    error = attempt.outcome.error
    assert attempt.outcome.kind is OutcomeKind.FAILED and error is not None
    assert error.status == status and not error.retryable


@pytest.mark.anyio
async def test_a_key_cut_by_the_message_cap_is_masked_to_its_last_character() -> None:
    # Kept messages are capped at 1000 characters: an echoed key may straddle the cut.
    key = "sk-proj-" + "A1b2C3d4" * 20
    message = "x" * 980 + " provided: " + key
    body = msgspec.json.encode({"error": {"message": message, "code": "invalid_api_key"}})
    turn = ReplayTurn(status=401, body=body, content_type="application/json")
    async with ReplayServer([turn]) as server, httpx.AsyncClient() as http:
        endpoint = ProviderEndpoint(base_url=server.base_url, api_key=key)
        attempt = await stream_turn(
            http, load_adapter("openai_chat"), CHAT, endpoint, retry=THREE, sleep=_no_sleep
        )
    error = attempt.outcome.error
    assert error is not None and error.message is not None
    assert error.message.endswith(" provided: ***") and key[:8] not in error.message


async def _raise_for_status(response: httpx.Response) -> None:
    response.raise_for_status()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "attempts", "retryable"), [(400, 1, False), (429, 3, True), (503, 3, True)]
)
async def test_a_host_clients_raise_for_status_hook_leaves_the_status_deciding(
    status: int, attempts: int, retryable: bool
) -> None:
    # A shared client with a response hook calling raise_for_status (a common idiom): the
    # provider's error status still decides, as without the hook; it is no "no response"
    # transport error, which would send a 400 three times.
    error = ReplayTurn(
        status=status,
        body=b'{"error":{"code":"context_length_exceeded","message":"too long"}}',
        content_type="application/json",
    )
    hooked = {"event_hooks": {"response": [_raise_for_status]}}
    attempt, requests = await _run([error] * 3, client=hooked)
    assert (requests, attempt.attempts) == (attempts, attempts)
    outcome = attempt.outcome
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.error is not None
    assert (outcome.error.status, outcome.error.retryable) == (status, retryable)
    assert "no response" not in outcome.stop_reason


@pytest.mark.anyio
async def test_a_hook_raising_a_status_error_for_a_success_reaches_the_host() -> None:
    async def picky(response: httpx.Response) -> None:
        raise httpx.HTTPStatusError("host says no", request=response.request, response=response)

    recorded = (FIXTURES / "openai_chat" / "parallel_tool_calls_no_args.sse").read_bytes()
    with pytest.raises(httpx.HTTPStatusError, match="host says no"):
        await _run([ReplayTurn(body=recorded)], client={"event_hooks": {"response": [picky]}})


@pytest.mark.anyio
async def test_a_status_error_a_request_hook_raises_for_another_server_is_a_transport_error() -> (
    None
):
    # A request hook fetching a gateway token (raise_for_status on the identity server's
    # 401) is not the provider answering 401: the attempt had no response, and is retried.
    recorded = (FIXTURES / "openai_chat" / "parallel_tool_calls_no_args.sse").read_bytes()
    refusals = [0]

    async def token(request: httpx.Request) -> None:
        if refusals[0] < 1:
            refusals[0] += 1
            identity = httpx.Request("POST", "https://login.example.net/token")
            raise httpx.HTTPStatusError(
                "401", request=identity, response=httpx.Response(401, request=identity)
            )

    attempt, requests = await _run(
        [ReplayTurn(body=recorded)], client={"event_hooks": {"request": [token]}}
    )
    assert (attempt.attempts, requests) == (2, 1)
    assert attempt.outcome.kind is OutcomeKind.TOOL_PROPOSALS
