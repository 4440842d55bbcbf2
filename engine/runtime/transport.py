"""The HTTP side of one model turn: POST the request, stream the body through the bounded
decoder, retry transient failures, and always come back with a classified ``TurnOutcome``.

It owns: endpoint configuration from the environment, the retry policy (jittered exponential
backoff, ``retry-after``, a deadline), the timeouts value object, and ``stream_turn``
(``http_errors`` reads error bodies and masks the key). The host's own code stays the
host's: an exception its ``on_event`` raises reaches it unchanged, even an httpx one.
Every third-party failure is mapped here, at the seam, into an outcome:

    httpx connect/write/read-before-headers error  → FAILED (retryable: nothing was received)
    HTTP 4xx/5xx                                   → FAILED, ProviderErrorInfo(status, code)
    200 with a content type other than SSE         → FAILED (not retried)
    read error, disconnect, idle or total timeout   → decoder.finish(), forced TRUNCATED at
      once the body started                          best (a cut stream is never complete),
                                                     ``disconnected=True``
    provider error event in the stream             → FAILED as the decoder classified it

A failure is retried only while no call fragment has been received, the policy allows
another attempt and the caller's deadline leaves room for the wait.

It must never: know a provider's paths, bodies or header names (the adapter's
``build_request`` and ``auth_headers`` give them), parse SSE itself (the core decoder does,
with its byte caps), turn a provider's error text into a business status, or log a key.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, runtime_checkable

import anyio
import httpx
import httpx_sse
import msgspec

from callgate.engine.core.adapter import Adapter, HttpRequestSpec
from callgate.engine.core.decode import StreamDecoder
from callgate.engine.core.errors import ConfigError
from callgate.engine.core.events import (
    ArgumentsDelta,
    CallDone,
    CallStarted,
    EngineEvent,
    ProviderError,
)
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits
from callgate.engine.core.outcome import OutcomeKind, ProviderErrorInfo, TurnOutcome, Usage
from callgate.engine.store.url import redact_url

from .http_errors import error_fields, masked, retry_after_seconds, without_key

__all__ = [
    "RETRY_STATUSES",
    "EventCallback",
    "ProviderEndpoint",
    "RetryPolicy",
    "TransportAdapter",
    "TransportTimeouts",
    "TurnAttempt",
    "retry_after_seconds",
    "stream_turn",
    "tls_context",
]

# Request timeout (408) and lock timeout (409), as the official OpenAI and Anthropic
# clients retry them; rate limited (429); server errors that providers document as
# transient (500, 502, 503, 504) and Anthropic's "overloaded" (529). Other 4xx are the
# request's fault, and 501/505 the server saying it never does this: retrying cannot
# help. A provider's ``x-should-retry`` header overrides the set either way (below).
RETRY_STATUSES: frozenset[int] = frozenset({408, 409, 429, 500, 502, 503, 504, 529})

# Error bodies are JSON objects of a few hundred bytes; 64 KiB keeps a hostile or
# misconfigured endpoint (an HTML error page, an endless body) from being held.
_MAX_ERROR_BODY = 64 * 1024
_FRAGMENT_EVENTS = (CallStarted, ArgumentsDelta, CallDone)

# provider name -> (base URL variable, API key variable, default base URL)
_ENV: dict[str, tuple[str, str, str]] = {
    "openai_chat": ("OPENAI_BASE_URL", "OPENAI_API_KEY", "https://api.openai.com"),
    "openai_responses": ("OPENAI_BASE_URL", "OPENAI_API_KEY", "https://api.openai.com"),
    "anthropic": ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "https://api.anthropic.com"),
    "gemini": (
        "GEMINI_BASE_URL",
        "GEMINI_API_KEY",
        "https://generativelanguage.googleapis.com",
    ),
    "gemini_interactions": (
        "GEMINI_BASE_URL",
        "GEMINI_API_KEY",
        "https://generativelanguage.googleapis.com",
    ),
}

EventCallback = Callable[[EngineEvent], Awaitable[None]]
# (attempt that failed, why it is retried)
RetryCallback = Callable[[int, str], Awaitable[None]]


@runtime_checkable
class TransportAdapter(Adapter, Protocol):
    """What the transport needs from an adapter: the decode side plus the auth headers
    (every ``Adapter & EncodeSide`` satisfies it)."""

    def auth_headers(self, api_key: str) -> dict[str, str]: ...


class ProviderEndpoint(msgspec.Struct, frozen=True, kw_only=True):
    """Where one provider lives and the key to call it with. ``repr`` never shows the key."""

    base_url: str
    api_key: str

    def __post_init__(self) -> None:
        # A user:password may sit in the URL (from the environment): never shown, refused.
        shown = redact_url(self.base_url)
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base URL must start with http:// or https://: {shown!r}")
        try:  # (a bad port or host would otherwise fail at the first model turn)
            url = httpx.URL(self.base_url)
        except httpx.InvalidURL as exc:
            why = "its user, password, host or port does not parse" if "@" in self.base_url else exc
            raise ConfigError(f"base URL {shown!r} is not a valid URL ({why})") from None
        if not url.host:
            raise ConfigError(f"base URL {shown!r} names no host")
        if url.userinfo:
            # httpx would send them as Basic auth, which replaces OpenAI's Bearer key (the
            # key never goes out), and HTTP libraries log request URLs whole.
            raise ConfigError(
                f"base URL {shown!r} carries a user or password: it would be sent in place "
                "of the API key and logged with every request; give a gateway's credentials "
                "as headers of a host client (Runner(client=httpx.AsyncClient(headers=...)))"
            )
        if (
            not self.api_key
            or not self.api_key.isascii()  # (a header value is bytes: non-ASCII fails late)
            or not self.api_key.isprintable()
            or self.api_key != self.api_key.strip()
        ):
            # (A newline would fail in the HTTP library, which may log the header value.)
            raise ConfigError(
                "the API key must be non-empty printable ASCII without surrounding whitespace"
            )

    def __repr__(self) -> str:
        return f"ProviderEndpoint(base_url={redact_url(self.base_url)!r}, api_key=<redacted>)"

    @classmethod
    def from_env(cls, provider: str, environ: Mapping[str, str] | None = None) -> ProviderEndpoint:
        """Read the provider's base URL and API key variables (see ``_ENV``); a missing or
        empty key is a ``ConfigError`` naming the variable."""
        env = os.environ if environ is None else environ
        try:
            url_var, key_var, default_url = _ENV[provider]
        except KeyError:
            raise ConfigError(
                f"unknown provider {provider!r}; expected one of {', '.join(sorted(_ENV))}"
            ) from None
        key = env.get(key_var, "").strip()
        if not key:
            raise ConfigError(f"{key_var} is not set: the {provider} provider needs an API key")
        return cls(base_url=env.get(url_var, "").strip() or default_url, api_key=key)

    def url(self, path: str) -> str:
        """The absolute URL of an adapter's request path (which may carry a query)."""
        return self.base_url.rstrip("/") + "/" + path.lstrip("/")


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How often and how patiently to retry a transient failure.

    The n-th retry waits ``min(max_delay, base_delay * 2**(n-1))``, reduced by up to
    ``jitter`` (a fraction) at random so that many clients do not retry in lockstep. A
    ``retry-after`` from the provider replaces the backoff, capped by ``max_delay``.
    An HTTP error is retried when its status is in ``retry_statuses``, unless the
    response's ``x-should-retry`` header says ``false``; ``true`` retries any status.
    """

    # Three attempts ride out a brief overload without multiplying a long outage's cost.
    max_attempts: int = 3
    base_delay: float = 0.5
    # Providers ask for up to tens of seconds under load; beyond that a human should know.
    max_delay: float = 30.0
    jitter: float = 0.25
    retry_statuses: frozenset[int] = RETRY_STATUSES

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError("RetryPolicy.max_attempts must be >= 1")
        if not (self.base_delay >= 0 and self.max_delay >= 0):  # (NaN fails both)
            raise ConfigError("RetryPolicy delays must be >= 0")
        if not 0.0 <= self.jitter <= 1.0:
            raise ConfigError("RetryPolicy.jitter must be within 0..1")

    def delay(self, retry_number: int, retry_after: float | None, rand: float) -> float:
        """Seconds to wait before retry ``retry_number`` (1-based); ``rand`` in [0, 1)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay)
        backoff = min(self.max_delay, self.base_delay * 2.0 ** min(retry_number - 1, 60))
        return backoff * (1.0 - self.jitter * rand)


class TransportTimeouts(msgspec.Struct, frozen=True, kw_only=True):
    """Seconds. ``idle_stream`` is the longest silence allowed between two received chunks
    (and before the response head); ``total`` bounds one attempt from connect to last byte."""

    connect: float = 10.0
    # Reasoning models can think silently for a while between events, and not every
    # provider sends keep-alive pings; 90 s separates that from a dead connection.
    idle_stream: float = 90.0
    total: float = 600.0

    def __post_init__(self) -> None:
        values = (self.connect, self.idle_stream, self.total)
        if not all(v > 0 and not math.isnan(v) for v in values):  # (NaN compares false)
            raise ConfigError("TransportTimeouts must all be > 0")


class TurnAttempt(msgspec.Struct, frozen=True, kw_only=True):
    """What ``stream_turn`` ended with. ``attempts`` counts HTTP requests made;
    ``retried_statuses`` the HTTP error statuses that were retried; ``retry_reasons`` why
    each retry happened (callgate's words); ``disconnected`` that the final attempt's body
    was cut (the outcome is then never complete)."""

    outcome: TurnOutcome
    attempts: int
    retried_statuses: tuple[int, ...] = ()
    retry_reasons: tuple[str, ...] = ()
    retry_delays: tuple[float, ...] = ()
    disconnected: bool = False
    # Usage the retried attempts reported (billed, though their outcome was discarded).
    discarded_usage: Usage = Usage()


class _Result(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt's result, before the retry decision."""

    outcome: TurnOutcome
    retryable: bool
    reason: str
    status: int | None = None
    retry_after: float | None = None
    disconnected: bool = False


async def stream_turn(
    client: httpx.AsyncClient,
    adapter: TransportAdapter,
    spec: HttpRequestSpec,
    endpoint: ProviderEndpoint,
    *,
    limits: Limits = DEFAULT_LIMITS,
    retry: RetryPolicy | None = None,
    timeouts: TransportTimeouts | None = None,
    on_event: EventCallback | None = None,
    on_retry: RetryCallback | None = None,
    deadline: float | None = None,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
) -> TurnAttempt:
    """Run one model turn over HTTP and return its classified outcome (never raises for
    anything the network or the provider does).

    ``deadline`` is an absolute ``anyio.current_time()``: no attempt runs past it and no
    retry starts whose wait would end after it. ``on_event`` sees every engine event as it
    is decoded (for progress displays); events of an attempt that is later retried were
    already delivered, so ``on_retry(attempt, reason)`` is awaited before each retry: what
    was shown since that attempt began is to be discarded. ``sleep`` is the wait between
    attempts (tests inject a recorder).
    """
    retry = retry or RetryPolicy()
    timeouts = timeouts or TransportTimeouts()
    # The core's decoder bounds every buffer; a compressed body could inflate one received
    # chunk far past those caps before the decoder sees it, so ask for identity encoding.
    headers = httpx.Headers(spec.headers)
    headers.update(adapter.auth_headers(endpoint.api_key))
    headers["accept-encoding"] = "identity"
    headers["content-type"] = "application/json"
    request = _Request(
        client=client,
        adapter=adapter,
        url=endpoint.url(spec.path),
        content=msgspec.json.encode(spec.body),
        headers=headers,
        limits=limits,
        timeouts=timeouts,
        retry=retry,
        on_event=on_event,
        api_key=endpoint.api_key,
    )
    statuses: list[int] = []
    reasons: list[str] = []
    delays: list[float] = []
    discarded = Usage()
    attempts = 0
    while True:
        budget = timeouts.total
        if deadline is not None:
            budget = min(budget, deadline - anyio.current_time())
        if budget <= 0:
            return TurnAttempt(
                outcome=_failure("deadline_exceeded", "the operation deadline has passed"),
                attempts=attempts,
                retried_statuses=tuple(statuses),
                retry_reasons=tuple(reasons),
                retry_delays=tuple(delays),
                discarded_usage=discarded,
            )
        attempts += 1
        result = await _attempt(request, budget)
        done = TurnAttempt(
            outcome=without_key(result.outcome, endpoint.api_key),
            attempts=attempts,
            retried_statuses=tuple(statuses),
            retry_reasons=tuple(reasons),
            retry_delays=tuple(delays),
            disconnected=result.disconnected,
            discarded_usage=discarded,
        )
        if not result.retryable or attempts >= retry.max_attempts:
            return done
        wait = retry.delay(attempts, result.retry_after, random.random())
        if deadline is not None and anyio.current_time() + wait >= deadline:
            return done
        if result.status is not None:
            statuses.append(result.status)
        reasons.append(result.reason)
        delays.append(wait)
        discarded = discarded.plus(result.outcome.usage)
        if on_retry is not None:
            await on_retry(attempts, result.reason)
        await sleep(wait)


_TLS: list[ssl.SSLContext] = []  # the process's default context, once made


async def tls_context() -> ssl.SSLContext:
    """The default TLS context (system CA bundle) for clients callgate opens itself:
    made once per process, in a worker thread. Loading the bundle takes tens of
    milliseconds, which on the event loop would stall every operation in flight (and a
    client made without a context loads it again, each time)."""
    if not _TLS:
        context = await anyio.to_thread.run_sync(httpx.create_ssl_context)
        if not _TLS:  # (another drive may have made one meanwhile: keep the first)
            _TLS.append(context)
    return _TLS[0]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Request:
    """Everything that stays the same across the attempts of one turn."""

    client: httpx.AsyncClient
    adapter: TransportAdapter
    url: str
    content: bytes
    headers: httpx.Headers = dataclasses.field(repr=False)  # (they hold the key)
    limits: Limits
    timeouts: TransportTimeouts
    retry: RetryPolicy
    on_event: EventCallback | None
    api_key: str = dataclasses.field(repr=False)


class _HostRaised(Exception):
    """Carries an exception the host's ``on_event`` raised past the handlers of
    ``_attempt``: an ``httpx`` error from the host's own code (forwarding events to a
    webhook) must reach the host, not be taken for the provider's stream being cut."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(type(error).__name__)
        self.error = error


async def _attempt(request: _Request, budget: float) -> _Result:
    timeouts, retry, on_event = request.timeouts, request.retry, request.on_event
    http_timeout = httpx.Timeout(
        connect=timeouts.connect,
        read=timeouts.idle_stream,
        write=timeouts.connect,
        pool=timeouts.connect,
    )
    decoder: StreamDecoder | None = None
    fragments = False
    refused: httpx.Response | None = None  # an error response whose body is being read
    with anyio.move_on_after(budget):
        try:
            async with httpx_sse.aconnect_sse(
                request.client,
                "POST",
                request.url,
                content=request.content,
                headers=request.headers.copy(),
                timeout=http_timeout,
                # A host's client may follow redirects; a provider key must never be sent
                # to another origin (httpx strips only Authorization), so a 3xx is an error.
                follow_redirects=False,
                # Nor may a host client's own auth replace (or join) the provider key and
                # carry the host's credentials to the provider.
                auth=None,
            ) as source:
                response = source.response
                if not response.is_success or not _is_event_stream(response):
                    refused = response
                    body = await _read_bounded(response)
                    return _refusal(response, body, retry.retry_statuses)
                if _is_encoded(response):
                    return _encoding_failure(response)
                decoder = StreamDecoder(request.adapter, request.limits)
                async for chunk in response.aiter_bytes():
                    for event in decoder.feed(chunk):
                        if isinstance(event, _FRAGMENT_EVENTS):
                            fragments = True
                        if on_event is not None:
                            shown = event
                            if type(event) is ProviderError:
                                # An endpoint's echoed key is masked before anyone sees it.
                                shown = ProviderError(masked(event.error, request.api_key))
                            try:
                                await on_event(shown)
                            except httpx.HTTPError as exc:  # (httpx_sse.SSEError included)
                                raise _HostRaised(exc) from exc
                    if decoder.failed:
                        break  # the outcome is decided: stop downloading the rest
        except _HostRaised as raised:  # the host's callback, not the provider's connection
            raise raised.error from None
        except httpx_sse.SSEError:
            return _Result(
                outcome=_failure("unexpected_content_type", "the response is not an SSE stream"),
                retryable=False,
                reason="unexpected content type",
            )
        except httpx.TimeoutException as exc:
            what = "idle stream timeout" if isinstance(exc, httpx.ReadTimeout) else "timeout"
            reason = f"{what} ({type(exc).__name__})"
            return _transport_failure(decoder, fragments, reason, retry.retry_statuses)
        except httpx.HTTPError as exc:
            if (
                isinstance(exc, httpx.HTTPStatusError)
                and exc.request.method == "POST"
                and exc.request.url == request.url
            ):
                # A host client's response hook (``raise_for_status``) on the provider's
                # answer: its status decides, as without the hook (the hook closed the
                # body). One on another request (a request hook fetching a token) is a
                # transport error like any other: the provider never answered.
                if exc.response.is_success:
                    raise  # the host's own verdict on a success: the host's exception
                return _http_failure(exc.response, b"", retry.retry_statuses)
            reason = f"transport error ({type(exc).__name__})"
            return _transport_failure(decoder, fragments, reason, retry.retry_statuses)
        outcome = decoder.finish()
        retryable = _retryable_failure(outcome, retry.retry_statuses, fragments)
        return _Result(outcome=outcome, retryable=retryable, reason="provider error in stream")
    if refused is not None:
        # The time ran out while its body arrived: it answered all the same (its status
        # decides, not "no response", which would be retried).
        return _refusal(refused, b"", retry.retry_statuses)
    return _transport_failure(
        decoder, fragments, f"attempt time budget ({budget:.3g} s) spent", retry.retry_statuses
    )


def _refusal(response: httpx.Response, body: bytes, retry_statuses: frozenset[int]) -> _Result:
    """The result of an HTTP error status, or of a success that is no SSE stream."""
    if not response.is_success:
        return _http_failure(response, body, retry_statuses)
    return _content_type_failure(response, body)


def _retryable_failure(
    outcome: TurnOutcome, retry_statuses: frozenset[int], fragments: bool
) -> bool:
    """Whether a FAILED outcome decoded from the stream may be retried: a provider error
    that says so (or has a retry status), before any call fragment arrived. A cap or a
    protocol violation is not: the same request would fail the same way."""
    error = outcome.error
    return (
        outcome.kind is OutcomeKind.FAILED
        and error is not None
        and (error.retryable or error.status in retry_statuses)
        and not fragments
    )


def _transport_failure(
    decoder: StreamDecoder | None,
    fragments: bool,
    reason: str,
    retry_statuses: frozenset[int],
) -> _Result:
    """A failure of the connection itself. Before the body started there is nothing to
    keep; after, the decoder classifies what arrived and the cut caps it at TRUNCATED. A
    stream that had already failed (a provider error, a cap) keeps its own verdict on
    retrying: the cut after it changes nothing."""
    if decoder is None:
        return _Result(
            outcome=_failure("transport_error", f"no response: {reason}", retryable=True),
            retryable=True,
            reason=reason,
        )
    decoded = decoder.finish()
    if decoded.kind is OutcomeKind.FAILED:
        retryable = _retryable_failure(decoded, retry_statuses, fragments)
        return _Result(outcome=decoded, retryable=retryable, reason=reason, disconnected=True)
    outcome = _cut(decoded, f"the stream was cut: {reason}")
    return _Result(outcome=outcome, retryable=not fragments, reason=reason, disconnected=True)


def _cut(outcome: TurnOutcome, reason: str) -> TurnOutcome:
    """A stream that did not end cleanly is never a completed turn, whatever it held: a
    provider error stays FAILED, anything else becomes TRUNCATED (calls are kept for
    diagnostics; the run loop never executes a truncated turn)."""
    if outcome.kind is OutcomeKind.FAILED:
        return outcome
    return msgspec.structs.replace(
        outcome, kind=OutcomeKind.TRUNCATED, stop_reason=f"{reason}; {outcome.stop_reason}"
    )


def _failure(
    code: str, stop_reason: str, *, status: int | None = None, retryable: bool = False
) -> TurnOutcome:
    return TurnOutcome(
        kind=OutcomeKind.FAILED,
        raw_reason=None,
        stop_reason=stop_reason,
        error=ProviderErrorInfo(code=code, status=status, retryable=retryable),
    )


def _http_failure(response: httpx.Response, body: bytes, retry_statuses: frozenset[int]) -> _Result:
    status = response.status_code
    # OpenAI and Anthropic say per response whether a retry can help (their own clients
    # obey it before looking at the status); anything but "true"/"false" is no answer.
    hint = response.headers.get("x-should-retry")
    retryable = hint == "true" or (hint != "false" and status in retry_statuses)
    code, message = error_fields(body)
    outcome = TurnOutcome(
        kind=OutcomeKind.FAILED,
        raw_reason=f"HTTP {status}",
        stop_reason=f"the provider answered HTTP {status}",
        error=ProviderErrorInfo(
            code=code or f"http_{status}", message=message, status=status, retryable=retryable
        ),
    )
    after = retry_after_seconds(response.headers, time.time()) if retryable else None
    return _Result(
        outcome=outcome,
        retryable=retryable,
        reason=f"HTTP {status}",
        status=status,
        retry_after=after,
    )


def _content_type_failure(response: httpx.Response, body: bytes) -> _Result:
    content_type = response.headers.get("content-type", "")
    code, message = error_fields(body)
    outcome = TurnOutcome(
        kind=OutcomeKind.FAILED,
        raw_reason=None,
        stop_reason=f"expected an SSE stream, the response is {content_type[:100]!r}",
        error=ProviderErrorInfo(
            code=code or "unexpected_content_type", message=message, status=response.status_code
        ),
    )
    return _Result(outcome=outcome, retryable=False, reason="unexpected content type")


def _is_encoded(response: httpx.Response) -> bool:
    """A compressed body (sent although identity was asked for): httpx would inflate each
    received chunk before any cap sees it, so such a body is never decoded."""
    return response.headers.get("content-encoding", "identity").strip().lower() not in (
        "",
        "identity",
    )


def _encoding_failure(response: httpx.Response) -> _Result:
    encoding = response.headers.get("content-encoding", "")[:100]
    outcome = TurnOutcome(
        kind=OutcomeKind.FAILED,
        raw_reason=None,
        stop_reason=(
            f"the stream is compressed ({encoding!r}) although identity was asked for; a "
            "compressed stream cannot be read within the byte caps"
        ),
        error=ProviderErrorInfo(code="unexpected_content_encoding", status=response.status_code),
    )
    return _Result(outcome=outcome, retryable=False, reason="unexpected content encoding")


def _is_event_stream(response: httpx.Response) -> bool:
    # The whole media type, case-insensitively, parameters (charset) aside: not httpx_sse's
    # substring test (which only runs inside ``aiter_sse``; the bytes here go to callgate's
    # decoder instead), under which "text/event-streamx" or two joined Content-Type
    # headers ("application/json, text/event-stream") would pass.
    media_type: str = response.headers.get("content-type", "").partition(";")[0]
    return media_type.strip().lower() == "text/event-stream"


async def _read_bounded(response: httpx.Response) -> bytes:
    """At most ``_MAX_ERROR_BODY`` bytes of an error body. A compressed one is read raw
    (still compressed, so unreadable as JSON, but never inflated past the bound)."""
    data = bytearray()
    chunks = response.aiter_raw() if _is_encoded(response) else response.aiter_bytes()
    try:
        async for chunk in chunks:
            data += chunk[: _MAX_ERROR_BODY - len(data)]
            if len(data) >= _MAX_ERROR_BODY:
                break
    except httpx.HTTPError:
        pass  # an error body cut short is still an error; keep what arrived
    return bytes(data)
