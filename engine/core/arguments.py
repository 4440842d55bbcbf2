"""Strict parsing of a tool call's argument text: one JSON object, or a named rejection.

A model's argument text is untrusted. It is parsed once, after the provider's done
signal, and either accepted exactly as written or rejected with a reason. It is never
repaired: no closing brace is added, no trailing junk is dropped, no duplicate key is
resolved by "last one wins", no NaN is read as a number.

Rejected: invalid UTF-8, lone surrogates (raw or escaped), invalid JSON, trailing data,
NaN/Infinity, numbers out of float range, a top-level value that is not an object,
duplicate keys in any object, and nesting deeper than ``Limits.max_json_depth``.
Integers keep full precision (msgspec decodes big integers exactly; orjson would turn
them into floats, silently changing the value) up to msgspec's limit of 4,300 digits;
a longer one is rejected ("Integer value out of range"), never rounded.

Memory: one decode of a text with a long escaped string needs msgspec's unescape buffer
beside the input and the result (three times the text, briefly). Text longer than
``_PIECEWISE`` is therefore read in two steps when it can be: its containers with their
members left raw (zero-copy views of the input), then every long string in slices of
at most ``_SLICE`` bytes cut between characters and outside escapes, appended to one
``str`` in place. The value is identical to one decode; anything unusual (no safe cut,
any error) falls back to the one decode, whose error is the one reported.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import msgspec

__all__ = ["ArgumentsRejected", "parse_arguments", "string_slices"]

_decoder = msgspec.json.Decoder()
_members = msgspec.json.Decoder(dict[str, msgspec.Raw])
_items = msgspec.json.Decoder(list[msgspec.Raw])
_string = msgspec.json.Decoder(str)
# Texts from this size on are parsed piecewise; strings from _SLICE on are read in
# slices of it (what the unescape buffer may grow to, above the input and the result).
_PIECEWISE = 1 << 18
_SLICE = 1 << 17
# Slices of a literal that is only streamed through (compared, never kept): smaller,
# since nothing is gained by fewer of them.
_STREAM_SLICE = 1 << 15
_OPEN_OBJECT, _OPEN_ARRAY, _QUOTE = b'{["'
# Containers nested deeper than this (rare in tool arguments) take the one decode.
_PIECEWISE_DEPTH = 6
_CONTAINERS = (dict, list)
# The exact types of JSON's scalars as decoded (a member of any other type is walked).
_SCALARS = frozenset((str, int, float, bool, type(None)))
_BLANK = b" \t\n\r"  # JSON's whitespace (bytes.strip() would also take VT and FF)


class ArgumentsRejected(ValueError):
    """The argument text is not acceptable; ``reason`` says why without echoing values."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def parse_arguments(raw: bytes, max_depth: int) -> dict[str, Any]:
    """Parse ``raw`` as one JSON object under callgate's strict rules.

    Empty (or all-whitespace) text means "no arguments" and yields ``{}``: Anthropic
    streams a no-argument call as a single empty fragment, and an empty text cannot be
    a cut-off object (a cut stream never reaches the done signal that calls us).
    """
    if not raw or (raw[0] in _BLANK and not raw.strip(_BLANK)):
        return {}
    if len(raw) >= _PIECEWISE:
        value = _piecewise(raw, max_depth)
        if value is not None:
            _check_structure(value, raw, max_depth)
            return value
    try:
        value = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise ArgumentsRejected(f"arguments are not valid JSON: {exc}") from None
    except RecursionError:
        # msgspec's own nesting guard: far past the cap, or a caller already deep in its
        # stack (the depth cap is bounded, see Limits; the stack is the caller's).
        raise ArgumentsRejected(
            f"arguments nest deeper than can be decoded here (the cap is {max_depth} levels)"
        ) from None
    if not isinstance(value, dict):
        raise ArgumentsRejected(f"arguments must be a JSON object, not {_json_type(value)}")
    _check_structure(value, raw, max_depth)
    return value


class _OneDecode(Exception):
    """The piecewise reading gives way to one decode: a long string offers no safe cut
    (escapes every few bytes), or long containers nest deeper than a few levels (each
    level would scan everything below it again; one decode also rejects a text past the
    depth cap at once)."""


def _piecewise(raw: bytes, max_depth: int) -> dict[str, Any] | None:
    """``raw`` decoded without an unescape buffer the size of its longest string, or
    None when that cannot be done (the caller then decodes it in one go)."""
    try:
        value = _container(memoryview(raw), 1, max_depth)
    except (msgspec.DecodeError, RecursionError, _OneDecode):
        return None
    return value if isinstance(value, dict) else None


def _container(view: memoryview, depth: int, max_depth: int) -> Any:
    # Each level scans what lies below it again, so only a few levels go piecewise.
    if depth > max_depth or depth > _PIECEWISE_DEPTH:
        raise _OneDecode
    first = view[0]
    if first == _OPEN_OBJECT:
        return {
            key: _member(member, depth, max_depth) for key, member in _members.decode(view).items()
        }
    if first == _OPEN_ARRAY:
        return [_member(item, depth, max_depth) for item in _items.decode(view)]
    return _decoder.decode(view)


def _member(raw: msgspec.Raw, depth: int, max_depth: int) -> Any:
    view = memoryview(raw)
    if len(view) < _SLICE:
        return _decoder.decode(view)
    if view[0] == _QUOTE:
        return _long_string(view)
    return _container(view, depth + 1, max_depth)


def _long_string(view: memoryview) -> str:
    """A long JSON string literal (quotes included), decoded a slice at a time."""
    return _concatenate(view, _cuts(view, _SLICE))


def _cuts(view: memoryview, size: int) -> list[int]:
    """Where a string literal (quotes included) is cut into slices of at most ``size``
    bytes: the content's start, each cut, the content's end."""
    cuts = [1]
    end = len(view) - 1
    while end - cuts[-1] > size:
        cuts.append(_safe_cut(view, cuts[-1], cuts[-1] + size))
    cuts.append(end)
    return cuts


def string_slices(literal: bytes | bytearray | memoryview | msgspec.Raw) -> Iterator[str]:
    """The decoded text of a JSON string literal (quotes included), in slices of at most
    ``_STREAM_SLICE`` bytes of it, never the whole text at once (a long literal with no
    safe cut comes whole). Raises ``msgspec.DecodeError`` where one strict decode of the
    literal would."""
    view = memoryview(literal)
    if len(view) - 2 <= _STREAM_SLICE:
        yield _string.decode(view)
        return
    try:
        cuts = _cuts(view, _STREAM_SLICE)
    except _OneDecode:
        yield _string.decode(view)
        return
    for i in range(1, len(cuts)):
        yield _string.decode(b'"' + view[cuts[i - 1] : cuts[i]] + b'"')


def _concatenate(view: memoryview, cuts: list[int]) -> str:
    # ``out += part`` as the last statement of a ``for`` body: CPython then extends
    # ``out`` in place (the interpreter's in-place str concatenation, specialised once
    # the loop has run a few times; see the warm-up below). Without it each step would
    # copy, and the peak would be twice the string; the value is the same either way.
    out = ""
    for i in range(1, len(cuts)):
        part = _string.decode(b'"' + view[cuts[i - 1] : cuts[i]] + b'"')
        out += part
    return out


def _safe_cut(view: memoryview, start: int, target: int) -> int:
    """A position at most ``target`` and past ``start`` where the literal's bytes can be
    cut: not inside a multi-byte character and not within six bytes after a backslash
    (so never inside an escape, nor between the halves of a surrogate pair)."""
    low = max(start + 1, target - 4096)
    cut = target
    while cut > low:
        lo = max(cut - 6, start)
        window = bytes(view[lo : cut + 1])
        back = window.rfind(b"\\", 0, len(window) - 1)
        if back >= 0:
            cut = lo + back  # the backslash may open an escape: try just before it
        elif 0x80 <= window[-1] <= 0xBF:
            cut -= 1  # a continuation byte: the character starts earlier
        else:
            return cut
    raise _OneDecode


# Warm the loop up so the first long argument text already gets the in-place appends.
_concatenate(memoryview(b'"' + b"x" * 64 + b'"'), list(range(1, 66)))


def _json_type(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool) or value is None:
        return "a literal"
    return "a number"


def _check_structure(root: dict[str, Any], raw: bytes, max_depth: int) -> None:
    """Enforce the depth cap and detect duplicate keys.

    Duplicate keys vanish in a parsed dict, so they are found by counting: every object
    member puts exactly one ``:`` outside strings, so ``colons(raw) >= members >= keys``
    (distinct keys), and the keys are duplicate-free exactly when ``members == keys``.
    One walk over the containers counts the keys; when ``raw`` holds no more colons
    than that, ``members == keys`` follows at once (the common case: argument text
    without colons inside its strings). Otherwise ``members = colons(raw) - colons
    inside decoded strings``; an escaped colon (``\\u003a``) would break that count, so
    its rare presence takes the slow path.
    """
    if max_depth < 1:
        raise ArgumentsRejected(f"arguments nest deeper than {max_depth} levels")
    keys = len(root)
    # Most argument objects are flat (no member is a container): one C-level pass over
    # the members' exact types settles the depth, and the keys are the top level's.
    # (Decoded JSON holds exact dict/list; anything else takes the walk.)
    if not _SCALARS.issuperset(map(type, root.values())):
        keys += _nested_keys(root, max_depth)
    if _colons_at_most(raw, keys):
        return
    _count_members(root, raw, keys)


def _nested_keys(root: dict[str, Any], max_depth: int) -> int:
    """The keys of the objects below ``root``; raises past the depth cap."""
    keys = 0
    # The top level first, without a stack.
    stack: list[tuple[Any, int]] = []
    for item in root.values():
        if isinstance(item, _CONTAINERS):
            stack.append((item, 2))
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise ArgumentsRejected(f"arguments nest deeper than {max_depth} levels")
        if isinstance(node, dict):
            keys += len(node)
            items = node.values()
        else:
            items = node
        for item in items:
            if isinstance(item, _CONTAINERS):
                stack.append((item, depth + 1))
    return keys


def _count_members(root: dict[str, Any], raw: bytes, keys: int) -> None:
    """``raw`` holds more colons than keys: subtract those inside strings (see
    ``_check_structure``) and compare the members with the keys."""
    string_colons = 0
    nodes: list[Any] = [root]
    while nodes:
        node = nodes.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                string_colons += key.count(":")
                if isinstance(item, str):
                    string_colons += item.count(":")
                elif isinstance(item, _CONTAINERS):
                    nodes.append(item)
        else:
            for item in node:
                if isinstance(item, str):
                    string_colons += item.count(":")
                elif isinstance(item, _CONTAINERS):
                    nodes.append(item)
    if b"\\u003" in raw and b"\\u003a" in raw.lower():
        _check_duplicates_slow(raw)
        return
    members = raw.count(b":") - string_colons
    if members != keys:
        raise ArgumentsRejected("arguments contain a duplicate key")


def _colons_at_most(raw: bytes, limit: int) -> bool:
    """Whether ``raw`` holds at most ``limit`` colons. Few keys in a long text: look for
    the first ``limit + 1`` colons (``find`` of one byte is a memchr, far faster than
    ``count``, which visits every byte)."""
    if limit * 128 >= len(raw):
        return raw.count(b":") <= limit
    find = raw.find
    pos = -1
    for _ in range(limit + 1):
        pos = find(b":", pos + 1)
        if pos < 0:
            return True
    return False


def _check_duplicates_slow(raw: bytes) -> None:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({k for k, _ in pairs}) != len(pairs):
            raise ArgumentsRejected("arguments contain a duplicate key")
        return {}

    try:
        json.loads(raw, object_pairs_hook=hook)
    except RecursionError:  # a caller already deep in its stack (depth <= MAX_JSON_DEPTH)
        raise ArgumentsRejected(
            "arguments nest deeper than can be checked for duplicate keys here"
        ) from None
