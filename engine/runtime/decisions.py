"""What a resume reads of the people's decisions on a paused turn: every approval read
before any is consumed, each consumed (or its expiry recorded) only when it authorizes
its call, and turned into the ``ApprovalDecision`` revalidation takes. The store is the
only I/O; ``loop.Runner.resume`` calls ``collect_decisions`` under its claim."""

from __future__ import annotations

from callgate.engine.core.errors import StoreError
from callgate.engine.core.registry import Registry
from callgate.engine.core.validation import ApprovalDecision
from callgate.engine.store.base import ApprovalRecord, ApprovalStatus, Store
from callgate.engine.store.errors import ApprovalAlreadyConsumed, ApprovalExpired

from .operation import OperationSnapshot

__all__ = ["collect_decisions"]


async def collect_decisions(
    registry: Registry, snap: OperationSnapshot, store: Store, now: float
) -> tuple[dict[str, ApprovalDecision] | None, tuple[str, ...]]:
    """The human decisions for the paused turn, or None (nothing consumed) while some
    approval is still pending and unexpired; then also the ids of those still pending
    (what a person must still decide, not the ones decided already)."""
    # Two passes: read every approval before consuming any. Consuming the decided ones
    # while another is still pending would spend them on a resume that stays paused,
    # and the next resume would find them consumed.
    records: dict[str, ApprovalRecord] = {}
    for call_id, approval_id in snap.approvals.items():
        record = await store.get_approval(approval_id)
        if record is None:
            raise StoreError(f"approval {approval_id} vanished")
        records[call_id] = record
    waiting = tuple(
        r.approval_id
        for r in records.values()
        if r.status is ApprovalStatus.PENDING and now < r.expires_at
    )
    if waiting:
        return None, waiting
    out: dict[str, ApprovalDecision] = {}
    for call_id, record in records.items():
        out[call_id] = await _decision(registry, snap, call_id, record, store=store, now=now)
    return out, ()


async def _decision(
    registry: Registry,
    snap: OperationSnapshot,
    call_id: str,
    record: ApprovalRecord,
    *,
    store: Store,
    now: float,
) -> ApprovalDecision:
    """Settle one approval of the paused turn in the store (consume it, or record its
    expiry) and say whether it authorizes the call."""
    spec = registry.get(record.tool)
    bound = (
        record.operation_id == snap.operation_id
        and record.call_id == call_id
        and spec is not None
        and spec.schema_version == record.schema_version
        and spec.policy_revision == record.policy_revision
    )
    expired = False
    approved = False
    lapsed = False
    if record.status is ApprovalStatus.CONSUMED:
        # Consumed by an earlier resume of this same operation that did not finish: an
        # approval belongs to one call of one operation and the claim makes resumes
        # exclusive, so nobody else spent it. The human's decision stands while it
        # holds; if that attempt already ran the call, the idempotency ledger answers
        # it instead of running the side effect again. Once it no longer holds
        # (expired, or the tool contract or policy changed) the call may not run, and
        # it may have run (the ledger forgets finished keys after its retention): the
        # operation escalates (``lapsed``).
        approved = bound
        lapsed = not bound or now >= record.expires_at
    elif not bound:
        # The person approved this call under another tool contract or policy revision
        # (or the row is another call's): that approval does not carry over, and
        # revalidation answers denied or unknown_tool. Left as it is (never consumed:
        # a consumed approval reads as one that authorized a run).
        expired = record.status is ApprovalStatus.EXPIRED or (
            record.status is not ApprovalStatus.DENIED and now >= record.expires_at
        )
    elif record.status in (ApprovalStatus.APPROVED, ApprovalStatus.PENDING):
        # A pending row here is past its expiry (pass one waits otherwise): consuming it
        # records the expiry in the store, so it is never approvable later.
        try:
            await store.consume_approval(record.approval_id, now=now)
            approved = True
        except ApprovalExpired:  # approved too late, or never decided in time
            expired = True
        except ApprovalAlreadyConsumed:  # consumed since pass one (as a CONSUMED row)
            approved = True
        # Other store errors propagate; the failed resume releases its claim, and the
        # next resume reads the approvals again.
    elif record.status is ApprovalStatus.EXPIRED:
        expired = True
    return ApprovalDecision(
        approval_id=record.approval_id,
        call_id=call_id,
        args_digest=record.args_digest,
        approved=approved,
        expired=expired,
        lapsed=lapsed,
        approver=record.approver,
        reason=record.reason,
        decided_at=record.decided_at,
    )
