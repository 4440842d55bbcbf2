"""Strict parsing of a tool call's argument text: one JSON object, or a named rejection.

A model's argument text is untrusted. It is parsed once, after the provider's done
signal, and either accepted exactly as written or rejected with a reason. It is never
repaired: no closing brace is added, no trailing junk is dropped, no duplicate key is
resolved by "last one wins", no NaN is read as a number.

Rejected: invalid UTF-8, lone surrogates (raw or escaped), invalid JSON, trailing data,
NaN/Infinity, numbers out of float range, a top-level value that is not an object,
duplicate keys in any object, and nesting deeper than ``Limits.max_json_depth``.
Integers keep full precision (msgspec decodes big integers exactly; orjson would turn
them into floats, silently changing the value).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

__all__ = ["ArgumentsRejected", "parse_arguments"]

_decoder = msgspec.json.Decoder()
_CONTAINERS = (dict, list)
_BLANK = b" \t\n\r\x0b\x0c"  # what bytes.strip() removes


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
    if not raw or (raw[0] in _BLANK and not raw.strip()):
        return {}
    try:
        value = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise ArgumentsRejected(f"arguments are not valid JSON: {exc}") from None
    except RecursionError:  # msgspec's own nesting guard, far past our cap
        raise ArgumentsRejected(f"arguments nest deeper than {max_depth} levels") from None
    if not isinstance(value, dict):
        raise ArgumentsRejected(f"arguments must be a JSON object, not {_json_type(value)}")
    _check_structure(value, raw, max_depth)
    return value


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
    # The top level first, without a stack: most argument objects are flat.
    keys = len(root)
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
    if _colons_at_most(raw, keys):
        return
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

    json.loads(raw, object_pairs_hook=hook)
