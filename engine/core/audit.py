"""The tamper-evident audit trail: append-only, redacted, hash-chained records.

Each ``AuditRecord`` holds the digest of its predecessor and its own digest::

    digest = SHA-256(canonical ["callgate-audit-v1", prev_digest, body])

where ``body`` is the record as an object without ``digest`` (HMAC-SHA256 instead of
SHA-256 when the chain has a host secret). The first record's ``prev_digest`` is
``GENESIS`` and its ``seq`` is 0 unless a chain is continued from a known head.
``verify_trail`` walks a trail once and names the first record that does not fit:
deleted, reordered, inserted and edited records all break the chain at (or, for a
plain-SHA-256 chain rewritten by someone who recomputed digests, right after) the
place of the change. Removing records from the *end* is only visible against a head
digest kept elsewhere (``expected_head``): a chain cannot vouch for what follows it.

Before a record is chained, ``data`` is sanitized:

- sensitive paths become ``"[REDACTED]"``. Paths are a JSONPath subset, rooted at the
  record's ``data``: ``$.arguments.card.number``, ``$.items[0].token``, ``$.items[*].pin``
  (``[*]`` every list item, ``.*`` every object value), ``$['key.with.dots']``. The
  leading ``$.`` may be left out (``arguments.password``). Keys named in
  ``sensitive_keys`` (``DEFAULT_SENSITIVE_KEYS``: api keys, passwords, tokens...) are
  redacted wherever they occur.
- every string (values, keys, ids, tool, kind) has its control characters (C0, DEL, C1,
  U+2028/9, bidi overrides) escaped as ``\\xNN`` / ``\\uNNNN`` and backslashes doubled,
  so no audit line or terminal rendering of one can be forged, and the escaping is
  unambiguous.

This module never reads a clock (``ts`` is given), never writes anywhere (sinks live in
``runtime.audit_sink``), and never puts a redacted value into a digest or an error text.
"""

from __future__ import annotations

import enum
import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec

from .canonical import digest_fields, digests_equal, hmac_fields
from .errors import ConfigError

__all__ = [
    "AUDIT_VERSION",
    "DEFAULT_SENSITIVE_KEYS",
    "GENESIS",
    "REDACTED",
    "AuditChain",
    "AuditKind",
    "AuditRecord",
    "Token",
    "VerifyReport",
    "encode_line",
    "escape_controls",
    "parse_path",
    "record_digest",
    "redact",
    "sanitize",
    "verify_trail",
]

AUDIT_VERSION = "callgate-audit-v1"
GENESIS = "0" * 64
REDACTED = "[REDACTED]"
# Deeper data is replaced wholesale: argument objects are capped at 64 levels upstream, and
# a bounded walk cannot be made to exhaust the interpreter stack.
_MAX_DEPTH = 128
_TOO_DEEP = "[TRUNCATED: nesting too deep]"
# Canonical JSON (orjson) has no form for integers outside the 64-bit range; a model can
# send one, and a record must never fail to chain because of what a model sent.
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
_BIG_INT = "[UNREPRESENTABLE: integer beyond 64 bits]"

DEFAULT_SENSITIVE_KEYS: frozenset[str] = frozenset(
    {
        "access_token",
        "api_key",
        "apikey",
        "authorization",
        "client_secret",
        "cookie",
        "passwd",
        "password",
        "private_key",
        "proxy-authorization",
        "refresh_token",
        "secret",
        "set-cookie",
        "x-api-key",
        "x-goog-api-key",
    }
)


class AuditKind(enum.StrEnum):
    """The record kinds callgate writes; ``AuditChain.append`` accepts any string."""

    REQUESTED = "requested"
    VALIDATED = "validated"
    AUTHORIZED = "authorized"
    APPROVAL = "approval"
    EXECUTED = "executed"
    RESULT = "result"
    BINDING_FAILED = "binding_failed"
    STATE = "state"


class AuditRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One link of the chain. Field order is the JSON-lines field order."""

    seq: int
    ts: float
    operation_id: str
    kind: str
    call_id: str | None
    tool: str | None
    data: dict[str, Any]
    prev_digest: str
    digest: str


class VerifyReport(msgspec.Struct, frozen=True, kw_only=True):
    """``first_broken`` is the 0-based position (in the trail as given) of the first
    record that does not fit, ``len(trail)`` when the trail ends before ``expected_head``.
    ``count`` is the number of records verified intact before it. ``head`` is the digest
    of the last intact record (store it elsewhere to detect truncation later)."""

    ok: bool
    count: int
    first_broken: int | None = None
    reason: str = ""
    head: str | None = None


# --- escaping -----------------------------------------------------------------------------

_UNSAFE = re.compile("[\\\\\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\\":
        return "\\\\"
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with backslashes doubled and control/line/bidi characters spelled out."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escape_char, text)


# --- paths --------------------------------------------------------------------------------


class _Wild:
    __slots__ = ()

    def __repr__(self) -> str:
        return "*"


_WILD: Final = _Wild()
Token = str | int | _Wild
_NAME_END = re.compile(r"[.\[]")


@functools.lru_cache(maxsize=1024)
def parse_path(path: str) -> tuple[Token, ...]:
    """Parse a redaction path (see the module docstring) into tokens; ``ConfigError``
    names the offending path when it is not well-formed."""
    text = path if path.startswith("$") else "$." + path if path[:1] != "[" else "$" + path
    tokens: list[Token] = []
    i = 1
    while i < len(text):
        char = text[i]
        if char == ".":
            match = _NAME_END.search(text, i + 1)
            end = match.start() if match else len(text)
            name = text[i + 1 : end]
            if not name:
                raise ConfigError(f"redaction path {path!r}: empty key at offset {i}")
            tokens.append(_WILD if name == "*" else name)
            i = end
        elif char == "[":
            close = text.find("]", i)
            inner = text[i + 1 : close] if close > 0 else ""
            if close < 0 or not inner:
                raise ConfigError(f"redaction path {path!r}: unclosed or empty [] at {i}")
            if inner == "*":
                tokens.append(_WILD)
            elif len(inner) >= 2 and inner[0] == inner[-1] and inner[0] in "'\"":
                tokens.append(inner[1:-1])
            elif inner.isdigit():
                tokens.append(int(inner))
            else:
                raise ConfigError(f"redaction path {path!r}: bad selector [{inner}]")
            i = close + 1
        else:
            raise ConfigError(f"redaction path {path!r}: unexpected {char!r} at offset {i}")
    return tuple(tokens)


def _step_key(cursors: list[tuple[Token, ...]], key: str) -> list[tuple[Token, ...]]:
    return [c[1:] for c in cursors if c[0] is _WILD or (isinstance(c[0], str) and c[0] == key)]


def _step_index(cursors: list[tuple[Token, ...]], index: int) -> list[tuple[Token, ...]]:
    return [c[1:] for c in cursors if c[0] is _WILD or (isinstance(c[0], int) and c[0] == index)]


def _sanitize(
    value: Any,
    cursors: list[tuple[Token, ...]],
    keys: frozenset[str],
    escape: bool,
    depth: int,
) -> Any:
    """A fresh copy of ``value`` with redactions applied (and strings escaped)."""
    if any(not c for c in cursors):
        return REDACTED
    if isinstance(value, str):
        return escape_controls(value) if escape else value
    if type(value) is int and not _INT_MIN <= value <= _INT_MAX:
        return _BIG_INT
    if value is None or isinstance(value, bool | int | float):
        return value
    if depth >= _MAX_DEPTH:
        return _TOO_DEEP
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError("audit data: object keys must be strings")
            name = escape_controls(key) if escape else key
            if key.lower() in keys:
                out[name] = REDACTED
            else:
                step = _step_key(cursors, key) if cursors else cursors
                out[name] = _sanitize(item, step, keys, escape, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [
            _sanitize(
                item, _step_index(cursors, i) if cursors else cursors, keys, escape, depth + 1
            )
            for i, item in enumerate(value)
        ]
    raise ConfigError(f"audit data: {type(value).__name__} is not JSON data")


def sanitize(
    value: Any,
    paths: Iterable[str] = (),
    *,
    sensitive_keys: Iterable[str] = DEFAULT_SENSITIVE_KEYS,
) -> Any:
    """What the audit trail stores for ``value``: a copy with ``paths`` and sensitive keys
    redacted and every string escaped. Also used for opt-in telemetry attributes."""
    cursors = [parse_path(p) for p in paths]
    keys = frozenset(k.lower() for k in sensitive_keys)
    return _sanitize(value, cursors, keys, True, 0)


def redact(value: Any, paths: Iterable[str]) -> Any:
    """A copy of ``value`` with every path in ``paths`` replaced by ``"[REDACTED]"``.
    Paths that do not occur are ignored; the input is never modified."""
    cursors = [parse_path(p) for p in paths]
    return _sanitize(value, cursors, frozenset(), False, 0)


# --- the chain ----------------------------------------------------------------------------


def record_digest(prev_digest: str, body: Mapping[str, Any], secret: bytes | None = None) -> str:
    """The digest of a record whose fields other than ``digest`` are ``body``."""
    if secret is None:
        return digest_fields(AUDIT_VERSION, prev_digest, body)
    return hmac_fields(secret, AUDIT_VERSION, prev_digest, body)


def _body(record: AuditRecord) -> dict[str, Any]:
    return {
        "seq": record.seq,
        "ts": record.ts,
        "operation_id": record.operation_id,
        "kind": record.kind,
        "call_id": record.call_id,
        "tool": record.tool,
        "data": record.data,
        "prev_digest": record.prev_digest,
    }


def _opt(text: str | None) -> str | None:
    return None if text is None else escape_controls(text)


class AuditChain:
    """Builds one trail's records in order. Holds only the head, never the records.

    ``redact_paths`` apply to every record's ``data``; ``append`` may add more (the tool's
    sensitive argument and result paths, prefixed where the record nests them).
    """

    def __init__(
        self,
        *,
        secret: bytes | None = None,
        redact_paths: Sequence[str] = (),
        sensitive_keys: Iterable[str] = DEFAULT_SENSITIVE_KEYS,
        start_seq: int = 0,
        prev_digest: str = GENESIS,
    ) -> None:
        if secret is not None and not secret:
            raise ConfigError("the audit secret must not be empty")
        self._secret = secret
        self._paths = self._parse(redact_paths)
        self._keys = frozenset(k.lower() for k in sensitive_keys)
        self._seq = start_seq
        self._head = prev_digest

    @staticmethod
    def _parse(paths: Sequence[str | tuple[Token, ...]]) -> list[tuple[Token, ...]]:
        parsed = [p if isinstance(p, tuple) else parse_path(p) for p in paths]
        if any(not p for p in parsed):
            raise ConfigError("redaction path '$' would redact the whole record data")
        return parsed

    @property
    def head(self) -> str:
        """Digest of the last record appended (``GENESIS`` before the first)."""
        return self._head

    def redacts_keys_in(self, value: Any) -> bool:
        """Whether this chain's sensitive keys would redact part of ``value`` (an object
        key named in them at any depth). Bytes (argument text that did not parse) are
        searched for the names themselves, which errs towards yes. A digest over such a
        value must not be written unkeyed: it would let anyone holding the trail guess
        the redacted value back."""
        keys = self._keys
        if isinstance(value, bytes | bytearray | memoryview):
            text = bytes(value).lower()
            return any(key.encode("utf-8", "surrogatepass") in text for key in keys)
        stack = [value]
        while stack:
            node = stack.pop()
            if isinstance(node, Mapping):
                for key, item in node.items():
                    if isinstance(key, str) and key.lower() in keys:
                        return True
                    stack.append(item)
            elif isinstance(node, list | tuple):
                stack.extend(node)
        return False

    @property
    def next_seq(self) -> int:
        return self._seq

    def append(
        self,
        kind: str,
        *,
        ts: float,
        operation_id: str,
        call_id: str | None = None,
        tool: str | None = None,
        data: Mapping[str, Any] | None = None,
        redact_paths: Sequence[str | tuple[Token, ...]] = (),
    ) -> AuditRecord:
        """Sanitize, chain and return the next record. ``ConfigError`` when ``data`` is not
        JSON data or ``ts`` is not finite (the chain is left unchanged). ``redact_paths``
        are path strings or already parsed tokens (``parse_path``), rooted at ``data``."""
        moment = float(ts)
        if not math.isfinite(moment):
            raise ConfigError("audit ts must be a finite number")
        cursors = self._paths + self._parse(redact_paths) if redact_paths else self._paths
        clean = _sanitize(data or {}, cursors, self._keys, True, 0)
        body: dict[str, Any] = {
            "seq": self._seq,
            "ts": moment,
            "operation_id": escape_controls(operation_id),
            "kind": escape_controls(str(kind)),
            "call_id": _opt(call_id),
            "tool": _opt(tool),
            "data": clean,
            "prev_digest": self._head,
        }
        digest = record_digest(self._head, body, self._secret)
        record = AuditRecord(digest=digest, **body)
        self._seq += 1
        self._head = digest
        return record


# --- verification -------------------------------------------------------------------------

_DECODER = msgspec.json.Decoder(AuditRecord)
_ENCODER = msgspec.json.Encoder()


def encode_line(record: AuditRecord) -> bytes:
    """The one byte form of ``record`` in a trail (without the newline): a line that is not
    exactly this for the record it decodes to does not verify."""
    return _ENCODER.encode(record)


def verify_trail(
    records: Iterable[AuditRecord | bytes | str],
    *,
    secret: bytes | None = None,
    start_seq: int = 0,
    start_prev: str = GENESIS,
    expected_head: str | None = None,
) -> VerifyReport:
    """Walk a trail (records, or their JSON lines) once and report the first break.

    Stops at the first record that is malformed, out of sequence, not linked to its
    predecessor, or whose digest does not match its content. Reasons never quote a
    record's values; a decoder's message (which may name a field) is escaped.
    """
    prev = start_prev
    count = 0
    for position, item in enumerate(records):
        checked = _check(item, position, start_seq + position, prev, secret)
        if isinstance(checked, str):
            return VerifyReport(
                ok=False, count=position, first_broken=position, reason=checked, head=prev
            )
        prev = checked.digest
        count = position + 1
    if expected_head is not None and not digests_equal(prev, expected_head):
        return VerifyReport(
            ok=False,
            count=count,
            first_broken=count,
            reason=f"the trail ends after {count} records without reaching the expected head "
            "(records removed from the end, or a different trail)",
            head=prev,
        )
    return VerifyReport(ok=True, count=count, head=prev)


def _check(
    item: object, position: int, seq: int, prev: str, secret: bytes | None
) -> AuditRecord | str:
    """The record if it fits the chain at ``position``, else the reason it does not."""
    if isinstance(item, bytes | str):
        line = item.encode("utf-8", "surrogatepass") if isinstance(item, str) else item
        try:
            record = _DECODER.decode(line)
        except msgspec.DecodeError as exc:
            # (A decoder's message may name a field of the line: escaped, it cannot
            # draw on a terminal.)
            return f"record {position} is not a valid audit record ({escape_controls(str(exc))})"
        except RecursionError:
            return f"record {position} is not a valid audit record (nested too deeply)"
        # The decoded record is what gets digested, so the line must be exactly its
        # encoding: a duplicate key (decoders keep the last, other readers the first) or
        # any other re-spelling would show a reader something the digest does not cover.
        try:
            same = encode_line(record) == line.removesuffix(b"\n").removesuffix(b"\r")
        except (RecursionError, TypeError, ValueError):
            same = False
        if not same:
            return (
                f"record {position} is not the canonical encoding of its record "
                "(duplicate keys or re-spelled JSON: edited)"
            )
    elif isinstance(item, AuditRecord):
        record = item
    else:
        return f"record {position} is not an audit record"
    try:
        return _check_links(record, position, seq, prev, secret)
    except (TypeError, AttributeError, ValueError):
        # Only reachable for AuditRecord objects built with wrong field types in-process
        # (decoded lines are type-checked above).
        return f"record {position} has fields of the wrong type"


def _check_links(
    record: AuditRecord, position: int, seq: int, prev: str, secret: bytes | None
) -> AuditRecord | str:
    if type(record.seq) is not int or record.seq != seq:
        return (
            f"record {position} has seq {record.seq!r:.24}, expected {seq} "
            "(a record was deleted, inserted or reordered here)"
        )
    if not digests_equal(record.prev_digest, prev):
        return (
            f"record {position} does not link to record {position - 1} "
            "(a record before it was removed, replaced or rewritten)"
            if position
            else "record 0 does not link to the start of the trail"
        )
    try:
        expected = record_digest(prev, _body(record), secret)
    except ConfigError:
        return f"record {position} has data with no canonical form"
    if not digests_equal(record.digest, expected):
        return f"record {position} does not match its digest (edited, or wrong secret)"
    return record
