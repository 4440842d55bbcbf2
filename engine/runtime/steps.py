"""The steps of one drive of an operation, between two pauses: a model turn, validation,
dispatch, binding and the approval request. ``Runner`` (in ``loop``) owns the lifecycle
and persistence; ``OperationDrive`` owns what happens inside one drive and changes state
only through the transition table."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import msgspec

from callgate.engine.core.audit import AuditChain, AuditRecord, Token
from callgate.engine.core.canonical import canonical_json, sha256_hex
from callgate.engine.core.envelope import ErrorCode
from callgate.engine.core.events import CallStarted, EngineEvent, TextDelta
from callgate.engine.core.guards import BudgetTracker, ExhaustedBudget, estimated_usage
from callgate.engine.core.ids import new_approval_id
from callgate.engine.core.outcome import OutcomeKind, ProposedCall, TurnOutcome
from callgate.engine.core.registry import AuthContext
from callgate.engine.core.states import (
    OpInput,
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
from callgate.engine.store.base import ApprovalRecord, Store
from callgate.engine.store.memory import MemoryStore

from .binding_step import bind_results, binding_context
from .call_records import (
    approvals_to_request,
    argument_value,
    audit_digests,
    bindable_arguments,
    decision_data,
    echoed_turn,
    invites_retry,
    lapsed_reason,
    model_response_data,
    requested_data,
    seal,
    sensitive_paths,
    trusted_key,
)
from .dispatch import CallResult, DispatchContext, execute_calls
from .operation import (
    DriveMarks,
    OperationSnapshot,
    RunSettings,
    unresolved_unknowns,
)
from .progress import (
    ApprovalRequested,
    CallPreparing,
    ProgressEvent,
    StateChanged,
    TextChunk,
    TurnRetried,
)
from .transport import stream_turn, tls_context

AuditWriter = Callable[[AuditRecord], Awaitable[None]]


if TYPE_CHECKING:
    from .loop import Runner

__all__ = ["OperationDrive"]


class OperationDrive:
    """One drive of one operation (between two pauses). Not shared across tasks."""

    def __init__(
        self,
        runner: Runner,
        snap: OperationSnapshot,
        tracker: BudgetTracker,
        audit: AuditChain,
        stack: contextlib.AsyncExitStack,
        *,
        settings: RunSettings,
        marks: DriveMarks,
    ) -> None:
        self.r = runner
        self.marks = marks
        # The host's client, or one opened on first use and closed with ``stack``: one per
        # drive (a client is bound to its event loop), never one per turn.
        self.client = runner._client
        self.stack = stack
        self.snap = snap
        self.settings = settings
        self.budgets = settings.budgets
        self.tracker = tracker
        self.audit = audit
        # One bound for the drive's handlers across its turns: a sync handler that ran
        # past its deadline still holds its slot while the next turn's calls start.
        self.parallel = anyio.CapacityLimiter(self.budgets.max_parallelism)
        self.auth = AuthContext(
            tenant=snap.tenant,
            subject=snap.subject,
            operation_id=snap.operation_id,
            roles=frozenset(snap.roles),
        )
        self.pending: list[NeedsApproval] = []
        # The idempotency ledger: the store's, or without one an in-process ledger for
        # this drive (a storeless operation lives in one drive: it cannot pause), so a
        # write the model proposes again under a new call id still runs once.
        self.ledger: Store = runner.store or MemoryStore()

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
        redact: Sequence[tuple[Token, ...]] = (),
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
        self.marks.audit = (self.audit.next_seq, self.audit.head)  # written, or no sink

    async def to(self, event: OpInput) -> None:
        old = self.snap.state
        self.snap.state = transition(old, event)
        await self.record(
            "state", data={"from": old.value, "to": self.snap.state.value, "input": event.value}
        )
        self.marks.state = self.snap.state  # (once the trail holds it)
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
            system=self.settings.system,
            max_tokens=self.settings.max_tokens,
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

        async def on_retry(attempt: int, reason: str) -> None:
            # The transport waits and asks again: the operation passes through RETRY.
            await self.to(OpInput.TRANSIENT_FAILURE)
            await self.emit(
                TurnRetried(operation_id=snap.operation_id, attempt=attempt, reason=reason)
            )
            await self.to(OpInput.RETRY_READY)

        deadline = anyio.current_time() + self.tracker.remaining_seconds(now)
        if self.client is None:
            client = httpx.AsyncClient(verify=await tls_context())
            self.client = await self.stack.enter_async_context(client)
        await self.marks.asking()  # from here on, a replay would ask the model again
        attempt = await stream_turn(
            self.client,
            r._adapter,
            spec,
            r._endpoint,
            limits=r._limits,
            retry=r._retry,
            timeouts=r._timeouts,
            on_event=on_event,
            on_retry=on_retry,
            deadline=deadline,
        )
        outcome = attempt.outcome
        snap.outcome = outcome
        # Retried attempts were billed too: their usage counts against the budgets.
        usage = reported = outcome.usage.plus(attempt.discarded_usage)
        if (usage.input_tokens is None or usage.output_tokens is None) and _generated(outcome):
            usage = estimated_usage(
                usage,
                request_bytes=len(msgspec.json.encode(spec.body)),
                output_bytes=_output_bytes(outcome),
            )
        overrun = self.tracker.record_turn(usage, outcome.model or r.model)
        data = model_response_data(r, spec, outcome, attempt.attempts, usage)
        if usage is not reported:
            data["usage_estimated"] = True
        await self.record("model_response", data=data)
        event = input_for_outcome(outcome)
        refusal_of_echo = None
        if event in (OpInput.TOOL_PROPOSALS, OpInput.PAUSED):
            # A call the provider would refuse to take back (a name no tool can have,
            # such as "multi_tool_use.parallel"): the next request would fail after the
            # turn's other calls ran, so the turn fails now, before any of them runs.
            refusal_of_echo = next(
                (why for c in outcome.calls if (why := r._adapter.unsendable(c)) is not None),
                None,
            )
            if refusal_of_echo is not None:
                event = OpInput.API_FAILURE
        if event is OpInput.TRANSIENT_FAILURE:
            # The transport already retried within its policy: what reaches us is final,
            # the retries exhausted (RETRY -> FAILED). With a side effect's outcome still
            # unknown it is a stop for a person instead (below, from MODEL_REQUESTED).
            if unresolved_unknowns(snap.calls) or attempt.attempts < 2:
                # (One attempt only, the deadline or the policy leaving no room for a
                # retry: no retry ran out, the provider's failure is the end.)
                event = OpInput.API_FAILURE
            else:
                await self.to(OpInput.TRANSIENT_FAILURE)
                event = OpInput.RETRY_EXHAUSTED
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
                    limit=str(self.budgets.deadline_seconds),
                    used=f"{self.tracker.elapsed(r._clock()):.3f}",
                    input=OpInput.DEADLINE,
                )
            )
            return
        if event is OpInput.PAUSED:
            snap.messages.extend(r._adapter.assistant_echo(echoed_turn(outcome)))
            await self.to(event)
        elif event is OpInput.TOOL_PROPOSALS:
            snap.messages.extend(r._adapter.assistant_echo(echoed_turn(outcome)))
            snap.text = outcome.text or snap.text
            await self.to(event)
        else:
            snap.text = outcome.text or outcome.refusal or snap.text
            reason = refusal_of_echo or outcome.stop_reason
            # Whatever ended the turn (an answer, a refusal, a cut, a failure), a side
            # effect whose outcome is still unknown makes it a stop for a person: ending
            # incomplete or failed would invite a fresh run under new idempotency keys.
            unknown = unresolved_unknowns(snap.calls)
            if unknown:
                names = ", ".join(f"{c.tool} ({c.call_id})" for c in unknown)
                why = f" ({reason})" if reason else ""
                reason = (
                    f"the model turn ended {event.value}{why}, but these calls'"
                    f" outcome is unknown: {names}"
                )
                event = OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE
            await self.stop(event, reason, outcome.raw_reason)
            return
        if overrun is not None:
            # This turn spent past a token or cost budget: its proposals are not run (nor
            # put to a person); the model would never see their results anyway.
            await self.exhausted(overrun)

    async def validate(self, decisions: dict[str, ApprovalDecision] | None) -> None:
        snap = self.snap
        outcome = snap.outcome
        assert outcome is not None
        late = self.tracker.check_deadline(self.r._clock())
        if late is not None:
            # Out of time: ask no person to approve, and run nothing after a resume.
            await self.exhausted(late)
            return
        if decisions is not None:
            by_id = {c.call_id: c for c in outcome.calls}
            for d in decisions.values():  # who decided what, chained before it is acted on
                await self.record("approval", call=by_id.get(d.call_id), data=decision_data(d))
            lapsed = lapsed_reason(decisions)
            if lapsed is not None:
                await self.stop(OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE, lapsed, outcome.raw_reason)
                return
        else:
            for call in outcome.calls:
                digests = self._digests(
                    call.name, argument_value(call), raw_sha256=sha256_hex(call.raw_arguments)
                )
                await self.record(
                    "requested",
                    call=call,
                    data=requested_data(call, digests),
                    redact=self._sensitive(call.name, arguments=True),
                )
        verdicts = validate_turn(
            outcome.calls, self.r.registry, self.auth, self.tracker, approvals=decisions
        )
        for v in verdicts:
            status = "rejected" if isinstance(v, Rejected) else type(v).__name__.lower()
            verdict: dict[str, Any] = {"verdict": status}
            if isinstance(v, Rejected):
                verdict.update(code=v.envelope.code.value, reason=v.reason)
            await self.record("validated", call=v.call, data=verdict)
        progress = self.tracker.check_progress()
        if progress is not None:
            await self.stop(progress.input, progress.reason, outcome.raw_reason)
            return
        step = turn_input(verdicts)
        if step is OpInput.APPROVAL_NEEDED:
            self.pending = approvals_to_request(verdicts, decisions, snap.approvals)
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
        # Before any handler runs: a handler may change the arguments it is given in
        # place, and a key computed after that would disown a result that is the call's.
        keys = {v.call.call_id: trusted_key(v, snap.operation_id) for v in executables}
        # Recorded now too: what each result will be bound to, sealed the moment its
        # handler returns (see binding_step).
        contexts = {
            v.call.call_id: (
                binding_context(self, v.call, v.spec, keys[v.call.call_id]),
                bindable_arguments(v.call),
            )
            for v in executables
        }
        results: dict[str, CallResult] = {}
        if executables:
            ctx = DispatchContext(
                auth=self.auth,
                store=self.ledger,
                worker_id=r.worker_id,
                max_parallelism=self.budgets.max_parallelism,
                max_result_bytes=self.budgets.max_result_bytes,
                clock=r._clock,
                progress=r._progress,
                provider=r.provider,
                model=r.model,
                tool_limiters=r._tool_limiters.here(),
                limiter=self.parallel,
                seal=lambda item, res: seal(*contexts[item.call.call_id], item, res, r._secret),
            )
            remaining = self.tracker.remaining_seconds(r._clock())
            for res in await execute_calls(executables, ctx, remaining_seconds=remaining):
                results[res.call.call_id] = res
                if res.status != ErrorCode.OUTCOME_UNKNOWN.value:
                    # An unknown outcome carries no information and must stay retryable:
                    # the model's retry (same intent, new call id) is the recovery path,
                    # reconciled by idempotency key, so it is no duplicate.
                    digest = sha256_hex(canonical_json(res.model_result))
                    failed = invites_retry(res.status, r.registry.get(res.tool))
                    self.tracker.record_result(res.tool, res.args_digest, digest, failed=failed)
                await self.record(
                    "executed",
                    call=res.call,
                    data={
                        "status": res.status,
                        "duration_ms": round(res.duration_ms, 3),
                        "ran": res.ran,
                        **self._digests(
                            res.tool, argument_value(res.call), idempotency_key=res.idempotency_key
                        ),
                        "detail": res.detail,
                        "result": res.model_result,
                    },
                    redact=self._sensitive(res.tool, arguments=False),
                )
            unresolved = [res for res in results.values() if res.unresolved]
            if unresolved:
                # A side effect may have happened and nothing could settle it: keep every
                # result in the audit and stop for a human, sending nothing.
                bound = await bind_results(
                    self, verdicts, results, decisions, keys=keys, contexts=contexts
                )
                if bound is not None:
                    which = "; ".join(
                        f"{u.tool} ({u.call.call_id}): {u.detail}" for u in unresolved
                    )
                    await self.stop(
                        OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE,
                        f"a side effect's outcome is unknown and could not be reconciled: {which}",
                        outcome.raw_reason,
                    )
                return
            await self.to(OpInput.RESULTS_DONE)
        verified = await bind_results(
            self, verdicts, results, decisions, keys=keys, contexts=contexts
        )
        if verified is None:
            return
        snap.messages.extend(r._adapter.encode_results(outcome, verified))
        await self.to(OpInput.RESULTS_SENT)

    async def binding_failed(self, reason: str, raw_reason: str | None) -> None:
        await self.record("binding_failed", data={"reason": reason})
        await self.stop(OpInput.BINDING_MISMATCH, f"result binding failed: {reason}", raw_reason)

    async def request_approvals(self) -> None:
        r, snap = self.r, self.snap
        store = r._need_store()
        now, ttl = r._clock(), self.settings.approval_ttl or r._approval_ttl
        snap.pending = []
        for v in self.pending:
            approval_id = new_approval_id()
            snap.pending.append(approval_id)
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
                    expires_at=now + ttl,
                )
            )
            snap.approvals[v.call.call_id] = approval_id
            await self.record(
                "approval",
                call=v.call,
                data={
                    "approval_id": approval_id,
                    "requested": True,
                    **self._digests(spec.name, argument_value(v.call), args_digest=v.args_digest),
                    "expires_at": now + ttl,
                },
            )
            await self.emit(
                ApprovalRequested(
                    operation_id=snap.operation_id,
                    approval_id=approval_id,
                    call_id=v.call.call_id,
                    name=spec.name,
                    expires_at=now + ttl,
                )
            )

    def _sensitive(self, tool: str, *, arguments: bool) -> list[tuple[Token, ...]]:
        return sensitive_paths(self.r.registry.get(tool), arguments=arguments)

    def _digests(
        self, tool: str | None, *covered: Any, **digests: str | None
    ) -> dict[str, str | None]:
        spec = self.r.registry.get(tool) if tool is not None else None
        return audit_digests(spec, self.audit, self.r._audit_secret, covered, digests)


def _generated(outcome: TurnOutcome) -> bool:
    """Whether the model produced anything this turn (billed output), as opposed to a
    request refused before generation (an HTTP error, a connection that never answered)."""
    return (
        bool(outcome.response_id or outcome.text or outcome.refusal or outcome.calls)
        or outcome.kind is not OutcomeKind.FAILED
    )


def _output_bytes(outcome: TurnOutcome) -> int:
    text = len(outcome.text.encode()) + len(outcome.refusal.encode())
    return text + sum(len(c.raw_arguments) + len(c.name) for c in outcome.calls)
