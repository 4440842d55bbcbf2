"""Loop protection: every budget at its limit and one past it, duplicate detection with
the "new information" rule, the no-progress escalation, and snapshot/restore."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.engine.core.envelope import ErrorCode
from callgate.engine.core.errors import ConfigError
from callgate.engine.core.guards import (
    Admission,
    AdmissionKind,
    Budgets,
    BudgetTracker,
    ExhaustedBudget,
)
from callgate.engine.core.outcome import Usage, token_sum
from callgate.engine.core.states import TRANSITIONS, OpInput, OpState

NOW = 1000.0


def tracker(**kw: Any) -> BudgetTracker:
    return BudgetTracker(Budgets(**kw), now=NOW)


def usage(inp: int = 0, out: int = 0) -> Usage:
    return Usage(input_tokens=inp, output_tokens=out)


def turn(t: BudgetTracker, inp: int = 0, out: int = 0, model: str = "m") -> ExhaustedBudget | None:
    return t.record_turn(usage(inp, out), model)


# --- Budgets ---------------------------------------------------------------------------------


def test_default_budgets_are_valid_and_bounded() -> None:
    b = Budgets()
    assert b.max_turns == 25 and b.max_tool_calls == 100
    assert b.deadline_seconds == 600.0 and b.max_parallelism == 8
    assert b.max_result_bytes == 64 * 1024 and b.max_cost is None


@pytest.mark.parametrize(
    "kw",
    [
        {"max_turns": 0},
        {"max_tool_calls": -1},
        {"max_input_tokens": 0},
        {"max_output_tokens": 0},
        {"max_parallelism": 0},
        {"max_result_bytes": 0},
        {"duplicate_threshold": 0},
        {"no_progress_limit": 0},
        {"max_turns": True},
        {"max_turns": 2.5},
        {"deadline_seconds": 0},
        {"deadline_seconds": -1.0},
        # Kept with the operation as JSON, which has no inf: it could never be resumed.
        {"deadline_seconds": float("inf")},
        {"deadline_seconds": float("nan")},
        {"deadline_seconds": True},
        {"deadline_seconds": 10**400},  # past float's range: a typed error, not Overflow
        {"max_cost": Decimal("-0.01")},
        {"prices": {"m": (Decimal(1),)}},
        {"prices": {"m": (Decimal(1), Decimal(-1))}},
        {"prices": {"m": 3}},
        {"prices": {"m": (1, float("nan"))}},
        {"max_cost": Decimal("NaN")},
        {"max_cost": "5"},
    ],
)
def test_invalid_budgets_are_config_errors(kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        Budgets(**kw)


def test_result_bytes_limit_never_exceeds_the_operation_cap() -> None:
    b = Budgets(max_result_bytes=1000)
    assert b.result_bytes_limit(None) == 1000
    assert b.result_bytes_limit(10) == 10
    assert b.result_bytes_limit(5000) == 1000


def test_price_lookup_is_exact_then_longest_prefix() -> None:
    b = Budgets(prices={"gpt-4o": (2.5, 10), "gpt-4o-mini": (Decimal("0.15"), Decimal("0.6"))})
    assert b.price_for("gpt-4o") == (Decimal("2.5"), Decimal(10))
    assert b.price_for("gpt-4o-mini-2024-07-18") == (Decimal("0.15"), Decimal("0.6"))
    assert b.price_for("gpt-4o-2024-08-06") == (Decimal("2.5"), Decimal(10))
    assert b.price_for("claude") is None
    assert b.price_for(None) is None


# --- turns, tokens, cost, deadline: at the limit and one past it -----------------------------


def test_max_turns_allows_exactly_the_limit() -> None:
    t = tracker(max_turns=3)
    for _ in range(3):
        assert t.check_before_model_turn(NOW) is None
        assert turn(t) is None
    spent = t.check_before_model_turn(NOW)
    assert spent == ExhaustedBudget(budget="max_turns", limit="3", used="3")
    assert spent.input is OpInput.BUDGET_EXHAUSTED
    assert "max_turns" in spent.reason


@pytest.mark.parametrize(
    ("field", "inp", "out"),
    [("max_input_tokens", 100, 0), ("max_output_tokens", 0, 100)],
)
def test_token_budgets_at_limit_and_limit_plus_one(field: str, inp: int, out: int) -> None:
    at = tracker(**{field: 100})
    assert turn(at, inp, out) is None, "using exactly the budget is not an overrun"
    spent = at.check_before_model_turn(NOW)
    assert spent is not None and spent.budget == field, "nothing is left for another turn"

    over = tracker(**{field: 100})
    spent = turn(over, inp + (1 if inp else 0), out + (1 if out else 0))
    assert spent is not None and spent.budget == field and spent.used == "101"

    under = tracker(**{field: 100})
    assert turn(under, max(inp - 1, 0), max(out - 1, 0)) is None
    assert under.check_before_model_turn(NOW) is None


def test_tokens_accumulate_across_turns_and_missing_usage_counts_zero() -> None:
    t = tracker(max_input_tokens=100)
    assert turn(t, 60) is None
    assert t.record_turn(Usage(), "m") is None
    assert turn(t, 41) is not None
    assert t.input_tokens == 101


def test_cost_budget_at_limit_and_limit_plus_one() -> None:
    # 1,000,000 input tokens at 2 per 1M = 2.00; output at 8 per 1M.
    budgets = {"max_cost": Decimal(2), "prices": {"m": (Decimal(2), Decimal(8))}}
    at = tracker(**budgets)
    assert turn(at, 1_000_000) is None
    assert at.cost == Decimal(2)
    spent = at.check_before_model_turn(NOW)
    assert spent is not None and spent.budget == "max_cost"

    over = tracker(**budgets)
    spent = turn(over, 1_000_000, 1)
    assert spent is not None and spent.budget == "max_cost"
    assert Decimal(spent.used) == Decimal(2) + Decimal(8) / Decimal(1_000_000)


def test_float_prices_do_not_carry_binary_noise() -> None:
    t = tracker(max_cost=1, prices={"m": (0.1, 0.2)})
    turn(t, 1_000_000, 1_000_000)
    assert t.cost == Decimal("0.3")


def test_an_unpriced_model_exhausts_a_cost_budget() -> None:
    t = tracker(max_cost=Decimal(100), prices={"other": (1, 1)})
    spent = turn(t, 1, 1, model="mystery")
    assert spent is not None and spent.budget == "max_cost" and "mystery" in spent.used
    assert t.check_before_model_turn(NOW) is not None


def test_without_a_cost_budget_prices_are_optional() -> None:
    t = tracker()
    assert turn(t, 10, 10, model="mystery") is None
    assert t.cost == Decimal(0)


def test_deadline_at_limit_and_past_it() -> None:
    t = tracker(deadline_seconds=10.0)
    assert t.check_before_model_turn(NOW + 9.999) is None
    assert t.remaining_seconds(NOW + 4.0) == pytest.approx(6.0)
    at = t.check_before_model_turn(NOW + 10.0)
    assert at is not None and at.budget == "deadline_seconds"
    assert at.input is OpInput.DEADLINE
    assert t.check_deadline(NOW + 11.0) is not None
    assert t.remaining_seconds(NOW + 11.0) == 0.0


def test_every_exhaustion_input_ends_escalated() -> None:
    for event in (OpInput.BUDGET_EXHAUSTED, OpInput.DEADLINE):
        assert TRANSITIONS[(OpState.RESULTS_READY, event)] is OpState.ESCALATED
    assert TRANSITIONS[(OpState.RESULTS_READY, OpInput.NO_PROGRESS)] is OpState.ESCALATED


# --- tool calls and duplicates -------------------------------------------------------------


def test_max_tool_calls_admits_exactly_the_limit() -> None:
    t = tracker(max_tool_calls=3)
    turn(t)
    for i in range(3):
        assert t.admit_call("tool", f"d{i}", call_id=f"c{i}").ok
    refused = t.admit_call("tool", "d3", call_id="c3")
    assert refused.kind is AdmissionKind.BUDGET_EXHAUSTED
    assert refused.error_code is ErrorCode.BUDGET_EXHAUSTED
    assert t.tool_calls == 3
    spent = t.check_before_model_turn(NOW)
    assert spent is not None and spent.budget == "max_tool_calls"


def test_using_the_whole_tool_call_budget_without_a_refusal_lets_the_model_answer() -> None:
    t = tracker(max_tool_calls=1)
    turn(t)
    assert t.admit_call("tool", "d", call_id="c").ok
    assert t.check_before_model_turn(NOW) is None


def test_admission_is_idempotent_per_call_id_within_a_turn() -> None:
    t = tracker(max_tool_calls=1)
    turn(t)
    first = t.admit_call("tool", "d", call_id="c")
    assert t.admit_call("tool", "d", call_id="c") == first
    assert t.tool_calls == 1


def test_identical_call_in_the_same_turn_is_no_progress() -> None:
    t = tracker()
    turn(t)
    assert t.admit_call("tool", "d", call_id="a").ok
    second = t.admit_call("tool", "d", call_id="b")
    assert second.kind is AdmissionKind.NO_PROGRESS
    assert second.error_code is ErrorCode.NO_PROGRESS
    assert t.admit_call("other", "d", call_id="c").ok, "another tool is not a duplicate"


def execute(t: BudgetTracker, tool: str, digest: str, result: str, call_id: str) -> Admission:
    admission = t.admit_call(tool, digest, call_id=call_id)
    if admission.ok:
        t.record_result(tool, digest, result)
    return admission


def test_repeat_without_new_information_is_no_progress() -> None:
    t = tracker()
    turn(t)
    assert execute(t, "get", "d", "r1", "c1").ok
    turn(t)
    assert execute(t, "get", "d", "r1", "c2").kind is AdmissionKind.NO_PROGRESS


def test_an_identical_retry_after_a_failure_that_invites_it_is_admitted_up_to_the_threshold() -> (
    None
):
    # A timeout or handler error tells the model to retry: that answer is nothing to act
    # on, so the identical retry is no "no new information" refusal; duplicate_threshold
    # still ends a tool that always fails.
    t = tracker(duplicate_threshold=3)
    for i in range(3):
        turn(t)
        admission = t.admit_call("get", "d", call_id=f"c{i}")
        assert admission.ok, (i, admission.reason)
        t.record_result("get", "d", "timeout-envelope", failed=True)
    turn(t)
    last = t.admit_call("get", "d", call_id="c3")
    assert last.kind is AdmissionKind.NO_PROGRESS and "3 times" in last.reason


def test_a_success_after_a_retried_failure_is_the_information_again() -> None:
    t = tracker()
    turn(t)
    assert t.admit_call("get", "d", call_id="c1").ok
    t.record_result("get", "d", "timeout-envelope", failed=True)
    turn(t)
    assert execute(t, "get", "d", "r1", "c2").ok  # the retry ran, and answered
    turn(t)
    assert execute(t, "get", "d", "r1", "c3").kind is AdmissionKind.NO_PROGRESS


def test_a_non_duplicate_call_in_a_later_turn_is_new_information() -> None:
    t = tracker()
    turn(t)
    assert execute(t, "get", "d", "r1", "c1").ok
    turn(t)
    assert execute(t, "other", "x", "r2", "c2").ok
    turn(t)
    assert execute(t, "get", "d", "r1", "c3").ok


def test_results_from_the_same_turn_are_not_new_information() -> None:
    t = tracker()
    turn(t)
    assert execute(t, "get", "d", "r1", "c1").ok
    assert execute(t, "other", "x", "r2", "c2").ok  # same turn: the model saw both together
    turn(t)
    assert execute(t, "get", "d", "r1", "c3").kind is AdmissionKind.NO_PROGRESS


def test_a_changed_result_is_new_information_an_unchanged_one_is_not() -> None:
    t = tracker()
    turn(t)
    assert execute(t, "poll", "p", "pending", "c1").ok
    turn(t)
    assert execute(t, "get", "d", "r", "c2").ok  # new information for poll
    turn(t)
    assert execute(t, "poll", "p", "done", "c3").ok  # and poll's result changed
    turn(t)
    assert execute(t, "get", "d", "r", "c4").ok, "poll's changed result is new information"
    turn(t)
    # get's repeat returned the same result: nothing new since poll last ran.
    assert execute(t, "poll", "p", "done", "c5").kind is AdmissionKind.NO_PROGRESS


def test_duplicate_threshold_at_limit_and_limit_plus_one() -> None:
    t = tracker(duplicate_threshold=2)
    for i in range(2):
        turn(t)
        assert execute(t, "poll", "p", f"r{i}", f"c{i}").ok
        turn(t)
        assert execute(t, "noise", f"n{i}", "x", f"n{i}").ok  # new information
    turn(t)
    third = execute(t, "poll", "p", "r2", "c2")
    assert third.kind is AdmissionKind.NO_PROGRESS
    assert "2 times" in third.reason


# --- no-progress counter -------------------------------------------------------------------


def test_no_progress_limit_at_limit_and_limit_plus_one() -> None:
    t = tracker(no_progress_limit=3)
    for streak in (1, 2):
        turn(t)
        assert t.record_validation(calls=2, futile=2) is None
        assert t.no_progress_streak == streak
    turn(t)
    spent = t.record_validation(calls=1, futile=1)
    assert spent is not None and spent.input is OpInput.NO_PROGRESS
    assert spent.budget == "no_progress_limit" and spent.used == "3"
    assert t.check_progress() == spent
    assert t.check_before_model_turn(NOW) == spent
    turn(t)
    assert t.record_validation(calls=1, futile=1) is not None, "limit + 1 stays exhausted"


def test_a_useful_call_resets_the_no_progress_streak() -> None:
    t = tracker(no_progress_limit=2)
    turn(t)
    t.record_validation(calls=1, futile=1)
    turn(t)
    t.record_validation(calls=3, futile=2)
    assert t.no_progress_streak == 0
    turn(t)
    assert t.record_validation(calls=1, futile=1) is None


def test_revalidating_a_turn_does_not_count_it_twice_and_zero_calls_change_nothing() -> None:
    t = tracker(no_progress_limit=2)
    turn(t)
    t.record_validation(calls=1, futile=1)
    t.record_validation(calls=1, futile=1)
    assert t.no_progress_streak == 1
    t.record_validation(calls=0, futile=0)
    assert t.no_progress_streak == 1


# --- snapshot / restore ----------------------------------------------------------------------


def busy_tracker() -> BudgetTracker:
    t = BudgetTracker(
        Budgets(max_cost=Decimal(5), prices={"m": (Decimal("1.25"), Decimal(3))}), now=NOW
    )
    turn(t, 1000, 200)
    execute(t, "get", "d1", "r1", "c1")
    t.admit_call("slow", "d2", call_id="c2")  # admitted, waiting for approval
    t.record_validation(calls=2, futile=0)
    return t


def test_snapshot_is_json_and_restore_round_trips() -> None:
    t = busy_tracker()
    snap = t.snapshot(NOW + 5.0)
    wire = json.loads(json.dumps(snap))
    restored = BudgetTracker.restore(t.budgets, wire, now=50.0)  # another process's clock
    assert restored.snapshot(50.0) == snap
    assert restored.cost == t.cost == Decimal("0.0018500")
    assert restored.turns == 1 and restored.tool_calls == 2
    # Admissions of the paused turn are kept: revalidation does not double-count.
    assert restored.admit_call("slow", "d2", call_id="c2").ok
    assert restored.tool_calls == 2
    # Duplicates survive the pause.
    turn(restored)
    assert execute(restored, "get", "d1", "r1", "c9").kind is AdmissionKind.NO_PROGRESS


def test_time_between_snapshot_and_restore_is_not_counted() -> None:
    t = tracker(deadline_seconds=10.0)
    snap = t.snapshot(NOW + 6.0)
    restored = BudgetTracker.restore(t.budgets, snap, now=5_000_000.0)
    assert restored.elapsed(5_000_000.0) == pytest.approx(6.0)
    assert restored.check_deadline(5_000_003.9) is None
    assert restored.check_deadline(5_000_004.0) is not None


@pytest.mark.parametrize(
    "snap",
    [{"turns": "many"}, {"version": 2}, {"cost": "not a number"}, {"executions": []}],
)
def test_malformed_snapshots_are_config_errors(snap: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        BudgetTracker.restore(Budgets(), snap, now=0.0)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("turn"), st.integers(0, 50), st.integers(0, 50)),
        st.tuples(st.just("call"), st.sampled_from("ab"), st.sampled_from("xy")),
        st.tuples(st.just("validate"), st.integers(0, 3), st.integers(0, 3)),
        st.tuples(st.just("pause"), st.integers(0, 5), st.integers(0, 0)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_a_restored_tracker_behaves_exactly_like_the_original(ops: list[tuple[Any, ...]]) -> None:
    budgets = Budgets(
        max_turns=6,
        max_tool_calls=5,
        max_input_tokens=200,
        max_output_tokens=200,
        duplicate_threshold=2,
        no_progress_limit=2,
        deadline_seconds=60.0,
        max_cost=Decimal("0.001"),
        prices={"m": (Decimal(1), Decimal(2))},
    )
    a = BudgetTracker(budgets, now=0.0)
    b = BudgetTracker(budgets, now=0.0)
    clock = 0.0
    for n, op in enumerate(ops):
        kind, x, y = op
        if kind == "turn":
            assert a.record_turn(usage(x, y), "m") == b.record_turn(usage(x, y), "m")
        elif kind == "call":
            ra = execute(a, x, y, f"r{n % 2}", f"c{n}")
            rb = execute(b, x, y, f"r{n % 2}", f"c{n}")
            assert ra == rb
        elif kind == "validate":
            assert a.record_validation(x, y) == b.record_validation(x, y)
        else:
            clock += x
            snap = json.loads(json.dumps(b.snapshot(clock)))
            b = BudgetTracker.restore(budgets, snap, now=clock)
        assert a.check_before_model_turn(clock) == b.check_before_model_turn(clock)
    assert a.snapshot(clock) == b.snapshot(clock)


def test_a_negative_usage_count_never_refunds_the_token_and_cost_budgets() -> None:
    tokens = tracker(max_output_tokens=100)
    money = tracker(max_cost=1, prices={"m": (10_000, 10_000)})  # 0.01 a token
    for t, budget in ((tokens, "max_output_tokens"), (money, "max_cost")):
        assert turn(t, out=90) is None
        assert turn(t, inp=-5_000, out=-1_000_000) is None  # bad provider input: 0
        spent = turn(t, out=20)
        assert spent is not None and spent.budget == budget
    kept = tokens.snapshot(NOW)
    assert kept["output_tokens"] == 110 and kept["input_tokens"] == 0


def test_a_negative_part_never_cancels_the_others_in_a_sum() -> None:
    # Anthropic's billed input is input + cache read + cache write: a negative cache count
    # must not turn a million input tokens into none.
    assert token_sum(1_000_000, -1_000_000, None) == 1_000_000
    assert token_sum(None, None) is None and token_sum(-5) == 0
    plus = Usage(input_tokens=10).plus(Usage(input_tokens=-10, output_tokens=-1))
    assert (plus.input_tokens, plus.output_tokens) == (10, 0)
