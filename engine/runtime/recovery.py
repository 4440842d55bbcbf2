"""What happens to an operation's claim when its drive does not end normally: releasing
it after a failure (and, where replaying it would ask the model again, ending it
``escalated`` with its audit trail's last record saying so), making a resumed drive's
first model request durable before it leaves, and settling an operation that no drive
holds any more. The ``Runner`` (in ``loop``) calls these; they change rows only through
the store's fenced writes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from callgate.engine.core.audit import AuditChain
from callgate.engine.core.errors import StaleWriteError, StoreError
from callgate.engine.core.states import TERMINAL, OpInput, OpState, StopInfo
from callgate.engine.store.base import ApprovalStatus
from callgate.engine.store.errors import StoreUnavailable

from .operation import DriveMarks, OperationResult, OperationSnapshot, decode_snapshot

if TYPE_CHECKING:
    from .loop import Runner

__all__ = [
    "drive_failed",
    "mark_past_pause",
    "record_end",
    "release",
    "restated",
    "settle_stuck",
    "undecided",
]

# How long the shielded release of a claim after a failed drive may take. It is one read
# and one write; 10 s rides out a briefly busy store, and the bound keeps a cancelled task
# from being held by a store that stopped answering. A release that does not finish leaves
# the claim to ``claim_stale_after``.
_RELEASE_TIMEOUT = 10.0


async def settle_stuck(runner: Runner, operation_id: str, now: float) -> OperationResult:
    """``resume`` of an operation it cannot claim as paused. One that no drive holds
    any more (its start failed and could not be escalated, or its worker stopped and
    the claim went stale) in a state a drive only passes through is ended
    ``escalated``: replaying it would ask the model again, and a different call than
    the one that may already have run could repeat a side effect."""
    record = await runner._need_store().get_operation(operation_id)
    if record is None:
        raise StoreError(f"no operation {operation_id}")
    snap = decode_snapshot(record.snapshot, operation_id)
    if snap.state in TERMINAL:
        return runner._result(snap)
    if snap.state is OpState.WAITING_APPROVAL:
        # Not claimable although paused: another resume holds it, or it was released
        # meanwhile. Busy, the approvals still listed are those nobody has decided
        # (that resume will pause again for them); decided ones it is acting on.
        if record.owner is None:
            return runner._result(snap)
        return runner._result(snap, await undecided(runner, snap), busy=True)
    token = await runner._need_store().claim_operation(
        operation_id,
        runner.worker_id,
        now=now,
        from_states=[snap.state.value],
        stale_after=runner._claim_stale_after,
    )
    if token is None:  # a live drive holds it, or it was released meanwhile
        now_held = await runner._need_store().get_operation(operation_id)
        if now_held is None:
            raise StoreError(f"no operation {operation_id}")
        held = decode_snapshot(now_held.snapshot, operation_id)
        if now_held.owner is None or held.state is OpState.WAITING_APPROVAL:
            return runner._result(held)  # released (paused again, or ended)
        return runner._result(held, busy=True)
    error = StoreError(f"operation {operation_id}: no drive holds it")
    stop = drive_failed("no drive holds it (its start failed, or its worker stopped)")
    failure = await release(runner, operation_id, token, error, stop=stop)
    if failure is not None:
        # Settling it failed: the store's own error (a retry policy keyed on
        # StoreUnavailable must see it), never reported as settled.
        failure.add_note(f"callgate: settling {operation_id} (no drive holds it) failed")
        raise failure
    return runner._result(await runner._load(operation_id))


async def undecided(runner: Runner, snap: OperationSnapshot) -> tuple[str, ...]:
    """The approvals requested at the pause that are still pending in the store."""
    requested = snap.approvals.values() if snap.pending is None else snap.pending
    store = runner._need_store()
    pending = []
    for approval_id in requested:
        row = await store.get_approval(approval_id)
        if row is not None and row.status is ApprovalStatus.PENDING:
            pending.append(approval_id)
    return tuple(pending)


async def release(
    runner: Runner,
    operation_id: str,
    token: int,
    exc: BaseException,
    *,
    stop: StopInfo | None = None,
    marks: DriveMarks | None = None,
) -> Exception | None:
    # Returns the store's own failure when the release failed (noted on ``exc`` too).
    # Only the owner changes: the snapshot stays the one last persisted (the pause, or
    # the operation as created). The failed drive's in-memory snapshot may stop
    # mid-step — state advanced past the pause, approvals cleared, results bound but
    # never sent — and persisting it could lose the pause or skip work. Replaying from
    # the last persisted point is safe: consumed approvals still count (``_decision``)
    # and the idempotency ledger answers calls that already ran. The cost: the failed
    # attempt's audit records stay in the sink, and the retry's records chain again
    # from the persisted head (a branch in the trail that shows both attempts).
    # With ``stop`` the persisted snapshot ends there instead, when replaying from it
    # would ask the model again (a start's operation as created, or the pause of a
    # resume whose drive already sent a model request): the model may word a call that
    # already ran differently, under a new idempotency key, and repeat its effect.
    store = runner._need_store()
    deadline = anyio.current_time() + _RELEASE_TIMEOUT
    with anyio.CancelScope(shield=True, deadline=deadline):
        try:
            record = await store.get_operation(operation_id)
            if record is None or record.owner is None or record.fencing_token != token:
                return None  # released by the drive itself, or taken over: not ours now
            changes: dict[str, Any] = {"owner": None, "updated_at": runner._clock()}
            if stop is not None:
                snap = decode_snapshot(record.snapshot, operation_id)
                position = await record_end(runner, snap, stop, marks)
                changes.update(restated(snap, stop.state, position, stop=stop))
            await store.save_operation(
                msgspec.structs.replace(record, **changes),
                expected_version=record.version,
                fencing_token=token,
            )
            return None
        except StaleWriteError:
            return None  # another worker took the operation over meanwhile
        except Exception as err:  # the original failure must still reach the caller
            exc.add_note(
                f"callgate: releasing the claim on {operation_id} failed too "
                f"({type(err).__name__}); it stays claimed until claim_stale_after"
            )
            return err
    exc.add_note(
        f"callgate: releasing the claim on {operation_id} timed out; it stays "
        "claimed until claim_stale_after"
    )
    return StoreUnavailable(f"releasing the claim on {operation_id} timed out")


async def record_end(
    runner: Runner, snap: OperationSnapshot, stop: StopInfo, marks: DriveMarks | None
) -> tuple[int, str] | None:
    """Chain a failed drive's end (its move to ``stop.state``) into the audit trail
    after the records that drive wrote, so the trail itself shows how the operation
    ended. Returns where the chain then stands, for the snapshot (None: as persisted).
    A sink that fails or stalls here costs only this record: the snapshot's stop still
    says why, and the head stays the last record written. Without ``marks`` (settling
    a dead worker's operation) nothing is appended: that worker may have written
    records past the persisted head, and a record chained to the head would fork the
    trail."""
    if marks is None:
        return None
    position = marks.audit
    if runner._audit is None:
        return position
    seq, head = position or (snap.audit_seq, snap.audit_head)
    old = marks.state or snap.state  # the last state the trail recorded
    if old in TERMINAL:
        # The drive ended (its record is written) and persisting that failed: there
        # is no move out of a terminal state to record; the snapshot's stop says it.
        return position
    chain = AuditChain(secret=runner._audit_secret, start_seq=seq, prev_digest=head)
    rec = chain.append(
        "state",
        ts=runner._clock(),
        operation_id=snap.operation_id,
        call_id=None,
        tool=None,
        data={
            "from": old.value,
            "to": stop.state.value,
            "input": stop.input.value,
            "reason": stop.reason,
        },
    )
    with anyio.move_on_after(_RELEASE_TIMEOUT / 2):
        try:
            await runner._audit(rec)
        except Exception:
            return position
        return (chain.next_seq, chain.head)
    return position


async def mark_past_pause(runner: Runner, operation_id: str, token: int, marks: DriveMarks) -> None:
    """Persist that a resumed drive is about to ask the model again: the row leaves
    ``waiting_approval`` (as ``model_requested``, the snapshot otherwise the pause as
    persisted), so no later resume can replay the pause once this request has left,
    even if this worker dies without a word (``settle_stuck`` ends it escalated).
    A claim taken over meanwhile fails here, before the request."""
    store = runner._need_store()
    record = await store.get_operation(operation_id)
    if record is None:
        raise StoreError(f"no operation {operation_id}")
    snap = decode_snapshot(record.snapshot, operation_id)
    changes = restated(snap, OpState.MODEL_REQUESTED, marks.audit)
    await store.save_operation(
        msgspec.structs.replace(record, **changes, updated_at=runner._clock()),
        expected_version=record.version,
        fencing_token=token,
    )


def restated(
    snap: OperationSnapshot,
    state: OpState,
    audit: tuple[int, str] | None,
    *,
    stop: StopInfo | None = None,
) -> dict[str, Any]:
    """The row's persisted snapshot ``snap`` (the pause, or the operation as created:
    never a failed drive's mid-step one) moved to ``state``, stopped with ``stop`` if
    given, with the audit position ``audit`` of the records the drive wrote (where a
    verifier must find the trail's end): the changes for ``save_operation``."""
    snap.state = state
    if stop is not None:
        snap.stop = stop
    if audit is not None:
        snap.audit_seq, snap.audit_head = audit
    return {"state": state.value, "snapshot": msgspec.json.encode(snap)}


def drive_failed(what: str) -> StopInfo:
    return StopInfo(
        state=OpState.ESCALATED,
        input=OpInput.DRIVE_FAILED,
        provider_reason=None,
        reason=(
            f"no verdict: {what}; calls that ran are in the idempotency ledger and the audit trail"
        ),
    )
