"""The durable records of an operation: the snapshot persisted at every pause (everything
a fresh process needs to continue), and what the host gets back (``OperationResult``,
``CallSummary``), and what one drive has done that its failure must account for
(``DriveMarks``). Values only; no I/O."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from callgate.engine.core.audit import GENESIS
from callgate.engine.core.errors import ConfigError, StoreError
from callgate.engine.core.guards import Budgets
from callgate.engine.core.outcome import TurnOutcome
from callgate.engine.core.states import (
    TERMINAL,
    OpState,
    StopInfo,
)

__all__ = [
    "SNAPSHOT_DECODER",
    "CallSummary",
    "DriveMarks",
    "OperationResult",
    "OperationSnapshot",
    "RunSettings",
    "decode_snapshot",
    "unresolved_unknowns",
]


class CallSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One answered call of the operation: the ids that identify it and how it ended."""

    turn: int
    response_id: str | None
    call_id: str
    tool: str
    status: str
    idempotency_key: str | None = None
    approval_id: str | None = None
    binding_sha256: str | None = None


class RunSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The host's settings an operation started under, kept with it: whichever worker
    resumes it (``callgate operations resume`` included, which knows none of them) asks
    the model with the same instructions and stops at the same budgets."""

    budgets: Budgets
    system: str | None = None
    max_tokens: int | None = None
    approval_ttl: float | None = None  # None only in snapshots written before it was kept


class OperationSnapshot(msgspec.Struct, kw_only=True):
    """Everything needed to continue the operation in another process. ``settings`` is
    None only in a snapshot written before it was kept (the resuming runner's own apply)."""

    operation_id: str
    tenant: str
    subject: str
    roles: list[str]
    provider: str
    model: str
    state: OpState
    messages: list[dict[str, Any]]
    outcome: TurnOutcome | None = None
    tracker: dict[str, Any] = {}
    approvals: dict[str, str] = {}  # call id -> approval id, for the paused turn
    calls: list[CallSummary] = []
    text: str = ""
    stop: StopInfo | None = None
    audit_seq: int = 0
    audit_head: str = GENESIS
    settings: RunSettings | None = None
    # The approval ids requested at the latest pause (None in older snapshots): what a
    # person must decide, not the spent or decided ones ``approvals`` still maps.
    pending: list[str] | None = None


class OperationResult(msgspec.Struct, frozen=True, kw_only=True):
    """Where an operation stands when control returns to the host: a terminal state, or
    WAITING_APPROVAL with the approval ids a human must decide, or (``busy``) a state
    another drive is moving it through.

    ``busy`` is set by a ``resume`` that found the operation held by another live drive
    (two workers resuming it at once, or a resume while one is still running): this call
    did nothing, ``state`` is where that drive last persisted it (WAITING_APPROVAL while
    it acts on the decisions, or a state it only passes through) and
    ``pending_approvals`` lists only approvals nobody has decided yet (none once that
    drive is past the pause). Resume again, or read the operation, once it is done."""

    operation_id: str
    state: OpState
    stop: StopInfo | None
    text: str
    calls: tuple[CallSummary, ...]
    pending_approvals: tuple[str, ...] = ()
    busy: bool = False

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


SNAPSHOT_DECODER = msgspec.json.Decoder(OperationSnapshot)


def decode_snapshot(data: bytes, operation_id: str) -> OperationSnapshot:
    """The snapshot stored for ``operation_id``; one that does not decode (edited by hand,
    written by another tool or version) is a ``StoreError``, never a bare decode error.
    Its message names the kind of failure and the place only: msgspec's text may quote
    the stored value (arguments, results) before the place."""
    try:
        return SNAPSHOT_DECODER.decode(data)
    except RecursionError:  # nesting past msgspec's own guard
        raise StoreError(
            f"operation {operation_id}: its stored snapshot nests too deeply to read; "
            "nothing was resumed"
        ) from None
    except ConfigError as exc:  # a stored value its type refuses (Budgets' own checks)
        raise StoreError(
            f"operation {operation_id}: its stored snapshot holds a refused value ({exc}); "
            "nothing was resumed"
        ) from None
    except msgspec.DecodeError as exc:  # (ValidationError included)
        kind = "not valid JSON" if type(exc) is msgspec.DecodeError else "of another shape"
        _, sep, path = str(exc).rpartition(" - at ")
        where = f" at {path[:200]!r}" if sep else ""
        raise StoreError(
            f"operation {operation_id}: its stored snapshot is {kind}{where}; nothing was resumed"
        ) from None


class DriveMarks:
    """What one drive (one ``start`` or ``resume`` call) has done that the last persisted
    snapshot does not show. One per drive, never per ``Runner``: a runner drives many
    operations at once.

    ``asked_model`` is set just before the drive sends a model request. From then on,
    replaying the drive from its last persisted point would ask the model again, and the
    model may word a call that already ran differently (a new idempotency key: its side
    effect would run twice); so a failure or a cancellation after it ends the operation
    ``escalated``. A worker that dies cannot do that, so a resumed drive first makes the
    mark durable: ``before_first_ask`` (set by the runner for a resume) persists it
    before the first request leaves."""

    __slots__ = ("asked_model", "audit", "before_first_ask", "state")

    def __init__(self) -> None:
        self.asked_model = False
        self.before_first_ask: Callable[[], Awaitable[None]] | None = None
        # Where the drive's audit chain stands (seq, head): an operation its failure ends
        # keeps the head of the records the drive wrote, so ``--expected-head`` verifies,
        # and the trail's record of that end chains on from it.
        self.audit: tuple[int, str] | None = None
        # The state the drive last moved the operation to (what its failure ends).
        self.state: OpState | None = None

    async def asking(self) -> None:
        """Called just before every model request of the drive."""
        if not self.asked_model and self.before_first_ask is not None:
            await self.before_first_ask()
        self.asked_model = True


# Statuses of a later call under the same idempotency key that settle an unknown outcome:
# the ledger holds an answer for the key (a reconciliation found the effect, or a replay).
_SETTLES = frozenset({"ok", "replayed", "result_too_large", "handler_error"})


def unresolved_unknowns(calls: list[CallSummary]) -> list[CallSummary]:
    """The side-effect calls whose outcome is still unknown: answered ``outcome_unknown``
    and not settled by a later call under the same idempotency key. An operation must not
    end ``completed`` while any is left (the model's answer would be a guess about them)."""
    open_calls: dict[str | None, CallSummary] = {}
    for call in calls:
        if call.status == "outcome_unknown":
            open_calls[call.idempotency_key or f"call:{call.call_id}"] = call
        elif call.idempotency_key in open_calls and call.status in _SETTLES:
            del open_calls[call.idempotency_key]
    return list(open_calls.values())
