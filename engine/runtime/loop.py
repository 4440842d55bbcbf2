"""The run loop: one tool-calling operation from the first model request to an explicit
terminal state, with approval pauses persisted in the store (no coroutine waits on a
human) and resumable by any worker.

Per model turn: request → classified outcome → validation (in the order of
``core.validation``) → approval pause, or bounded dispatch → binding and verification of
every result → the provider's result shape → next request. Every phase change goes
through the transition table (``core.states``); every terminal state carries the
provider's raw reason and callgate's own. Exhausting a budget ends in ESCALATED with the
partial results kept, never with an exception.
"""

from __future__ import annotations

import contextlib
import secrets
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import httpx
import msgspec

from callgate.engine.core.adapter import EncodeSide, load_adapter
from callgate.engine.core.audit import AuditChain, AuditRecord
from callgate.engine.core.errors import ConfigError, StoreError
from callgate.engine.core.guards import Budgets, BudgetTracker
from callgate.engine.core.ids import new_operation_id
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits
from callgate.engine.core.registry import Registry
from callgate.engine.core.states import (
    TERMINAL,
    OpInput,
    OpState,
)
from callgate.engine.core.validation import (
    ApprovalDecision,
)
from callgate.engine.store.base import ApprovalStatus, OperationRecord, Store
from callgate.engine.store.errors import ApprovalExpired

from .operation import SNAPSHOT_DECODER, CallSummary, OperationResult, OperationSnapshot
from .progress import (
    OperationEnded,
    ProgressEvent,
)
from .steps import OperationDrive
from .transport import ProviderEndpoint, RetryPolicy, TransportTimeouts

AuditWriter = Callable[[AuditRecord], Awaitable[None]]


__all__ = ["CallSummary", "OperationResult", "Runner"]


class Runner:
    """Drives operations for one provider/model/registry. Reusable and concurrency-safe
    across operations; each ``start``/``resume`` call drives one operation."""

    def __init__(
        self,
        *,
        provider: str,
        model: str,
        registry: Registry,
        endpoint: ProviderEndpoint | None = None,
        client: httpx.AsyncClient | None = None,
        store: Store | None = None,
        budgets: Budgets | None = None,
        limits: Limits = DEFAULT_LIMITS,
        retry: RetryPolicy | None = None,
        timeouts: TransportTimeouts | None = None,
        system: str | None = None,
        max_tokens: int | None = None,
        binding_secret: bytes | None = None,
        audit: AuditWriter | None = None,
        progress: Callable[[ProgressEvent], Awaitable[None]] | None = None,
        worker_id: str | None = None,
        approval_ttl: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        adapter = load_adapter(provider)
        if not isinstance(adapter, EncodeSide):
            raise ConfigError(f"adapter {provider!r} has no encode side")
        self.provider = provider
        self.model = model
        self.registry = registry
        self._adapter: Any = adapter
        self._endpoint = endpoint or ProviderEndpoint.from_env(provider)
        self._client = client
        self.store = store
        self.budgets = budgets or Budgets()
        self._limits = limits
        self._retry = retry
        self._timeouts = timeouts
        self._system = system
        self._max_tokens = max_tokens
        self._secret = binding_secret
        self._audit = audit
        self._progress = progress
        self.worker_id = worker_id or "w_" + secrets.token_hex(6)
        self._approval_ttl = approval_ttl
        self._clock = clock
        # Per-tool concurrency limits hold across every operation this runner drives.
        self._tool_limiters: dict[str, anyio.CapacityLimiter] = {}
        # Loading the CA bundle takes tens of ms: done once per runner, not per drive.
        self._tls: ssl.SSLContext | None = None

    # --- public entry points -------------------------------------------------------------

    async def start(
        self,
        prompt: str,
        *,
        tenant: str = "default",
        subject: str = "anonymous",
        roles: Sequence[str] = (),
        operation_id: str | None = None,
    ) -> OperationResult:
        """Begin an operation and drive it until it ends or waits for a human."""
        now = self._clock()
        snap = OperationSnapshot(
            operation_id=operation_id or new_operation_id(),
            tenant=tenant,
            subject=subject,
            roles=sorted(roles),
            provider=self.provider,
            model=self.model,
            state=OpState.MODEL_REQUESTED,
            messages=list(self._adapter.initial_messages(prompt)),
            tracker=BudgetTracker(self.budgets, now=now).snapshot(now),
        )
        lease: tuple[int, int] | None = None
        if self.store is not None:
            record = await self.store.create_operation(
                OperationRecord(
                    operation_id=snap.operation_id,
                    tenant=tenant,
                    subject=subject,
                    state=snap.state.value,
                    snapshot=msgspec.json.encode(snap),
                    created_at=now,
                    updated_at=now,
                    owner=self.worker_id,
                    fencing_token=1,
                )
            )
            lease = (record.version, record.fencing_token)
        return await self._drive(snap, lease)

    async def resume(self, operation_id: str) -> OperationResult:
        """Continue an operation paused for approval, from any worker and process. Exactly
        one concurrent caller wins the claim; the others get the state as it stands."""
        store = self._need_store()
        now = self._clock()
        token = await store.claim_operation(
            operation_id, self.worker_id, now=now, from_states=[OpState.WAITING_APPROVAL.value]
        )
        record = await store.get_operation(operation_id)
        if record is None:
            raise StoreError(f"no operation {operation_id}")
        snap = SNAPSHOT_DECODER.decode(record.snapshot)
        if token is None or record.owner != self.worker_id:
            return self._result(snap)  # not claimable (another worker, or not paused)
        lease = (record.version, token)
        decisions = await self._collect_decisions(snap, store, now)
        if decisions is None:  # someone has not decided yet: stay paused, release
            await self._persist(snap, lease, release=True)
            return self._result(snap)
        return await self._drive(snap, lease, decisions=decisions)

    # --- the loop ------------------------------------------------------------------------

    async def _drive(
        self,
        snap: OperationSnapshot,
        lease: tuple[int, int] | None,
        *,
        decisions: dict[str, ApprovalDecision] | None = None,
    ) -> OperationResult:
        now = self._clock()
        tracker = BudgetTracker.restore(self.budgets, snap.tracker, now=now)
        audit = AuditChain(start_seq=snap.audit_seq, prev_digest=snap.audit_head)
        async with contextlib.AsyncExitStack() as stack:
            run = OperationDrive(self, snap, tracker, audit, stack)
            if decisions is not None:
                await run.to(OpInput.RESUMED)
                await run.validate(decisions)
            while snap.state not in TERMINAL and snap.state is not OpState.WAITING_APPROVAL:
                if snap.state is OpState.MODEL_REQUESTED:
                    await run.model_turn()
                elif snap.state is OpState.VALIDATING:
                    await run.validate(None)
                else:  # pragma: no cover - every other state is handled inside the steps
                    raise ConfigError(f"run loop reached {snap.state} outside a step")
        if snap.state is OpState.WAITING_APPROVAL:
            await run.request_approvals()
        snap.tracker = tracker.snapshot(self._clock())
        snap.audit_seq, snap.audit_head = audit.next_seq, audit.head
        if lease is not None:
            await self._persist(snap, lease, release=True)
        if snap.state in TERMINAL and self._progress is not None and snap.stop is not None:
            await self._progress(
                OperationEnded(
                    operation_id=snap.operation_id,
                    state=snap.state.value,
                    raw_reason=snap.stop.provider_reason,
                    stop_reason=snap.stop.reason,
                )
            )
        return self._result(snap)

    async def _collect_decisions(
        self, snap: OperationSnapshot, store: Store, now: float
    ) -> dict[str, ApprovalDecision] | None:
        """The human decisions for the paused turn, consuming each approval once. None if
        some approval is still pending and unexpired."""
        out: dict[str, ApprovalDecision] = {}
        for call_id, approval_id in snap.approvals.items():
            record = await store.get_approval(approval_id)
            if record is None:
                raise StoreError(f"approval {approval_id} vanished")
            expired = False
            approved = False
            if record.status is ApprovalStatus.APPROVED:
                try:
                    record = await store.consume_approval(approval_id, now=now)
                    approved = True
                except ApprovalExpired:  # approved too late; other store errors propagate
                    expired = True
            elif record.status is ApprovalStatus.PENDING:
                if now < record.expires_at:
                    return None
                # Nobody decided in time: record the expiry in the store (consuming an
                # expired approval marks it expired and refuses), so it is never approvable.
                with contextlib.suppress(ApprovalExpired):
                    await store.consume_approval(approval_id, now=now)
                expired = True
            elif record.status in (ApprovalStatus.EXPIRED,):
                expired = True
            spec = self.registry.get(record.tool)
            if approved and (spec is None or spec.schema_version != record.schema_version):
                # The person approved a call under another tool contract: that approval
                # does not carry over (revalidation then answers denied or unknown_tool).
                approved = False
            out[call_id] = ApprovalDecision(
                approval_id=approval_id,
                call_id=call_id,
                args_digest=record.args_digest,
                approved=approved,
                expired=expired,
            )
        return out

    async def _persist(
        self, snap: OperationSnapshot, lease: tuple[int, int], *, release: bool
    ) -> None:
        store = self._need_store()
        version, token = lease
        record = await store.get_operation(snap.operation_id)
        if record is None:
            raise StoreError(f"no operation {snap.operation_id}")
        await store.save_operation(
            msgspec.structs.replace(
                record,
                state=snap.state.value,
                snapshot=msgspec.json.encode(snap),
                owner=None if release else self.worker_id,
                updated_at=self._clock(),
            ),
            expected_version=record.version if record.fencing_token == token else version,
            fencing_token=token,
        )

    def _need_store(self) -> Store:
        if self.store is None:
            raise ConfigError("this needs a store (approvals and resume are persisted)")
        return self.store

    @staticmethod
    def _result(snap: OperationSnapshot) -> OperationResult:
        pending = tuple(snap.approvals.values()) if snap.state is OpState.WAITING_APPROVAL else ()
        return OperationResult(
            operation_id=snap.operation_id,
            state=snap.state,
            stop=snap.stop,
            text=snap.text,
            calls=tuple(snap.calls),
            pending_approvals=pending,
        )
