"""Binding a turn's results to their calls, and the binding context each call gets.

A call's ``BindingContext`` (provider, family, response and call ids, operation,
idempotency key, adapter revision, tenant and subject, the tool's six revisions) is
recorded from callgate's own state when the call is validated, before any handler runs.
The dispatcher seals each executed call's result under it the moment the handler
returns (``OperationDrive.seal``); this step binds the rejected calls, checks each
dispatcher result answers its call, and verifies the whole set against the records made
before dispatch, so a result body moved to another call after it was produced fails the
operation instead of reaching the model. The audit trail gets each result's digests and
its binding context (what ``binding_sha256`` covers, recomputable by an auditor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from callgate.engine.core.adapter import ModelResult
from callgate.engine.core.binding import (
    BindingContext,
    BoundResult,
    TrustedCall,
    bind,
    to_model_result,
)
from callgate.engine.core.correlation import verify_result_set
from callgate.engine.core.envelope import ErrorCode
from callgate.engine.core.errors import BindingError
from callgate.engine.core.outcome import ProposedCall
from callgate.engine.core.registry import ToolSpec
from callgate.engine.core.validation import ApprovalDecision, Rejected, Verdict

from .call_records import answers, argument_value, bindable_arguments
from .dispatch import CallResult
from .operation import CallSummary
from .progress import CallRejected

if TYPE_CHECKING:
    from .steps import OperationDrive

__all__ = ["bind_results", "binding_context"]

# The binding context as the result's audit record keeps it (call id and tool are there
# already; the digests go through the redaction rules of ``audit_digests``, and so does
# the idempotency key, in the call's ``executed`` record: a plain SHA-256 over the
# business arguments, it would let redacted values be guessed back).
_CONTEXT_FIELDS = (
    *(f for f in BindingContext.__struct_fields__ if f not in ("call_id", "idempotency_key")),
    "hmac",
)


def binding_context(
    drive: OperationDrive, call: ProposedCall, spec: ToolSpec | None, key: str | None
) -> BindingContext:
    """What ``call``'s result is bound to, from callgate's own state only."""
    r, snap = drive.r, drive.snap
    outcome = snap.outcome
    assert outcome is not None
    revisions = spec.revisions if spec is not None else None
    return BindingContext(
        provider=r.provider,
        api_family=r._adapter.family,
        response_id=outcome.response_id,
        call_id=call.call_id,
        operation_id=snap.operation_id,
        idempotency_key=key or "",
        adapter_revision=r._adapter.revision,
        tenant_ref=snap.tenant,
        subject_ref=snap.subject,
        input_revision=revisions.input if revisions else None,
        output_revision=revisions.output if revisions else None,
        effect_revision=revisions.effect if revisions else None,
        handler_revision=revisions.handler if revisions else None,
        producer_revision=revisions.producer if revisions else None,
        policy_revision=revisions.policy if revisions else None,
    )


async def bind_results(
    drive: OperationDrive,
    verdicts: list[Verdict],
    results: dict[str, CallResult],
    decisions: dict[str, ApprovalDecision] | None,
    *,
    keys: dict[str, str | None],
    contexts: dict[str, tuple[BindingContext, dict[str, Any]]],
) -> list[ModelResult] | None:
    """Bind every result to its call, verify the set against callgate's own records and
    return the wire projections in proposal order (None: the operation FAILED).
    ``keys``: the idempotency keys computed from the validated calls before dispatch;
    ``contexts``: their binding contexts and bindable arguments, recorded then too (the
    dispatcher sealed each executed call's result under its own when the handler
    returned)."""
    r, snap = drive.r, drive.snap
    outcome = snap.outcome
    assert outcome is not None
    trusted: list[TrustedCall] = []
    bound: list[BoundResult] = []
    summaries: list[CallSummary] = []
    covered: list[tuple[Any, Any]] = []  # what each bound result's digests cover
    # A repeated call id cannot carry a result of its own: providers key results by
    # call id (and verify_result_set refuses two results for one key), so the first
    # occurrence's result answers it. The repeat is audited and summarised, not sent.
    repeats: list[tuple[int, CallSummary]] = []
    for position, v in enumerate(verdicts):
        call = v.call
        spec = v.spec
        if isinstance(v, Rejected) and v.envelope.code is ErrorCode.DUPLICATE_CALL:
            code = ErrorCode.DUPLICATE_CALL.value
            await _rejected(drive, call, code)
            summary = CallSummary(
                turn=drive.tracker.turns,
                response_id=outcome.response_id,
                call_id=call.call_id,
                tool=call.name,
                status=code,
            )
            repeats.append((position, summary))
            continue
        key = keys.get(call.call_id)  # callgate's own, not the dispatcher's
        recorded = contexts.get(call.call_id)
        ctx, args = recorded or (binding_context(drive, call, spec, key), bindable_arguments(call))
        b: BoundResult
        if isinstance(v, Rejected):
            model_result, status = v.envelope.to_model_result(), v.envelope.code.value
            b = bind(ctx, call.name, args, model_result, True, r._secret)
            await _rejected(drive, call, status)
        else:
            res = results[call.call_id]
            if not answers(res, v, key):
                # A result the dispatcher labelled with this call but produced for
                # another (other arguments, tool or key): never bound to this one.
                await drive.binding_failed(
                    f"the result labelled {call.call_id!r} answers another call",
                    outcome.raw_reason,
                )
                return None
            if res.bound is None:  # every executed call's result is sealed in dispatch
                await drive.binding_failed(
                    f"the result of {call.call_id!r} was not bound when it was produced",
                    outcome.raw_reason,
                )
                return None
            # What is sent is what was sealed: a body changed since (a defect moving
            # results between calls) fails the set's verification below.
            b, status = res.bound, res.status
            model_result = b.model_result
        trusted.append(TrustedCall.record(ctx, call.name, args))
        bound.append(b)
        covered.append((argument_value(call), model_result))
        approval_id = (
            decisions[call.call_id].approval_id if decisions and call.call_id in decisions else None
        )
        summaries.append(
            CallSummary(
                turn=drive.tracker.turns,
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
        await drive.binding_failed(str(exc), outcome.raw_reason)
        return None
    for b, s, values in zip(verified, summaries, covered, strict=True):
        pa = b.protected_audit
        # binding_sha256 covers both digests: unkeyed, it is as guessable as they are;
        # an HMAC under the binding secret is not, and stays as the snapshot shows it.
        digests = {"request_sha256": pa.request_sha256, "result_sha256": pa.result_sha256}
        keyed_binding = {"binding_sha256": pa.binding_sha256} if pa.hmac else {}
        if not pa.hmac:
            digests["binding_sha256"] = pa.binding_sha256
        await drive.record(
            "result",
            call=None,
            tool=s.tool,
            data={
                "call_id": s.call_id,
                "status": s.status,
                **drive._digests(s.tool, *values, **digests),
                **keyed_binding,
                # What binding_sha256 covers besides the digests: an auditor recomputes it.
                "binding": {f: getattr(pa, f) for f in _CONTEXT_FIELDS},
            },
        )
    for position, summary in repeats:  # ascending: each lands at its proposal position
        summaries.insert(position, summary)
    snap.calls.extend(summaries)
    snap.approvals = {}
    return [to_model_result(b) for b in verified]


async def _rejected(drive: OperationDrive, call: ProposedCall, code: str) -> None:
    await drive.emit(
        CallRejected(
            operation_id=drive.snap.operation_id, call_id=call.call_id, name=call.name, code=code
        )
    )
