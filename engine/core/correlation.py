"""Verification of a turn's result set before any result goes back to a provider.

A result belongs to a call only if everything about it can be recomputed from
callgate's own ``TrustedCall`` record plus the result's own ``model_result`` and
``is_error``: the request digest from the trusted tool and arguments, the result digest
from the body actually present (never the digest carried on the object), the binding
from the trusted context. The recomputed protected projection must equal the carried
one byte for byte, compared with ``hmac.compare_digest`` only.

The set is keyed by ``(response_id, call_id)``: exactly one result per proposed call;
missing, duplicate and unknown results are rejected; array order may differ (results
come back in proposal order) but identity may not swap. One pass, one dict: linear.

This module never repairs a set (no dropping, no reordering around a defect): the first
defect raises ``CorrelationError`` and the operation fails. Its messages name the
``(response_id, call_id)`` and the mismatching field names, never a value or a secret.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import Literal

import msgspec

from .binding import (
    BoundResult,
    ProtectedAudit,
    TrustedCall,
    binding_digest,
    make_protected_audit,
    result_digest,
)
from .errors import BindingError, ConfigError

__all__ = ["CorrelationError", "Problem", "verify_result_set"]

Problem = Literal["duplicate_proposal", "duplicate", "malformed", "mismatch", "missing", "unknown"]

Key = tuple[str | None, str]

_ENCODER = msgspec.json.Encoder()
# Ids in messages are model- or provider-chosen text: bound their length and let repr()
# escape anything unprintable so an error line cannot be used to forge a log line.
_MAX_ID_CHARS = 80


class CorrelationError(BindingError):
    """A result set failed verification. ``problem`` classifies the defect; ``key`` is the
    ``(response_id, call_id)`` it concerns (None when the result's key is unreadable)."""

    def __init__(self, problem: Problem, key: Key | None, detail: str) -> None:
        self.problem: Problem = problem
        self.key = key
        super().__init__(f"{problem}: {_fmt_key(key)}: {detail}")


def verify_result_set(
    trusted: Sequence[TrustedCall],
    results: Sequence[BoundResult],
    secret: bytes | None = None,
) -> list[BoundResult]:
    """Check ``results`` against the turn's proposed calls and return them in proposal
    order. ``secret`` must be the host secret the results were bound with (None for plain
    SHA-256 bindings). Raises ``CorrelationError`` (a ``BindingError``) on any defect."""
    if secret is not None and not secret:
        raise ConfigError("the binding secret must not be empty")
    index: dict[Key, int] = {}
    for position, call in enumerate(trusted):
        key = call.key
        if key in index:
            raise CorrelationError("duplicate_proposal", key, "two proposed calls share a key")
        index[key] = position
    slots: list[BoundResult | None] = [None] * len(trusted)
    for result in results:
        key = _result_key(result)
        slot = index.get(key)
        if slot is None:
            raise CorrelationError("unknown", key, "no proposed call has this key")
        if slots[slot] is not None:
            raise CorrelationError("duplicate", key, "a second result for the same call")
        _verify_one(trusted[slot], result, secret)
        slots[slot] = result
    ordered: list[BoundResult] = []
    for position, filled in enumerate(slots):
        if filled is None:
            raise CorrelationError("missing", trusted[position].key, "proposed call has no result")
        ordered.append(filled)
    return ordered


def _result_key(result: BoundResult) -> Key:
    try:
        audit = result.protected_audit
        key: Key = (audit.response_id, audit.call_id)
        hash(key)
    except (AttributeError, TypeError):
        raise CorrelationError("malformed", None, "result carries no usable key") from None
    return key


def _verify_one(call: TrustedCall, result: BoundResult, secret: bytes | None) -> None:
    key = call.key
    body = result.model_result
    is_error = result.is_error
    if not isinstance(body, dict) or not isinstance(is_error, bool):
        raise CorrelationError("malformed", key, "model_result must be an object")
    try:
        result_sha = result_digest(body)
    except ConfigError:
        raise CorrelationError("malformed", key, "model_result has no canonical form") from None
    request_sha = call.request_sha256()
    binding = binding_digest(call.ctx, request_sha, result_sha, secret, is_error=is_error)
    expected = make_protected_audit(
        call.ctx,
        call.tool,
        request_sha=request_sha,
        result_sha=result_sha,
        binding_sha=binding,
        keyed=secret is not None,
    )
    try:
        carried = _ENCODER.encode(result.protected_audit)
    except (TypeError, ValueError):
        raise CorrelationError("malformed", key, "protected_audit is not encodable") from None
    if not hmac.compare_digest(_ENCODER.encode(expected), carried):
        raise CorrelationError("mismatch", key, _diagnose(expected, result.protected_audit))


def _diagnose(expected: ProtectedAudit, carried: ProtectedAudit) -> str:
    """Name (never show) the fields that differ. Runs only after a mismatch was found."""
    differing: list[str] = []
    for name in ProtectedAudit.__struct_fields__:
        want = getattr(expected, name)
        got = getattr(carried, name, None)
        try:
            same = hmac.compare_digest(_ENCODER.encode(want), _ENCODER.encode(got))
        except (TypeError, ValueError):
            same = False
        if not same:
            differing.append(name)
    if not differing:
        return "protected_audit is not the canonical record of this call"
    detail = ", ".join(differing) + " differ from the trusted record"
    if differing == ["binding_sha256"]:
        detail += " (bound under another secret or context)"
    return detail


def _fmt_key(key: Key | None) -> str:
    if key is None:
        return "(unknown call)"
    response_id, call_id = key
    return f"(response_id={_fmt_id(response_id)}, call_id={_fmt_id(call_id)})"


def _fmt_id(value: object) -> str:
    text = repr(value)
    if len(text) > _MAX_ID_CHARS:
        return text[: _MAX_ID_CHARS - 3] + "..."
    return text
