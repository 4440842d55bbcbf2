"""What the admin CLI prints of stored approvals and operations: their ``--json`` views,
their aligned-text views, and a run-loop snapshot read field by field without trusting its
shape (it may come from another callgate version, or not be one at all).

Every stored string in a text view goes through ``shown`` (``escape_controls``: control
characters spelled out, backslashes doubled), and the lines are written through
``cli_output.say`` (``terminal_text``) as a second guard. A view never holds a
conversation or a call's arguments (their digest only).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from .cli_audit import CliFailure
from .cli_output import say, say_json
from .core.audit import escape_controls
from .core.states import OpState
from .store.base import ApprovalRecord, ApprovalStatus, OperationRecord, Store

__all__ = [
    "APPROVAL_HEADERS",
    "approval_json",
    "approval_rows",
    "approval_text",
    "get_operation",
    "operation_json",
    "operation_text",
    "pairs",
    "print_operation",
    "shown",
    "snapshot_view",
    "table",
    "when",
]

# A model's final answer can be long: the text view shows its start, --json all of it.
_TEXT_PREVIEW = 200


def shown(value: object) -> str:
    """A value for the text view: control characters escaped, so that nothing stored (a
    model's call id, an approver's reason) can drive the terminal."""
    return "-" if value is None else escape_controls(str(value))


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    try:
        moment = datetime.datetime.fromtimestamp(ts, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return repr(ts)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    )


def pairs(items: Sequence[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in items)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in items)


def _preview(text: str) -> str:
    return text if len(text) <= _TEXT_PREVIEW else text[:_TEXT_PREVIEW] + "…"


# --- approvals ----------------------------------------------------------------------------


def approval_json(record: ApprovalRecord, now: float) -> dict[str, Any]:
    """The ``--json`` view of an approval: every stored field, plus ``past_expiry`` (a
    pending approval stays ``pending`` in the store until a decision finds it expired)."""
    out: dict[str, Any] = msgspec.to_builtins(record)
    out["past_expiry"] = now >= record.expires_at
    return out


def _status_text(record: ApprovalRecord, now: float) -> str:
    if record.status is ApprovalStatus.PENDING and now >= record.expires_at:
        return "pending (expired)"
    return record.status.value


APPROVAL_HEADERS = ("APPROVAL", "STATUS", "OPERATION", "TOOL", "CALL", "EXPIRES", "DECIDED BY")


def approval_rows(records: Sequence[ApprovalRecord], now: float) -> list[list[str]]:
    return [
        [
            shown(r.approval_id),
            _status_text(r, now),
            shown(r.operation_id),
            shown(r.tool),
            shown(r.call_id),
            when(r.expires_at),
            shown(r.approver),
        ]
        for r in records
    ]


def approval_text(r: ApprovalRecord, now: float) -> str:
    decided = "-"
    if r.decided_at is not None:
        decided = f"{when(r.decided_at)} by {shown(r.approver)}"
        if r.reason:
            decided += f": {shown(r.reason)}"
    return pairs(
        [
            ("approval", shown(r.approval_id)),
            ("status", _status_text(r, now)),
            ("operation", shown(r.operation_id)),
            ("call", shown(r.call_id)),
            ("tool", f"{shown(r.tool)} (schema {shown(r.schema_version)})"),
            ("arguments", f"sha256 {shown(r.args_digest)}"),
            ("policy", shown(r.policy_revision)),
            ("tenant", shown(r.tenant)),
            ("subject", shown(r.subject)),
            ("created", when(r.created_at)),
            ("expires", when(r.expires_at)),
            ("decided", decided),
            ("consumed", when(r.consumed_at)),
        ]
    )


# --- operations ---------------------------------------------------------------------------


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


def operation_text(
    record: OperationRecord, view: dict[str, Any] | None, approvals: Sequence[ApprovalRecord]
) -> str:
    """The text view of ``operations show``: the stored columns, what the snapshot says
    (``view``; "not readable" when None), its approvals, the paused turn's proposed calls
    and the answered calls."""
    items = [
        ("operation", shown(record.operation_id)),
        ("state", shown(record.state)),
        ("tenant", shown(record.tenant)),
        ("subject", shown(record.subject)),
        ("owner", shown(record.owner)),
        ("version", f"{record.version} (fencing token {record.fencing_token})"),
        ("created", when(record.created_at)),
        ("updated", when(record.updated_at)),
    ]
    if view is None:
        items.append(("snapshot", f"not readable ({len(record.snapshot)} bytes)"))
    else:
        items.append(("model", f"{shown(view['provider'])} / {shown(view['model'])}"))
        stop = view["stop"]
        if stop is not None:
            raw = (
                f" (provider: {shown(stop['provider_reason'])})" if stop["provider_reason"] else ""
            )
            items.append(("stop", f"{shown(stop['input'])}: {shown(stop['reason'])}{raw}"))
        if view["text"]:
            items.append(("text", shown(_preview(view["text"]))))
        if view["audit_seq"] is not None:
            items.append(
                ("audit", f"{view['audit_seq']} records, head {shown(view['audit_head'])}")
            )
    parts = [pairs(items)]
    now = time.time()
    if approvals:
        parts.append("approvals\n" + table(APPROVAL_HEADERS, approval_rows(approvals, now)))
    if view is not None and view["proposed"] and record.state == OpState.WAITING_APPROVAL:
        rows = [[shown(c["call_id"]), shown(c["name"])] for c in view["proposed"]]
        parts.append("paused turn\n" + table(("CALL", "TOOL"), rows))
    if view is not None and view["calls"]:
        fields = ("turn", "call_id", "tool", "status", "approval_id", "idempotency_key")
        rows = [[shown(c[k]) for k in fields] for c in view["calls"]]
        headers = ("TURN", "CALL", "TOOL", "STATUS", "APPROVAL", "IDEMPOTENCY KEY")
        parts.append("calls\n" + table(headers, rows))
    return "\n\n".join(parts)


async def get_operation(store: Store, operation_id: str) -> OperationRecord:
    record = await store.get_operation(operation_id)
    if record is None:
        raise CliFailure(f"no operation '{shown(operation_id)}' in this store")
    return record


async def print_operation(store: Store, operation_id: str, *, as_json: bool) -> None:
    """``operations show``'s answer, read from the store as it stands now."""
    record = await get_operation(store, operation_id)
    approvals = await store.list_approvals(operation_id=operation_id, limit=1000)
    view = snapshot_view(record.snapshot)
    if as_json:
        now = time.time()
        out = operation_json(record)
        out["snapshot"] = view
        out["approvals"] = [approval_json(a, now) for a in approvals]
        say_json(out)
    else:
        say(operation_text(record, view, approvals))
