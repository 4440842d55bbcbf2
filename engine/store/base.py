"""The store's vocabulary: frozen records, ledger decisions, published constants, and the
async ``Store`` protocol every backend (SQLite, PostgreSQL, in-memory) implements.

This module owns *what* is stored and the contract of each method; ``rules.py`` owns the
state transitions, the backends own only locking and I/O. It never does I/O and never
reads a clock: every timestamp (``now``, ``created_at``...) is passed in by the caller, in
epoch seconds, so a test or a recovery can place itself anywhere on the time line.

Contract summary (the conformance suite in tests/test_store_conformance*.py checks it);
``now`` is keyword-only everywhere, so a float cannot land in the wrong slot:

Operations (optimistic concurrency + fencing):
    create_operation(rec)                  -> rec stored with version=1  | DuplicateRecord
    save_operation(rec, expected_version, fencing_token)
        writes state/owner/snapshot/updated_at, version += 1  | StaleWriteError, RecordNotFound
    claim_operation(id, worker, now=, from_states=None, stale_after=None) -> token | None
        exactly one concurrent claimer wins; the winner's token is the old one + 1, so
        every write still carrying the old token is rejected (a stale worker is fenced).
        Saving owner=None releases; stale_after lets a claimer take over from an owner
        that has not written for that long (a crashed worker).

Approvals (born pending; first decision wins; single use):
    decide_approval(id, approve, approver, reason, now=): pending -> approved/denied;
        any other status -> ApprovalAlreadyDecided; at/after expires_at -> the row
        becomes ``expired`` (committed) and ApprovalExpired is raised.
    consume_approval(id, now=): approved -> consumed (once); at/after expires_at ->
        expired + ApprovalExpired; pending/denied -> ApprovalNotApproved; consumed ->
        ApprovalAlreadyConsumed.

Idempotency ledger, keyed by (tenant, key):
    ledger_begin(t, k, digest, owner, now=, lease=) -> Began | Replay | Conflict |
        InFlight | Unknown   (see the decision classes)
    ledger_finish           in_flight (mine) -> succeeded | failed
    ledger_mark_unknown     in_flight|unknown (mine) -> unknown, owner released
    ledger_resolve_unknown  unknown (mine, taken via Unknown) -> succeeded | failed
    prune_ledger(now=, older_than=LEDGER_RETENTION): finished rows only; unknown and
        in_flight rows are never pruned.
    A write by an owner that does not hold the key raises LedgerOwnershipLost.

The recovery protocol for a key whose outcome is unknown (handler timeout, crash):
    d = await store.ledger_begin(t, k, digest, me, now=now)
    Unknown -> you now own the key: call the tool's reconcile hook (look the effect up
               downstream by key); found -> ledger_resolve_unknown(..., SUCCEEDED, result);
               provably absent -> execute now and resolve with the outcome. Never retry
               under a new key. Mid-reconcile and giving up -> ledger_mark_unknown.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from types import TracebackType
from typing import Protocol, Self, TypeAlias

import msgspec

__all__ = [
    "LEDGER_IN_FLIGHT_LEASE",
    "LEDGER_RETENTION",
    "ApprovalRecord",
    "ApprovalStatus",
    "Began",
    "Conflict",
    "InFlight",
    "LedgerDecision",
    "LedgerRecord",
    "LedgerState",
    "OperationRecord",
    "Replay",
    "Store",
    "Unknown",
]

# Finished ledger rows are kept this long after their last write, then ``prune_ledger`` may
# delete them. A retry of the same business intent later than this runs again, so the
# window must exceed the longest client retry horizon; 7 days covers the usual
# "retry for up to a few days" policies of payment-style APIs with margin.
LEDGER_RETENTION: float = 7 * 24 * 3600.0

# An ``in_flight`` row not written for this long belongs to a process presumed dead: the
# next ``ledger_begin`` treats it as Unknown (reconcile first), never as free. It must
# exceed the longest handler deadline plus clock skew between workers, or a slow but live
# handler could be reconciled (and its effect repeated) under its feet. 15 minutes is
# well above callgate's default per-tool deadlines.
LEDGER_IN_FLIGHT_LEASE: float = 15 * 60.0


class ApprovalStatus(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    CONSUMED = "consumed"
    EXPIRED = "expired"


class LedgerState(enum.StrEnum):
    IN_FLIGHT = "in_flight"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"


class OperationRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One business operation. ``snapshot`` is opaque to the store (JSON written by the run
    loop: conversation continuation, budgets spent, pending calls); ``state`` is the run
    loop's state name. ``version`` grows by one on every write; ``fencing_token`` only on a
    claim. ``owner`` is informational (which worker holds it); the token is what fences."""

    operation_id: str
    tenant: str
    subject: str
    state: str
    snapshot: bytes
    created_at: float
    updated_at: float
    version: int = 0
    owner: str | None = None
    fencing_token: int = 0


class ApprovalRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One human decision about one call, bound to what was shown to the approver:
    tool + schema version + canonical argument digest + policy revision."""

    approval_id: str
    operation_id: str
    call_id: str
    tool: str
    schema_version: str
    args_digest: str
    policy_revision: str
    tenant: str
    subject: str
    created_at: float
    expires_at: float
    status: ApprovalStatus = ApprovalStatus.PENDING
    approver: str | None = None
    reason: str | None = None
    decided_at: float | None = None
    consumed_at: float | None = None


class LedgerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The idempotency ledger row of (tenant, key). ``owner`` is the token of the attempt
    that holds the key (None once finished or released as unknown)."""

    tenant: str
    key: str
    request_digest: str
    state: LedgerState
    result: bytes | None
    owner: str | None
    created_at: float
    updated_at: float


class Began(msgspec.Struct, frozen=True, kw_only=True, tag="began"):
    """The key was free: you own it (state in_flight). Run the handler, then finish."""

    record: LedgerRecord


class Replay(msgspec.Struct, frozen=True, kw_only=True, tag="replay"):
    """Same key, same request, already finished: return ``result``, do not run."""

    state: LedgerState
    result: bytes | None


class Conflict(msgspec.Struct, frozen=True, kw_only=True, tag="conflict"):
    """Same key, different request digest: ``idempotency_conflict``; nothing runs."""

    stored_digest: str


class InFlight(msgspec.Struct, frozen=True, kw_only=True, tag="in_flight"):
    """Another live attempt holds the key (running, or reconciling an unknown outcome):
    a conflict for this caller, never a second execution. Retry later."""

    owner: str | None
    state: LedgerState
    since: float


class Unknown(msgspec.Struct, frozen=True, kw_only=True, tag="unknown"):
    """A previous attempt may have had its effect. You now own the key for reconciliation
    (``record.owner`` is you): reconcile downstream, then ``ledger_resolve_unknown``.
    ``stale_in_flight`` says the previous owner vanished mid-flight (lease elapsed)
    rather than reporting an unknown outcome itself."""

    record: LedgerRecord
    stale_in_flight: bool


LedgerDecision: TypeAlias = Began | Replay | Conflict | InFlight | Unknown


class Store(Protocol):
    """Durable state of operations, approvals and the idempotency ledger.

    Use as ``async with open_store(url) as store:`` (or ``await store.start()`` /
    ``await store.aclose()``); ``start`` applies pending migrations. Every method is safe
    to call concurrently from many coroutines, processes and (PostgreSQL) machines.
    Methods that fail on purpose raise the typed errors of ``callgate.engine.store.errors``.
    """

    async def start(self) -> None:
        """Connect and apply pending schema migrations (idempotent, concurrency-safe)."""
        ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- operations --------------------------------------------------------------------
    async def create_operation(self, record: OperationRecord) -> OperationRecord:
        """Insert ``record`` as given except ``version``, stored as 1; return the row.
        An existing id raises DuplicateRecord."""
        ...

    async def get_operation(self, operation_id: str) -> OperationRecord | None: ...

    async def list_operations(
        self, state: str | None = None, limit: int = 100
    ) -> list[OperationRecord]:
        """Oldest first (created_at, then id)."""
        ...

    async def save_operation(
        self, record: OperationRecord, expected_version: int, fencing_token: int
    ) -> OperationRecord:
        """Write ``state``, ``owner``, ``snapshot`` and ``updated_at`` of ``record`` if the
        row still has ``expected_version`` and ``fencing_token``; return the new row
        (version + 1). Otherwise StaleWriteError; a missing row RecordNotFound. Saving
        ``owner=None`` releases the operation for the next claim."""
        ...

    async def claim_operation(
        self,
        operation_id: str,
        worker_id: str,
        *,
        now: float,
        from_states: Collection[str] | None = None,
        stale_after: float | None = None,
    ) -> int | None:
        """Take the operation if its state is in ``from_states`` (None: any) and it has no
        owner — or, when ``stale_after`` is given, its owner has not written for that many
        seconds. Returns the new fencing token (old + 1; also sets owner, updated_at=now,
        version + 1), or None when not claimable or another claimer holds the row.
        A missing row raises RecordNotFound."""
        ...

    # -- approvals ---------------------------------------------------------------------
    async def create_approval(self, record: ApprovalRecord) -> ApprovalRecord: ...

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None: ...

    async def list_approvals(
        self,
        status: ApprovalStatus | None = None,
        *,
        operation_id: str | None = None,
        limit: int = 100,
    ) -> list[ApprovalRecord]:
        """Oldest first. ``status`` is the stored one: a pending row past its expiry is
        listed as pending until a decide/consume marks it expired."""
        ...

    async def decide_approval(
        self, approval_id: str, approve: bool, approver: str, reason: str | None, *, now: float
    ) -> ApprovalRecord: ...

    async def consume_approval(self, approval_id: str, *, now: float) -> ApprovalRecord: ...

    # -- idempotency ledger ------------------------------------------------------------
    async def ledger_begin(
        self,
        tenant: str,
        key: str,
        request_digest: str,
        owner: str,
        *,
        now: float,
        lease: float = LEDGER_IN_FLIGHT_LEASE,
    ) -> LedgerDecision: ...

    async def ledger_finish(
        self,
        tenant: str,
        key: str,
        owner: str,
        state: LedgerState,
        result: bytes | None,
        *,
        now: float,
    ) -> LedgerRecord: ...

    async def ledger_mark_unknown(
        self, tenant: str, key: str, owner: str, *, now: float
    ) -> LedgerRecord: ...

    async def ledger_resolve_unknown(
        self,
        tenant: str,
        key: str,
        owner: str,
        state: LedgerState,
        result: bytes | None,
        *,
        now: float,
    ) -> LedgerRecord: ...

    async def ledger_get(self, tenant: str, key: str) -> LedgerRecord | None: ...

    async def prune_ledger(self, *, now: float, older_than: float = LEDGER_RETENTION) -> int:
        """Delete succeeded/failed rows last written before ``now - older_than``; return
        how many. Never touches in_flight or unknown rows."""
        ...
