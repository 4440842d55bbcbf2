"""Per-call argument accumulation for one response.

Fragments are keyed by the provider's output index and collected per call; the
provider's explicit done signal closes a call, and its bytes are joined and parsed once,
when the turn's calls are read (``complete``), never before the done signal. Every
buffer is capped: bytes per call, bytes per response, calls per response. A call that
never receives its done signal is never a complete call.

Protocol violations (a reused index, a fragment for a call that never started or that
is already done) raise ``StreamProtocolError``; exceeding the per-response caps raises
``LimitExceeded``. Exceeding the per-call cap only spoils that call: it is reported with
``arguments=None`` and an error (and later answered with ``invalid_arguments``), while
its fragments stop being stored, so memory stays bounded.

Why it is shaped like this (speed and memory): a fragment for an open call costs one
dict lookup, two additions and a list append; every ``_COMPACT`` code points the held
fragments are joined and encoded into one UTF-8 block, so a long call holds about its
own size in bytes, not one string object per 8-byte fragment, and its raw bytes are one
join of those blocks (never a whole-text ``encode``, whose worst-case buffer is twice
the text). Joining and parsing wait until the calls are read, after the stream's events
(and their copies of the text) have been released.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from .arguments import ArgumentsRejected, parse_arguments, string_slices
from .errors import LimitExceeded, StreamProtocolError
from .ids import derive_call_id
from .limits import Limits
from .outcome import IncompleteCall, ProposedCall

__all__ = ["CallAccumulator"]

# Held fragments are joined into one block every this many code points: small enough
# that per-fragment object overhead stays bounded, large enough that joins are rare.
_COMPACT = 4096
# Text longer than this is encoded in slices of it, so no encode needs a buffer of
# twice a whole argument text.
_SLICE = 1 << 16
_SURROGATE = "arguments contain a lone surrogate"
# Call indexes a stream may use: what a signed 64-bit JSON integer holds.
# A call id travels back to the provider and into the stores (PostgreSQL text holds no
# NUL): no provider issues one with a control character, so such an id is bad input.
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_MIN_INDEX = -(1 << 63)
_MAX_INDEX = (1 << 63) - 1
# A done event's literal up to this size is decoded whole (cheaper than slicing).
_SHORT_LITERAL = 1 << 15


def _cap_error(limit: int) -> str:
    return f"arguments exceed max_call_argument_bytes ({limit})"


def _response_cap_error(limit: int) -> str:
    return f"the response's arguments exceed max_response_argument_bytes ({limit}) in UTF-8"


def _encode(text: str, blocks: list[bytes | str]) -> None:
    """Append ``text`` to ``blocks`` as UTF-8 (in ``_SLICE`` pieces when long). Text that
    cannot be encoded (a lone surrogate) is kept as ``str``: the call is rejected when
    it is read, exactly as if it had been encoded then."""
    if len(text) <= _SLICE:
        pieces = [text]
    else:
        pieces = [text[i : i + _SLICE] for i in range(0, len(text), _SLICE)]
    for piece in pieces:
        try:
            blocks.append(piece.encode())
        except UnicodeEncodeError:
            blocks.append(piece)


def _text_chunks(text: str) -> Iterator[bytes]:
    # surrogatepass: a text with a lone surrogate compares equal only to itself.
    for start in range(0, len(text), _SLICE):
        yield text[start : start + _SLICE].encode("utf-8", "surrogatepass")


def _literal_texts(literal: msgspec.Raw) -> Iterator[str]:
    """A done event's JSON string literal as text slices; an invalid one is a protocol
    error (the event was not valid JSON)."""
    try:
        yield from string_slices(literal)
    except msgspec.DecodeError as exc:
        raise StreamProtocolError(
            f"arguments in the done event are not a JSON string: {exc}"
        ) from None


def _literal_chunks(literal: msgspec.Raw) -> Iterator[bytes]:
    """The UTF-8 bytes of a JSON string literal's text, a slice at a time."""
    for text in _literal_texts(literal):
        yield text.encode("utf-8", "surrogatepass")


def _equal(left: Iterable[bytes], right: Iterable[bytes]) -> bool:
    """Whether two byte streams, however chunked, carry the same bytes (no joined copy)."""
    rest = iter(right)
    have = memoryview(b"")
    for chunk in left:
        want = memoryview(chunk)
        while want:
            if not have:
                nxt = next(rest, None)
                if nxt is None:
                    return False
                have = memoryview(nxt)
                continue
            n = min(len(have), len(want))
            if have[:n] != want[:n]:
                return False
            have, want = have[n:], want[n:]
    return not have and all(not chunk for chunk in rest)


def _drain(chunks: Iterator[object]) -> None:
    """Run a done text's chunks to the end (a literal's validity is checked there)."""
    for _ in chunks:
        pass


def _check(literal: msgspec.Raw | None) -> None:
    """Read a long literal through, for its errors only."""
    if literal is not None:
        _drain(_literal_texts(literal))


def _decode_literal(literal: msgspec.Raw) -> str:
    return "".join(_literal_texts(literal))


class _Call:
    __slots__ = (
        "arguments",
        "blocks",
        "call_id",
        "disagree",
        "done",
        "error",
        "index",
        "item_id",
        "mark",
        "name",
        "parts",
        "pending",
        "raw",
        "size",
        "whole",
    )

    def __init__(
        self, index: int, name: str, call_id: str | None, item_id: str | None, mark: int
    ) -> None:
        self.index = index
        self.name = name
        self.call_id = call_id
        self.item_id = item_id
        self.parts: list[str] = []  # fragments since the last compaction
        # Compacted fragments, in order: UTF-8 bytes (str where a lone surrogate made
        # encoding impossible), with the code points of each.
        self.blocks: list[bytes | str] = []
        self.size = 0  # code points received: a cheap lower bound of the UTF-8 size
        self.mark = mark  # the size at which the next fragment takes the slow path
        self.done = False
        self.error: str | None = None
        # Done and not yet joined and parsed (``complete`` does it once).
        self.pending = False
        # Arguments that arrived whole in the done event, as text or as bytes.
        self.whole: str | bytes | None = None
        # A repeated done signal disagreed while the arguments were still unparsed.
        self.disagree = False
        self.arguments: dict[str, Any] | None = None
        self.raw = b""


class CallAccumulator:
    """Collects the calls of one response. Not thread-safe; one per response."""

    __slots__ = (
        "_by_item",
        "_calls",
        "_done",
        "_joined",
        "_limits",
        "_max_call",
        "_max_total",
        "_open",
        "_total",
    )

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._max_call = limits.max_call_argument_bytes
        self._max_total = limits.max_response_argument_bytes
        self._calls: dict[int, _Call] = {}
        # Calls that take fragments: started, not done, not over their cap.
        self._open: dict[int, _Call] = {}
        self._by_item: dict[str, int] = {}
        self._total = 0
        # UTF-8 bytes of the calls joined so far: while streaming the caps count code
        # points (cheap), so a joined call is held to the response's cap in bytes too.
        self._joined = 0
        self._done = 0  # calls whose done signal arrived

    def start(self, index: int, name: str, call_id: str | None, item_id: str | None) -> None:
        if not _MIN_INDEX <= index <= _MAX_INDEX:
            # A derived call id digests the index as a JSON integer (64 bits at most).
            raise StreamProtocolError(f"call index {index} out of range")
        if index in self._calls:
            raise StreamProtocolError(f"call index {index} started twice")
        if call_id is not None and _CONTROL.search(call_id):
            raise StreamProtocolError(f"call {index}: its id holds a control character")
        if len(self._calls) >= self._limits.max_calls_per_response:
            raise LimitExceeded("max_calls_per_response", self._limits.max_calls_per_response)
        call = _Call(index, name, call_id, item_id, min(self._max_call, _COMPACT))
        self._calls[index] = call
        self._open[index] = call
        if item_id is not None:
            self._by_item[item_id] = index

    def index_of(self, item_id: str) -> int | None:
        return self._by_item.get(item_id)

    def fragment(self, index: int, text: str) -> None:
        call = self._open.get(index)
        if call is None:
            self._closed_fragment(index, text)
            return
        n = len(text)
        total = self._total + n
        if total > self._max_total:
            raise LimitExceeded("max_response_argument_bytes", self._max_total)
        self._total = total
        size = call.size + n
        call.size = size
        if size > call.mark:
            self._grow(call, text)
        elif n:
            call.parts.append(text)

    def fragments(self, indexes: list[int], pieces: list[str]) -> None:
        """Fragments in stream order, ``pieces[k]`` for the call at ``indexes[k]`` (an
        ``ArgumentsRun``), with exactly the effect of ``fragment`` on each in turn. When
        every call involved is open and no cap can be crossed, they are stored without
        the per-fragment checks; otherwise they go one by one, so an error or a spoiled
        call happens at the same fragment whatever the batching."""
        n = sum(map(len, pieces))
        total = self._total + n
        if total <= self._max_total:
            opened = self._open
            first = indexes[0]
            max_call = self._max_call
            if indexes.count(first) == len(indexes):
                call = opened.get(first)
                if call is not None and call.size + n <= max_call:
                    self._total = total
                    call.size += n
                    call.parts.append("".join(pieces))
                    if call.size > call.mark:
                        self._compact(call)
                    return
            else:
                calls = [opened.get(i) for i in set(indexes)]
                # n bounds what any one of them receives here.
                if all(c is not None and c.size + n <= max_call for c in calls):
                    self._total = total
                    for index, piece in zip(indexes, pieces, strict=True):
                        call = opened[index]
                        call.parts.append(piece)
                        call.size += len(piece)
                    for call in calls:
                        if call.size > call.mark:  # type: ignore[union-attr]  # all open
                            self._compact(call)  # type: ignore[arg-type]
                    return
        fragment = self.fragment
        for index, piece in zip(indexes, pieces, strict=True):
            fragment(index, piece)

    def _closed_fragment(self, index: int, text: str) -> None:
        """A fragment for a call that takes none: a violation, or a spoiled call."""
        call = self._calls.get(index)
        if call is None:
            raise StreamProtocolError(
                f"argument fragment for call index {index} that never started"
            )
        if call.done:
            raise StreamProtocolError(
                f"argument fragment for call index {index} after its done signal"
            )
        # Otherwise the call is over its cap: keep memory bounded, it is spoiled anyway;
        # its fragments still count against the response's cap.
        total = self._total + len(text)
        if total > self._max_total:
            raise LimitExceeded("max_response_argument_bytes", self._max_total)
        self._total = total

    def _grow(self, call: _Call, text: str) -> None:
        """The call passed its mark: spoil it over the cap, else compact its fragments."""
        if call.size > self._max_call:
            call.error = _cap_error(self._max_call)
            call.parts = []
            call.blocks = []
            del self._open[call.index]
            return
        call.parts.append(text)
        self._compact(call)

    def _compact(self, call: _Call) -> None:
        parts = call.parts
        _encode(parts[0] if len(parts) == 1 else "".join(parts), call.blocks)
        parts.clear()
        call.mark = min(self._max_call, call.size + _COMPACT)

    def done(
        self,
        index: int,
        arguments: str | None,
        raw: bytes | None = None,
        literal: msgspec.Raw | None = None,
        *,
        error: str | None = None,
        refused_bytes: int = 0,
    ) -> None:
        """The call's done signal. A done event that repeats the arguments gives them as
        ``arguments`` (text) or ``literal`` (the JSON string literal, compared a slice at
        a time): they must equal the fragments. ``raw`` is the exact bytes of a call the
        provider sends whole (Gemini), never together with fragments. ``error``: the
        adapter refused the arguments it assembled (the call is done and refused); their
        ``refused_bytes`` still count against the response's cap."""
        call = self._calls.get(index)
        if call is None:
            raise StreamProtocolError(f"done signal for call index {index} that never started")
        if literal is not None and len(literal) <= _SHORT_LITERAL:
            arguments, literal = _decode_literal(literal), None  # short: as plain text
        if call.done:
            # A repeated done (Responses sends arguments.done and output_item.done) is a
            # no-op when it agrees; a disagreeing one spoils the call.
            if arguments is None and literal is None and raw is None:
                return
            if call.error is not None:
                _check(literal)  # a literal is checked for what it is either way
            elif not (
                self._told_equal(call, call.pending, arguments, literal)
                if raw is None
                else _equal((raw,), self._held(call, call.pending))
            ):
                if call.pending:
                    call.disagree = True  # applied after the parse, whose errors come first
                else:
                    call.error = "done events disagree about the arguments"
                    call.arguments = None
            return
        if error is not None:
            if self._total + refused_bytes > self._max_total:
                raise LimitExceeded("max_response_argument_bytes", self._max_total)
            self._total += refused_bytes
            call.done = True
            self._done += 1
            self._open.pop(index, None)
            call.error = call.error or error
            call.blocks, call.parts = [], []
            return
        streamed = bool(call.blocks or call.parts)
        whole: str | bytes | None = None
        size = 0
        if call.error is None and not streamed:
            # Arguments that arrive whole count in code points, as fragments and texts do
            # (the bytes meet the per-call cap once joined); bytes sent whole count as
            # bytes. Over the response's cap the turn fails with this call still open:
            # it never becomes a complete call.
            if raw is not None:
                whole, size = raw, len(raw)
            elif literal is not None:
                chunks = []
                for text in _literal_texts(literal):
                    size += len(text)
                    chunks.append(text.encode("utf-8", "surrogatepass"))
                whole = b"".join(chunks)
                del chunks
            elif arguments is not None:
                whole, size = arguments, len(arguments)
            if self._total + size > self._max_total:
                raise LimitExceeded("max_response_argument_bytes", self._max_total)
        call.done = True
        self._done += 1
        self._open.pop(index, None)  # absent when the call is over its cap
        if call.error is not None:
            _check(literal)
            return
        if whole is not None:
            self._total += size
            if size > self._max_call:
                call.error = _cap_error(self._max_call)
                return
            call.whole = whole
        elif raw is not None or (
            (arguments is not None or literal is not None)
            and not self._told_equal(call, True, arguments, literal)
        ):
            self._differ(call)  # whole bytes after fragments, or a text that disagrees
            return
        call.pending = True

    def _told_equal(
        self, call: _Call, pending: bool, arguments: str | None, literal: msgspec.Raw | None
    ) -> bool:
        """Whether a done event's text (``arguments``, or a long ``literal``) is exactly
        what the call holds. A literal is read to its end either way (checked)."""
        if literal is not None:
            told = _literal_chunks(literal)
            same = _equal(told, self._held(call, pending))
            _drain(told)
            return same
        text = arguments or ""
        if pending and not call.blocks and call.whole is None:
            return "".join(call.parts) == text  # a short call: one small comparison
        return _equal(_text_chunks(text), self._held(call, pending))

    @staticmethod
    def _differ(call: _Call) -> None:
        call.error = "arguments in the done event differ from the streamed fragments"
        call.blocks, call.parts = [], []

    @staticmethod
    def _held(call: _Call, pending: bool) -> Iterator[bytes]:
        """The bytes a call holds, in order, as a stream of chunks: its parsed bytes, or
        (``pending``: done or not, not yet parsed) what it will be parsed from."""
        if not pending:
            yield call.raw
            return
        whole = call.whole
        if type(whole) is bytes:
            yield whole
            return
        if type(whole) is str:
            yield from _text_chunks(whole)
            return
        for block in call.blocks:
            yield block if type(block) is bytes else block.encode("utf-8", "surrogatepass")  # type: ignore[union-attr]
        for part in call.parts:
            yield part.encode("utf-8", "surrogatepass")

    def _join(self, call: _Call) -> bytes | None:
        """A pending call's exact bytes (its buffers released), or None when it holds a
        lone surrogate."""
        whole = call.whole
        call.whole = None
        if type(whole) is bytes:
            return whole
        blocks = call.blocks
        call.blocks = []
        if type(whole) is str:
            _encode(whole, blocks)
            del whole
        elif call.parts:
            _encode("".join(call.parts), blocks)
            call.parts = []
        if not all(type(block) is bytes for block in blocks):
            return None
        if len(blocks) == 1:
            return blocks[0]  # type: ignore[return-value]
        raw = b"".join(blocks)  # type: ignore[arg-type]  # all bytes (checked above)
        blocks.clear()
        return raw

    def _finish(self, call: _Call) -> None:
        """Join and parse a done call's arguments (once)."""
        call.pending = False
        raw = self._join(call)
        if raw is None:
            call.error = _SURROGATE
            return
        if len(raw) > self._max_call:  # more bytes than code points (counted so far)
            call.error = _cap_error(self._max_call)
            return  # over its cap, the call holds nothing, as one spoiled while streaming
        self._joined += len(raw)
        if self._joined > self._max_total:
            # (Calls are joined in output order, so the same call is refused whatever
            # the chunking; the turn's own verdict came earlier, in code points.)
            call.error = _response_cap_error(self._max_total)
            return
        call.raw = raw
        try:
            call.arguments = parse_arguments(raw, self._limits.max_json_depth)
        except ArgumentsRejected as exc:
            call.error = exc.reason
            return
        if call.disagree:
            call.error = "done events disagree about the arguments"
            call.arguments = None

    @property
    def open_count(self) -> int:
        return len(self._calls) - self._done

    @property
    def any_done(self) -> bool:
        return self._done > 0

    def complete(self, response_id: str | None) -> tuple[ProposedCall, ...]:
        """Calls whose done signal arrived, in output order."""
        if not self._done:
            return ()
        out = []
        calls = self._calls
        for index in sorted(calls):
            call = calls[index]
            if not call.done:
                continue
            if call.pending:
                self._finish(call)
            derived = call.call_id is None or call.call_id == ""
            out.append(
                ProposedCall(
                    index=index,
                    call_id=derive_call_id(response_id, index) if derived else str(call.call_id),
                    name=call.name,
                    arguments=call.arguments if call.error is None else None,
                    raw_arguments=call.raw,
                    error=call.error,
                    item_id=call.item_id,
                    call_id_derived=derived,
                )
            )
        return tuple(out)

    def incomplete(self, reason: str) -> tuple[IncompleteCall, ...]:
        if len(self._calls) == self._done:
            return ()
        return tuple(
            IncompleteCall(
                index=c.index,
                call_id=c.call_id,
                name=c.name,
                received_bytes=c.size,
                reason=reason,
            )
            for i, c in sorted(self._calls.items())
            if not c.done
        )
