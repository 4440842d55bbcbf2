"""Bounded, incremental Server-Sent Events decoder: bytes in, ``SSEEvent`` values out.

Owns the chunk and line side of the WHATWG event-stream rules (line ends, BOM, blank
lines, an unfinished event discarded at end of stream), the byte cap on lines, and the
fast paths for the chunk shapes real streams use; the fields of one event, their
dispatch and the cap on an event's bytes are ``sse_fields.EventFields``, which the
decoder extends. It must never buffer more than ``Limits.max_line_bytes`` of an
unterminated line, never decode ``data`` (adapters parse JSON straight from bytes), and
never do I/O.

Why not httpx-sse: its line splitter keeps an unterminated line in memory without any
bound, and it decodes every byte to ``str`` before splitting.

How it stays fast: CR and LF are ASCII, so the decoder splits raw bytes (a multi-byte
UTF-8 character can never be cut by a split). Each chunk is scanned by C-level
``bytes`` methods, a few calls per chunk rather than per event, for the shapes real
streams use: a chunk of ``data: <value>`` events (OpenAI chat; Gemini's CRLF framing
is split as is, since rewriting every CRLF costs more than the split) is split into
values by one ``split`` call; a chunk of ``event:`` + ``data:`` pairs (Anthropic,
Responses, Interactions) is split into lines once and its names and values sliced out
of that list. Everything else is normalised to LF and goes through the block and
per-line paths. An unterminated line that spans chunks grows in one ``array("B")`` (in
place, so a long line is held about once: arrays over-allocate by 1/16 as they grow,
where a ``bytearray`` takes 1/8, and that slack sits beside every other copy of a big
value), is never rescanned until its line end arrives, and a ``data:`` line then
becomes its event's value as a read-only view of that buffer, not a copy; per-line
length checks run only on chunks longer than a cap.
"""

from __future__ import annotations

from array import array
from itertools import repeat
from typing import cast

from .errors import CallgateError, ConfigError, SSELineTooLong
from .limits import DEFAULT_LIMITS, Limits
from .sse_fields import LINE_TYPES, TYPES, EventFields, SSEData, SSEEvent

__all__ = ["SSEData", "SSEDecoder", "SSEEvent"]

_BOM = b"\xef\xbb\xbf"
_LF = 10
_CR = 13


class SSEDecoder(EventFields):
    """Incremental event-stream decoder with byte caps.

    ``feed`` returns the events completed by a chunk; ``close`` ends the stream and
    discards an unfinished event (per spec a stream cut mid-event must not produce it).
    ``id`` on an event is the last event id seen so far (it persists across events);
    ``retry`` is the value given inside that event's own lines, if any.

    With ``collect_unframed=True`` lines that are neither comments nor one of the four
    SSE fields are joined with ``"\\n"`` and emitted as one ``SSEEvent(event="",
    unframed=True)`` at the next blank line, after the framed event of the same block,
    or at ``close()`` (so a raw body at the very end, even without a final line end,
    is still reported). Gemini appends raw JSON error bodies this way.

    Caps: a line longer than ``max_line_bytes`` (terminator excluded) raises
    ``SSELineTooLong`` as soon as more than that many bytes of it are buffered; joined
    data (or unframed text) of one event longer than ``max_event_bytes`` raises
    ``SSEEventTooLarge``. A line or event of exactly the cap is accepted. Errors are
    raised in stream order whatever the chunking; events completed earlier in the
    same ``feed`` call are not returned by it, but ``take_salvaged()`` hands them out
    (so a pipeline can process them before the error, whatever the chunking). After any
    error the decoder is poisoned and raises the same error again.
    """

    __slots__ = (
        "_carry",
        "_closed",
        "_cr",
        "_error",
        "_head",
        "_held",
        "_max_line",
        "_parts",
        "_plain",
        "_salvage",
        "_small",
        "_tail_len",
    )

    def __init__(self, limits: Limits = DEFAULT_LIMITS, *, collect_unframed: bool = False) -> None:
        EventFields.__init__(self, limits.max_event_bytes, collect_unframed)
        self._max_line = limits.max_line_bytes
        # A chunk whose complete part is at most this long cannot hold an over-cap line
        # or an over-cap single-line event, so it skips every per-line length check.
        self._small = min(self._max_line, self._max_event)
        # Stream position. ``_plain`` is False while any of the rare states below needs
        # attention at the start of ``feed``, so the common case tests one flag.
        self._plain = False
        self._head: bytes | None = b""  # bytes seen while a BOM is still possible
        self._cr = False  # the last chunk ended in CR: a leading LF is its CRLF's half
        self._error: CallgateError | None = None
        self._salvage: list[SSEEvent] = []  # events of the chunk that raised the error
        self._closed = False
        # Bytes carried to the next chunk: ``_held`` bytes of complete lines not yet
        # applied (see ``_blocks``), then the first piece of the unterminated line;
        # once it spans more chunks the whole line grows ``_parts`` instead (never
        # rescanned per chunk). The
        # unterminated line is ``_tail_len`` bytes long.
        self._carry = b""
        self._held = 0
        self._parts = array("B")
        self._tail_len = 0

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Consume a chunk; return the events it completed, in stream order."""
        if not self._plain or type(data) is not bytes:
            data = self._prepare(data)
            if not data:
                return []
        try:
            if _CR in data:  # an int operand: memchr, no method call
                # A CR always ends a line, so one at the chunk's end ends it now; only
                # an LF opening the next chunk must be swallowed as the CRLF's second half.
                if data[-1] == _CR:
                    self._cr = True
                    self._plain = False
                elif not self._parts and not self._held and not self._dirty:
                    events = self._crlf_values(data)
                    if events is not None:
                        return events
                data = data.replace(b"\r\n", b"\n")
                if _CR in data:  # a bare CR; rare, and replace() scans the whole chunk
                    data = data.replace(b"\r", b"\n")
            end = data.rfind(b"\n") + 1
            if not end:
                self._buffer(data)
                return []
            if self._parts:
                # A line that spans several chunks ends here: build it in one join.
                head, data = self._long_line(data)
                if not data:
                    return head
                try:
                    end = data.rfind(b"\n") + 1
                    if not end:
                        self._buffer(data)
                        return head
                    events = self._complete(data, end)
                except CallgateError:
                    self._salvage = head + self._salvage  # the long line's event came first
                    raise
                return head + events if head else events
            return self._complete(data, end)
        except CallgateError as exc:
            self._poison(exc)
            raise

    def _complete(self, data: bytes, end: int) -> list[SSEEvent]:
        """Apply the complete lines of the carry plus ``data`` (its first ``end`` bytes
        end in LF); keep the unterminated rest."""
        if self._carry:
            end += self._held + self._tail_len
            text = self._carry + data
        else:
            text = data
        rest = len(text) - end
        if rest > self._max_line or end > self._small:
            return self._guarded(text, end)
        self._carry = text[end:] if rest else b""
        self._held = 0
        self._tail_len = rest
        if not self._dirty:
            # (text[end - 2] is in range: a "data: " start puts the last LF past it.)
            if text.startswith(b"data: ") and text[end - 2] == _LF:
                # The chunk may be nothing but `data: <value>` lines each followed by
                # a blank line (OpenAI chat, Gemini): split out the values in one C
                # call, then check that no value hides another line. (bytes.count
                # is a plain loop; join + memchr is several times faster.)
                if text.find(b"\n", 6) == end - 2:  # network-sized chunks: one event
                    return [SSEEvent("message", text[6 : end - 2], self._last_id)]
                values = text[6 : end - 2].split(b"\n\ndata: ")
                if _LF not in b"".join(values):
                    last_id = self._last_id
                    return [SSEEvent("message", value, last_id) for value in values]
            elif text.startswith(b"event: "):
                events = self._pairs(text, end)
                if events is not None:
                    return events
        return self._blocks(text, rest, True)

    def _crlf_values(self, data: bytes) -> list[SSEEvent] | None:
        """A chunk of CRLF-framed ``data: <value>`` events (Gemini), split without
        first rewriting every CRLF (``replace`` of a two-byte pattern is slow); None
        when the chunk has any other shape. Called only with no event pending."""
        text = self._carry + data if self._carry else data
        end = text.rfind(b"\r\n\r\n") + 4
        if end < 10 or not text.startswith(b"data: "):
            return None
        rest = len(text) - end
        if rest:
            tail = text[end:]
            if _CR in tail or _LF in tail or rest > self._max_line:
                return None
        else:
            tail = b""
        if end > self._small:
            return None
        values = text[6 : end - 4].split(b"\r\n\r\ndata: ")
        joined = b"".join(values)
        if _CR in joined or _LF in joined:
            return None
        self._carry = tail
        self._held = 0
        self._tail_len = rest
        last_id = self._last_id
        return [SSEEvent("message", value, last_id) for value in values]

    def _long_line(self, data: bytes) -> tuple[list[SSEEvent], bytes]:
        """The unterminated line (kept as pieces) ends at ``data``'s first LF: apply it,
        joining its pieces once (a ``data:`` line straight into its value, so a large
        event is copied once, not three times), and dispatch the event if a blank line
        follows at once. Returns the events and the bytes after what was consumed."""
        nl = data.find(b"\n")
        if self._tail_len + nl > self._max_line:
            raise SSELineTooLong("max_line_bytes", self._max_line)
        # ``_parts`` holds the whole line so far (``_buffer`` moved its first piece there);
        # the carry holds at most complete lines not yet applied.
        held, line = self._held, self._parts
        if held:
            self._lines(self._carry[:held])  # a lone `event:` line, already validated
        self._carry = b""
        self._held = 0
        self._parts = array("B")
        self._tail_len = 0
        line.frombytes(memoryview(data)[:nl])
        view = memoryview(line).toreadonly()  # the buffer is never resized again
        head = view[:6].tobytes()
        if head.startswith(b"data:"):
            # The event's data is a view of this buffer: a long line is never held twice.
            self._add_data(view[6:] if head == b"data: " else view[5:])
        else:
            value = bytes(view)
            del view, line
            self._lines(value)
        out: list[SSEEvent] = []
        if data[nl + 1 : nl + 2] == b"\n":
            self._dispatch(out)
            return out, data[nl + 2 :]
        return out, data[nl + 1 :]

    def _pairs(self, text: bytes, end: int) -> list[SSEEvent] | None:
        """Complete ``event: <name>`` + ``data: <value>`` events (Anthropic, Responses,
        Interactions) up to the last blank line of ``text``, with a few C-level calls
        per chunk instead of a dozen per event; None (nothing applied) when any block
        has another shape. The lines after the last blank line are applied as usual."""
        cut = text.rfind(b"\n\n", 0, end) + 2
        if cut < 2:
            return None
        lines = text[: cut - 1].split(b"\n")
        if len(lines) % 3 or any(lines[2::3]):
            return None
        datas = lines[1::3]
        joined = b"\n".join(datas)
        values = joined.split(b"\ndata: ")
        # Each "\ndata: " starts a line, so every data line has the prefix exactly when
        # there are as many values as lines.
        if len(values) != len(datas) or not joined.startswith(b"data: "):
            return None
        values[0] = values[0][6:]
        names = lines[0::3]
        types = LINE_TYPES
        etypes: list[str | None]
        first = types.get(names[0])
        if first is not None and names.count(names[0]) == len(names):
            etypes = [first] * len(names)  # one type throughout (a long stream's middle)
        else:
            etypes = list(map(types.get, names))
        if None in etypes:
            for i, etype in enumerate(etypes):
                if etype is None:
                    line = names[i]
                    if not line.startswith(b"event: "):
                        return None
                    try:
                        etypes[i] = types.get(line) or self._event_line_type(line)
                    except CallgateError:
                        # A bad name: the events before it came first in the stream.
                        self._salvage = [
                            SSEEvent(t, v, self._last_id)
                            for t, v in zip(etypes[:i], values[:i], strict=True)
                            if t is not None  # always: every name before i was decoded
                        ]
                        raise
        # (Every entry is a str by now: the loop above filled each None or returned.)
        events = list(map(SSEEvent, cast("list[str]", etypes), values, repeat(self._last_id)))
        last = text[cut:end]
        if last:
            try:
                self._tail_block(last, True)
            except CallgateError:
                self._salvage = events  # complete before the bad line
                raise
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: discard an unfinished event; return pending unframed text."""
        if self._error is not None:
            raise self._error.with_traceback(None)
        if self._closed:
            return []
        out: list[SSEEvent] = []
        try:
            # A stream that ended inside a possible BOM (1-2 bytes held in ``_head``, with
            # nothing else fed): those bytes are its unterminated line, capped like any
            # other (``_buffer`` has already capped a line held in the carry or parts).
            if self._head and len(self._head) > self._max_line:
                raise SSELineTooLong("max_line_bytes", self._max_line)
            if self._collect:
                tail = b"".join((self._head or b"", self._carry[self._held :], self._parts))
                if tail and self._is_unframed(tail):
                    self._add_unframed(tail)
        except CallgateError as exc:
            self._poison(exc)
            raise
        if self._unframed:  # (only ever filled when collecting)
            out.append(SSEEvent("", b"\n".join(self._unframed), None, None, True))
        self._reset()
        self._head = None
        self._carry = b""
        self._held = 0
        self._parts = array("B")
        self._tail_len = 0
        self._closed = True
        self._plain = False
        return out

    def take_salvaged(self) -> list[SSEEvent]:
        """After ``feed`` raised: the events that same chunk completed before the error,
        in stream order (handed out once; empty when there were none)."""
        out, self._salvage = self._salvage, []
        return out

    def _poison(self, exc: CallgateError) -> None:
        self._error = exc
        self._plain = False
        # From now on the decoder only re-raises ``exc`` (``_salvage`` is apart): drop
        # what it buffered (a line up to the cap, a pending event's data or unframed
        # text) rather than keep it alive as long as the decoder.
        self._carry = b""
        self._held = 0
        self._parts = array("B")
        self._tail_len = 0
        self._reset()

    def _prepare(self, data: bytes) -> bytes:
        """The rare states at the start of a chunk: error, closed, BOM, split CRLF."""
        if self._error is not None:
            raise self._error.with_traceback(None)
        if self._closed:
            raise ConfigError("SSEDecoder.feed() called after close()")
        if type(data) is not bytes:
            data = bytes(data)
        if self._head is not None:
            head = self._head + data
            if len(head) < len(_BOM) and _BOM.startswith(head):
                self._head = head
                return b""
            self._head = None
            data = head[3:] if head.startswith(_BOM) else head
        if self._cr and data:
            self._cr = False
            if data[0] == _LF:
                data = data[1:]
        self._plain = self._head is None and not self._cr
        return data

    def _buffer(self, data: bytes) -> None:
        """Keep a piece of a line whose end has not arrived yet."""
        size = self._tail_len + len(data)
        if size > self._max_line:
            # Checked before any copy: a chunk past the cap is never buffered.
            raise SSELineTooLong("max_line_bytes", self._max_line)
        if self._parts or self._carry:
            if not self._parts and len(self._carry) > self._held:
                # The line spans a third chunk: its first piece moves from the carry
                # into the buffer, which from now on holds the whole line.
                self._parts.frombytes(memoryview(self._carry)[self._held :])
                self._carry = self._carry[: self._held]
            self._parts.frombytes(data)  # grows in place: a long line is held about once
        else:
            self._carry = data
        self._tail_len = size

    def _guarded(self, text: bytes, end: int) -> list[SSEEvent]:
        """A chunk long enough to hold an over-cap line: measure every line once."""
        max_line = self._max_line
        too_long = len(text) - end > max_line
        lengths = list(map(len, text[:end].split(b"\n")))
        longest = max(lengths)
        if longest > max_line:
            # Apply the lines before the first over-long one, so that an earlier
            # error is raised first, exactly as when the bytes arrive one by one.
            first = next(i for i, n in enumerate(lengths) if n > max_line)
            end = sum(lengths[:first]) + first
            too_long = True
        self._held = 0
        if too_long:
            self._carry = b""
            self._tail_len = 0
            if end:
                self._salvage = self._blocks(text[:end], 0, longest <= self._max_event)
            raise SSELineTooLong("max_line_bytes", max_line)
        rest = len(text) - end
        self._carry = text[end:] if rest else b""
        self._tail_len = rest
        return self._blocks(text, rest, longest <= self._max_event)

    def _blocks(self, text: bytes, rest: int, fast: bool) -> list[SSEEvent]:
        """Apply the complete lines of ``text`` (all but its last ``rest`` bytes, the
        tail, already kept). ``fast``: no line or one-line event can exceed a cap.
        On an error, the events completed before it are kept for ``take_salvaged``."""
        out: list[SSEEvent] = []
        try:
            return self._apply_blocks(text, rest, fast, out)
        except CallgateError:
            self._salvage = out
            raise

    def _apply_blocks(
        self, text: bytes, rest: int, fast: bool, out: list[SSEEvent]
    ) -> list[SSEEvent]:
        # Blocks between blank lines. Every block but the last ends at a blank line;
        # the last holds lines still waiting for one (plus the tail, cut off below).
        # Runs of three or more LFs leave a leading LF on the next block; stripping it
        # is right because an extra blank line right after a dispatch is a no-op.
        blocks = text.split(b"\n\n")
        last = blocks.pop()
        if rest:
            last = last[:-rest]
        if self._dirty:
            if text[0] == _LF:
                self._dispatch(out)  # the chunk opens with the blank line ending it
            elif blocks:
                self._lines(blocks[0])  # the first block continues that event
                self._dispatch(out)
                del blocks[0]
        last_id = self._last_id
        types = TYPES
        for block in blocks:
            # The common shapes: `data:` alone, or `event:` then `data:` (Anthropic,
            # OpenAI Responses), each on one line.
            # (`_LF in x` with an int operand is a memchr without a method call.)
            if fast:
                if block.startswith(b"data:"):
                    if _LF not in block:
                        value = block[6:] if block[5:6] == b" " else block[5:]
                        out.append(SSEEvent("message", value, last_id))
                        continue
                elif block.startswith(b"event: "):
                    i = block.find(b"\n")
                    if block.startswith(b"data: ", i + 1):  # i == -1: never at 0
                        value = block[i + 7 :]
                        if _LF not in value:
                            name = block[7:i]
                            etype = types.get(name) or self._event_type(name)
                            out.append(SSEEvent(etype, value, last_id))
                            continue
            self._lines(block)
            self._dispatch(out)
            last_id = self._last_id
        if last:
            self._tail_block(last, fast)
        return out

    def _tail_block(self, last: bytes, fast: bool) -> None:
        """Complete lines after the chunk's last blank line: an event still arriving."""
        if (
            fast
            and not self._dirty
            and last.startswith(b"event: ")
            and last.find(b"\n") == len(last) - 1
        ):
            # A lone `event:` line whose `data:` line is still on its way: carry
            # it so the whole block takes the fast path next time (small chunks
            # split Anthropic/Responses events exactly here). Decoding the name
            # now raises a bad one where applying the line would have.
            self._event_type(last[7:-1])
            self._carry = last + self._carry
            self._held = len(last)
        else:
            self._lines(last)
