"""Canonical JSON: the one byte form every digest in callgate is computed over.

The form (documented in the README, stable across releases):
- UTF-8, no insignificant whitespace, object keys sorted by their Unicode code points;
- keys must be strings; values are null, booleans, integers, finite floats, strings,
  arrays (lists/tuples) and objects (dicts); anything else is rejected (datetimes and
  dataclasses included), except two conversions orjson makes and ``msgspec.to_builtins``
  makes too, so a value digests the same before and after it: a UUID is its canonical
  string and an Enum member its value (rejecting them would need a type walk of every
  value, several times the cost of the encode on the hot paths);
- integers in plain decimal; floats in the shortest form that round-trips (orjson's
  formatting, which never emits NaN/Infinity: those are rejected);
- strings with JSON's minimal escapes (``"``, ``\\``, control characters) and other
  characters as raw UTF-8; lone surrogates are rejected.

A tuple of fields is digested as a canonical JSON *array*: every string is delimited and
escaped, so no two different tuples encode to the same bytes (unlike naive
concatenation, where ``("ab", "c")`` and ``("a", "bc")`` collide).
"""

from __future__ import annotations

import hashlib
import hmac
import math
from typing import Any

import orjson

from .errors import ConfigError

__all__ = ["canonical_json", "digest_fields", "digests_equal", "hmac_fields", "sha256_hex"]

# datetime/date/time and dataclass instances then reach ``_reject`` (orjson would encode
# them natively: a datetime as a string, and a dataclass without the NaN check below).
_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def canonical_json(value: Any) -> bytes:
    """Encode ``value`` in callgate's canonical form, or raise ``ConfigError``."""
    try:
        out = orjson.dumps(value, option=_OPTS, default=_reject)
    except orjson.JSONEncodeError as exc:
        raise ConfigError(f"value has no canonical JSON form: {exc}") from None
    if b"null" in out:
        # orjson writes NaN/Infinity as null; refuse rather than digest a lie.
        _check_floats(value)
    return out


def _reject(value: object) -> object:
    raise TypeError(f"type {type(value).__name__} is not canonical JSON")


def _check_floats(value: Any) -> None:
    # Exact-type tests first: this walk runs over every argument object that contains a
    # null, and isinstance() on each leaf made it ~10x slower than the encode itself.
    # Subclasses (which orjson also serializes) fall through to the isinstance() tests.
    stack = [value]
    pop, extend, finite = stack.pop, stack.extend, math.isfinite
    while stack:
        item = pop()
        kind = type(item)
        if kind is dict:
            extend(item.values())
        elif kind is list or kind is tuple:
            extend(item)
        elif kind is float:
            if not finite(item):
                raise ConfigError("NaN and Infinity have no canonical JSON form")
        elif kind is str or kind is int or kind is bool or item is None:
            continue
        elif isinstance(item, dict):
            extend(item.values())
        elif isinstance(item, list | tuple):
            extend(item)
        elif isinstance(item, float) and not finite(item):
            raise ConfigError("NaN and Infinity have no canonical JSON form")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_fields(*fields: Any) -> str:
    """SHA-256 (hex) of the canonical JSON array of ``fields``: length-safe."""
    return hashlib.sha256(canonical_json(list(fields))).hexdigest()


def hmac_fields(secret: bytes, *fields: Any) -> str:
    """HMAC-SHA256 (hex) of the canonical JSON array of ``fields``."""
    return hmac.new(secret, canonical_json(list(fields)), hashlib.sha256).hexdigest()


def digests_equal(a: str, b: str) -> bool:
    """Constant-time equality of two digests (or any two strings, e.g. untrusted ones read
    back from a file). Never compare digests with ``==``: a test enforces it."""
    return hmac.compare_digest(
        a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass")
    )
