"""``MemoryStore``: an in-process store for unit tests, and the idempotency ledger of a
drive whose ``Runner`` has no store.

It is not durable (everything is gone when the process exits), not shared between
processes, and must never back a real deployment: a pause kept here is exactly the
"approval waits only in process memory" the spec forbids. It exists so run-loop tests
need no file, and so a storeless operation (one drive, no pause) still runs a write the
model proposes twice only once; it shares ``rules.py`` with the real backends and passes
the same conformance suite (minus the cross-process scenarios).

Each method reads and writes its dicts with no ``await`` in between, so on one event
loop every method is atomic without a lock; the leading checkpoint keeps it a real
scheduling point, like the I/O of the real backends.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import anyio.lowlevel

from callgate.engine.core.errors import StoreError

from . import rules
from .base import (
    LEDGER_IN_FLIGHT_LEASE,
    LEDGER_RETENTION,
    ApprovalRecord,
    ApprovalStatus,
    Began,
    LedgerDecision,
    LedgerRecord,
    OperationRecord,
    Store,
)
from .errors import DuplicateRecord, RecordNotFound

__all__ = ["MemoryStore"]


class MemoryStore(rules.LedgerMoves, Store):
    """Unit tests, and a storeless drive's ledger: see the module docstring."""

    def __init__(self) -> None:
        self._operations: dict[str, OperationRecord] = {}
        self._approvals: dict[str, ApprovalRecord] = {}
        self._ledger: dict[tuple[str, str], LedgerRecord] = {}
        self._closed = False

    async def _enter(self) -> None:
        await anyio.lowlevel.checkpoint()
        if self._closed:
            raise StoreError("store is closed")

    async def start(self) -> None:
        await anyio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self._closed = True

    # -- operations ----------------------------------------------------------------------
    async def create_operation(self, record: OperationRecord) -> OperationRecord:
        await self._enter()
        if record.operation_id in self._operations:
            raise DuplicateRecord(f"operation {record.operation_id!r} exists")
        row = self._operations[record.operation_id] = rules.new_operation(record)
        return row

    async def get_operation(self, operation_id: str) -> OperationRecord | None:
        await self._enter()
        return self._operations.get(operation_id)

    async def list_operations(
        self, state: str | None = None, limit: int = 100
    ) -> list[OperationRecord]:
        await self._enter()
        limit = rules.check_limit(limit)
        rows = [r for r in self._operations.values() if state is None or r.state == state]
        rows.sort(key=lambda r: (r.created_at, r.operation_id))
        return rows[:limit]

    def _require_operation(self, operation_id: str) -> OperationRecord:
        current = self._operations.get(operation_id)
        if current is None:
            raise RecordNotFound(f"no operation {operation_id!r}")
        return current

    async def save_operation(
        self, record: OperationRecord, expected_version: int, fencing_token: int
    ) -> OperationRecord:
        await self._enter()
        current = self._require_operation(record.operation_id)
        new = rules.save(current, record, expected_version, fencing_token)
        self._operations[new.operation_id] = new
        return new

    async def claim_operation(
        self,
        operation_id: str,
        worker_id: str,
        *,
        now: float,
        from_states: Collection[str] | None = None,
        stale_after: float | None = None,
    ) -> int | None:
        await self._enter()
        current = self._require_operation(operation_id)
        new = rules.claim(current, worker_id, now, from_states, stale_after)
        if new is None:
            return None
        self._operations[operation_id] = new
        return new.fencing_token

    # -- approvals -----------------------------------------------------------------------
    async def create_approval(self, record: ApprovalRecord) -> ApprovalRecord:
        await self._enter()
        record = rules.new_approval(record)
        if record.approval_id in self._approvals:
            raise DuplicateRecord(f"approval {record.approval_id!r} exists")
        self._approvals[record.approval_id] = record
        return record

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        await self._enter()
        return self._approvals.get(approval_id)

    async def list_approvals(
        self,
        status: ApprovalStatus | None = None,
        *,
        operation_id: str | None = None,
        limit: int = 100,
    ) -> list[ApprovalRecord]:
        await self._enter()
        limit = rules.check_limit(limit)
        rows = [
            r
            for r in self._approvals.values()
            if (status is None or r.status is status)
            and (operation_id is None or r.operation_id == operation_id)
        ]
        rows.sort(key=lambda r: (r.created_at, r.approval_id))
        return rows[:limit]

    def _require_approval(self, approval_id: str) -> ApprovalRecord:
        current = self._approvals.get(approval_id)
        if current is None:
            raise RecordNotFound(f"no approval {approval_id!r}")
        return current

    async def decide_approval(
        self, approval_id: str, approve: bool, approver: str, reason: str | None, *, now: float
    ) -> ApprovalRecord:
        await self._enter()
        current = self._require_approval(approval_id)
        new, error = rules.decide(current, approve, approver, reason, now)
        self._approvals[approval_id] = new
        return rules.settle((new, error))

    async def consume_approval(self, approval_id: str, *, now: float) -> ApprovalRecord:
        await self._enter()
        current = self._require_approval(approval_id)
        new, error = rules.consume(current, now)
        self._approvals[approval_id] = new
        return rules.settle((new, error))

    # -- idempotency ledger --------------------------------------------------------------
    async def ledger_get(self, tenant: str, key: str) -> LedgerRecord | None:
        await self._enter()
        return self._ledger.get((tenant, key))

    async def ledger_begin(
        self,
        tenant: str,
        key: str,
        request_digest: str,
        owner: str,
        *,
        now: float,
        lease: float = LEDGER_IN_FLIGHT_LEASE,
    ) -> LedgerDecision:
        await self._enter()
        current = self._ledger.get((tenant, key))
        if current is None:
            fresh = rules.fresh_ledger(tenant, key, request_digest, owner, now)
            self._ledger[(tenant, key)] = fresh
            return Began(record=fresh)
        decision, write = rules.begin(current, request_digest, owner, now, lease)
        if write is not None:
            self._ledger[(tenant, key)] = write
        return decision

    async def _ledger_change(
        self, tenant: str, key: str, change: Callable[[LedgerRecord], LedgerRecord]
    ) -> LedgerRecord:
        await self._enter()
        current = self._ledger.get((tenant, key))
        if current is None:
            raise RecordNotFound(f"no ledger row for ({tenant!r}, {key!r})")
        new = self._ledger[(tenant, key)] = change(current)
        return new

    async def prune_ledger(self, *, now: float, older_than: float = LEDGER_RETENTION) -> int:
        await self._enter()
        cutoff = now - older_than
        doomed = [
            k
            for k, r in self._ledger.items()
            if r.state in rules.FINISHED and r.updated_at < cutoff
        ]
        for k in doomed:
            del self._ledger[k]
        return len(doomed)
