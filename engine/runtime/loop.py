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

from callgate.engine.core.adapter import EncodeSide, ModelResult, load_adapter
from callgate.engine.core.audit import GENESIS, AuditChain, AuditRecord
from callgate.engine.core.binding import (
    BindingContext,
    BoundResult,
    TrustedCall,
    bind,
    to_model_result,
)
from callgate.engine.core.canonical import canonical_json, sha256_hex
from callgate.engine.core.correlation import verify_result_set
from callgate.engine.core.envelope import ErrorCode
from callgate.engine.core.errors import BindingError, ConfigError, StoreError
from callgate.engine.core.events import CallStarted, EngineEvent, TextDelta
from callgate.engine.core.guards import Budgets, BudgetTracker, ExhaustedBudget
from callgate.engine.core.ids import new_approval_id, new_operation_id
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits
from callgate.engine.core.outcome import ProposedCall, TurnOutcome
from callgate.engine.core.registry import AuthContext, Registry
from callgate.engine.core.states import (
    TERMINAL,
    OpInput,
    OpState,
    StopInfo,
    input_for_outcome,
    transition,
)
from callgate.engine.core.validation import (
    ApprovalDecision,
    Executable,
    NeedsApproval,
    Rejected,
    Verdict,
    turn_input,
    validate_turn,
)
from callgate.engine.store.base import ApprovalRecord, ApprovalStatus, OperationRecord, Store
from callgate.engine.store.errors import ApprovalExpired

from .dispatch import CallResult, DispatchContext, execute_calls
from .progress import (
    ApprovalRequested,
    CallPreparing,
    CallRejected,
    OperationEnded,
    ProgressEvent,
    StateChanged,
    TextChunk,
)
from .transport import ProviderEndpoint, RetryPolicy, TransportTimeouts, stream_turn

__all__ = ["CallSummary", "OperationResult", "Runner"]

AuditWriter = Callable[[AuditRecord], Awaitable[None]]


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


class _Snapshot(msgspec.Struct, kw_only=True):
    """Everything needed to continue the operation in another process."""

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


class OperationResult(msgspec.Struct, frozen=True, kw_only=True):
    """Where an operation stands when control returns to the host: a terminal state, or
    WAITING_APPROVAL with the approval ids a human must decide."""

    operation_id: str
    state: OpState
    stop: StopInfo | None
    text: str
    calls: tuple[CallSummary, ...]
    pending_approvals: tuple[str, ...] = ()

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


_SNAPSHOT_DECODER = msgspec.json.Decoder(_Snapshot)


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
        snap = _Snapshot(
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
        snap = _SNAPSHOT_DECODER.decode(record.snapshot)
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
        snap: _Snapshot,
        lease: tuple[int, int] | None,
        *,
        decisions: dict[str, ApprovalDecision] | None = None,
    ) -> OperationResult:
        now = self._clock()
        tracker = BudgetTracker.restore(self.budgets, snap.tracker, now=now)
        audit = AuditChain(start_seq=snap.audit_seq, prev_digest=snap.audit_head)
        async with contextlib.AsyncExitStack() as stack:
            run = _Run(self, snap, tracker, audit, stack)
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
        self, snap: _Snapshot, store: Store, now: float
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
                expired = True
            elif record.status in (ApprovalStatus.EXPIRED,):
                expired = True
            out[call_id] = ApprovalDecision(
                approval_id=approval_id,
                call_id=call_id,
                args_digest=record.args_digest,
                approved=approved,
                expired=expired,
            )
        return out

    async def _persist(self, snap: _Snapshot, lease: tuple[int, int], *, release: bool) -> None:
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
    def _result(snap: _Snapshot) -> OperationResult:
        pending = tuple(snap.approvals.values()) if snap.state is OpState.WAITING_APPROVAL else ()
        return OperationResult(
            operation_id=snap.operation_id,
            state=snap.state,
            stop=snap.stop,
            text=snap.text,
            calls=tuple(snap.calls),
            pending_approvals=pending,
        )


class _Run:
    """One drive of one operation (between two pauses). Not shared across tasks."""

    def __init__(
        self,
        runner: Runner,
        snap: _Snapshot,
        tracker: BudgetTracker,
        audit: AuditChain,
        stack: contextlib.AsyncExitStack,
    ) -> None:
        self.r = runner
        # The host's client, or one opened on first use and closed with ``stack``: one per
        # drive (a client is bound to its event loop), never one per turn.
        self.client = runner._client
        self.stack = stack
        self.snap = snap
        self.tracker = tracker
        self.audit = audit
        self.auth = AuthContext(
            tenant=snap.tenant,
            subject=snap.subject,
            operation_id=snap.operation_id,
            roles=frozenset(snap.roles),
        )
        self.pending: list[NeedsApproval] = []

    # --- bookkeeping ---------------------------------------------------------------------

    async def emit(self, event: ProgressEvent) -> None:
        if self.r._progress is not None:
            await self.r._progress(event)

    async def record(
        self,
        kind: str,
        *,
        call: ProposedCall | None = None,
        tool: str | None = None,
        data: dict[str, Any] | None = None,
        redact: Sequence[str] = (),
    ) -> None:
        rec = self.audit.append(
            kind,
            ts=self.r._clock(),
            operation_id=self.snap.operation_id,
            call_id=call.call_id if call else None,
            tool=tool or (call.name if call else None),
            data=data or {},
            redact_paths=redact,
        )
        if self.r._audit is not None:
            await self.r._audit(rec)

    async def to(self, event: OpInput) -> None:
        old = self.snap.state
        self.snap.state = transition(old, event)
        await self.record(
            "state", data={"from": old.value, "to": self.snap.state.value, "input": event.value}
        )
        await self.emit(
            StateChanged(
                operation_id=self.snap.operation_id,
                old=old.value,
                new=self.snap.state.value,
                input=event.value,
            )
        )

    async def stop(self, event: OpInput, reason: str, provider_reason: str | None = None) -> None:
        await self.to(event)
        self.snap.stop = StopInfo(
            state=self.snap.state, input=event, provider_reason=provider_reason, reason=reason
        )

    async def exhausted(self, spent: ExhaustedBudget) -> None:
        raw = self.snap.outcome.raw_reason if self.snap.outcome else None
        await self.stop(spent.input, spent.reason, raw)

    # --- steps ---------------------------------------------------------------------------

    async def model_turn(self) -> None:
        r, snap = self.r, self.snap
        now = r._clock()
        spent = self.tracker.check_before_model_turn(now)
        if spent is not None:
            await self.exhausted(spent)
            return
        spec = r._adapter.build_request(
            model=r.model,
            messages=snap.messages,
            tools=r.registry.declarations(),
            system=r._system,
            max_tokens=r._max_tokens,
            previous=snap.outcome,
        )

        async def on_event(event: EngineEvent) -> None:
            if isinstance(event, CallStarted):
                await self.emit(
                    CallPreparing(
                        operation_id=snap.operation_id, name=event.name, call_id=event.call_id
                    )
                )
            elif isinstance(event, TextDelta):
                await self.emit(TextChunk(operation_id=snap.operation_id, text=event.text))

        deadline = anyio.current_time() + self.tracker.remaining_seconds(now)
        if self.client is None:
            if r._tls is None:
                r._tls = httpx.create_ssl_context()
            client = httpx.AsyncClient(verify=r._tls)
            self.client = await self.stack.enter_async_context(client)
        attempt = await stream_turn(
            self.client,
            r._adapter,
            spec,
            r._endpoint,
            limits=r._limits,
            retry=r._retry,
            timeouts=r._timeouts,
            on_event=on_event,
            deadline=deadline,
        )
        outcome = attempt.outcome
        snap.outcome = outcome
        overrun = self.tracker.record_turn(outcome.usage, outcome.model or r.model)
        event = input_for_outcome(outcome)
        if event is OpInput.TRANSIENT_FAILURE:
            # The transport already retried within its policy: what reaches us is final.
            event = OpInput.API_FAILURE
        if (
            not outcome.complete
            and event is not OpInput.PAUSED
            and anyio.current_time() >= deadline
        ):
            # The turn was cut because the operation ran out of time (the transport stops
            # at this same deadline): that is the deadline's doing, not the provider's.
            snap.text = outcome.text or outcome.refusal or snap.text
            await self.exhausted(
                ExhaustedBudget(
                    budget="deadline_seconds",
                    limit=str(r.budgets.deadline_seconds),
                    used=f"{self.tracker.elapsed(r._clock()):.3f}",
                    input=OpInput.DEADLINE,
                )
            )
            return
        if event is OpInput.PAUSED:
            snap.messages.extend(r._adapter.assistant_echo(outcome))
            await self.to(event)
        elif event is OpInput.TOOL_PROPOSALS:
            snap.messages.extend(r._adapter.assistant_echo(outcome))
            snap.text = outcome.text or snap.text
            await self.to(event)
        else:
            snap.text = outcome.text or outcome.refusal or snap.text
            await self.stop(event, outcome.stop_reason, outcome.raw_reason)
            return
        if overrun is not None and snap.state is not OpState.VALIDATING:
            await self.exhausted(overrun)

    async def validate(self, decisions: dict[str, ApprovalDecision] | None) -> None:
        snap = self.snap
        outcome = snap.outcome
        assert outcome is not None
        if decisions is None:
            for call in outcome.calls:
                await self.record(
                    "requested",
                    call=call,
                    data={
                        "arguments": call.arguments,
                        "raw_sha256": sha256_hex(call.raw_arguments),
                    },
                    redact=self._sensitive(call.name, "arguments"),
                )
        verdicts = validate_turn(
            outcome.calls, self.r.registry, self.auth, self.tracker, approvals=decisions
        )
        for v in verdicts:
            status = "rejected" if isinstance(v, Rejected) else type(v).__name__.lower()
            data: dict[str, Any] = {"verdict": status}
            if isinstance(v, Rejected):
                data.update(code=v.envelope.code.value, reason=v.reason)
            await self.record("validated", call=v.call, data=data)
        progress = self.tracker.check_progress()
        if progress is not None:
            await self.stop(progress.input, progress.reason, outcome.raw_reason)
            return
        step = turn_input(verdicts)
        if step is OpInput.APPROVAL_NEEDED:
            self.pending = [v for v in verdicts if isinstance(v, NeedsApproval)]
            await self.to(step)
            return
        await self.execute(verdicts, step, decisions)

    async def execute(
        self, verdicts: list[Verdict], step: OpInput, decisions: dict[str, ApprovalDecision] | None
    ) -> None:
        r, snap = self.r, self.snap
        outcome = snap.outcome
        assert outcome is not None
        await self.to(step)
        executables = [v for v in verdicts if isinstance(v, Executable)]
        results: dict[str, CallResult] = {}
        if executables:
            ctx = DispatchContext(
                auth=self.auth,
                store=r.store,
                worker_id=r.worker_id,
                max_parallelism=r.budgets.max_parallelism,
                max_result_bytes=r.budgets.max_result_bytes,
                clock=r._clock,
                progress=r._progress,
                provider=r.provider,
                model=r.model,
                tool_limiters=r._tool_limiters,
            )
            remaining = self.tracker.remaining_seconds(r._clock())
            for res in await execute_calls(executables, ctx, remaining_seconds=remaining):
                results[res.call.call_id] = res
                if res.status != ErrorCode.OUTCOME_UNKNOWN.value:
                    # An unknown outcome carries no information and must stay retryable:
                    # the model's retry (same intent, new call id) is the recovery path,
                    # reconciled by idempotency key, so it is no duplicate.
                    self.tracker.record_result(
                        res.tool, res.args_digest, sha256_hex(canonical_json(res.model_result))
                    )
                await self.record(
                    "executed",
                    call=res.call,
                    data={
                        "status": res.status,
                        "duration_ms": round(res.duration_ms, 3),
                        "ran": res.ran,
                        "idempotency_key": res.idempotency_key,
                        "detail": res.detail,
                        "result": res.model_result,
                    },
                    redact=self._sensitive(res.tool, "result"),
                )
            if any(res.unresolved for res in results.values()):
                # A side effect may have happened and reconciliation could not settle it:
                # keep every result in the audit and stop for a human, sending nothing.
                if await self.bind(verdicts, results, decisions) is not None:
                    await self.stop(
                        OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE,
                        "a side effect's outcome is unknown and reconciliation found no record",
                        outcome.raw_reason,
                    )
                return
            await self.to(OpInput.RESULTS_DONE)
        verified = await self.bind(verdicts, results, decisions)
        if verified is None:
            return
        snap.messages.extend(r._adapter.encode_results(outcome, verified))
        await self.to(OpInput.RESULTS_SENT)

    async def bind(
        self,
        verdicts: list[Verdict],
        results: dict[str, CallResult],
        decisions: dict[str, ApprovalDecision] | None,
    ) -> list[ModelResult] | None:
        """Bind every result to its call, verify the set against callgate's own records and
        return the wire projections in proposal order (None: the operation FAILED)."""
        r, snap = self.r, self.snap
        outcome = snap.outcome
        assert outcome is not None
        trusted: list[TrustedCall] = []
        bound: list[BoundResult] = []
        summaries: list[CallSummary] = []
        # A repeated call id cannot carry a result of its own: providers key results by
        # call id (and verify_result_set refuses two results for one key), so the first
        # occurrence's result answers it. The repeat is audited and summarised, not sent.
        repeats: list[tuple[int, CallSummary]] = []
        for position, v in enumerate(verdicts):
            call = v.call
            spec = v.spec
            if isinstance(v, Rejected) and v.envelope.code is ErrorCode.DUPLICATE_CALL:
                code = ErrorCode.DUPLICATE_CALL.value
                await self.emit(
                    CallRejected(
                        operation_id=snap.operation_id,
                        call_id=call.call_id,
                        name=call.name,
                        code=code,
                    )
                )
                summary = CallSummary(
                    turn=self.tracker.turns,
                    response_id=outcome.response_id,
                    call_id=call.call_id,
                    tool=call.name,
                    status=code,
                )
                repeats.append((position, summary))
                continue
            key = results[call.call_id].idempotency_key if call.call_id in results else None
            ctx = BindingContext(
                provider=r.provider,
                api_family=r._adapter.family,
                response_id=outcome.response_id,
                call_id=call.call_id,
                operation_id=snap.operation_id,
                idempotency_key=key or "",
                adapter_revision=r._adapter.revision,
                tenant_ref=snap.tenant,
                subject_ref=snap.subject,
                input_revision=spec.revisions.input if spec else None,
                output_revision=spec.revisions.output if spec else None,
                effect_revision=spec.revisions.effect if spec else None,
                handler_revision=spec.revisions.handler if spec else None,
                producer_revision=spec.revisions.producer if spec else None,
                policy_revision=spec.revisions.policy if spec else None,
            )
            args = _bindable_arguments(call)
            if isinstance(v, Rejected):
                model_result, is_error, status = (
                    v.envelope.to_model_result(),
                    True,
                    v.envelope.code.value,
                )
                await self.emit(
                    CallRejected(
                        operation_id=snap.operation_id,
                        call_id=call.call_id,
                        name=call.name,
                        code=status,
                    )
                )
            else:
                res = results[call.call_id]
                model_result, is_error, status = res.model_result, res.is_error, res.status
            trusted.append(TrustedCall.record(ctx, call.name, args))
            b = bind(ctx, call.name, args, model_result, is_error, r._secret)
            bound.append(b)
            approval_id = (
                decisions[call.call_id].approval_id
                if decisions and call.call_id in decisions
                else None
            )
            summaries.append(
                CallSummary(
                    turn=self.tracker.turns,
                    response_id=outcome.response_id,
                    call_id=call.call_id,
                    tool=call.name,
                    status=status,
                    idempotency_key=key,
                    approval_id=approval_id,
                    binding_sha256=b.protected_audit.binding_sha256,
                )
            )
        try:
            verified = verify_result_set(trusted, bound, r._secret)
        except BindingError as exc:
            await self.record("binding_failed", data={"reason": str(exc)})
            await self.stop(
                OpInput.BINDING_MISMATCH, f"result binding failed: {exc}", outcome.raw_reason
            )
            return None
        for b, s in zip(verified, summaries, strict=True):
            pa = b.protected_audit
            await self.record(
                "result",
                call=None,
                tool=s.tool,
                data={
                    "call_id": s.call_id,
                    "status": s.status,
                    "request_sha256": pa.request_sha256,
                    "result_sha256": pa.result_sha256,
                    "binding_sha256": pa.binding_sha256,
                },
            )
        for position, summary in repeats:  # ascending: each lands at its proposal position
            summaries.insert(position, summary)
        snap.calls.extend(summaries)
        snap.approvals = {}
        return [to_model_result(b) for b in verified]

    async def request_approvals(self) -> None:
        r, snap = self.r, self.snap
        store = r._need_store()
        now = r._clock()
        for v in self.pending:
            approval_id = new_approval_id()
            spec = v.spec
            await store.create_approval(
                ApprovalRecord(
                    approval_id=approval_id,
                    operation_id=snap.operation_id,
                    call_id=v.call.call_id,
                    tool=spec.name,
                    schema_version=spec.schema_version,
                    args_digest=v.args_digest,
                    policy_revision=spec.policy_revision,
                    tenant=snap.tenant,
                    subject=snap.subject,
                    created_at=now,
                    expires_at=now + r._approval_ttl,
                )
            )
            snap.approvals[v.call.call_id] = approval_id
            await self.record(
                "approval",
                call=v.call,
                data={
                    "approval_id": approval_id,
                    "requested": True,
                    "args_digest": v.args_digest,
                    "expires_at": now + r._approval_ttl,
                },
            )
            await self.emit(
                ApprovalRequested(
                    operation_id=snap.operation_id,
                    approval_id=approval_id,
                    call_id=v.call.call_id,
                    name=spec.name,
                    expires_at=now + r._approval_ttl,
                )
            )

    def _sensitive(self, tool: str, prefix: str) -> list[str]:
        spec = self.r.registry.get(tool)
        if spec is None:
            return []
        return [f"{prefix}.{p.removeprefix('$.')}" for p in spec.sensitive_paths]


def _bindable_arguments(call: ProposedCall) -> dict[str, Any]:
    """The arguments a result is bound to: the parsed object, or — for a call whose text
    was rejected or has no canonical form — the digest of its raw bytes."""
    if call.arguments is not None:
        try:
            canonical_json(call.arguments)
            return call.arguments
        except ConfigError:
            pass
    return {"raw_arguments_sha256": sha256_hex(call.raw_arguments)}
