"""Where the transport's responsibility ends, over real loopback HTTP: the host's own code
and configuration on one side (its event callback, its ``httpx`` client), the provider's
untrusted answers on the other (error bodies nested past any decoder's stack, megabytes
of error text, a key echoed in an error code, near-miss content types, a malformed base
URL). The host's exceptions reach the host; the provider's answers become outcomes."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest

from callgate.engine.core.adapter import HttpRequestSpec, load_adapter
from callgate.engine.core.decode import decode
from callgate.engine.core.errors import ConfigError
from callgate.engine.core.events import EngineEvent, ProviderError
from callgate.engine.core.outcome import (
    MAX_ERROR_CODE,
    MAX_ERROR_MESSAGE,
    OutcomeKind,
    ProviderErrorInfo,
)
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn
from callgate.engine.runtime.transport import (
    ProviderEndpoint,
    RetryPolicy,
    TurnAttempt,
    stream_turn,
)

pytestmark = pytest.mark.anyio

CHAT = HttpRequestSpec(path="/v1/chat/completions", body={"model": "m"}, headers={})
THREE = RetryPolicy(max_attempts=3, base_delay=0.0, max_delay=0.0, jitter=0.0)
KEY = "sk-test-0123456789abcdef"
_FINAL = (
    b'data: {"id":"r1","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    b'data: {"id":"r1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


async def _no_sleep(_seconds: float) -> None:
    return None


async def _turn(
    turns: list[ReplayTurn],
    *,
    on_event: Any = None,
    client: httpx.AsyncClient | None = None,
) -> tuple[TurnAttempt, ReplayServer]:
    async with ReplayServer(turns) as server:
        http = client or httpx.AsyncClient()
        async with http:
            attempt = await stream_turn(
                http,
                load_adapter("openai_chat"),
                CHAT,
                ProviderEndpoint(base_url=server.base_url, api_key=KEY),
                retry=THREE,
                on_event=on_event,
                sleep=_no_sleep,
            )
    return attempt, server


@pytest.mark.parametrize(
    ("status", "content_type", "code"),
    [
        (400, "application/json", "http_400"),
        (503, "application/json", "http_503"),
        (200, "application/json", "unexpected_content_type"),
    ],
)
async def test_an_error_body_nested_past_the_decoders_stack_is_an_outcome(
    status: int, content_type: str, code: str
) -> None:
    body = b"[" * 5000 + b"]" * 5000  # msgspec gives up with RecursionError on this
    attempt, _ = await _turn([ReplayTurn(status=status, body=body, content_type=content_type)] * 3)
    error = attempt.outcome.error
    assert attempt.outcome.kind is OutcomeKind.FAILED and error is not None
    assert (error.code, error.status, error.message) == (code, status, None)


async def test_an_httpx_error_the_hosts_callback_raises_reaches_the_host() -> None:
    # A host forwarding events to a webhook with httpx: its failure is its own, not the
    # provider's stream being cut (which would be retried: more billed model requests).
    async def forward(event: EngineEvent) -> None:
        raise httpx.ConnectError("the host's webhook is down")

    turns = [ReplayTurn(body=_FINAL)] * 3
    async with ReplayServer(turns) as server, httpx.AsyncClient() as http:
        with pytest.raises(httpx.ConnectError, match="webhook"):
            await stream_turn(
                http,
                load_adapter("openai_chat"),
                CHAT,
                ProviderEndpoint(base_url=server.base_url, api_key=KEY),
                retry=THREE,
                on_event=forward,
                sleep=_no_sleep,
            )
        assert len(server.requests) == 1


async def test_a_host_clients_own_auth_never_replaces_or_joins_the_provider_key() -> None:
    client = httpx.AsyncClient(auth=("internal-svc", "host-password"))
    attempt, server = await _turn([ReplayTurn(body=_FINAL)], client=client)
    assert attempt.outcome.kind is OutcomeKind.FINAL_TEXT
    (request,) = server.requests
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert "host-password" not in repr(request.headers)


def _stream_error(message: str, code: str) -> bytes:
    error = {"error": {"message": message, "type": "server_error", "code": code}}
    return b"data: " + msgspec.json.encode(error) + b"\n\n"


async def test_a_stream_errors_texts_are_bounded_and_the_key_masked_before_anyone_sees_them() -> (
    None
):
    seen: list[ProviderErrorInfo] = []

    async def watch(event: EngineEvent) -> None:
        if isinstance(event, ProviderError):
            seen.append(event.error)

    body = _stream_error("x" * 3_000_000 + KEY, f"bad_key_{KEY}")
    attempt, _ = await _turn([ReplayTurn(body=body)] * 3, on_event=watch)
    error = attempt.outcome.error
    assert attempt.outcome.kind is OutcomeKind.FAILED and error is not None
    assert error.message is not None and len(error.message) == MAX_ERROR_MESSAGE
    assert error.code == "bad_key_***"
    assert seen and all(KEY not in repr(e) for e in seen)  # the callback's copy, too
    assert all(len(e.message or "") <= MAX_ERROR_MESSAGE for e in seen)


def test_error_texts_are_bounded_however_the_error_is_made() -> None:
    made = ProviderErrorInfo(code="c" * 10_000, message="m" * 10_000)
    assert (len(made.code or ""), len(made.message or "")) == (MAX_ERROR_CODE, MAX_ERROR_MESSAGE)
    stored = msgspec.json.encode({"code": "c" * 10_000, "message": "m" * 10_000})
    read = msgspec.json.decode(stored, type=ProviderErrorInfo)  # an old snapshot, say
    assert (len(read.code or ""), len(read.message or "")) == (MAX_ERROR_CODE, MAX_ERROR_MESSAGE)
    # The offline decoder gives the same bound (the adapter made this one).
    outcome = decode("openai_chat", [_stream_error("y" * 50_000, "z" * 5_000)])
    assert outcome.kind is OutcomeKind.FAILED and outcome.error is not None
    assert len(outcome.error.message or "") == MAX_ERROR_MESSAGE
    assert len(outcome.error.code or "") == MAX_ERROR_CODE


@pytest.mark.parametrize(
    "content_type",
    [
        "text/event-streamx",
        "application/x-text/event-stream",
        "application/json, text/event-stream",  # two Content-Type headers, joined
        "text/event-stream-but-not",
    ],
)
async def test_a_content_type_that_only_contains_the_sse_media_type_is_refused(
    content_type: str,
) -> None:
    attempt, server = await _turn([ReplayTurn(body=_FINAL, content_type=content_type)] * 3)
    error = attempt.outcome.error
    assert attempt.outcome.kind is OutcomeKind.FAILED and error is not None
    assert error.code == "unexpected_content_type"
    assert len(server.requests) == 1  # never retried


@pytest.mark.parametrize(
    "content_type", ["text/event-stream", "TEXT/Event-Stream; charset=utf-8", " text/event-stream "]
)
async def test_the_sse_media_type_is_accepted_in_any_case_with_parameters(
    content_type: str,
) -> None:
    attempt, _ = await _turn([ReplayTurn(body=_FINAL, content_type=content_type)])
    assert attempt.outcome.kind is OutcomeKind.FINAL_TEXT


@pytest.mark.parametrize(
    "base_url", ["http://[::1", "https://", "http://:8080/v1", "https://[not-an-ip]/"]
)
def test_a_base_url_that_cannot_be_requested_is_refused_when_the_endpoint_is_made(
    base_url: str,
) -> None:
    with pytest.raises(ConfigError, match="base URL"):
        ProviderEndpoint(base_url=base_url, api_key=KEY)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://proxyuser:hunter2pw@127.0.0.1:1",  # wrong scheme
        "http://proxyuser:hunter2pw@/v1",  # no host
        "http://proxyuser:hunter2pw@h:port/v1",  # a port that does not parse
        "http://proxyuser:hunter2pw@[::1/v1",  # brackets that do not close
        "http://proxyuser:hunter2pw@127.0.0.1:1/v1",  # a valid URL carrying credentials
    ],
)
def test_a_refused_base_url_never_shows_its_password(url: str) -> None:
    # A proxy's credentials in OPENAI_BASE_URL were echoed in the refusal.
    with pytest.raises(ConfigError) as caught:
        ProviderEndpoint(base_url=url, api_key="k")
    assert "hunter2pw" not in str(caught.value)


@pytest.mark.parametrize("url", ["http://gw:hunter2pw@127.0.0.1:1", "https://gw@h.example/v1"])
def test_a_base_url_with_credentials_is_refused(url: str) -> None:
    # httpx would send them as Basic auth in place of OpenAI's Bearer key (the key never
    # went out) and log them with every request URL.
    with pytest.raises(ConfigError, match="carries a user or password") as caught:
        ProviderEndpoint(base_url=url, api_key="k")
    assert "hunter2pw" not in str(caught.value)
    environ = {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": url}
    with pytest.raises(ConfigError, match="carries a user or password"):
        ProviderEndpoint.from_env("openai_chat", environ)
