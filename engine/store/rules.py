"""The store's state transitions as pure functions: current row + request -> new row.

Every backend does the same three steps — lock the row, apply one of these functions,
write what it returns — so SQLite, PostgreSQL and the in-memory store cannot disagree on
semantics. Nothing here does I/O, reads a clock or holds a lock.

A function either returns the row to write, or raises a typed error. ``decide`` and
``consume`` may instead return ``(row, error)``: write the row (an approval found
expired is *recorded* as expired), commit, then raise the error.

``LedgerMoves`` gives every backend the ledger moves after ``ledger_begin`` in these
terms; a backend supplies only ``_ledger_change`` (its lock, read and write).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from msgspec.structs import replace

from callgate.engine.core.canonical import digests_equal
from callgate.engine.core.errors import ConfigError, StaleWriteError

from .base import (
    ApprovalRecord,
    ApprovalStatus,
    Conflict,
    InFlight,
    LedgerDecision,
    LedgerRecord,
    LedgerState,
    OperationRecord,
    Replay,
    Unknown,
)
from .errors import (
    ApprovalAlreadyConsumed,
    ApprovalAlreadyDecided,
    ApprovalError,
    ApprovalExpired,
    ApprovalNotApproved,
    LedgerOwnershipLost,
)

__all__ = [
    "FINISHED",
    "begin",
    "claim",
    "claimable",
    "consume",
    "decide",
    "finish",
    "fresh_ledger",
    "mark_unknown",
    "new_approval",
    "new_operation",
    "resolve_unknown",
    "save",
    "settle",
]

FINISHED = frozenset({LedgerState.SUCCEEDED, LedgerState.FAILED})


# -- operations ----------------------------------------------------------------------------
def check_limit(limit: object) -> int:
    """A listing's row limit: a positive int (a negative one meant three things in three
    backends: all rows, all but the last, an error)."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ConfigError(f"a listing's limit must be a positive int, not {limit!r}")
    return limit


def new_operation(record: OperationRecord) -> OperationRecord:
    return replace(record, version=1)


def save(
    current: OperationRecord, record: OperationRecord, expected_version: int, fencing_token: int
) -> OperationRecord:
    if current.version != expected_version or current.fencing_token != fencing_token:
        raise StaleWriteError(
            f"operation {current.operation_id!r}: write with version {expected_version} / "
            f"token {fencing_token}, row has version {current.version} / "
            f"token {current.fencing_token}"
        )
    return replace(
        current,
        state=record.state,
        owner=record.owner,
        snapshot=record.snapshot,
        updated_at=record.updated_at,
        version=current.version + 1,
    )


def claimable(
    current: OperationRecord,
    now: float,
    from_states: Collection[str] | None,
    stale_after: float | None,
) -> bool:
    if from_states is not None and current.state not in from_states:
        return False
    if current.owner is None:
        return True
    return stale_after is not None and now - current.updated_at >= stale_after


def claim(
    current: OperationRecord,
    worker_id: str,
    now: float,
    from_states: Collection[str] | None,
    stale_after: float | None,
) -> OperationRecord | None:
    if not claimable(current, now, from_states, stale_after):
        return None
    return replace(
        current,
        owner=worker_id,
        fencing_token=current.fencing_token + 1,
        version=current.version + 1,
        updated_at=now,
    )


# -- approvals -----------------------------------------------------------------------------
def new_approval(record: ApprovalRecord) -> ApprovalRecord:
    """An approval is born pending and undecided: a decision only ever enters through
    ``decide``, so the audit trail of who approved what cannot be forged at creation."""
    undecided = (record.approver, record.reason, record.decided_at, record.consumed_at)
    if record.status is not ApprovalStatus.PENDING or any(f is not None for f in undecided):
        raise ConfigError(f"approval {record.approval_id!r} must be created pending, undecided")
    return record


def _expire(current: ApprovalRecord, now: float) -> tuple[ApprovalRecord, ApprovalError]:
    expired = replace(current, status=ApprovalStatus.EXPIRED)
    return expired, ApprovalExpired(
        current.approval_id, "expired", f"expires_at={current.expires_at!r}, now={now!r}"
    )


def decide(
    current: ApprovalRecord, approve: bool, approver: str, reason: str | None, now: float
) -> tuple[ApprovalRecord, ApprovalError | None]:
    if not isinstance(approver, str) or not approver.strip():
        # The approval id audits who approved which action: an anonymous one audits nothing.
        raise ConfigError(f"deciding approval {current.approval_id}: the approver must be named")
    for label, text in (("approver", approver), ("reason", reason)):
        # Both go into the audit trail (canonical JSON) and the stores (UTF-8 text): a
        # lone surrogate (surrogateescape'd argv bytes) would fail every later resume.
        if text is not None and not (isinstance(text, str) and _encodable(text)):
            raise ConfigError(f"deciding approval {current.approval_id}: the {label} is not text")
    status = current.status
    if status is ApprovalStatus.EXPIRED:
        raise ApprovalExpired(current.approval_id, status)
    if status is not ApprovalStatus.PENDING:
        raise ApprovalAlreadyDecided(current.approval_id, status, f"by {current.approver!r}")
    if now >= current.expires_at:
        return _expire(current, now)
    decided = replace(
        current,
        status=ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED,
        approver=approver,
        reason=reason,
        decided_at=now,
    )
    return decided, None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def consume(current: ApprovalRecord, now: float) -> tuple[ApprovalRecord, ApprovalError | None]:
    status = current.status
    if status is ApprovalStatus.EXPIRED:
        raise ApprovalExpired(current.approval_id, status)
    if status is ApprovalStatus.CONSUMED:
        raise ApprovalAlreadyConsumed(current.approval_id, status)
    if status is ApprovalStatus.DENIED:
        raise ApprovalNotApproved(current.approval_id, status)
    # Pending or approved: expiry wins over everything else, and is recorded.
    if now >= current.expires_at:
        return _expire(current, now)
    if status is ApprovalStatus.PENDING:
        raise ApprovalNotApproved(current.approval_id, status)
    return replace(current, status=ApprovalStatus.CONSUMED, consumed_at=now), None


# -- ledger --------------------------------------------------------------------------------
def fresh_ledger(
    tenant: str, key: str, request_digest: str, owner: str, now: float
) -> LedgerRecord:
    return LedgerRecord(
        tenant=tenant,
        key=key,
        request_digest=request_digest,
        state=LedgerState.IN_FLIGHT,
        result=None,
        owner=owner,
        created_at=now,
        updated_at=now,
    )


def begin(
    current: LedgerRecord, request_digest: str, owner: str, now: float, lease: float
) -> tuple[LedgerDecision, LedgerRecord | None]:
    """Decision for an existing row, plus the row to write (None: no write). A missing row
    is the caller's insert of ``fresh_ledger`` -> Began."""
    # Constant time, and safe on non-ASCII text: a digest here is caller data.
    if not digests_equal(current.request_digest, request_digest):
        return Conflict(stored_digest=current.request_digest), None
    if current.state in FINISHED:
        return Replay(state=current.state, result=current.result), None
    expired = now - current.updated_at >= lease
    if current.state is LedgerState.IN_FLIGHT and not expired:
        return InFlight(owner=current.owner, state=current.state, since=current.updated_at), None
    if current.state is LedgerState.UNKNOWN and current.owner not in (None, owner) and not expired:
        # Someone took it for reconciliation and is (presumably) still at it.
        return InFlight(owner=current.owner, state=current.state, since=current.updated_at), None
    # Free to reconcile: unknown and released, a lease that ran out, or our own reconcile
    # being retried (reconciling is a lookup: doing it twice is harmless). Taking the key
    # restarts its lease.
    taken = replace(current, state=LedgerState.UNKNOWN, owner=owner, updated_at=now)
    return Unknown(record=taken, stale_in_flight=current.state is LedgerState.IN_FLIGHT), taken


def _check_terminal(state: LedgerState) -> None:
    if state not in FINISHED:
        raise ConfigError(f"a ledger outcome must be succeeded or failed, not {state!r}")


def _require(current: LedgerRecord, owner: str, states: Collection[LedgerState]) -> None:
    if current.owner != owner or current.state not in states:
        raise LedgerOwnershipLost(
            f"ledger ({current.tenant!r}, {current.key!r}) is {current.state} held by "
            f"{current.owner!r}, not {'/'.join(states)} held by {owner!r}"
        )


def finish(
    current: LedgerRecord, owner: str, state: LedgerState, result: bytes | None, now: float
) -> LedgerRecord:
    _check_terminal(state)
    _require(current, owner, (LedgerState.IN_FLIGHT,))
    return replace(current, state=state, result=result, owner=None, updated_at=now)


def mark_unknown(current: LedgerRecord, owner: str, now: float) -> LedgerRecord:
    _require(current, owner, (LedgerState.IN_FLIGHT, LedgerState.UNKNOWN))
    # Releasing the owner lets the very next attempt reconcile without waiting a lease.
    return replace(current, state=LedgerState.UNKNOWN, owner=None, updated_at=now)


def resolve_unknown(
    current: LedgerRecord, owner: str, state: LedgerState, result: bytes | None, now: float
) -> LedgerRecord:
    _check_terminal(state)
    _require(current, owner, (LedgerState.UNKNOWN,))
    return replace(current, state=state, result=result, owner=None, updated_at=now)


def settle(outcome: tuple[ApprovalRecord, ApprovalError | None]) -> ApprovalRecord:
    """After the row of ``decide``/``consume`` is committed: raise its error, if any."""
    record, error = outcome
    if error is not None:
        raise error
    return record


class LedgerMoves:
    """The ledger moves after ``ledger_begin``, the same in every backend: each reads the
    row under the backend's lock, applies its rule above and writes the result, which
    the backend's ``_ledger_change`` does (``RecordNotFound`` for a missing row)."""

    async def _ledger_change(
        self, tenant: str, key: str, change: Callable[[LedgerRecord], LedgerRecord]
    ) -> LedgerRecord:
        raise NotImplementedError

    async def ledger_finish(
        self,
        tenant: str,
        key: str,
        owner: str,
        state: LedgerState,
        result: bytes | None,
        *,
        now: float,
    ) -> LedgerRecord:
        return await self._ledger_change(
            tenant, key, lambda cur: finish(cur, owner, state, result, now)
        )

    async def ledger_mark_unknown(
        self, tenant: str, key: str, owner: str, *, now: float
    ) -> LedgerRecord:
        return await self._ledger_change(tenant, key, lambda cur: mark_unknown(cur, owner, now))

    async def ledger_resolve_unknown(
        self,
        tenant: str,
        key: str,
        owner: str,
        state: LedgerState,
        result: bytes | None,
        *,
        now: float,
    ) -> LedgerRecord:
        return await self._ledger_change(
            tenant, key, lambda cur: resolve_unknown(cur, owner, state, result, now)
        )
