"""Vertex AI streamed function-call arguments: ``partialArgs`` pieces in, one JSON object
text out.

Vertex (not the Gemini API) can stream a call's arguments as ``{"jsonPath": "$.location",
"stringValue": "Bos", "willContinue": true}`` pieces. This module owns accumulating them
per path (strings concatenate while ``willContinue``; numbers, booleans and nulls arrive
whole) and rebuilding the object from the paths ``$.a``, ``$.a.b`` and ``$.a[0]``. It must
never guess: any other path syntax, a path repeated after it ended, a conflicting or
out-of-order array index is a ``StreamProtocolError``. Every byte it holds counts against
``max_call_argument_bytes``; path depth against ``max_json_depth``.
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

    __slots__ = ("_leaves", "_limits", "_nbytes", "index")

    def __init__(self, index: int, limits: Limits) -> None:
        self.index = index
        self._limits = limits
        self._leaves: dict[str, _Leaf] = {}
        self._nbytes = 0

    def add(self, pieces: list[PartialArg]) -> None:
        limit = self._limits.max_call_argument_bytes
        leaves = self._leaves
        for piece in pieces:
            path = piece.json_path
            string = piece.string_value
            leaf = leaves.get(path)
            # What is held: each path once, plus every string piece.
            self._nbytes += (0 if leaf is not None else len(path)) + (
                utf8_len(string) if string else 0
            )
            if self._nbytes > limit:
                raise LimitExceeded("max_call_argument_bytes", limit, "vertex streamed arguments")
            if leaf is not None:
                held = leaf.pieces
                if string is None or held is None or not leaf.open:
                    raise StreamProtocolError(f"vertex: jsonPath {path!r} repeated after it ended")
                held.append(string)
                leaf.open = piece.will_continue
                leaf.fresh += 1
                if leaf.fresh >= _COMPACT:
                    held[-_COMPACT:] = ["".join(held[-_COMPACT:])]
                    leaf.fresh = 0
            elif string is not None:
                leaves[path] = _Leaf(None, [string], piece.will_continue)
            elif piece.number_value is not None:
                leaves[path] = _Leaf(piece.number_value, None, False)
            elif piece.bool_value is not None:
                leaves[path] = _Leaf(piece.bool_value, None, False)
            elif piece.null_value is not msgspec.UNSET:
                leaves[path] = _Leaf(None, None, False)
            else:
                raise StreamProtocolError(f"vertex: partialArg {path!r} carries no value")

    def build(self) -> bytes | None:
        """The JSON object text (UTF-8) of everything received, or None when no piece
        came (a call without arguments)."""
        if not self._leaves:
            return None
        if self._nbytes <= _FLAT and self._limits.max_json_depth >= 1:
            flat = self._flat()
            if flat is not None:
                return flat
        root: dict[str, Any] = {}
        max_depth = self._limits.max_json_depth
        for path, leaf in self._leaves.items():
            segments = _parse_path(path)
            if len(segments) > max_depth:
                raise LimitExceeded("max_json_depth", max_depth, f"vertex jsonPath {path!r}")
            value = _Text(leaf.pieces) if leaf.pieces is not None else leaf.value
            leaf.pieces = None
            _assign(root, segments, value, path)
        self._leaves = {}
        out: list[bytes | memoryview] = []
        _write(root, out)
        return b"".join(out)

    def _flat(self) -> bytes | None:
        """A small object of top-level members only (every path ``$.name``, the usual
        shape) in one encode, or None for any other shape. The same bytes as the general
        build: msgspec escapes every code point exactly as the stdlib escaper does, and
        members keep their arrival order; distinct paths of this form are distinct keys."""
        flat: dict[str, Any] = {}
        match = _MEMBER.fullmatch
        for path, leaf in self._leaves.items():
            member = match(path)
            if member is None:
                return None
            pieces = leaf.pieces
            flat[member.group(1)] = "".join(pieces) if pieces is not None else leaf.value
        self._leaves = {}
        return msgspec.json.encode(flat)


class _Text:
    """A string leaf still in the pieces it arrived in (written without joining them)."""

    __slots__ = ("pieces",)

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces


def _write(value: Any, out: list[bytes | memoryview]) -> None:
    """Append the JSON text of ``value`` to ``out``: strings escaped by the stdlib's C
    escaper (the same output as msgspec's for every code point), other scalars by
    msgspec. A long streamed string is written in groups of about ``_GROUP`` characters,
    each group's pieces released as it is written, so it is held about once as text and
    once as bytes, never as one joined copy of either."""
    if type(value) is _Text:
        # From the end, a group at a time, then put back in order: one escape per group,
        # not per 8-byte piece (the quotes the escaper adds are sliced off, not copied).
        pieces = value.pieces
        groups: list[memoryview] = []
        while pieces:
            take = size = 0
            while take < len(pieces) and size < _GROUP:
                take += 1
                size += len(pieces[-take])
            text = "".join(pieces[-take:])
            del pieces[-take:]
            groups.append(memoryview(_escape(text).encode())[1:-1])
            del text
        groups.reverse()
        out.append(b'"')
        out += groups
        out.append(b'"')
    elif type(value) is str:
        out.append(_escape(value).encode())
    elif type(value) is dict:
        out.append(b"{")
        for i, key in enumerate(list(value)):
            if i:
                out.append(b",")
            out.append(_escape(key).encode())
            out.append(b":")
            _write(value.pop(key), out)
        out.append(b"}")
    elif type(value) is list:
        out.append(b"[")
        for i, item in enumerate(value):
            if i:
                out.append(b",")
            _write(item, out)
        value.clear()
        out.append(b"]")
    else:
        out.append(msgspec.json.encode(value))


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
