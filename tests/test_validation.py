"""Validation of a turn's calls: the order of checks, every rejection code, fail-closed host
callables, safe messages, approvals, and that handlers never run during validation."""

from __future__ import annotations

import enum
import json
from typing import Annotated, Any

import msgspec
import pytest

from callgate.engine.core.envelope import ErrorCode, ErrorEnvelope, safe_validation_detail
from callgate.engine.core.guards import Budgets, BudgetTracker
from callgate.engine.core.outcome import ProposedCall, Usage
from callgate.engine.core.registry import (
    AuthContext,
    Decision,
    PolicyContext,
    Registry,
    RiskClass,
    ToolContext,
    ToolSpec,
    args_digest,
)
from callgate.engine.core.states import OpInput
from callgate.engine.core.validation import (
    ApprovalDecision,
    Executable,
    NeedsApproval,
    Rejected,
    Verdict,
    turn_input,
    validate_turn,
)

SECRET = "sk-live-SECRET-0123456789"
AUTH = AuthContext(tenant="t1", subject="alice", operation_id="op1", roles=frozenset({"agent"}))

HANDLER_CALLS: list[tuple[str, Any]] = []


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class OrderArgs(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    order_id: Annotated[str, msgspec.Meta(max_length=40)]


class RefundArgs(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    order_id: str
    amount_cents: Annotated[int, msgspec.Meta(ge=1)]
    color: Color = Color.RED


def recording_handler(args: Any, ctx: ToolContext) -> dict[str, object]:
    HANDLER_CALLS.append((ctx.tool, args))
    return {"ok": True}


def only_tenant_t1(auth: AuthContext, args: Any) -> bool:
    return auth.tenant == "t1"


def refund_policy(ctx: PolicyContext, args: Any) -> Decision:
    if args.amount_cents > 50_000:
        return Decision.deny(f"refund of {args.amount_cents} over the limit")
    return Decision.allow()


def registry(**overrides: Any) -> Registry:
    get_order: dict[str, Any] = {
        "name": "get_order",
        "description": "Look up an order.",
        "args_type": OrderArgs,
        "handler": recording_handler,
        "authorize": only_tenant_t1,
    }
    refund: dict[str, Any] = {
        "name": "refund",
        "description": "Refund an order.",
        "args_type": RefundArgs,
        "handler": recording_handler,
        "risk": RiskClass.IRREVERSIBLE,
        "authorize": only_tenant_t1,
        "policy": refund_policy,
    }
    refund.update(overrides)
    return Registry([ToolSpec(**get_order), ToolSpec(**refund)])


def call(
    name: str, arguments: dict[str, Any] | None, call_id: str = "c1", index: int = 0, **kw: Any
) -> ProposedCall:
    raw = json.dumps(arguments).encode() if arguments is not None else b"{bad"
    return ProposedCall(
        index=index, call_id=call_id, name=name, arguments=arguments, raw_arguments=raw, **kw
    )


def only(verdicts: list[Verdict]) -> Verdict:
    assert len(verdicts) == 1
    return verdicts[0]


def rejected(verdict: Verdict) -> Rejected:
    assert isinstance(verdict, Rejected), verdict
    return verdict


def code_of(verdict: Verdict) -> ErrorCode:
    return rejected(verdict).envelope.code


@pytest.fixture(autouse=True)
def _no_handler_runs() -> Any:
    HANDLER_CALLS.clear()
    yield
    assert HANDLER_CALLS == [], "validation must never call a handler"


# --- envelopes -------------------------------------------------------------------------------


@pytest.mark.parametrize("code", list(ErrorCode), ids=str)
def test_every_code_has_fixed_safe_text_and_the_model_shape(code: ErrorCode) -> None:
    envelope = ErrorEnvelope.of(code)
    assert envelope.to_model_result() == {
        "error": {"code": code.value, "message": envelope.message}
    }
    assert envelope.message and "Traceback" not in envelope.message
    assert ErrorEnvelope.of(code, "x" * 10_000).message.startswith(envelope.message)
    assert len(ErrorEnvelope.of(code, "x" * 10_000).message) < len(envelope.message) + 300


def test_outcome_unknown_is_never_a_retry_hint() -> None:
    assert not ErrorEnvelope.of(ErrorCode.OUTCOME_UNKNOWN).retryable
    assert ErrorEnvelope.of(ErrorCode.INVALID_ARGUMENTS).retryable


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Invalid enum value 5 - at `$.n`", "Invalid enum value - at `$.n`"),
        (f"Object contains unknown field `{SECRET}`", "Object contains an unknown field - at `$`"),
        (f"Something new '{SECRET}' - at `$.a[0]`", "Invalid value - at `$.a[0]`"),
        ("Invalid UUID - at `$.u`", "Invalid UUID - at `$.u`"),
    ],
)
def test_safe_validation_detail_drops_values(text: str, expected: str) -> None:
    assert safe_validation_detail(text) == expected


# --- happy paths -----------------------------------------------------------------------------


def test_a_valid_read_call_is_executable() -> None:
    v = only(validate_turn([call("get_order", {"order_id": "o1"})], registry(), AUTH))
    assert isinstance(v, Executable)
    assert v.args == OrderArgs(order_id="o1")
    assert v.spec.name == "get_order"
    assert v.args_digest == args_digest("get_order", OrderArgs(order_id="o1"))
    assert v.approval_id is None


def test_an_irreversible_call_needs_approval_by_default() -> None:
    v = only(
        validate_turn([call("refund", {"order_id": "o1", "amount_cents": 5})], registry(), AUTH)
    )
    assert isinstance(v, NeedsApproval)
    assert v.args == RefundArgs(order_id="o1", amount_cents=5)


def test_verdicts_come_back_in_proposal_order() -> None:
    calls = [
        call("nope", {}, "a", 0),
        call("get_order", {"order_id": "o1"}, "b", 1),
        call("refund", {"order_id": "o1", "amount_cents": 5}, "c", 2),
        call("get_order", {"order_id": 1}, "d", 3),
    ]
    verdicts = validate_turn(calls, registry(), AUTH)
    assert [v.call.call_id for v in verdicts] == ["a", "b", "c", "d"]
    assert [type(v) for v in verdicts] == [Rejected, Executable, NeedsApproval, Rejected]


# --- each rejection, in order ----------------------------------------------------------------


def test_duplicate_call_id_rejects_the_second_and_later_occurrences() -> None:
    calls = [
        call("get_order", {"order_id": "o1"}, "same", 0),
        call("get_order", {"order_id": "o2"}, "same", 1),
        call("nope", {}, "same", 2),
    ]
    verdicts = validate_turn(calls, registry(), AUTH)
    assert isinstance(verdicts[0], Executable)
    assert code_of(verdicts[1]) is ErrorCode.DUPLICATE_CALL
    assert code_of(verdicts[2]) is ErrorCode.DUPLICATE_CALL, "dedupe comes before unknown tool"


def test_unknown_tool_is_rejected() -> None:
    v = only(validate_turn([call("delete_everything", {})], registry(), AUTH))
    assert code_of(v) is ErrorCode.UNKNOWN_TOOL
    assert rejected(v).envelope.to_model_result() == {
        "error": {"code": "unknown_tool", "message": "No tool with this name is available."}
    }


@pytest.mark.parametrize(
    "name",
    ["recording_handler", "validate_turn", "eval", "exec", "__import__", "print", "open"],
)
def test_names_of_global_functions_are_unknown_tools(name: str) -> None:
    v = only(validate_turn([call(name, {"order_id": "o1"})], registry(), AUTH))
    assert code_of(v) is ErrorCode.UNKNOWN_TOOL


def test_arguments_rejected_by_the_parser_are_invalid_and_the_parser_text_stays_out() -> None:
    bad = call("get_order", None, error=f"invalid JSON near {SECRET}")
    v = only(validate_turn([bad], registry(), AUTH))
    assert code_of(v) is ErrorCode.INVALID_ARGUMENTS
    assert SECRET not in rejected(v).envelope.message
    assert SECRET in rejected(v).reason, "kept for the protected audit"


def test_unknown_tool_is_checked_before_parser_rejection() -> None:
    v = only(validate_turn([call("nope", None, error="bad json")], registry(), AUTH))
    assert code_of(v) is ErrorCode.UNKNOWN_TOOL


@pytest.mark.parametrize(
    ("arguments", "path", "kind"),
    [
        ({"order_id": 12345}, "$.order_id", "Expected `str`, got `int`"),
        ({"order_id": "x" * 41}, "$.order_id", "Expected `str` of length <= 40"),
        ({}, "$", "Object missing required field `order_id`"),
        ({"order_id": "o1", SECRET: 1}, "$", "Object contains an unknown field"),
        ({"order_id": ["a"]}, "$.order_id", "Expected `str`, got `array`"),
    ],
)
def test_strict_decode_errors_name_the_path_not_the_value(
    arguments: dict[str, Any], path: str, kind: str
) -> None:
    v = only(validate_turn([call("get_order", arguments)], registry(), AUTH))
    assert code_of(v) is ErrorCode.INVALID_ARGUMENTS
    message = rejected(v).envelope.message
    assert f"at `{path}`" in message
    assert kind in message
    assert SECRET not in message and "12345" not in message
    assert rejected(v).envelope.retryable


def test_strict_decode_does_not_coerce_types() -> None:
    v = only(
        validate_turn([call("refund", {"order_id": "o1", "amount_cents": "5"})], registry(), AUTH)
    )
    assert code_of(v) is ErrorCode.INVALID_ARGUMENTS
    assert "at `$.amount_cents`" in rejected(v).envelope.message


def test_an_invalid_enum_value_is_not_echoed() -> None:
    arguments = {"order_id": "o1", "amount_cents": 5, "color": SECRET}
    v = only(validate_turn([call("refund", arguments)], registry(), AUTH))
    assert code_of(v) is ErrorCode.INVALID_ARGUMENTS
    assert "Invalid enum value - at `$.color`" in rejected(v).envelope.message
    assert SECRET not in rejected(v).envelope.message
    assert SECRET not in rejected(v).reason


def test_arguments_without_canonical_form_are_invalid() -> None:
    v = only(
        validate_turn([call("refund", {"order_id": "o1", "amount_cents": 2**70})], registry(), AUTH)
    )
    assert code_of(v) is ErrorCode.INVALID_ARGUMENTS
    assert "canonical" in rejected(v).envelope.message


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError,
        # msgspec wraps these two in a ValidationError carrying their text, which looks
        # like its own ("Invalid ...", "Expected `...`"): still the type only.
        pytest.param(lambda s: ValueError("Invalid card 4111111111111111"), id="ValueError"),
        pytest.param(lambda s: TypeError(f"Expected `row` got {s}"), id="TypeError"),
    ],
)
def test_argument_type_post_init_crash_is_invalid_arguments(error: Any) -> None:
    class Fussy(msgspec.Struct, forbid_unknown_fields=True):
        x: int

        def __post_init__(self) -> None:
            raise error(SECRET)

    reg = Registry(
        [ToolSpec(name="fussy", description="", args_type=Fussy, handler=recording_handler)]
    )
    v = only(validate_turn([call("fussy", {"x": 1})], reg, AUTH))
    assert code_of(v) is ErrorCode.INVALID_ARGUMENTS
    message = rejected(v).envelope.message
    assert SECRET not in message and SECRET not in rejected(v).reason
    assert "4111111111111111" not in message


def test_invalid_arguments_are_checked_before_authorization() -> None:
    asked: list[str] = []

    def authorize(auth: AuthContext, args: Any) -> bool:
        asked.append("authorize")
        return False

    v = only(validate_turn([call("refund", {"order_id": 1})], registry(authorize=authorize), AUTH))
    assert code_of(v) is ErrorCode.INVALID_ARGUMENTS
    assert asked == []


@pytest.mark.parametrize(
    "authorize",
    [
        lambda auth, args: False,
        lambda auth, args: Decision.deny("not your order"),
        lambda auth, args: None,
        lambda auth, args: "yes",
        lambda auth, args: 1,
        lambda auth, args: Decision(allowed=1),  # type: ignore[arg-type]
    ],
    ids=["false", "deny", "none", "truthy-str", "truthy-int", "truthy-decision"],
)
def test_authorization_allows_only_an_explicit_yes(authorize: Any) -> None:
    arguments = {"order_id": "o1", "amount_cents": 5}
    v = only(validate_turn([call("refund", arguments)], registry(authorize=authorize), AUTH))
    assert code_of(v) is ErrorCode.UNAUTHORIZED


def test_authorization_sees_the_tenant_and_parsed_arguments() -> None:
    seen: list[tuple[str, str, Any]] = []

    def authorize(auth: AuthContext, args: Any) -> Decision:
        seen.append((auth.tenant, auth.subject, args))
        return Decision.allow()

    arguments = {"order_id": "o1", "amount_cents": 5}
    validate_turn([call("refund", arguments)], registry(authorize=authorize), AUTH)
    assert seen == [("t1", "alice", RefundArgs(order_id="o1", amount_cents=5))]
    other = AuthContext(tenant="t2", subject="bob", operation_id="op2")
    v = only(validate_turn([call("get_order", {"order_id": "o1"})], registry(), other))
    assert code_of(v) is ErrorCode.UNAUTHORIZED


def test_a_crashing_authorizer_fails_closed_without_leaking() -> None:
    def authorize(auth: AuthContext, args: Any) -> bool:
        raise ValueError(SECRET)

    v = only(
        validate_turn(
            [call("refund", {"order_id": "o1", "amount_cents": 5})],
            registry(authorize=authorize),
            AUTH,
        )
    )
    assert code_of(v) is ErrorCode.UNAUTHORIZED
    assert isinstance(v, Rejected)
    assert SECRET not in v.envelope.message and SECRET not in v.reason
    assert "ValueError" in v.reason


def test_policy_denial_is_denied_and_its_reason_stays_in_the_audit() -> None:
    arguments = {"order_id": "o1", "amount_cents": 90_000}
    v = only(validate_turn([call("refund", arguments)], registry(), AUTH))
    assert code_of(v) is ErrorCode.DENIED
    assert isinstance(v, Rejected)
    assert "90000" not in v.envelope.message
    assert "90000" in v.reason


def test_a_crashing_or_vague_policy_fails_closed() -> None:
    def crash(ctx: PolicyContext, args: Any) -> Decision:
        raise KeyError(SECRET)

    for policy in (crash, lambda ctx, args: None):
        arguments = {"order_id": "o1", "amount_cents": 5}
        v = only(validate_turn([call("refund", arguments)], registry(policy=policy), AUTH))
        assert code_of(v) is ErrorCode.DENIED
        assert SECRET not in rejected(v).envelope.message


def test_policy_sees_its_context() -> None:
    seen: list[PolicyContext] = []

    def policy(ctx: PolicyContext, args: Any) -> bool:
        seen.append(ctx)
        return True

    arguments = {"order_id": "o1", "amount_cents": 5}
    validate_turn([call("refund", arguments, "cX")], registry(policy=policy), AUTH)
    assert seen[0].tool == "refund" and seen[0].call_id == "cX"
    assert seen[0].risk is RiskClass.IRREVERSIBLE and seen[0].auth == AUTH
    assert seen[0].policy_revision == "1"


def test_unauthorized_is_checked_before_policy() -> None:
    asked: list[str] = []

    def policy(ctx: PolicyContext, args: Any) -> bool:
        asked.append("policy")
        return True

    reg = registry(authorize=lambda a, b: False, policy=policy)
    v = only(validate_turn([call("refund", {"order_id": "o1", "amount_cents": 5})], reg, AUTH))
    assert code_of(v) is ErrorCode.UNAUTHORIZED
    assert asked == []


# --- approval ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("approval", "expected"),
    [
        (False, Executable),
        (True, NeedsApproval),
        (lambda args, ctx: args.amount_cents > 100, Executable),
        (lambda args, ctx: None, NeedsApproval),
        (lambda args, ctx: 1 / 0, NeedsApproval),
    ],
    ids=["never", "always", "rule-false", "rule-vague", "rule-crash"],
)
def test_approval_rules_fail_closed(approval: Any, expected: type) -> None:
    arguments = {"order_id": "o1", "amount_cents": 5}
    v = only(validate_turn([call("refund", arguments)], registry(approval=approval), AUTH))
    assert type(v) is expected


def _decision(v: Verdict, **kw: Any) -> ApprovalDecision:
    assert isinstance(v, NeedsApproval)
    base: dict[str, Any] = {
        "approval_id": "ap1",
        "call_id": v.call.call_id,
        "args_digest": v.args_digest,
        "approved": True,
    }
    base.update(kw)
    return ApprovalDecision(**base)


def test_revalidation_after_approval_runs_the_call() -> None:
    reg = registry()
    calls = [call("refund", {"order_id": "o1", "amount_cents": 5})]
    tracker = BudgetTracker(Budgets(max_tool_calls=1), now=0.0)
    tracker.record_turn(_usage(), "m")
    first = only(validate_turn(calls, reg, AUTH, tracker))
    decision = _decision(first)
    again = only(validate_turn(calls, reg, AUTH, tracker, approvals={"c1": decision}))
    assert isinstance(again, Executable)
    assert again.approval_id == "ap1"
    assert tracker.tool_calls == 1, "revalidation must not count the call twice"


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"approved": False}, ErrorCode.DENIED),
        ({"expired": True}, ErrorCode.APPROVAL_EXPIRED),
        ({"args_digest": "0" * 64}, ErrorCode.DENIED),
    ],
    ids=["denied", "expired", "other-arguments"],
)
def test_denied_expired_or_mismatched_approvals_reject(
    kw: dict[str, Any], expected: ErrorCode
) -> None:
    reg = registry()
    calls = [call("refund", {"order_id": "o1", "amount_cents": 5})]
    decision = _decision(only(validate_turn(calls, reg, AUTH)), **kw)
    v = only(validate_turn(calls, reg, AUTH, approvals={"c1": decision}))
    assert code_of(v) is expected


def test_revalidation_rechecks_policy() -> None:
    calls = [call("refund", {"order_id": "o1", "amount_cents": 5})]
    decision = _decision(only(validate_turn(calls, registry(), AUTH)))
    stricter = registry(policy=lambda ctx, args: Decision.deny("policy changed"))
    v = only(validate_turn(calls, stricter, AUTH, approvals={"c1": decision}))
    assert code_of(v) is ErrorCode.DENIED


# --- guards ----------------------------------------------------------------------------------


def _usage() -> Usage:
    return Usage(input_tokens=10, output_tokens=1)


def _run_turn(tracker: BudgetTracker, calls: list[ProposedCall], reg: Registry) -> list[Verdict]:
    """One model turn: record it, validate, then 'execute' the executable calls."""
    tracker.record_turn(_usage(), "m")
    verdicts = validate_turn(calls, reg, AUTH, tracker)
    for v in verdicts:
        if isinstance(v, Executable):
            tracker.record_result(v.spec.name, v.args_digest, "same-result")
    return verdicts


def test_repeating_an_identical_call_gets_no_progress_and_then_escalates() -> None:
    reg = registry()
    tracker = BudgetTracker(Budgets(no_progress_limit=2), now=0.0)
    first = _run_turn(tracker, [call("get_order", {"order_id": "o1"})], reg)
    assert isinstance(first[0], Executable)
    second = _run_turn(tracker, [call("get_order", {"order_id": "o1"}, "c2")], reg)
    assert code_of(second[0]) is ErrorCode.NO_PROGRESS
    assert tracker.check_progress() is None
    third = _run_turn(tracker, [call("get_order", {"order_id": "o1"}, "c3")], reg)
    assert code_of(third[0]) is ErrorCode.NO_PROGRESS
    spent = tracker.check_progress()
    assert spent is not None and spent.input is OpInput.NO_PROGRESS


def test_identical_calls_in_one_response_run_once() -> None:
    calls = [call("get_order", {"order_id": "o1"}, "a"), call("get_order", {"order_id": "o1"}, "b")]
    tracker = BudgetTracker(Budgets(), now=0.0)
    tracker.record_turn(_usage(), "m")
    verdicts = validate_turn(calls, registry(), AUTH, tracker)
    assert isinstance(verdicts[0], Executable)
    assert code_of(verdicts[1]) is ErrorCode.NO_PROGRESS


def test_tool_call_budget_rejects_with_budget_exhausted() -> None:
    calls = [call("get_order", {"order_id": f"o{i}"}, f"c{i}", i) for i in range(3)]
    tracker = BudgetTracker(Budgets(max_tool_calls=2), now=0.0)
    tracker.record_turn(_usage(), "m")
    verdicts = validate_turn(calls, registry(), AUTH, tracker)
    assert [type(v) for v in verdicts[:2]] == [Executable, Executable]
    assert code_of(verdicts[2]) is ErrorCode.BUDGET_EXHAUSTED
    spent = tracker.check_before_model_turn(0.0)
    assert spent is not None and spent.budget == "max_tool_calls"


def test_rejected_calls_do_not_consume_the_tool_call_budget() -> None:
    tracker = BudgetTracker(Budgets(max_tool_calls=1), now=0.0)
    tracker.record_turn(_usage(), "m")
    calls = [
        call("refund", {"order_id": "o1", "amount_cents": 90_000}, "a", 0),  # denied
        call("get_order", {"order_id": "o1"}, "b", 1),
    ]
    verdicts = validate_turn(calls, registry(), AUTH, tracker)
    assert code_of(verdicts[0]) is ErrorCode.DENIED
    assert isinstance(verdicts[1], Executable)


# --- turn input ------------------------------------------------------------------------------


def test_turn_input_summarises_the_verdicts() -> None:
    reg = registry()
    ok = call("get_order", {"order_id": "o1"}, "a", 0)
    wait = call("refund", {"order_id": "o1", "amount_cents": 5}, "b", 1)
    bad = call("nope", {}, "c", 2)
    assert turn_input(validate_turn([ok, wait, bad], reg, AUTH)) is OpInput.APPROVAL_NEEDED
    assert turn_input(validate_turn([ok, bad], reg, AUTH)) is OpInput.EXECUTABLE
    assert turn_input(validate_turn([bad], reg, AUTH)) is OpInput.ALL_REJECTED


class _Tagged(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    tags: frozenset[str] = frozenset()


class _WithSets(msgspec.Struct, forbid_unknown_fields=True):
    ids: set[int]
    items: list[_Tagged] = []
    by_name: dict[str, frozenset[int]] = {}


@pytest.mark.parametrize(
    ("arguments", "ok"),
    [
        ({"ids": [7, 8]}, True),
        ({"ids": [7, 7, 8]}, False),  # a set would drop the repeat: a repair
        ({"ids": [1], "items": [{"tags": ["a", "b"]}, {"tags": ["a"]}]}, True),
        ({"ids": [1], "items": [{"tags": ["a", "a"]}]}, False),  # nested in a list
        ({"ids": [1], "by_name": {"x": [2, 3], "y": [2, 2]}}, False),  # a dict's values
    ],
)
def test_an_array_for_a_set_with_a_repeated_item_is_refused(
    arguments: dict[str, Any], ok: bool
) -> None:
    reg = Registry(
        [ToolSpec(name="tagger", description="", args_type=_WithSets, handler=recording_handler)]
    )
    v = only(validate_turn([call("tagger", arguments)], reg, AUTH))
    if ok:
        assert isinstance(v, Executable), v
    else:
        assert code_of(v) is ErrorCode.INVALID_ARGUMENTS
    spec = reg.get("tagger")
    assert spec is not None and spec.set_fields is not None


def test_tools_without_set_fields_are_not_walked() -> None:
    assert all(spec.set_fields is None for spec in registry())
