"""Validation of one turn's proposed calls: from untrusted proposals to verdicts.

Every call goes through the same checks in this fixed order; the first that fails
decides, and the call becomes ``Rejected`` with an error envelope for the model:

1. call id already seen in this response      -> duplicate_call
2. tool name not in the registry               -> unknown_tool
3. arguments rejected by the stream parser     -> invalid_arguments
4. strict decode into the tool's argument type -> invalid_arguments (JSON path, no value)
5. authorization (``ToolSpec.authorize``)      -> unauthorized
6. policy (``ToolSpec.policy``)                -> denied
7. loop guards (``BudgetTracker.admit_call``)  -> no_progress / budget_exhausted
8. approval rule: needed and not yet decided   -> ``NeedsApproval``;
   decided: approved -> ``Executable``, denied -> denied, expired -> approval_expired

Authorization, policy and approval callables are host code: if one raises or returns
anything but an explicit "allow", the call fails closed (unauthorized / denied /
approval needed) and the model sees only fixed text.

This module owns the order and the verdicts. It never calls a handler, never awaits,
and never looks a tool up anywhere but the registry it is given.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from .canonical import digest_fields, digests_equal, sha256_hex
from .envelope import ErrorCode, ErrorEnvelope, safe_validation_detail
from .errors import ConfigError
from .guards import BudgetTracker
from .outcome import ProposedCall
from .registry import (
    AuthContext,
    Decision,
    PolicyContext,
    Registry,
    RiskClass,
    ToolSpec,
    args_digest,
)
from .sets import repeats_in_sets
from .states import OpInput

__all__ = [
    "ApprovalDecision",
    "Executable",
    "NeedsApproval",
    "Rejected",
    "Verdict",
    "turn_input",
    "validate_turn",
]

_ENCODER = msgspec.json.Encoder()
_COPY_DECODER = msgspec.json.Decoder()
_CONTAINERS = (dict, list, tuple)


class ApprovalDecision(msgspec.Struct, frozen=True, kw_only=True):
    """A human's decision on one call, as recorded by the approvals store.

    ``args_digest`` is the digest of the arguments the approver saw; a decision only
    applies to a call whose revalidated arguments have the same digest. ``lapsed``: the
    approval was consumed by an earlier resume that did not finish, and no longer holds
    (expired, or the tool contract or policy changed since); that resume may have run the
    call, and running it now is not allowed, so nobody can answer it (the run loop
    escalates)."""

    approval_id: str
    call_id: str
    args_digest: str
    approved: bool
    expired: bool = False
    lapsed: bool = False
    # Who decided, why and when, as the approvals store holds it (for the audit trail).
    approver: str | None = None
    reason: str | None = None
    decided_at: float | None = None


class Rejected(msgspec.Struct, frozen=True, kw_only=True):
    """The call does not run; ``envelope`` is its result for the model. ``reason`` is for
    the protected audit record only (host decision reasons may name data)."""

    call: ProposedCall
    envelope: ErrorEnvelope
    reason: str
    spec: ToolSpec | None = None


class NeedsApproval(msgspec.Struct, frozen=True, kw_only=True):
    """The call passed every check and waits for a human: persist it and pause."""

    call: ProposedCall
    spec: ToolSpec
    args: Any  # an instance of spec.args_type
    args_digest: str


class Executable(msgspec.Struct, frozen=True, kw_only=True):
    """The call may run now. ``approval_id`` is set when a human approved it."""

    call: ProposedCall
    spec: ToolSpec
    args: Any  # an instance of spec.args_type
    args_digest: str
    approval_id: str | None = None


Verdict = Rejected | NeedsApproval | Executable

_FUTILE = frozenset({ErrorCode.DUPLICATE_CALL, ErrorCode.NO_PROGRESS})
_REFUSAL = "callgate/refusal/v1"


def validate_turn(
    calls: Sequence[ProposedCall],
    registry: Registry,
    auth: AuthContext,
    guards: BudgetTracker | None = None,
    *,
    approvals: Mapping[str, ApprovalDecision] | None = None,
) -> list[Verdict]:
    """One verdict per call, in proposal order (see the module docstring for the order
    of checks).

    ``guards``: when given, calls that pass checks 1-6 are admitted through
    ``guards.admit_call`` (idempotent per call id) and the turn is reported to
    ``guards.record_validation``; afterwards ``guards.check_progress()`` says whether the
    operation must end ``ESCALATED`` (``NO_PROGRESS``). Apart from that bookkeeping the
    function is pure. ``approvals``: decisions by call id, for revalidation after an
    approval pause (same calls, same guards)."""
    seen: set[str] = set()
    verdicts: list[Verdict] = []
    for call in calls:
        verdict = _validate_one(
            call, seen=seen, registry=registry, auth=auth, guards=guards, approvals=approvals or {}
        )
        seen.add(call.call_id)
        verdicts.append(verdict)
    if guards is not None:
        futile = sum(1 for v in verdicts if isinstance(v, Rejected) and _futile(v, guards))
        guards.record_validation(len(verdicts), futile)
    return verdicts


def _futile(verdict: Rejected, guards: BudgetTracker) -> bool:
    """A refusal that tells the model nothing new: a duplicate, no progress, or the very
    refusal the same call got in an earlier turn (an unknown tool or bad arguments sent
    again unchanged would otherwise keep a loop going until max_turns)."""
    code = verdict.envelope.code
    if code in _FUTILE:
        return True
    if code is ErrorCode.BUDGET_EXHAUSTED:
        return False  # the budget stops the operation itself
    call = verdict.call
    fingerprint = None
    if call.arguments is not None:
        with contextlib.suppress(ConfigError):
            fingerprint = digest_fields(_REFUSAL, call.name, code.value, call.arguments)
    if fingerprint is None:  # unparsed, or no canonical form: the exact bytes sent
        raw = sha256_hex(call.raw_arguments)
        fingerprint = digest_fields(_REFUSAL, call.name, code.value, raw)
    return guards.repeats_rejection(fingerprint)


def turn_input(verdicts: Sequence[Verdict]) -> OpInput:
    """The state-machine input for ``VALIDATING``: ``APPROVAL_NEEDED`` if any call waits
    for a human (nothing runs before the decisions), else ``EXECUTABLE`` if any call can
    run, else ``ALL_REJECTED``."""
    if any(isinstance(v, NeedsApproval) for v in verdicts):
        return OpInput.APPROVAL_NEEDED
    if any(isinstance(v, Executable) for v in verdicts):
        return OpInput.EXECUTABLE
    return OpInput.ALL_REJECTED


def _reject(
    call: ProposedCall,
    code: ErrorCode,
    reason: str,
    spec: ToolSpec | None = None,
    detail: str | None = None,
) -> Rejected:
    return Rejected(call=call, envelope=ErrorEnvelope.of(code, detail), reason=reason, spec=spec)


def _validate_one(
    call: ProposedCall,
    *,
    seen: set[str],
    registry: Registry,
    auth: AuthContext,
    guards: BudgetTracker | None,
    approvals: Mapping[str, ApprovalDecision],
) -> Verdict:
    if call.call_id in seen:
        return _reject(call, ErrorCode.DUPLICATE_CALL, "call id repeated in this response")
    spec = registry.get(call.name)
    if spec is None:
        return _reject(call, ErrorCode.UNKNOWN_TOOL, "tool name not in the registry")
    if call.arguments is None:
        # The parser's text may quote the bad input: audit only, never the model.
        reason = f"arguments rejected by the stream parser: {call.error or 'no reason given'}"
        return _reject(call, ErrorCode.INVALID_ARGUMENTS, reason, spec)

    try:
        # From a private copy when there is anything to share: convert hands nested dicts
        # and lists of its input to the Struct, and a handler may change what it is given
        # in place, while the proposal (bound to its result, echoed to the provider,
        # persisted) must stay what the model sent. Flat arguments hold only immutable
        # values (the common case: no copy). A round trip through msgspec's JSON is exact
        # for parsed arguments.
        source = call.arguments
        if any(isinstance(value, _CONTAINERS) for value in source.values()):
            source = _COPY_DECODER.decode(_ENCODER.encode(source))
        args = msgspec.convert(source, spec.args_type, strict=True)
    except msgspec.ValidationError as exc:
        host = exc.__cause__  # a ValueError/TypeError of __post_init__, wrapped by msgspec
        if host is not None:
            # The host's own text may name its data: the type only, never the message.
            reason = f"argument type raised {type(host).__name__}"
            return _reject(call, ErrorCode.INVALID_ARGUMENTS, reason, spec)
        detail = safe_validation_detail(str(exc))
        return _reject(call, ErrorCode.INVALID_ARGUMENTS, detail, spec, detail)
    except Exception as exc:  # host code in the argument type (__post_init__) failed
        reason = f"argument type raised {type(exc).__name__}"
        return _reject(call, ErrorCode.INVALID_ARGUMENTS, reason, spec)
    if spec.set_fields is not None and repeats_in_sets(spec.set_fields, call.arguments):
        # A set would drop the repeat: the handler would run on what the model never sent.
        detail = "An array for a set holds a repeated item."
        return _reject(call, ErrorCode.INVALID_ARGUMENTS, detail, spec, detail)
    try:
        digest = args_digest(spec.name, args)
    except ConfigError:
        detail = "The arguments have no canonical JSON form."
        return _reject(call, ErrorCode.INVALID_ARGUMENTS, detail, spec, detail)

    if spec.authorize is not None:
        allowed, reason = _ask(spec.authorize, auth, args, "authorize")
        if not allowed:
            return _reject(call, ErrorCode.UNAUTHORIZED, reason, spec)
    ctx = PolicyContext(
        auth=auth,
        tool=spec.name,
        risk=spec.risk,
        call_id=call.call_id,
        policy_revision=spec.policy_revision,
    )
    if spec.policy is not None:
        allowed, reason = _ask(spec.policy, ctx, args, "policy")
        if not allowed:
            return _reject(call, ErrorCode.DENIED, reason, spec)

    if guards is not None:
        admission = guards.admit_call(spec.name, digest, call_id=call.call_id)
        code = admission.error_code
        if code is not None:
            return _reject(call, code, admission.reason, spec)

    decision = approvals.get(call.call_id)
    if decision is None:
        if not _approval_needed(spec, args, ctx):
            return Executable(call=call, spec=spec, args=args, args_digest=digest)
        return NeedsApproval(call=call, spec=spec, args=args, args_digest=digest)
    # A person decided on this call: the decision stands whatever the approval rule says
    # now (a denied or expired call must not run because the rule changed meanwhile).
    if not digests_equal(decision.args_digest, digest):
        reason = f"approval {decision.approval_id} was given for different arguments"
        return _reject(call, ErrorCode.DENIED, reason, spec)
    if decision.expired:
        reason = f"approval {decision.approval_id} expired"
        return _reject(call, ErrorCode.APPROVAL_EXPIRED, reason, spec)
    if not decision.approved:
        reason = f"approval {decision.approval_id} denied"
        return _reject(call, ErrorCode.DENIED, reason, spec)
    return Executable(
        call=call, spec=spec, args=args, args_digest=digest, approval_id=decision.approval_id
    )


def _ask(check: Any, ctx: Any, args: Any, label: str) -> tuple[bool, str]:
    """Run a host authorization/policy callable, failing closed: only ``True`` or an
    allowing ``Decision`` allows; an exception or any other value denies."""
    try:
        result = check(ctx, args)
    except Exception as exc:  # host code: a crash must deny, not escape or allow
        return False, f"{label} raised {type(exc).__name__}"
    if result is True:
        return True, ""
    if isinstance(result, Decision):
        return result.allowed is True, result.reason
    if result is False:
        return False, f"{label} returned False"
    return False, f"{label} returned {type(result).__name__}, not bool or Decision"


def _approval_needed(spec: ToolSpec, args: Any, ctx: PolicyContext) -> bool:
    """Default: irreversible tools need a human. A rule that raises or returns anything
    but ``False`` asks for approval (fail closed)."""
    rule = spec.approval
    if rule is None:
        return spec.risk is RiskClass.IRREVERSIBLE
    if isinstance(rule, bool):
        return rule
    try:
        return rule(args, ctx) is not False
    except Exception:  # host code: when in doubt, ask a human
        return True
