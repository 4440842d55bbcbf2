"""What a drive records and checks about one call, beside running it: the arguments a
result is bound to, whether a dispatcher's result answers the call as validated, and the
digest fields of the call's audit records (keyed where the trail redacts what they cover),
which calls a pausing turn asks a person about, and the turn as it is echoed.

Owns no state and does no I/O; ``steps.OperationDrive`` calls these while it binds results
and writes the audit trail.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from typing import Any

import httpx
import msgspec

from callgate.engine.core.adapter import HttpRequestSpec
from callgate.engine.core.audit import AuditChain, Token, parse_path
from callgate.engine.core.binding import BindingContext, bind
from callgate.engine.core.canonical import canonical_json, digests_equal, hmac_fields, sha256_hex
from callgate.engine.core.envelope import ErrorCode
from callgate.engine.core.errors import ConfigError
from callgate.engine.core.outcome import ProposedCall, TurnOutcome, Usage
from callgate.engine.core.registry import ToolSpec
from callgate.engine.core.validation import ApprovalDecision, Executable, NeedsApproval, Verdict

from .dispatch import CallResult

__all__ = [
    "answers",
    "approvals_to_request",
    "argument_value",
    "audit_digests",
    "bindable_arguments",
    "decision_data",
    "echoed_turn",
    "has_canonical_form",
    "invites_retry",
    "lapsed_reason",
    "model_response_data",
    "requested_data",
    "seal",
    "sensitive_paths",
    "trusted_key",
]

_KEYED_DIGEST = "callgate/audit-keyed-digest/v1"


def has_canonical_form(arguments: Any) -> bool:
    try:
        canonical_json(arguments)
    except ConfigError:
        return False
    return True


def argument_value(call: ProposedCall) -> Any:
    """A call's arguments as the trail sees them: parsed, or the raw text that did not."""
    return call.arguments if call.arguments is not None else call.raw_arguments


def bindable_arguments(call: ProposedCall) -> dict[str, Any]:
    """The arguments a result is bound to: the parsed object, or — for a call whose text
    was rejected or has no canonical form — the digest of its raw bytes."""
    if call.arguments is not None and has_canonical_form(call.arguments):
        return call.arguments
    return {"raw_arguments_sha256": sha256_hex(call.raw_arguments)}


def trusted_key(verdict: Verdict, operation_id: str) -> str | None:
    """A side effect's idempotency key, computed again from the validated call (the key
    the dispatcher used must be this one); None for a read, or where none computes (the
    dispatcher then refused to run the call)."""
    if not isinstance(verdict, Executable) or not verdict.spec.is_side_effect:
        return None
    try:
        return verdict.spec.idempotency_key(operation_id, verdict.args)
    except Exception:  # host code (idempotency_fields), or no canonical form
        return None


def answers(result: CallResult, verdict: Verdict, key: str | None) -> bool:
    """Whether the dispatcher's ``result`` is for the validated call of ``verdict``: the
    same call, tool, argument digest and idempotency key (each recomputed or kept by
    validation, never read back from the result alone)."""
    return (
        isinstance(verdict, Executable)
        and result.call.call_id == verdict.call.call_id
        and result.tool == verdict.spec.name
        and digests_equal(result.args_digest, verdict.args_digest)
        and (
            result.idempotency_key is None
            if key is None
            else result.idempotency_key is not None and digests_equal(result.idempotency_key, key)
        )
    )


def sensitive_paths(spec: ToolSpec | None, *, arguments: bool) -> list[tuple[Token, ...]]:
    """Redaction paths inside an audit record's data, as parsed tokens (never spliced
    strings: ``$``, ``$[*].x`` and ``$['x']`` must land under the prefix too):
    ``arguments`` + path for the call's arguments, ``result``, ``result`` + path for a
    handler's value (the record holds the model_result ``{"result": value}``)."""
    if spec is None:
        return []
    if arguments:
        return [("arguments", *parse_path(p)) for p in spec.sensitive_paths]
    return [("result", "result", *parse_path(p)) for p in spec.sensitive_result_paths]


def audit_digests(
    spec: ToolSpec | None,
    audit: AuditChain,
    secret: bytes | None,
    covered: tuple[Any, ...],
    digests: Mapping[str, str | None],
) -> dict[str, str | None]:
    """The digest fields of an audit record for a call of ``spec``'s tool; ``covered`` are
    the values (arguments, result) the digests were computed over.

    Where the trail redacts part of those values (the tool declares sensitive argument
    or result paths, or a value holds one of the chain's sensitive keys, such as
    ``password``), a plain SHA-256 of the unredacted values (raw_sha256,
    request/result/binding digests, idempotency key, args_digest) would let anyone
    holding the trail brute-force a low-entropy redacted value (a PIN, a one-time code).
    Such digests are written as HMACs under the audit ``secret`` (marked ``"digests":
    "hmac"``), and left out when there is none. Nothing is kept for verification's sake:
    ``verify_trail`` checks only the chain, and results are verified in process against
    callgate's own records, never against the trail. Other calls keep the plain digests
    (they correlate with the binding and the store).
    """
    declared = spec is not None and bool(spec.sensitive_paths or spec.sensitive_result_paths)
    if not declared and not any(audit.redacts_keys_in(v) for v in covered):
        return dict(digests)
    if secret is None:
        return {}
    out: dict[str, str | None] = {
        name: None if value is None else hmac_fields(secret, _KEYED_DIGEST, name, value)
        for name, value in digests.items()
    }
    out["digests"] = "hmac"
    return out


def approvals_to_request(
    verdicts: list[Verdict],
    decisions: Mapping[str, ApprovalDecision] | None,
    approvals: dict[str, str],
) -> list[NeedsApproval]:
    """The calls a pausing turn asks a person about. A resumed turn that pauses again (a
    call needs approval now) runs nothing, so the approvals its resume consumed
    authorized nothing: their calls are asked for again, never run later on an approval
    past its expiry, and a consumed one whose call is refused now (a policy denies it)
    is dropped from ``approvals`` (call id -> approval id, the paused turn's): the next
    resume revalidates that call afresh instead of finding a spent approval. Denied and
    expired decisions stay: a person's "no" holds whatever the rules say later."""
    for decision in (decisions or {}).values():
        if decision.approved:
            approvals.pop(decision.call_id, None)
    return [
        v
        if isinstance(v, NeedsApproval)
        else NeedsApproval(call=v.call, spec=v.spec, args=v.args, args_digest=v.args_digest)
        for v in verdicts
        if isinstance(v, NeedsApproval) or (isinstance(v, Executable) and v.approval_id)
    ]


def lapsed_reason(decisions: Mapping[str, ApprovalDecision]) -> str | None:
    """Why a resume must escalate before revalidating, if it must: an approval an
    unfinished resume consumed no longer holds (``ApprovalDecision.lapsed``)."""
    lapsed = sorted(d.call_id for d in decisions.values() if d.lapsed)
    if not lapsed:
        return None
    return (
        f"the approval of call(s) {', '.join(lapsed)} was consumed by a resume that did not "
        "finish and no longer holds (expired, or the tool contract or policy changed): "
        "whether they ran is for a person to check (idempotency ledger, audit trail)"
    )


def echoed_turn(outcome: TurnOutcome) -> TurnOutcome:
    """The turn as it is echoed: a call that repeats an earlier call's id is left out. It
    gets no result of its own (see ``bind``), and Anthropic and Gemini refuse a history
    whose calls and results do not pair up (400: ``tool_use`` ids must be unique)."""
    first = {c.call_id: c for c in reversed(outcome.calls)}  # each id's first call wins
    calls = [c for c in outcome.calls if first[c.call_id] is c]
    if len(calls) == len(outcome.calls):
        return outcome
    return msgspec.structs.replace(outcome, calls=tuple(calls))


# Results whose envelope invites the model to retry the identical call (see
# ``BudgetTracker.record_result``): a timeout, a handler error.
_RETRY_INVITED = frozenset({ErrorCode.TIMEOUT.value, ErrorCode.HANDLER_ERROR.value})


def invites_retry(status: str, spec: ToolSpec | None) -> bool:
    """Whether the identical call may run again after this result: a read's timeout or
    handler error. A side effect's failure is final (the ledger replays it to any retry
    under its key; a write's timeout is ``outcome_unknown``, reconciled instead)."""
    return status in _RETRY_INVITED and spec is not None and not spec.is_side_effect


def requested_data(call: ProposedCall, digests: Mapping[str, str | None]) -> dict[str, Any]:
    """The audit data of a proposed call. Arguments with no canonical form (an integer
    beyond 64 bits) cannot be chained: the record holds a marker and the raw bytes'
    digest, and validation refuses or accepts the call as usual (a model never crashes
    the run)."""
    canonical = call.arguments is None or has_canonical_form(call.arguments)
    data: dict[str, Any] = {"arguments": call.arguments if canonical else None}
    if not canonical:
        data["arguments_canonical"] = False
    data.update(digests)
    return data


def decision_data(decision: ApprovalDecision) -> dict[str, Any]:
    """The audit data of a person's decision as a resume reads it: the approval id audits
    who approved (or denied) which action, so the chained trail holds the name, the
    reason and the time, not only the approvals store (whose rows can be edited). No
    argument digest: the request's record holds it, keyed where the trail redacts."""
    return {
        "approval_id": decision.approval_id,
        "decided": True,
        "approved": decision.approved,
        "expired": decision.expired,
        "lapsed": decision.lapsed,
        "approver": decision.approver,
        "reason": decision.reason,
        "decided_at": decision.decided_at,
    }


def seal(
    binding: BindingContext,
    args: Mapping[str, Any],
    item: Executable,
    result: CallResult,
    secret: bytes | None,
) -> CallResult:
    """``result`` bound to ``item``'s call under ``binding`` and its bindable ``args``
    (both recorded before dispatch), at the moment it was produced for that item: a body
    moved to another call later no longer matches its binding."""
    try:
        bound = bind(binding, item.call.name, args, result.model_result, result.is_error, secret)
    except ConfigError:
        # (A result with no canonical form.) Left unsealed, it fails the turn's binding
        # step; raised here, it would cancel the turn's other calls mid-handler.
        return result
    return msgspec.structs.replace(result, bound=bound)


_KEY_SENTINEL = "callgate-key-sentinel-0000"
try:
    _CLIENT = f"callgate/{importlib.metadata.version('callgate')} httpx/{httpx.__version__}"
except importlib.metadata.PackageNotFoundError:  # (run from a source tree)
    _CLIENT = f"callgate httpx/{httpx.__version__}"


def model_response_data(
    runner: Any, spec: HttpRequestSpec, outcome: TurnOutcome, attempts: int, usage: Usage
) -> dict[str, Any]:
    """The audit data of one model response: who answered, under which API and adapter
    revisions, with which model, and how the turn ended (the spec's "record provider,
    API, SDK, model and adapter revision"). The API headers kept are those that carry no
    key (Anthropic's ``anthropic-version``); the key never reaches the trail."""
    adapter = runner._adapter
    api_headers = {
        name: value
        for name, value in adapter.auth_headers(_KEY_SENTINEL).items()
        if _KEY_SENTINEL not in value
    }
    return {
        "provider": runner.provider,
        "api_family": adapter.family,
        "adapter_revision": adapter.revision,
        "api_path": spec.path.partition("?")[0],
        "api_headers": api_headers,
        "client": _CLIENT,
        "model_requested": runner.model,
        "model_served": outcome.model,
        "response_id": outcome.response_id,
        "kind": outcome.kind.value,
        "raw_reason": outcome.raw_reason,
        "attempts": attempts,
        "usage": msgspec.to_builtins(usage),
    }
