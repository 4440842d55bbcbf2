"""``stream_turn`` against the loopback replay server with a real httpx client: decoding
over HTTP, retries (status, retry-after, in-stream errors, disconnects), their bounds, and
every network failure ending in an explicit, never-complete outcome."""

from __future__ import annotations

import email.utils
import math
import socket
from pathlib import Path

import anyio
import httpx
import msgspec
import pytest

from callgate.engine.core.adapter import HttpRequestSpec, load_adapter
from callgate.engine.core.decode import StreamDecoder, decode
from callgate.engine.core.errors import ConfigError
from callgate.engine.core.events import EngineEvent
from callgate.engine.core.outcome import OutcomeKind
from callgate.engine.runtime.replay import EXHAUSTED_STATUS, ReplayServer, ReplayTurn
from callgate.engine.runtime.transport import (
    ProviderEndpoint,
    RetryPolicy,
    TransportAdapter,
    TransportTimeouts,
    TurnAttempt,
    retry_after_seconds,
    stream_turn,
)

from .conftest import FIXTURES, coalesced, fixture_files

CHAT = "openai_chat"
TOOL_STREAM = (FIXTURES / CHAT / "parallel_tool_calls_two_functions.sse").read_bytes()
OVERLOADED = (FIXTURES / "anthropic" / "error_overloaded.docs-example.sse").read_bytes()
SPEC = HttpRequestSpec(
    path="/v1/chat/completions",
    body={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    headers={"x-extra": "1"},
)
NO_JITTER = RetryPolicy(max_attempts=3, base_delay=0.5, max_delay=8.0, jitter=0.0)


def _adapter(provider: str = CHAT) -> TransportAdapter:
    adapter = load_adapter(provider)
    assert isinstance(adapter, TransportAdapter)
    return adapter


class SleepRecorder:
    """Stands in for anyio.sleep between attempts: records the delay, waits for nothing."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


async def _run(
    turns: list[ReplayTurn],
    *,
    provider: str = CHAT,
    retry: RetryPolicy = NO_JITTER,
    timeouts: TransportTimeouts | None = None,
    deadline_in: float | None = None,
    sleep: SleepRecorder | None = None,
    events: list[EngineEvent] | None = None,
) -> tuple[TurnAttempt, ReplayServer]:
    async def collect(event: EngineEvent) -> None:
        if events is not None:
            events.append(event)

    async with ReplayServer(turns) as server, httpx.AsyncClient() as client:
        endpoint = ProviderEndpoint(base_url=server.base_url, api_key="sk-test")
        deadline = None if deadline_in is None else anyio.current_time() + deadline_in
        attempt = await stream_turn(
            client,
            _adapter(provider),
            SPEC,
            endpoint,
            retry=retry,
            timeouts=timeouts,
            on_event=collect,
            deadline=deadline,
            sleep=sleep or SleepRecorder(),
        )
    assert server.handler_errors == []
    return attempt, server


def _split_after_first_call_fragment(body: bytes) -> int:
    """Byte offset just past the first SSE event that carries a tool-call fragment."""
    start = body.index(b'"tool_calls"')
    return body.index(b"\n\n", start) + 2


# --- a whole stream over HTTP ---------------------------------------------------------------


@pytest.mark.parametrize(("provider", "path"), fixture_files(), ids=lambda v: getattr(v, "name", v))
@pytest.mark.anyio
async def test_every_fixture_decodes_over_http_as_it_does_offline(
    provider: str, path: Path
) -> None:
    body = await anyio.Path(path).read_bytes()
    events: list[EngineEvent] = []
    single = RetryPolicy(max_attempts=1)
    attempt, _ = await _run(
        [ReplayTurn(body=body, chunk_size=61)], provider=provider, retry=single, events=events
    )
    offline = StreamDecoder(load_adapter(provider))
    expected_events = offline.feed(body)
    assert attempt.outcome == decode(provider, [body])
    assert attempt.outcome == offline.finish()
    # Fragment granularity follows the chunking (a chunk's fragments are batched).
    assert coalesced(events) == coalesced(expected_events)
    assert attempt.attempts == 1
    assert not attempt.disconnected


@pytest.mark.anyio
async def test_request_carries_spec_body_headers_and_adapter_auth() -> None:
    attempt, server = await _run([ReplayTurn(body=TOOL_STREAM)])
    assert attempt.outcome.kind is OutcomeKind.TOOL_PROPOSALS
    (request,) = server.requests
    assert request.method == "POST"
    assert request.path == SPEC.path
    assert request.json() == SPEC.body
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.headers["x-extra"] == "1"
    assert request.headers["accept"] == "text/event-stream"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["accept-encoding"] == "identity"


# --- HTTP statuses -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_503_then_200_is_retried_once_honouring_retry_after() -> None:
    sleep = SleepRecorder()
    turns = [
        ReplayTurn.json_error(503, headers={"retry-after": "2"}),
        ReplayTurn(body=TOOL_STREAM, chunk_size=64),
    ]
    attempt, server = await _run(turns, sleep=sleep)
    assert attempt.outcome.kind is OutcomeKind.TOOL_PROPOSALS
    assert len(attempt.outcome.calls) == 2
    assert attempt.attempts == 2
    assert attempt.retried_statuses == (503,)
    assert sleep.delays == [2.0]
    assert attempt.retry_delays == (2.0,)
    assert len(server.requests) == 2
    assert server.requests[0].body == server.requests[1].body


@pytest.mark.anyio
async def test_retry_after_is_capped_by_max_delay_and_backoff_is_exponential() -> None:
    sleep = SleepRecorder()
    turns = [
        ReplayTurn.json_error(429, headers={"retry-after": "3600"}),
        ReplayTurn.json_error(529),
        ReplayTurn(body=TOOL_STREAM),
    ]
    policy = RetryPolicy(max_attempts=3, base_delay=0.5, max_delay=8.0, jitter=0.0)
    attempt, _ = await _run(turns, retry=policy, sleep=sleep)
    assert attempt.outcome.complete
    assert attempt.retried_statuses == (429, 529)
    # retry 1 honours retry-after up to max_delay; retry 2 falls back to base * 2**1.
    assert sleep.delays == [8.0, 1.0]


@pytest.mark.anyio
async def test_400_fails_without_retry_and_keeps_provider_text_out_of_the_status() -> None:
    sleep = SleepRecorder()
    payload = {"error": {"type": "invalid_request_error", "message": "bad tools: secret-ish"}}
    attempt, server = await _run([ReplayTurn.json_error(400, payload)], sleep=sleep)
    outcome = attempt.outcome
    assert outcome.kind is OutcomeKind.FAILED
    assert not outcome.complete
    assert outcome.error is not None
    assert outcome.error.status == 400
    assert outcome.error.code == "invalid_request_error"
    assert not outcome.error.retryable
    assert "secret" not in outcome.stop_reason  # provider text stays in error.message only
    assert attempt.attempts == 1
    assert sleep.delays == []
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("status", "retried"),
    [
        *((s, True) for s in (408, 409, 429, 500, 502, 503, 504, 529)),
        *((s, False) for s in (400, 401, 403, 404, 413, 422, 501, 505)),
    ],
)
@pytest.mark.anyio
async def test_which_statuses_are_retried(status: int, retried: bool) -> None:
    """Transient statuses (those the official OpenAI and Anthropic clients retry, but 501
    and 505, which say the server never does this) get one more attempt; the rest fail at
    once with their status."""
    turns = [ReplayTurn.json_error(status), ReplayTurn(body=TOOL_STREAM)]
    attempt, server = await _run(turns)
    assert len(server.requests) == (2 if retried else 1)
    if retried:
        assert attempt.outcome.complete and attempt.retried_statuses == (status,)
    else:
        assert attempt.outcome.kind is OutcomeKind.FAILED and attempt.outcome.error is not None
        assert (attempt.outcome.error.status, attempt.outcome.error.retryable) == (status, False)


@pytest.mark.parametrize(
    ("status", "hint", "retried"),
    [
        (400, "true", True),
        (503, "false", False),
        (503, "maybe", True),  # anything but true/false is no answer: the status decides
        (400, "", False),
    ],
)
@pytest.mark.anyio
async def test_the_providers_x_should_retry_header_overrides_the_status(
    status: int, hint: str, retried: bool
) -> None:
    turns = [
        ReplayTurn.json_error(status, headers={"x-should-retry": hint}),
        ReplayTurn(body=TOOL_STREAM),
    ]
    attempt, server = await _run(turns)
    assert len(server.requests) == (2 if retried else 1)
    assert attempt.outcome.complete is retried


@pytest.mark.anyio
async def test_retries_are_bounded_by_max_attempts() -> None:
    sleep = SleepRecorder()
    attempt, server = await _run([ReplayTurn.json_error(503)] * 5, sleep=sleep)
    assert attempt.outcome.kind is OutcomeKind.FAILED
    assert attempt.outcome.error is not None
    assert attempt.outcome.error.status == 503
    assert attempt.attempts == 3
    assert len(server.requests) == 3
    assert attempt.retried_statuses == (503, 503)
    assert sleep.delays == [0.5, 1.0]


@pytest.mark.anyio
async def test_no_retry_whose_wait_would_pass_the_deadline() -> None:
    sleep = SleepRecorder()
    turns = [ReplayTurn.json_error(503, headers={"retry-after": "5"}), ReplayTurn(body=TOOL_STREAM)]
    attempt, server = await _run(turns, sleep=sleep, deadline_in=2.0)
    assert attempt.outcome.kind is OutcomeKind.FAILED
    assert attempt.attempts == 1
    assert sleep.delays == []
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_a_deadline_already_passed_makes_no_request() -> None:
    attempt, server = await _run([ReplayTurn(body=TOOL_STREAM)], deadline_in=-1.0)
    assert attempt.outcome.kind is OutcomeKind.FAILED
    assert attempt.outcome.error is not None
    assert attempt.outcome.error.code == "deadline_exceeded"
    assert attempt.attempts == 0
    assert server.requests == []


@pytest.mark.anyio
async def test_exhausted_replay_script_is_a_failure_not_a_success() -> None:
    attempt, _ = await _run([])
    assert attempt.outcome.kind is OutcomeKind.FAILED
    assert attempt.outcome.error is not None
    assert attempt.outcome.error.status == EXHAUSTED_STATUS
    assert attempt.outcome.error.code == "replay_script_exhausted"


@pytest.mark.anyio
async def test_wrong_content_type_fails_without_retry() -> None:
    turn = ReplayTurn(body=b'{"choices": []}', content_type="application/json")
    attempt, server = await _run([turn, ReplayTurn(body=TOOL_STREAM)])
    assert attempt.outcome.kind is OutcomeKind.FAILED
    assert attempt.outcome.error is not None
    assert attempt.outcome.error.code == "unexpected_content_type"
    assert "application/json" in attempt.outcome.stop_reason
    assert attempt.attempts == 1
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_event_stream_content_type_with_parameters_is_accepted() -> None:
    turn = ReplayTurn(body=TOOL_STREAM, content_type="Text/Event-Stream; charset=utf-8")
    attempt, _ = await _run([turn])
    assert attempt.outcome.kind is OutcomeKind.TOOL_PROPOSALS


# --- in-stream errors and cut streams ----------------------------------------------------------


@pytest.mark.anyio
async def test_in_stream_overloaded_error_is_retried_before_any_call_fragment() -> None:
    sleep = SleepRecorder()
    tool_use = (FIXTURES / "anthropic" / "single_tool_use_no_args.sse").read_bytes()
    turns = [ReplayTurn(body=OVERLOADED), ReplayTurn(body=tool_use)]
    attempt, _ = await _run(turns, provider="anthropic", sleep=sleep)
    assert attempt.outcome == decode("anthropic", [tool_use])
    assert attempt.attempts == 2
    assert attempt.retried_statuses == ()  # the 200 carried the error, not the status
    assert attempt.retry_reasons == ("provider error in stream",)
    assert len(sleep.delays) == 1


@pytest.mark.anyio
async def test_in_stream_error_after_a_call_fragment_is_not_retried() -> None:
    tool_use = (FIXTURES / "anthropic" / "single_tool_use_no_args.sse").read_bytes()
    start = tool_use.index(b"content_block_start")
    cut = tool_use.index(b"\n\n", start) + 2
    error = OVERLOADED[OVERLOADED.index(b"event: error") :]
    turns = [ReplayTurn(body=tool_use[:cut] + error), ReplayTurn(body=tool_use)]
    attempt, server = await _run(turns, provider="anthropic")
    assert attempt.outcome.kind is OutcomeKind.FAILED
    assert attempt.outcome.error is not None
    assert attempt.outcome.error.retryable
    assert attempt.attempts == 1
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_disconnect_mid_stream_after_call_fragments_is_truncated_and_not_retried() -> None:
    cut = _split_after_first_call_fragment(TOOL_STREAM) + 40
    turns = [ReplayTurn(body=TOOL_STREAM, chunk_size=50, disconnect_after=cut)]
    turns.append(ReplayTurn(body=TOOL_STREAM))
    attempt, server = await _run(turns)
    outcome = attempt.outcome
    assert outcome.kind is OutcomeKind.TRUNCATED
    assert not outcome.complete
    assert outcome.calls == ()
    assert outcome.incomplete_calls  # the started call is reported, never proposed
    assert attempt.disconnected
    assert "cut" in outcome.stop_reason
    assert attempt.attempts == 1
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_disconnect_before_any_call_fragment_is_retried() -> None:
    cut = TOOL_STREAM.index(b'"tool_calls"') - 20  # inside the first event, before any call
    turns = [ReplayTurn(body=TOOL_STREAM, disconnect_after=cut), ReplayTurn(body=TOOL_STREAM)]
    sleep = SleepRecorder()
    attempt, server = await _run(turns, sleep=sleep)
    assert attempt.outcome.kind is OutcomeKind.TOOL_PROPOSALS
    assert not attempt.disconnected  # the final attempt was whole
    assert attempt.attempts == 2
    assert attempt.retry_reasons[0].startswith("transport error")
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_cut_after_the_terminal_event_is_still_never_complete() -> None:
    # Every byte arrives, but the HTTP message never ends: the transport cannot know the
    # body was whole, so the turn is capped at TRUNCATED even though it decoded fully.
    turn = ReplayTurn(body=TOOL_STREAM, disconnect_after=len(TOOL_STREAM))
    attempt, _ = await _run([turn, ReplayTurn(body=TOOL_STREAM)])
    assert decode(CHAT, [TOOL_STREAM]).complete
    assert attempt.outcome.kind is OutcomeKind.TRUNCATED
    assert not attempt.outcome.complete
    assert attempt.disconnected
    assert attempt.attempts == 1


@pytest.mark.anyio
async def test_idle_stream_timeout_truncates_and_is_not_retried_after_fragments() -> None:
    first = _split_after_first_call_fragment(TOOL_STREAM)
    stall = ReplayTurn(body=TOOL_STREAM, chunk_size=first, delay_s=30.0)
    timeouts = TransportTimeouts(connect=5.0, idle_stream=0.2, total=20.0)
    with anyio.fail_after(10):
        attempt, server = await _run([stall, ReplayTurn(body=TOOL_STREAM)], timeouts=timeouts)
    assert attempt.outcome.kind is OutcomeKind.TRUNCATED
    assert attempt.disconnected
    assert "idle stream timeout" in attempt.outcome.stop_reason
    assert attempt.attempts == 1
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_silence_before_the_response_body_is_retried() -> None:
    slow = ReplayTurn(body=TOOL_STREAM, first_byte_delay_s=30.0)
    timeouts = TransportTimeouts(connect=5.0, idle_stream=0.2, total=20.0)
    with anyio.fail_after(10):
        attempt, server = await _run([slow, ReplayTurn(body=TOOL_STREAM)], timeouts=timeouts)
    assert attempt.outcome.kind is OutcomeKind.TOOL_PROPOSALS
    assert attempt.attempts == 2
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_total_timeout_cuts_a_slow_drip() -> None:
    drip = ReplayTurn(body=TOOL_STREAM, chunk_size=200, delay_s=0.05)
    timeouts = TransportTimeouts(connect=5.0, idle_stream=5.0, total=0.4)
    with anyio.fail_after(10):
        attempt, _ = await _run([drip], timeouts=timeouts, retry=RetryPolicy(max_attempts=1))
    assert attempt.outcome.kind is OutcomeKind.TRUNCATED
    assert attempt.disconnected
    assert "time budget" in attempt.outcome.stop_reason


@pytest.mark.anyio
async def test_connection_refused_is_a_retryable_failure_within_bounds() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago and has no listener
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sleep = SleepRecorder()
    async with httpx.AsyncClient() as client:
        attempt = await stream_turn(
            client,
            _adapter(),
            SPEC,
            ProviderEndpoint(base_url=f"http://127.0.0.1:{port}", api_key="k"),
            retry=NO_JITTER,
            sleep=sleep,
        )
    assert attempt.outcome.kind is OutcomeKind.FAILED
    assert attempt.outcome.error is not None
    assert attempt.outcome.error.code == "transport_error"
    assert attempt.attempts == 3
    assert len(sleep.delays) == 2
    assert not attempt.disconnected


# --- configuration values ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "key_var", "default"),
    [
        ("openai_chat", "OPENAI_API_KEY", "https://api.openai.com"),
        ("openai_responses", "OPENAI_API_KEY", "https://api.openai.com"),
        ("anthropic", "ANTHROPIC_API_KEY", "https://api.anthropic.com"),
        ("gemini", "GEMINI_API_KEY", "https://generativelanguage.googleapis.com"),
        ("gemini_interactions", "GEMINI_API_KEY", "https://generativelanguage.googleapis.com"),
    ],
)
def test_endpoint_from_env(provider: str, key_var: str, default: str) -> None:
    endpoint = ProviderEndpoint.from_env(provider, {key_var: "sk-123"})
    assert endpoint.base_url == default
    assert endpoint.api_key == "sk-123"
    assert "sk-123" not in repr(endpoint)
    url_var = key_var.replace("API_KEY", "BASE_URL")
    custom = ProviderEndpoint.from_env(provider, {key_var: "k", url_var: "http://127.0.0.1:9/"})
    assert custom.url("/v1/x?alt=sse") == "http://127.0.0.1:9/v1/x?alt=sse"
    with pytest.raises(ConfigError, match=key_var):
        ProviderEndpoint.from_env(provider, {})
    with pytest.raises(ConfigError, match=key_var):
        ProviderEndpoint.from_env(provider, {key_var: "  "})


def test_endpoint_rejects_unknown_provider_and_bad_url() -> None:
    with pytest.raises(ConfigError, match="unknown provider"):
        ProviderEndpoint.from_env("nope", {})
    with pytest.raises(ConfigError):
        ProviderEndpoint(base_url="ftp://x", api_key="k")


def test_backoff_jitter_stays_within_its_fraction() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=10.0, jitter=0.5)
    assert policy.delay(1, None, 0.0) == 1.0
    assert policy.delay(1, None, 0.999) == pytest.approx(0.5005)
    assert policy.delay(3, None, 0.0) == 4.0
    assert policy.delay(30, None, 0.0) == 10.0
    assert policy.delay(1, 3.0, 0.9) == 3.0
    assert policy.delay(1, 60.0, 0.9) == 10.0
    with pytest.raises(ConfigError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ConfigError):
        RetryPolicy(jitter=1.5)
    with pytest.raises(ConfigError):
        TransportTimeouts(idle_stream=0)
    with pytest.raises(ConfigError):
        TransportTimeouts(total=math.nan)  # NaN compares false to every bound
    with pytest.raises(ConfigError):
        RetryPolicy(base_delay=math.nan)


@pytest.mark.parametrize(
    "key", ["", "sk-new\n", " sk-padded", "sk-\x00nul", "sk-proj-abc\u2026xyz", "sk-\u043a\u043b"]
)
def test_an_api_key_that_cannot_be_a_header_value_is_refused(key: str) -> None:
    # (The HTTP library would fail on it late, and may log the header value.)
    with pytest.raises(ConfigError, match="API key"):
        ProviderEndpoint(base_url="https://api.example", api_key=key)


def test_retry_after_forms() -> None:
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 7, usegmt=True)
    assert retry_after_seconds({"retry-after": "2"}, now) == 2.0
    assert retry_after_seconds({"retry-after": "1.5"}, now) == 1.5
    assert retry_after_seconds({"retry-after": date}, now) == pytest.approx(7.0)
    assert retry_after_seconds({"retry-after": email.utils.formatdate(now - 60)}, now) == 0.0
    assert retry_after_seconds({"retry-after-ms": "250", "retry-after": "9"}, now) == 0.25
    assert retry_after_seconds({"retry-after": "-3"}, now) is None
    assert retry_after_seconds({"retry-after": "soon"}, now) is None
    assert retry_after_seconds({"retry-after": "nan"}, now) is None
    assert retry_after_seconds({}, now) is None
    # Dates whose day or zone is out of range (the date parser overflows): unreadable.
    huge = "99999999999999999999"
    for value in (f"Mon, {huge} Jan 2024 00:00:00 GMT", f"Mon, 01 Jan 2024 00:00:00 +{huge}"):
        assert retry_after_seconds({"retry-after": value}, now) is None


def test_turn_attempt_is_a_frozen_value() -> None:
    attempt = TurnAttempt(outcome=decode(CHAT, [TOOL_STREAM]), attempts=1)
    with pytest.raises(AttributeError):
        attempt.attempts = 2  # type: ignore[misc]
    assert msgspec.json.decode(msgspec.json.encode(attempt))["attempts"] == 1
