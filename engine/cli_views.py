"""What the admin CLI prints of stored operations: their columns, and a run-loop
snapshot read field by field without trusting its shape (it may come from another
callgate version, or not be one at all)."""

from __future__ import annotations

from typing import Any

import msgspec

from .store.base import OperationRecord

__all__ = ["operation_json", "snapshot_view"]


def operation_json(record: OperationRecord) -> dict[str, Any]:
    """The stored columns of an operation, without the opaque snapshot (its size only)."""
    return {
        "operation_id": record.operation_id,
        "state": record.state,
        "tenant": record.tenant,
        "subject": record.subject,
        "owner": record.owner,
        "version": record.version,
        "fencing_token": record.fencing_token,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "snapshot_bytes": len(record.snapshot),
    }


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_CALL_FIELDS = ("response_id", "call_id", "tool", "status", "idempotency_key", "approval_id")


def _call_view(raw: object) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    out: dict[str, Any] = {"turn": _int(raw.get("turn"))}
    out.update((k, _str(raw.get(k))) for k in _CALL_FIELDS)
    out["binding_sha256"] = _str(raw.get("binding_sha256"))
    return out


def snapshot_view(snapshot: bytes) -> dict[str, Any] | None:
    """What the CLI shows of a run-loop snapshot, read field by field without trusting its
    shape (it may come from another callgate version): provider, model, stop, final text,
    the answered calls, the paused turn's proposed calls (names and ids — never arguments)
    and the audit chain position. None when it is not a JSON object."""
    try:
        data = msgspec.json.decode(snapshot)
    except (msgspec.DecodeError, RecursionError):  # (nesting past msgspec's own guard)
        return None
    if not isinstance(data, dict):
        return None
    stop = data.get("stop")
    outcome = data.get("outcome")
    proposed = outcome.get("calls") if isinstance(outcome, dict) else None
    approvals = data.get("approvals")
    calls = data.get("calls")
    return {
        "provider": _str(data.get("provider")),
        "model": _str(data.get("model")),
        "state": _str(data.get("state")),
        "stop": {k: _str(stop.get(k)) for k in ("state", "input", "reason", "provider_reason")}
        if isinstance(stop, dict)
        else None,
        "text": _str(data.get("text")) or "",
        "calls": [c for c in map(_call_view, calls) if c is not None]
        if isinstance(calls, list)
        else [],
        "proposed": [
            {"call_id": _str(c.get("call_id")), "name": _str(c.get("name"))}
            for c in proposed
            if isinstance(c, dict)
        ]
        if isinstance(proposed, list)
        else [],
        "waiting_on": {k: v for k, v in approvals.items() if isinstance(v, str)}
        if isinstance(approvals, dict)
        else {},
        "audit_seq": _int(data.get("audit_seq")),
        "audit_head": _str(data.get("audit_head")),
    }
