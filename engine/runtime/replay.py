"""A loopback HTTP/1.1 server that replays scripted provider streams, for tests and the demo.

It owns: a TCP listener on 127.0.0.1 (anyio), a small bounded HTTP/1.1 request parser
(request line, headers, ``Content-Length`` body), a script of ``ReplayTurn`` responses served
one per request, and the record of every request received. Responses always use
``Transfer-Encoding: chunked`` and ``Connection: close`` so that a cut stream (a scripted
``disconnect_after``) is visible to the client as an incomplete message, never as a short but
well-formed body.

It must never: listen beyond loopback unless the caller asks, crash because one connection
misbehaved (a client hanging up mid-response is normal), or hold an unbounded request.

    async with ReplayServer([ReplayTurn.from_file(path)]) as server:
        ...  # POST to server.base_url; then inspect server.requests
"""

from __future__ import annotations

import argparse
import contextlib
import http
import sys
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import msgspec
from anyio.streams.buffered import BufferedByteReceiveStream

from callgate.engine.core.errors import ConfigError

__all__ = [
    "EXHAUSTED_STATUS",
    "ReceivedRequest",
    "ReplayScript",
    "ReplayServer",
    "ReplayTurn",
    "main",
]

# Served when a request arrives after its script ran out: a status no provider uses, so a
# test that asked for one turn too many fails loudly instead of hanging.
EXHAUSTED_STATUS = 599

_KiB = 1024
_MiB = 1024 * _KiB
# Headers the server frames itself; a scripted turn may not override them.
_RESERVED_HEADERS = frozenset({"connection", "content-length", "content-type", "transfer-encoding"})
_TOKEN_CHARS = frozenset(
    b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)


class ReplayTurn(msgspec.Struct, frozen=True, kw_only=True):
    """One scripted response.

    ``chunk_size`` None writes the whole body at once; ``first_byte_delay_s`` waits after the
    headers before the first body byte (time to first token); ``delay_s`` waits between two
    body chunks (slow drip); ``disconnect_after`` closes the connection after that many body
    bytes without the terminating chunk (a cut stream).
    """

    status: int = 200
    body: bytes = b""
    content_type: str = "text/event-stream"
    headers: dict[str, str] = {}
    chunk_size: int | None = None
    delay_s: float = 0.0
    first_byte_delay_s: float = 0.0
    disconnect_after: int | None = None

    def __post_init__(self) -> None:
        if not 100 <= self.status <= 999:
            raise ConfigError(f"ReplayTurn.status must be 100..999, got {self.status}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ConfigError("ReplayTurn.chunk_size must be >= 1 or None")
        if self.delay_s < 0 or self.first_byte_delay_s < 0:
            raise ConfigError("ReplayTurn delays must be >= 0")
        if self.disconnect_after is not None and self.disconnect_after < 0:
            raise ConfigError("ReplayTurn.disconnect_after must be >= 0 or None")
        for name, value in [*self.headers.items(), ("content-type", self.content_type)]:
            # CR/LF in a scripted header would let a script forge the response framing;
            # a value outside latin-1 cannot be written as header bytes at all.
            if (
                not _is_token(name.encode("latin-1", "replace"))
                or any(c in value for c in "\r\n")
                or not _is_latin1(value)
            ):
                raise ConfigError(f"ReplayTurn header {name!r} is not a valid HTTP header")
        clash = _RESERVED_HEADERS.intersection(k.lower() for k in self.headers)
        if clash:
            raise ConfigError(f"ReplayTurn.headers may not set {sorted(clash)}")

    @classmethod
    def from_file(cls, path: str | Path, **options: Any) -> ReplayTurn:
        """A turn whose body is a recorded fixture file (``options`` are the other fields)."""
        return cls(body=Path(path).read_bytes(), **options)

    @classmethod
    def json_error(
        cls,
        status: int,
        payload: object = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> ReplayTurn:
        """An HTTP error response with a JSON body (e.g. 429 with a ``retry-after`` header)."""
        if payload is None:
            payload = {"error": {"code": status, "message": _http_reason(status)}}
        return cls(
            status=status,
            body=msgspec.json.encode(payload),
            content_type="application/json",
            headers=dict(headers or {}),
        )


class ReplayScript(msgspec.Struct, frozen=True):
    """Turns served in order, one per request. A request whose path is a key of ``by_path``
    takes the next turn of that list instead (so one server can fake several endpoints)."""

    turns: tuple[ReplayTurn, ...] = ()
    by_path: dict[str, tuple[ReplayTurn, ...]] = {}

    @classmethod
    def from_files(cls, paths: Sequence[str | Path], **options: Any) -> ReplayScript:
        return cls(tuple(ReplayTurn.from_file(p, **options) for p in paths))


class ReceivedRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One request as the server read it. Header names are lower-cased; repeated headers
    are joined with ", "."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body decoded as JSON (raises ``msgspec.DecodeError`` if it is not JSON)."""
        return msgspec.json.decode(self.body)

    def query_params(self) -> dict[str, list[str]]:
        return urllib.parse.parse_qs(self.query, keep_blank_values=True)


class _BadRequest(Exception):
    """The request cannot be served; answered with ``status`` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# Errors that mean "the peer went away or the socket broke": expected, never fatal.
_DISCONNECTS: tuple[type[BaseException], ...] = (
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
    anyio.IncompleteRead,
    OSError,
)


class ReplayServer:
    """Serves a ``ReplayScript`` on a loopback port; records every request.

    Use ``async with`` inside an event loop, or ``ReplayServer.run_in_thread`` from sync code.
    ``requests`` grows as requests arrive; ``completed`` counts responses sent in full,
    ``dropped`` connections that ended early (scripted disconnects, clients that hung up,
    malformed requests). ``handler_errors`` collects unexpected server-side failures (a
    correct run leaves it empty).
    """

    def __init__(
        self,
        script: ReplayScript | Sequence[ReplayTurn] = (),
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_head_bytes: int = 64 * _KiB,
        max_body_bytes: int = 32 * _MiB,
        read_timeout_s: float = 30.0,
    ) -> None:
        self.script = script if isinstance(script, ReplayScript) else ReplayScript(tuple(script))
        self.requests: list[ReceivedRequest] = []
        self.completed = 0
        self.dropped = 0
        self.handler_errors: list[str] = []
        self._host = host
        self._port = port
        # Request heads are a line and a few headers; 64 KiB is far above what httpx sends.
        self._max_head_bytes = max_head_bytes
        # Request bodies carry the whole conversation; 32 MiB bounds what one request may hold.
        self._max_body_bytes = max_body_bytes
        self._read_timeout_s = read_timeout_s
        self._cursors: dict[str | None, int] = {}
        # Created on entry: an anyio Event belongs to the loop that runs the server.
        self._changed: anyio.Event | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._base_url: str | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        if self._base_url is None:
            raise ConfigError("ReplayServer is not running")
        return self._base_url

    async def __aenter__(self) -> ReplayServer:
        if self._stack is not None:
            raise ConfigError("ReplayServer is already running")
        self._changed = anyio.Event()
        async with contextlib.AsyncExitStack() as stack:
            listener = await anyio.create_tcp_listener(local_host=self._host, local_port=self._port)
            await stack.enter_async_context(listener)
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            tg = await stack.enter_async_context(anyio.create_task_group())
            # Stop serving (and cut any response still dripping) before the listener closes.
            stack.callback(tg.cancel_scope.cancel)
            tg.start_soon(listener.serve, self._serve_connection)
            self._base_url = f"http://{_url_host(self._host)}:{port}"
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        self._base_url = None
        if stack is not None:
            await stack.aclose()

    @classmethod
    @contextlib.contextmanager
    def run_in_thread(
        cls,
        script: ReplayScript | Sequence[ReplayTurn] = (),
        *,
        use_uvloop: bool = False,
        **options: Any,
    ) -> Iterator[ReplayServer]:
        """Run the server on its own event loop in a background thread (for sync callers and
        for other processes talking to ``server.base_url``). Yields the running server."""
        with anyio.from_thread.start_blocking_portal(
            "asyncio", backend_options={"use_uvloop": use_uvloop}
        ) as portal:
            server = cls(script, **options)
            with portal.wrap_async_context_manager(server) as running:
                yield running

    # --- waiting (for tests; no sleeps) -----------------------------------------------------

    async def wait_for_requests(self, count: int) -> None:
        """Return once at least ``count`` requests have been received."""
        await self._wait(lambda: len(self.requests) >= count)

    async def wait_for_dropped(self, count: int) -> None:
        """Return once at least ``count`` connections ended early."""
        await self._wait(lambda: self.dropped >= count)

    async def _wait(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            if self._changed is None:
                raise ConfigError("ReplayServer is not running")
            await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
        self._changed = anyio.Event()

    # --- one connection ----------------------------------------------------------------------

    async def _serve_connection(self, stream: anyio.abc.SocketStream) -> None:
        # A test server must outlive any one connection: every failure is recorded, none
        # propagates into the listener's task group.
        finished = False
        try:
            async with stream:
                finished = await self._exchange(stream)
        except _DISCONNECTS:
            pass
        except Exception as exc:
            self.handler_errors.append(f"{type(exc).__name__}: {exc}")
        if finished:
            self.completed += 1
        else:
            self.dropped += 1
        self._notify()

    async def _exchange(self, stream: anyio.abc.SocketStream) -> bool:
        """Read one request and answer it; True when the response was sent in full."""
        try:
            with anyio.fail_after(self._read_timeout_s):
                request = await self._read_request(BufferedByteReceiveStream(stream))
        except _BadRequest as bad:
            await _send_turn(stream, ReplayTurn.json_error(bad.status, {"error": bad.message}))
            return False
        except TimeoutError:
            return False
        self.requests.append(request)
        self._notify()
        return await _send_turn(stream, self._next_turn(request.path))

    def _next_turn(self, path: str) -> ReplayTurn:
        key: str | None = path if path in self.script.by_path else None
        turns = self.script.turns if key is None else self.script.by_path[path]
        index = self._cursors.get(key, 0)
        self._cursors[key] = index + 1
        if index < len(turns):
            return turns[index]
        return ReplayTurn.json_error(
            EXHAUSTED_STATUS,
            {
                "error": {
                    "code": "replay_script_exhausted",
                    "message": f"request {index + 1} for {path!r}; the script has {len(turns)}",
                }
            },
        )

    async def _read_request(self, reader: BufferedByteReceiveStream) -> ReceivedRequest:
        try:
            head = await reader.receive_until(b"\r\n\r\n", self._max_head_bytes)
        except anyio.DelimiterNotFound:
            raise _BadRequest(431, "request head too large") from None
        # The buffered reader may overshoot by one socket read; the cap is ours to enforce.
        if len(head) > self._max_head_bytes:
            raise _BadRequest(431, "request head too large")
        method, target, headers = _parse_head(head)
        if "transfer-encoding" in headers:
            raise _BadRequest(501, "chunked request bodies are not supported; send Content-Length")
        length = _content_length(headers.get("content-length"), self._max_body_bytes)
        body = await reader.receive_exactly(length) if length else b""
        split = urllib.parse.urlsplit(target)
        return ReceivedRequest(
            method=method, path=split.path or "/", query=split.query, headers=headers, body=body
        )


# --- HTTP/1.1 framing ---------------------------------------------------------------------------


def _is_latin1(value: str) -> bool:
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def _is_token(value: bytes) -> bool:
    return bool(value) and all(c in _TOKEN_CHARS for c in value)


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _is_token(parts[0]) or not parts[1] or parts[2][:5] != b"HTTP/":
        raise _BadRequest(400, "malformed request line")
    if parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise _BadRequest(505, "only HTTP/1.0 and HTTP/1.1 are served")
    if len(lines) > 257:
        raise _BadRequest(431, "too many request headers")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        # No whitespace before the colon, no obsolete line folding (RFC 9112 §5).
        if not colon or not _is_token(name):
            raise _BadRequest(400, "malformed header line")
        key = name.decode("ascii").lower()
        text = value.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    target = parts[1].decode("latin-1")
    if any(c in target for c in " \t"):
        raise _BadRequest(400, "malformed request target")
    return parts[0].decode("ascii"), target, headers


def _content_length(value: str | None, limit: int) -> int:
    if value is None:
        return 0
    values = {v.strip() for v in value.split(",")}
    if len(values) != 1:
        raise _BadRequest(400, "conflicting Content-Length values")
    (text,) = values
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        raise _BadRequest(400, "invalid Content-Length")
    length = int(text)
    if length > limit:
        raise _BadRequest(413, f"request body larger than {limit} bytes")
    return length


def _http_reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return {529: "Overloaded", EXHAUSTED_STATUS: "Replay Script Exhausted"}.get(
            status, "Unknown"
        )


def _response_head(turn: ReplayTurn) -> bytes:
    lines = [
        f"HTTP/1.1 {turn.status} {_http_reason(turn.status)}",
        f"content-type: {turn.content_type}",
        "transfer-encoding: chunked",
        "connection: close",
        "cache-control: no-store",
        *(f"{k}: {v}" for k, v in turn.headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _body_pieces(turn: ReplayTurn) -> AsyncIterator[bytes]:
    body = turn.body
    end = len(body) if turn.disconnect_after is None else min(len(body), turn.disconnect_after)
    size = turn.chunk_size or max(end, 1)
    for offset in range(0, end, size):
        await anyio.sleep(turn.first_byte_delay_s if offset == 0 else turn.delay_s)
        yield body[offset : min(offset + size, end)]


async def _send_turn(stream: anyio.abc.SocketStream, turn: ReplayTurn) -> bool:
    """Write one response; True when it was sent in full (terminating chunk included)."""
    await stream.send(_response_head(turn))
    async for piece in _body_pieces(turn):
        # Size line, data and CRLF in one write: one segment per scripted chunk.
        await stream.send(b"%x\r\n%b\r\n" % (len(piece), piece))
    if turn.disconnect_after is not None:
        # The cut: the caller closes the socket with no terminating chunk, so the client's
        # HTTP parser reports an incomplete body rather than a short, valid one.
        return False
    await stream.send(b"0\r\n\r\n")
    return True


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# --- command line ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m callgate.engine.runtime.replay --port N FILES...``: serve the files as a
    script, one per request, until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m callgate.engine.runtime.replay")
    parser.add_argument("files", nargs="+", type=Path, help="response bodies, served in order")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds between chunks")
    parser.add_argument("--content-type", default="text/event-stream")
    args = parser.parse_args(argv)
    script = ReplayScript.from_files(
        args.files,
        chunk_size=args.chunk_size,
        delay_s=args.delay,
        content_type=args.content_type,
    )

    async def serve() -> None:
        async with ReplayServer(script, host=args.host, port=args.port) as server:
            print(f"serving {len(script.turns)} turn(s) at {server.base_url}", flush=True)
            await anyio.sleep_forever()

    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(serve)


if __name__ == "__main__":
    main(sys.argv[1:])
