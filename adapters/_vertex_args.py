"""Vertex AI streamed function-call arguments: ``partialArgs`` pieces in, one JSON object
text out.

Vertex (not the Gemini API) can stream a call's arguments as ``{"jsonPath": "$.location",
"stringValue": "Bos", "willContinue": true}`` pieces. This module owns accumulating them
per path (strings concatenate while ``willContinue``; numbers, booleans and nulls arrive
whole) and rebuilding the object from the paths ``$.a``, ``$.a.b`` and ``$.a[0]``. It must
never guess: any other path syntax, a path repeated after it ended, a conflicting or
out-of-order array index, a piece with no value or with more than one, a number, boolean
or null that says it continues, and a string still continuing when the call ends are a
``StreamProtocolError``. The bytes of the paths and strings count against
``max_call_argument_bytes`` and path depth against ``max_json_depth``: past either, the
call is refused on its own (``error``; what it held is dropped and its later pieces are
skipped), as a call whose ``args`` came whole is. What holding them costs beside
(``_PATH_COST`` a path and ``_LEVEL_COST`` each of its levels, ``_PIECE_COST`` a string
piece not yet joined) is charged to a budget of the same size (at least
``_BOOKKEEPING_FLOOR``), so that many tiny or deep paths or pieces cannot hold many times
the cap; past that budget the turn fails.
"""

from __future__ import annotations

import re
from json.encoder import encode_basestring as _escape
from typing import Any, Final

import msgspec

from callgate.engine.core.errors import LimitExceeded, StreamProtocolError
from callgate.engine.core.limits import Limits

from ._utf8 import utf8_len

__all__ = ["PartialArg", "StreamedArguments"]


class PartialArg(msgspec.Struct, rename="camel", gc=False):
    """Wire view of one ``functionCall.partialArgs[]`` piece."""

    json_path: str = ""
    string_value: str | None = None
    number_value: int | float | None = None
    bool_value: bool | None = None
    # Protobuf NullValue: present (as null or "NULL_VALUE") means a JSON null.
    null_value: Any = msgspec.UNSET
    will_continue: bool = False


# One jsonPath segment: `.name` or `[digits]`. Quoted keys, wildcards and slices cannot be
# rebuilt faithfully, so they do not match and the path is rejected.
_SEGMENT: Final = re.compile(r"\.([^.\[\]'\"*]+)|\[(\d+)\]")
# A path naming one top-level member: exactly what ``_parse_path`` reads as one key.
_MEMBER: Final = re.compile(r"\$\.([^.\[\]'\"*]+)")
# Arguments holding at most this many bytes (paths and text) are small enough to join.
_FLAT = 1 << 16


# A string leaf joins its newest pieces into one every this many pieces, so a long
# streamed string holds about its own size rather than one object per small piece.
_COMPACT = 512
# A long string leaf is escaped and encoded this many characters at a time.
_GROUP = 1 << 16
# The build's small tokens are cut into bytes of this size; longer writes (the groups of a
# long string) are kept as they are.
_CHUNK = 1 << 15

# Memory held beside the argument bytes (CPython 3.11, 64-bit, measured with
# tracemalloc), charged to the bookkeeping budget: a path holds its dict slot, the path
# string's header, its ``_Leaf`` and value (a piece list, a number), and at build its
# node of the object tree (its key, its dict slot), about 250 bytes in all; a string
# piece not yet joined holds a string header and a list slot, about 64 bytes. A joined
# group of pieces keeps one piece's charge.
_PATH_COST = 256
_PIECE_COST = 64
# And each level of a path: its node of the object tree at build (a dict, a key), about
# 190 bytes; without it, 16,000 paths of 63 levels held 188 MB for 2.6 MB of input.
_LEVEL_COST = 192
# The bookkeeping budget is ``max_call_argument_bytes``, but no less than this, so that
# a tiny cap (a test's) still admits a call of a few hundred paths.
_BOOKKEEPING_FLOOR = 1 << 16
_UNSET: Final = msgspec.UNSET


class _Leaf:
    """One path's value; a string grows from ``pieces`` while ``open``. ``fresh``
    counts the pieces appended since the last compaction."""

    __slots__ = ("fresh", "open", "pieces", "value")

    def __init__(self, value: Any, pieces: list[str] | None, open_: bool) -> None:
        self.value = value
        self.pieces = pieces
        self.open = open_
        self.fresh = 1


class StreamedArguments:
    """The arguments of one streamed call (the call at ``index``) while they arrive."""

    __slots__ = (
        "_budget",
        "_held",
        "_last_path",
        "_leaves",
        "_limits",
        "_nbytes",
        "error",
        "index",
    )

    def __init__(self, index: int, limits: Limits) -> None:
        self.index = index
        self._limits = limits
        # Why the call is refused (a per-call cap), or None; set, it holds nothing more.
        self.error: str | None = None
        self._leaves: dict[str, _Leaf] = {}
        self._nbytes = 0  # UTF-8 bytes of each path once and of every string piece
        self._held = 0  # bookkeeping charged (see the module docstring)
        self._budget = max(limits.max_call_argument_bytes, _BOOKKEEPING_FLOOR)
        self._last_path = ""  # (once refused) the path of the last piece measured

    def add(self, pieces: list[PartialArg]) -> None:
        if self.error is not None:
            self._measure(pieces)
            return
        limit, budget = self._limits.max_call_argument_bytes, self._budget
        max_depth = self._limits.max_json_depth
        leaves = self._leaves
        nbytes, held = self._nbytes, self._held
        depth = 0  # of the last new path: "." and "[" each open a level (_parse_path)
        for piece in pieces:
            path = piece.json_path
            string = piece.string_value
            if string is None:
                value = _scalar(piece, path)
                if path in leaves:
                    raise StreamProtocolError(f"vertex: jsonPath {path!r} repeated after it ended")
                nbytes += utf8_len(path)
                depth = path.count(".") + path.count("[")
                held += _PATH_COST + _LEVEL_COST * depth
                leaves[path] = _Leaf(value, None, False)
            elif (
                piece.number_value is not None
                or piece.bool_value is not None
                or piece.null_value is not _UNSET
            ):
                raise StreamProtocolError(f"vertex: partialArg {path!r} carries several values")
            else:
                held += _PIECE_COST
                leaf = leaves.get(path)
                if leaf is None:
                    nbytes += utf8_len(path) + utf8_len(string)
                    depth = path.count(".") + path.count("[")
                    held += _PATH_COST + _LEVEL_COST * depth
                    leaves[path] = _Leaf(None, [string], piece.will_continue)
                else:
                    text = leaf.pieces
                    if text is None or not leaf.open:
                        raise StreamProtocolError(
                            f"vertex: jsonPath {path!r} repeated after it ended"
                        )
                    # utf8_len(string), inlined: this runs once per piece.
                    nbytes += len(string) if string.isascii() else len(string.encode())
                    text.append(string)
                    leaf.open = piece.will_continue
                    leaf.fresh += 1
                    if leaf.fresh >= _COMPACT:
                        text[-_COMPACT:] = ["".join(text[-_COMPACT:])]
                        leaf.fresh = 0
                        held -= (_COMPACT - 1) * _PIECE_COST
            if nbytes > limit or depth > max_depth:
                self._nbytes = nbytes
                self._refuse(
                    f"arguments exceed max_call_argument_bytes ({limit})"
                    if nbytes > limit
                    # Refused here, before a path of many levels is split (the wording
                    # of the same refusal for arguments that came whole, as in build).
                    else f"arguments nest deeper than {max_depth} levels"
                )
                self._last_path = path
                at = next(i for i, p in enumerate(pieces) if p is piece)
                self._measure(pieces[at + 1 :])  # the rest of this list counts too
                return
            if held > budget:
                raise LimitExceeded(
                    "max_call_argument_bytes",
                    limit,
                    f"vertex streamed arguments: the bookkeeping of {len(leaves)} paths",
                )
        self._nbytes, self._held = nbytes, held

    @property
    def nbytes(self) -> int:
        """The UTF-8 bytes received: each path once and every string piece (once refused,
        a path counts again where it differs from the piece before)."""
        return self._nbytes

    def _measure(self, pieces: list[PartialArg]) -> None:
        """A refused call's later pieces: not kept, only measured (its bytes still count
        against the response's cap). A path counts again only where it differs from the
        piece before (a streamed string repeats its path at every piece), so nothing is
        kept that grows with the paths seen."""
        last, n = self._last_path, 0
        for piece in pieces:
            if piece.json_path != last:
                last = piece.json_path
                n += utf8_len(last)
            if piece.string_value:
                n += utf8_len(piece.string_value)
        self._last_path = last
        self._nbytes += n

    def _refuse(self, reason: str) -> None:
        self.error = reason
        self._leaves = {}
        self._held = 0

    def build(self) -> bytes | None:
        """The JSON object text (UTF-8) of everything received, or None when no piece
        came (a call without arguments) or the call is refused (``error``). A string
        still continuing is not a value."""
        leaves = self._leaves
        if not leaves:
            return None
        self._leaves = {}
        for path, leaf in leaves.items():
            if leaf.open:
                raise StreamProtocolError(
                    f"vertex: jsonPath {path!r} still continues (willContinue) at the call's end"
                )
        if self._nbytes <= _FLAT and self._limits.max_json_depth >= 1:
            flat = _flat(leaves)
            if flat is not None:
                return flat
        root: dict[str, Any] = {}
        max_depth = self._limits.max_json_depth
        for path, leaf in leaves.items():
            segments = _parse_path(path)
            if len(segments) > max_depth:
                # The wording of the same refusal for arguments that came whole.
                self._refuse(f"arguments nest deeper than {max_depth} levels")
                return None
            pieces = leaf.pieces
            if pieces is None:
                value = leaf.value
            else:  # one piece is written as it is; more, a group at a time
                value = pieces[0] if len(pieces) == 1 else _Text(pieces)
                leaf.pieces = None
            _assign(root, segments, value, path)
        leaves.clear()  # released before the text is written
        out = _Out()
        _write(root, out)
        return out.join()


def _scalar(piece: PartialArg, path: str) -> Any:
    """The value of a piece without a string: exactly one number, boolean or null, and
    whole (a piece that continues is a string's)."""
    number, flag = piece.number_value, piece.bool_value
    kinds = (number is not None) + (flag is not None) + (piece.null_value is not _UNSET)
    if kinds != 1:
        what = "no value" if not kinds else "several values"
        raise StreamProtocolError(f"vertex: partialArg {path!r} carries {what}")
    if piece.will_continue:
        raise StreamProtocolError(
            f"vertex: partialArg {path!r} continues a value that is not a string"
        )
    return number if number is not None else flag


def _flat(leaves: dict[str, _Leaf]) -> bytes | None:
    """A small object of top-level members only (every path ``$.name``, the usual shape)
    in one encode, or None for any other shape. The same bytes as the general build:
    msgspec escapes every code point exactly as the stdlib escaper does, and members keep
    their arrival order; distinct paths of this form are distinct keys."""
    flat: dict[str, Any] = {}
    match = _MEMBER.fullmatch
    for path, leaf in leaves.items():
        member = match(path)
        if member is None:
            return None
        pieces = leaf.pieces
        flat[member.group(1)] = "".join(pieces) if pieces is not None else leaf.value
    return msgspec.json.encode(flat)


class _Text:
    """A string leaf still in the pieces it arrived in (written without joining them)."""

    __slots__ = ("pieces",)

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces


class _Out:
    """Where ``_write`` puts the text: small tokens gather in one ``bytearray`` that is
    cut into ``_CHUNK``-sized ``bytes`` (no object per token), long string groups are kept
    as they are; one join at the end. The peak is then the pieces plus the joined text
    (twice the text), not a growing buffer's slack plus its final copy."""

    __slots__ = ("_buf", "_chunks")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._chunks: list[bytes | memoryview] = []

    def __iadd__(self, data: bytes | memoryview) -> _Out:
        if len(data) >= _CHUNK:
            if self._buf:
                self._chunks.append(bytes(self._buf))
                self._buf = bytearray()
            self._chunks.append(data)
        else:
            self._buf += data
            if len(self._buf) >= _CHUNK:
                self._chunks.append(bytes(self._buf))
                self._buf = bytearray()
        return self

    def join(self) -> bytes:
        chunks, self._chunks = self._chunks, []
        chunks.append(bytes(self._buf))
        self._buf = bytearray()
        return b"".join(chunks)


def _write(value: Any, out: _Out) -> None:
    """Append the JSON text of ``value`` to ``out``: strings escaped by the stdlib's C
    escaper (the same output as msgspec's for every code point), other scalars by
    msgspec. A long streamed string is written in groups of about ``_GROUP`` characters,
    each group's pieces released as it is written, so it is held about once as text and
    once as bytes, never as one joined copy of either; a node is released once written."""
    if type(value) is _Text:
        # A group at a time from the front (the list reversed, so that a group comes off
        # its end): one escape per group, not per 8-byte piece (the quotes the escaper
        # adds are sliced off, not copied).
        pieces = value.pieces
        pieces.reverse()
        out += b'"'
        while pieces:
            take = size = 0
            while take < len(pieces) and size < _GROUP:
                take += 1
                size += len(pieces[-take])
            group = pieces[-take:]
            del pieces[-take:]
            group.reverse()
            text = "".join(group)
            del group
            out += memoryview(_escape(text).encode())[1:-1]
            del text
        out += b'"'
    elif type(value) is str:
        out += _escape(value).encode()
    elif type(value) is dict:
        out += b"{"
        for i, key in enumerate(list(value)):
            if i:
                out += b","
            out += _escape(key).encode()
            out += b":"
            _write(value.pop(key), out)
        out += b"}"
    elif type(value) is list:
        out += b"["
        for i, item in enumerate(value):
            if i:
                out += b","
            _write(item, out)
        value.clear()
        out += b"]"
    else:
        out += msgspec.json.encode(value)


def _parse_path(path: str) -> list[str | int]:
    if not path.startswith("$"):
        raise StreamProtocolError(f"vertex: unsupported jsonPath {path!r}")
    segments: list[str | int] = []
    pos, end = 1, len(path)
    while pos < end:
        match = _SEGMENT.match(path, pos)
        if match is None:
            raise StreamProtocolError(f"vertex: unsupported jsonPath {path!r}")
        key, number = match.group(1), match.group(2)
        segments.append(key if key is not None else int(number))
        pos = match.end()
    if not segments:
        raise StreamProtocolError(f"vertex: jsonPath {path!r} names no member")
    return segments


def _assign(root: dict[str, Any], segments: list[str | int], value: Any, path: str) -> None:
    """Set ``value`` at ``segments`` under ``root``, creating objects and arrays on the way.
    Arrays only grow by appending, so their indices must arrive in order."""
    node: Any = root
    last = len(segments) - 1
    for i, seg in enumerate(segments):
        is_last = i == last
        child: Any = None if is_last else ({} if isinstance(segments[i + 1], str) else [])
        if isinstance(seg, str):
            if not isinstance(node, dict):
                raise StreamProtocolError(f"vertex: jsonPath {path!r} conflicts with another path")
            if is_last:
                if seg in node:
                    raise StreamProtocolError(f"vertex: jsonPath {path!r} set twice")
                node[seg] = value
                return
            node = node.setdefault(seg, child)
            continue
        if not isinstance(node, list) or seg > len(node):
            raise StreamProtocolError(f"vertex: jsonPath {path!r} conflicts or skips an index")
        if seg == len(node):
            node.append(value if is_last else child)
        elif is_last:
            raise StreamProtocolError(f"vertex: jsonPath {path!r} set twice")
        node = node[seg]
