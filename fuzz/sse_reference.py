"""A deliberately naive SSE parser: the oracle the SSE decoder target compares against.

It follows the WHATWG event-stream rules and callgate's documented extensions (byte caps,
unframed-text collection, UTF-8 errors) line by line over the whole input, with no fast
paths and no chunking, so that a disagreement points at the optimised decoder. It is
written from the documentation of ``callgate.engine.core.sse.SSEDecoder``, not from its
code. It never does I/O and is not used outside the fuzz targets and their tests.
"""

from __future__ import annotations

import re

import msgspec

from callgate.engine.core.errors import (
    CallgateError,
    SSEEventTooLarge,
    SSELineTooLong,
    StreamProtocolError,
)
from callgate.engine.core.limits import Limits
from callgate.engine.core.sse import SSEEvent

__all__ = ["ReferenceResult", "reference_decode"]

_BOM = b"\xef\xbb\xbf"
_FIELDS = (b"data", b"event", b"id", b"retry")
_LINE_END = re.compile(rb"\r\n|\r|\n")


class ReferenceResult(msgspec.Struct, frozen=True):
    """Every event dispatched before the first error, and that error's class (None for
    a stream that decodes to its end)."""

    events: list[SSEEvent]
    error: type[CallgateError] | None


class _State:
    def __init__(self, limits: Limits, collect: bool) -> None:
        self.max_line = limits.max_line_bytes
        self.max_event = limits.max_event_bytes
        self.collect = collect
        self.out: list[SSEEvent] = []
        self.last_id: str | None = None
        self.reset()

    def reset(self) -> None:
        self.data: list[bytes] = []
        self.etype = ""
        self.retry: int | None = None
        self.unframed: list[bytes] = []
        self.pending = False  # anything set since the last blank line

    def line(self, line: bytes) -> None:
        if len(line) > self.max_line:
            raise SSELineTooLong("max_line_bytes", self.max_line)
        if not line:
            self.dispatch()
            return
        if line.startswith(b":"):
            return
        name, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self.add(self.data, value)
        elif name == b"event":
            self.etype = _utf8(value, "event")
            self.pending = True
        elif name == b"id":
            if b"\0" not in value:
                self.last_id = _utf8(value, "id")
        elif name == b"retry":
            if value.isdigit():
                try:
                    self.retry = int(value)
                except ValueError:  # beyond int()'s digit limit: ignored like a bad value
                    return
                self.pending = True
        elif self.collect:
            self.add(self.unframed, line)

    def add(self, target: list[bytes], value: bytes) -> None:
        size = sum(map(len, target)) + len(target) + len(value)
        if size > self.max_event:
            raise SSEEventTooLarge("max_event_bytes", self.max_event)
        target.append(value)
        self.pending = True

    def dispatch(self) -> None:
        if not self.pending:
            return
        if self.data:
            self.out.append(
                SSEEvent(self.etype or "message", b"\n".join(self.data), self.last_id, self.retry)
            )
        if self.unframed:
            self.out.append(SSEEvent("", b"\n".join(self.unframed), None, None, True))
        self.reset()


def _utf8(value: bytes, field: str) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise StreamProtocolError(f"SSE {field!r} field is not valid UTF-8") from None


def reference_decode(data: bytes, limits: Limits, *, collect_unframed: bool) -> ReferenceResult:
    """Decode the whole stream ``data`` and close it."""
    state = _State(limits, collect_unframed)
    if data.startswith(_BOM):
        data = data[3:]
    try:
        pos = 0
        for match in _LINE_END.finditer(data):
            state.line(data[pos : match.start()])
            pos = match.end()
        tail = data[pos:]
        if len(tail) > state.max_line:
            raise SSELineTooLong("max_line_bytes", state.max_line)
        # End of stream: the unfinished event is dropped; with collection on, an
        # unframed tail line and pending unframed text are still reported.
        if collect_unframed:
            if tail and not tail.startswith(b":") and tail.partition(b":")[0] not in _FIELDS:
                state.add(state.unframed, tail)
            if state.unframed:
                state.out.append(SSEEvent("", b"\n".join(state.unframed), None, None, True))
    except CallgateError as exc:
        return ReferenceResult(state.out, type(exc))
    return ReferenceResult(state.out, None)
