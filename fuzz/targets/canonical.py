# Invariant: canonical_json is sorted, compact, round-tripping UTF-8, or ConfigError off-domain.
#   Digests hash exactly that form and are length-safe; TrustedCall.request_sha256 equals
#   request_digest; digests_equal agrees with ==.
"""Fuzz target: ``callgate.engine.core.canonical`` (canonical JSON and the digests built on
it) and the request digest shortcut of ``binding.TrustedCall``.

The fuzzer's bytes are read as a small value language (null, booleans, small and 64-bit
and wider integers, raw IEEE-754 doubles including NaN/Infinity/-0.0, strings that may
hold control characters or lone surrogates, lists, tuples, dicts, a non-string key, an
unsupported type), so both accepted and rejected values are common.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import struct
from collections.abc import Callable
from typing import Any

from callgate.engine.core.binding import BindingContext, TrustedCall, request_digest
from callgate.engine.core.canonical import (
    canonical_json,
    digest_fields,
    digests_equal,
    hmac_fields,
)
from callgate.engine.core.errors import ConfigError
from fuzz.harness import expect, fuzz_main
from fuzz.targets.arguments import same_json

__all__ = ["canonical_form_exists", "check", "values_from_bytes"]

_MAX_DEPTH = 6
_CTX = BindingContext(
    provider="p",
    api_family="f",
    response_id="r",
    call_id="c",
    operation_id="o",
    idempotency_key="k",
    adapter_revision="a/1",
)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def byte(self) -> int:
        b = self.take(1)
        return b[0] if b else 0

    def value(self, depth: int = 0) -> Any:
        op = self.byte()
        kind = op % 14 if depth < _MAX_DEPTH else op % 7
        size = op >> 4
        if kind == 0:
            return None
        if kind == 1:
            return bool(op & 0x10)
        if kind == 2:
            return int.from_bytes(self.take(1), "big", signed=True)
        if kind == 3:
            raw = self.take(1 + size % 9)
            return int.from_bytes(raw, "big", signed=bool(op & 0x80))  # up to 72 bits
        if kind == 4:
            raw = self.take(8).ljust(8, b"\0")
            return float(struct.unpack("<d", raw)[0])
        if kind in (5, 6):
            raw = self.take(size)
            return raw.decode("utf-8", "surrogateescape" if op & 0x80 else "replace")
        if kind in (7, 8):
            items = [self.value(depth + 1) for _ in range(size % 5)]
            return tuple(items) if kind == 8 and op & 0x80 else items
        if kind in (9, 10, 11):
            out: dict[Any, Any] = {}
            for _ in range(size % 5):
                key = self.value(depth + 1)
                out[key if isinstance(key, str) else str(key)] = self.value(depth + 1)
            return out
        if kind == 12:
            return {self.byte(): self.value(depth + 1)}  # a non-string key
        return frozenset({op}) if op & 0x10 else b"raw bytes"


def values_from_bytes(data: bytes) -> list[Any]:
    """The values encoded by ``data`` (one to four top-level fields)."""
    reader = _Reader(data)
    count = 1 + (data[0] % 4 if data else 0)
    return [reader.value() for _ in range(count)]


def canonical_form_exists(value: Any) -> bool:
    """The documented domain: null, bool, int within 64 bits (signed or unsigned), finite
    float, surrogate-free str, list/tuple, dict with str keys; nothing else."""
    stack = [value]
    while stack:
        node = stack.pop()
        if node is None or isinstance(node, bool):
            continue
        if isinstance(node, int):
            if not -(2**63) <= node < 2**64:
                return False
        elif isinstance(node, float):
            if not math.isfinite(node):
                return False
        elif isinstance(node, str):
            try:
                node.encode()
            except UnicodeEncodeError:
                return False
        elif isinstance(node, list | tuple):
            stack.extend(node)
        elif isinstance(node, dict):
            if not all(isinstance(k, str) for k in node):
                return False
            stack.extend(node.keys())
            stack.extend(node.values())
        else:
            return False
    return True


def _plain(value: Any) -> Any:
    """``value`` as JSON decodes it: tuples become lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _sorted_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    expect(keys == sorted(keys), f"object keys not in code-point order: {keys!r}")
    expect(len(set(keys)) == len(keys), "duplicate keys in canonical output")
    return dict(pairs)


def _compact(out: bytes) -> bool:
    """No whitespace outside strings."""
    in_string = escaped = False
    for byte in out:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in b" \t\r\n":
            return False
    return True


def _check_one(value: Any) -> bytes | None:
    try:
        out = canonical_json(value)
    except ConfigError:
        expect(not canonical_form_exists(value), f"refused a canonical value: {value!r}")
        return None
    expect(canonical_form_exists(value), f"encoded a value with no canonical form: {value!r}")
    expect(isinstance(out, bytes), "canonical_json returned non-bytes")
    text = out.decode("utf-8")  # strict: raises on invalid UTF-8
    expect(_compact(out), f"insignificant whitespace in {out[:200]!r}")
    decoded = json.loads(text, object_pairs_hook=_sorted_pairs)
    expect(same_json(decoded, _sorted(_plain(value))), f"round trip changed {value!r}")
    expect(canonical_json(decoded) == out, "re-encoding the decoded value changed the bytes")
    return out


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _shift(fields: list[Any]) -> list[Any] | None:
    """Move one character between two adjacent string fields (same concatenation)."""
    for i in range(len(fields) - 1):
        a, b = fields[i], fields[i + 1]
        if isinstance(a, str) and isinstance(b, str) and a:
            return [*fields[:i], a[:-1], a[-1] + b, *fields[i + 2 :]]
    return None


def check(data: bytes) -> None:
    fields = values_from_bytes(data)
    strings = [f for f in fields if isinstance(f, str)]  # lone surrogates included
    for a in strings:
        for b in strings:
            expect(digests_equal(a, b) == (a == b), f"digests_equal({a!r}, {b!r}) is wrong")
    encoded = [_check_one(v) for v in fields]
    if any(e is None for e in encoded):
        digests: list[Callable[[], str]] = [
            lambda: digest_fields(*fields),
            lambda: hmac_fields(b"k", *fields),
        ]
        for digest in digests:
            try:
                digest()
            except ConfigError:
                continue
            raise AssertionError("a digest over a field without canonical form did not raise")
        return
    whole = canonical_json(list(fields))
    expect(digest_fields(*fields) == hashlib.sha256(whole).hexdigest(), "digest_fields form")
    keyed = hmac.new(b"secret", whole, hashlib.sha256).hexdigest()
    expect(hmac_fields(b"secret", *fields) == keyed, "hmac_fields form")
    shifted = _shift(fields)
    if shifted is not None:
        expect(digest_fields(*shifted) != digest_fields(*fields), "digest is not length-safe")
    args = fields[0]
    if isinstance(args, dict):
        tool = fields[1] if len(fields) > 1 and isinstance(fields[1], str) else "tool"
        trusted = TrustedCall.record(_CTX, tool, args)
        expect(trusted.request_sha256() == request_digest(tool, args), "request digest shortcut")


if __name__ == "__main__":
    fuzz_main(check)
