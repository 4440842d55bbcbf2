"""Column order and row <-> record conversion shared by the SQL backends.

One place names the columns, so a SELECT, an INSERT and the decoder cannot drift apart.
A row that does not decode (a value outside the CHECK constraints or of another type,
written by hand or by a buggy tool) becomes a StoreError naming the column, never a bare
ValueError or TypeError. A JSON column written as TEXT reads as its UTF-8 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from callgate.engine.core.errors import StoreError

from .base import ApprovalRecord, ApprovalStatus, LedgerRecord, LedgerState, OperationRecord

__all__ = [
    "APPROVAL_COLUMNS",
    "LEDGER_COLUMNS",
    "OPERATION_COLUMNS",
    "approval_from_row",
    "approval_values",
    "ledger_from_row",
    "ledger_values",
    "operation_from_row",
    "operation_values",
]

_E = TypeVar("_E", ApprovalStatus, LedgerState)

OPERATION_COLUMNS = (
    "operation_id",
    "tenant",
    "subject",
    "state",
    "version",
    "owner",
    "fencing_token",
    "snapshot",
    "created_at",
    "updated_at",
)
APPROVAL_COLUMNS = (
    "approval_id",
    "operation_id",
    "call_id",
    "tool",
    "schema_version",
    "args_digest",
    "policy_revision",
    "tenant",
    "subject",
    "status",
    "approver",
    "reason",
    "created_at",
    "expires_at",
    "decided_at",
    "consumed_at",
)
LEDGER_COLUMNS = (
    "tenant",
    "key",
    "request_digest",
    "state",
    "result",
    "owner",
    "created_at",
    "updated_at",
)


def operation_values(r: OperationRecord) -> tuple[Any, ...]:
    return (
        r.operation_id,
        r.tenant,
        r.subject,
        r.state,
        r.version,
        r.owner,
        r.fencing_token,
        r.snapshot,
        r.created_at,
        r.updated_at,
    )


def operation_from_row(row: Sequence[Any]) -> OperationRecord:
    return OperationRecord(
        operation_id=row[0],
        tenant=row[1],
        subject=row[2],
        state=row[3],
        version=_int(row[4], "operations.version"),
        owner=row[5],
        fencing_token=_int(row[6], "operations.fencing_token"),
        snapshot=_blob(row[7], "operations.snapshot"),
        created_at=_float(row[8], "operations.created_at"),
        updated_at=_float(row[9], "operations.updated_at"),
    )


def approval_values(r: ApprovalRecord) -> tuple[Any, ...]:
    return (
        r.approval_id,
        r.operation_id,
        r.call_id,
        r.tool,
        r.schema_version,
        r.args_digest,
        r.policy_revision,
        r.tenant,
        r.subject,
        r.status.value,
        r.approver,
        r.reason,
        r.created_at,
        r.expires_at,
        r.decided_at,
        r.consumed_at,
    )


def approval_from_row(row: Sequence[Any]) -> ApprovalRecord:
    return ApprovalRecord(
        approval_id=row[0],
        operation_id=row[1],
        call_id=row[2],
        tool=row[3],
        schema_version=row[4],
        args_digest=row[5],
        policy_revision=row[6],
        tenant=row[7],
        subject=row[8],
        status=_enum(ApprovalStatus, row[9], "approvals.status"),
        approver=row[10],
        reason=row[11],
        created_at=_float(row[12], "approvals.created_at"),
        expires_at=_float(row[13], "approvals.expires_at"),
        decided_at=None if row[14] is None else _float(row[14], "approvals.decided_at"),
        consumed_at=None if row[15] is None else _float(row[15], "approvals.consumed_at"),
    )


def ledger_values(r: LedgerRecord) -> tuple[Any, ...]:
    return (
        r.tenant,
        r.key,
        r.request_digest,
        r.state.value,
        r.result,
        r.owner,
        r.created_at,
        r.updated_at,
    )


def ledger_from_row(row: Sequence[Any]) -> LedgerRecord:
    return LedgerRecord(
        tenant=row[0],
        key=row[1],
        request_digest=row[2],
        state=_enum(LedgerState, row[3], "ledger.state"),
        result=None if row[4] is None else _blob(row[4], "ledger.result"),
        owner=row[5],
        created_at=_float(row[6], "ledger.created_at"),
        updated_at=_float(row[7], "ledger.updated_at"),
    )


def _enum(kind: type[_E], value: object, column: str) -> _E:
    try:
        return kind(str(value))
    except ValueError:
        raise StoreError(
            f"{column} holds {value!r}, not one of {[m.value for m in kind]}"
        ) from None


def _int(value: object, column: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise StoreError(f"{column} holds {value!r}, not an integer")


def _float(value: object, column: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise StoreError(f"{column} holds {value!r}, not a number")


def _blob(value: object, column: str) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        # JSON written as TEXT (what the sqlite3 shell's UPDATE does): the same bytes.
        return value.encode("utf-8", "surrogatepass")
    raise StoreError(f"{column} holds a {type(value).__name__}, not bytes")
