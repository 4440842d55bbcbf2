"""One event's fields under the WHATWG event-stream rules: ``SSEEvent`` and the state
that builds it.

Owns the pending event (its ``data`` lines, ``event`` type, ``retry``, the unframed text
beside it), the last event id (which outlives the event that set it), the parsing of
one line into a field, the dispatch of the pending event at a blank line, the cap on an
event's bytes, and the process-wide cache of decoded event names. It never sees a chunk
or a line end: ``sse.SSEDecoder`` (which extends ``EventFields``) splits the bytes into
lines and blocks and hands them here, and owns the caps on lines.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from .errors import SSEEventTooLarge, StreamProtocolError

__all__ = ["LINE_TYPES", "TYPES", "EventFields", "SSEData", "SSEEvent"]

_FIELDS = frozenset((b"data", b"event", b"id", b"retry"))
# Decoded event names, shared by all decoders (a pure function of the bytes, so nothing
# leaks between streams): real streams use a few dozen, decoded once per process, not
# once per stream. A full cache is emptied, so a hostile stream with endless distinct
# names can cost a re-decode of the common ones, never unbounded memory. Only short
# names are cached (real ones are, e.g. `response.function_call_arguments.delta`): a
# longer one is decoded every time, so a stream of huge distinct names (each up to
# max_line_bytes) leaves nothing behind in the process once its decoder is gone.
_TYPE_CACHE = 256
_CACHED_NAME = 64  # longest event name (bytes) kept in `TYPES`
_CACHED_LINE = len(b"event: ") + _CACHED_NAME  # the same bound on a `LINE_TYPES` key
TYPES: dict[bytes, str] = {}  # event name -> dispatched type
LINE_TYPES: dict[bytes, str] = {}  # the same, keyed by the whole `event: <name>` line

# An event's data: bytes, or a read-only view of the buffer a line that spanned
# several chunks was gathered in (every bytes-like consumer, msgspec included, takes it).
SSEData = bytes | memoryview

# The lines of one event are joined at its dispatch; until then each is its own object,
# about 40 bytes beside its value (a view of a line gathered over several chunks, about
# 250), while the cap counts only the value and its line end. So an event of many short
# lines held up to 40 times `max_event_bytes`. Every run of this many lines is joined as
# it completes when it is short (a long line's overhead is small, and a long line kept
# as a view of its buffer stays held once): the same bytes at dispatch, since a run is
# joined with the same "\n" the dispatch puts between lines.
_PACK_RUN = 64
_PACK_BYTES = 16 * 1024
_Line = TypeVar("_Line", bytes, SSEData)  # an unframed line, or a data line's value


def _pack(parts: list[_Line], packed: int) -> int:
    """Join the run after the first ``packed`` entries of ``parts`` when it is short;
    returns how many leading entries are now settled (never looked at again)."""
    run = parts[packed:]
    if sum(map(len, run)) <= _PACK_BYTES:
        parts[packed:] = [b"\n".join(run)]
        return packed + 1
    return len(parts)


class SSEEvent(msgspec.Struct, frozen=True, gc=False):
    """One dispatched event. ``data`` is the UTF-8 bytes of the joined data lines
    (adapters decode JSON straight from bytes): ``bytes``, or a read-only
    ``memoryview`` of the buffer a data line that spanned several chunks was gathered
    in (handed over, not copied, so a long line is held once; it compares equal to
    the same bytes). ``unframed`` marks text that arrived outside any SSE field (only
    collected when the decoder is asked to)."""

    event: str = "message"
    data: SSEData = b""
    id: str | None = None
    retry: int | None = None
    unframed: bool = False


def _text(value: bytes, field: str) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise StreamProtocolError(f"SSE {field!r} field is not valid UTF-8") from None


class EventFields:
    """The event being built from field lines, and its dispatch (see the module
    docstring). ``max_event`` caps the joined data (and the unframed text) of one event;
    ``collect`` keeps lines outside any SSE field as unframed text."""

    __slots__ = (
        "_collect",
        "_data",
        "_data_len",
        "_data_packed",
        "_dirty",
        "_last_id",
        "_max_event",
        "_retry",
        "_type",
        "_unframed",
        "_unframed_len",
        "_unframed_packed",
    )

    def __init__(self, max_event: int, collect: bool) -> None:
        self._max_event = max_event
        self._collect = collect
        # The event being built; ``_dirty`` says whether any of it is set.
        self._dirty = False
        self._data: list[SSEData] = []
        self._data_len = 0
        self._data_packed = 0  # leading entries of `_data` that are packed runs (_pack)
        self._type = ""
        self._retry: int | None = None
        self._unframed: list[bytes] = []
        self._unframed_len = 0
        self._unframed_packed = 0
        self._last_id: str | None = None  # per spec it outlives the event that set it

    def _event_type(self, name: bytes) -> str:
        """The dispatched type for an ``event:`` value (empty means "message")."""
        etype = _text(name, "event") or "message"
        if len(name) <= _CACHED_NAME:
            if len(TYPES) >= _TYPE_CACHE:
                TYPES.clear()
            TYPES[name] = etype
        return etype

    def _event_line_type(self, line: bytes) -> str:
        """The dispatched type for a whole ``event: <name>`` line (cached by line)."""
        etype = self._event_type(line[7:])
        if len(line) <= _CACHED_LINE:
            if len(LINE_TYPES) >= _TYPE_CACHE:
                LINE_TYPES.clear()
            LINE_TYPES[line] = etype
        return etype

    def _lines(self, block: bytes) -> None:
        """Apply the lines of ``block`` (no blank lines inside) to the pending event."""
        block = block.strip(b"\n")
        if not block:
            return
        for line in block.split(b"\n"):
            if line[:5] == b"data:":
                self._add_data(line[6:] if line[5:6] == b" " else line[5:])
            elif line[:1] == b":":
                continue  # comment
            else:
                self._field(line)

    def _field(self, line: bytes) -> None:
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"event":
            self._type = _text(value, "event")
            self._dirty = True
        elif name == b"id":
            if b"\0" not in value:
                self._last_id = _text(value, "id")
        elif name == b"retry":
            # bytes.isdigit() is ASCII-only; int() still refuses absurdly long values.
            if value.isdigit():
                try:
                    self._retry = int(value)
                except ValueError:
                    return
                self._dirty = True
        elif name == b"data":
            self._add_data(value)  # `data` with no colon: an empty data line
        elif self._collect:
            self._add_unframed(line)

    def _add_data(self, value: SSEData) -> None:
        data = self._data
        size = self._data_len + len(value) + (1 if data else 0)
        if size > self._max_event:
            raise SSEEventTooLarge("max_event_bytes", self._max_event)
        data.append(value)
        self._data_len = size
        self._dirty = True
        if len(data) - self._data_packed >= _PACK_RUN:
            self._data_packed = _pack(data, self._data_packed)

    def _add_unframed(self, line: bytes) -> None:
        lines = self._unframed
        size = self._unframed_len + len(line) + (1 if lines else 0)
        if size > self._max_event:
            raise SSEEventTooLarge("max_event_bytes", self._max_event, "unframed text")
        lines.append(line)
        self._unframed_len = size
        self._dirty = True
        if len(lines) - self._unframed_packed >= _PACK_RUN:
            self._unframed_packed = _pack(lines, self._unframed_packed)

    @staticmethod
    def _is_unframed(line: bytes) -> bool:
        return line[:1] != b":" and line.partition(b":")[0] not in _FIELDS

    def _dispatch(self, out: list[SSEEvent]) -> None:
        """A blank line: emit the pending event (if it has data) and reset."""
        if not self._dirty:
            return
        data = self._data
        if data:
            joined = data[0] if len(data) == 1 else b"\n".join(data)
            out.append(SSEEvent(self._type or "message", joined, self._last_id, self._retry))
        if self._unframed:
            out.append(SSEEvent("", b"\n".join(self._unframed), None, None, True))
        self._reset()

    def _reset(self) -> None:
        self._dirty = False
        self._data = []
        self._data_len = 0
        self._data_packed = 0
        self._type = ""
        self._retry = None
        self._unframed = []
        self._unframed_len = 0
        self._unframed_packed = 0
