# Invariant: parse_arguments accepts exactly what a naive strict reference accepts, same values.
#   Only ArgumentsRejected escapes; reference: stdlib json + duplicate keys, NaN/Infinity, lone
#   surrogates, object-only and depth rules; values compared type-aware.
"""Fuzz target: ``callgate.engine.core.arguments.parse_arguments``, the strict argument
parser, differentially against a reference built on the standard library's ``json``.

The depth cap is drawn from the input's hash (1-8, or the default 64), so the cap is hit
at every level. Values are compared type-aware: ``1`` and ``1.0`` and ``True`` differ.
"""

from __future__ import annotations

import json
import math
from typing import Any

from callgate.engine.core.arguments import ArgumentsRejected, parse_arguments
from fuzz.harness import expect, fuzz_main, stream_seed

__all__ = ["check", "reference_parse"]

_DEPTHS = (1, 2, 3, 4, 5, 8, 64, 64)


class _Rejected(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _Rejected("duplicate key")
    return dict(pairs)


def _no_constants(name: str) -> Any:
    raise _Rejected(f"{name} is not JSON")


def _depth(text: str) -> int:
    """Deepest container nesting of ``text`` (brackets outside strings)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _surrogate_free(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _clean(value: Any) -> bool:
    """No lone surrogate in any string or key, no non-finite number."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if not all(_surrogate_free(k) for k in node):
                return False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str):
            if not _surrogate_free(node):
                return False
        elif isinstance(node, float) and not math.isfinite(node):
            return False
    return True


def reference_parse(raw: bytes, max_depth: int) -> dict[str, Any] | None:
    """The strict rules, naively: the parsed object, or None when rejected."""
    if not raw.strip(b" \t\n\r"):  # JSON's whitespace only (not VT or FF)
        return {}
    try:
        text = raw.decode("utf-8")
        if _depth(text) > max_depth:
            return None
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except (ValueError, _Rejected, RecursionError):
        return None
    if not isinstance(value, dict) or not _clean(value):
        return None
    return value


def same_json(a: Any, b: Any) -> bool:
    """Type-aware equality of decoded JSON (``1 != 1.0 != True``; ``-0.0 != 0.0``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return bool(a == b)


def check(data: bytes) -> None:
    max_depth = _DEPTHS[stream_seed(data) % len(_DEPTHS)]
    expected = reference_parse(data, max_depth)
    try:
        got: dict[str, Any] | None = parse_arguments(data, max_depth)
    except ArgumentsRejected as exc:
        expect(exc.reason, "a rejection without a reason")
        got = None
    if expected is None:
        expect(got is None, f"accepted what the reference rejects: {data[:200]!r}")
        return
    expect(got is not None, f"rejected what the reference accepts: {data[:200]!r}")
    expect(same_json(got, expected), f"values differ from the reference: {data[:200]!r}")


if __name__ == "__main__":
    fuzz_main(check)
