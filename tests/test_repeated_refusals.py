"""The no-progress counter also counts a call refused exactly as the same call was in an
earlier turn (unknown tool, bad arguments, denied): a model that keeps sending it
unchanged is escalated after ``no_progress_limit`` turns, not after ``max_turns``, and
mixing one such call into a turn of duplicates no longer resets the streak. A first
refusal is not futile (the model may correct itself), and revalidation of the same turn
counts nothing twice."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from callgate.engine.core.guards import Budgets, BudgetTracker
from callgate.engine.core.outcome import ProposedCall, Usage
from callgate.engine.core.registry import AuthContext, Registry, ToolContext, ToolSpec
from callgate.engine.core.states import OpState
from callgate.engine.core.validation import validate_turn
from callgate.engine.runtime.replay import ReplayServer

from .loop_helpers import make_runner, turn

P = "openai_chat"
AUTH = AuthContext(tenant="t", subject="s", operation_id="op_refusals")


class N(msgspec.Struct, forbid_unknown_fields=True):
    n: int


async def _echo(args: N, ctx: ToolContext) -> int:
    return args.n


REGISTRY = Registry([ToolSpec(name="echo", description="d", args_type=N, handler=_echo)])


async def _run(turns: list[Any], budgets: Budgets) -> tuple[Any, int]:
    async with ReplayServer(turns) as server:
        runner, _ = make_runner(P, server.base_url, REGISTRY, budgets=budgets)
        result = await runner.start("go")
        return result, len(server.requests)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("name", "args", "code"),
    [("rm_rf", '{"n":1}', "unknown_tool"), ("echo", '{"n":"x"}', "invalid_arguments")],
)
async def test_the_same_refused_call_every_turn_trips_no_progress(
    name: str, args: str, code: str
) -> None:
    turns = [turn(P, calls=[(f"c{i}", name, args)]) for i in range(10)]
    result, requests = await _run(turns, Budgets(no_progress_limit=2, max_turns=10))
    assert result.state is OpState.ESCALATED
    assert result.stop is not None and "no_progress" in result.stop.reason
    # Turn 1 is a first refusal; turns 2 and 3 repeat it: the streak reaches 2.
    assert requests == 3
    assert {c.status for c in result.calls} == {code}


@pytest.mark.anyio
async def test_one_refused_call_among_duplicates_no_longer_resets_the_streak() -> None:
    first = [turn(P, calls=[("a0", "echo", '{"n":1}')])]
    rest = [
        turn(P, calls=[(f"a{i}", "echo", '{"n":1}'), (f"b{i}", "nope", "{}")]) for i in range(1, 10)
    ]
    result, requests = await _run(first + rest, Budgets(no_progress_limit=2, max_turns=10))
    assert result.state is OpState.ESCALATED
    assert result.stop is not None and "no_progress" in result.stop.reason
    assert requests == 4  # turn 2 has a first refusal; turns 3 and 4 are futile


@pytest.mark.anyio
async def test_a_corrected_call_after_a_refusal_is_progress() -> None:
    turns = [
        turn(P, calls=[("c0", "echo", '{"n":"x"}')]),  # refused: invalid_arguments
        turn(P, calls=[("c1", "echo", '{"n":2}')]),  # corrected: runs
        turn(P, text="done"),
    ]
    result, requests = await _run(turns, Budgets(no_progress_limit=1, max_turns=10))
    assert result.state is OpState.COMPLETED and requests == 3
    assert [c.status for c in result.calls] == ["invalid_arguments", "ok"]


def _call(call_id: str, name: str, arguments: dict[str, Any] | None, raw: bytes) -> ProposedCall:
    return ProposedCall(index=0, call_id=call_id, name=name, arguments=arguments, raw_arguments=raw)


def _turn(tracker: BudgetTracker, *calls: ProposedCall) -> None:
    tracker.record_turn(Usage(), "m")
    validate_turn(list(calls), REGISTRY, AUTH, guards=tracker)


def test_revalidating_a_turn_counts_its_refusals_once() -> None:
    tracker = BudgetTracker(Budgets(no_progress_limit=5), now=0.0)
    bad = _call("c0", "nope", {}, b"{}")
    _turn(tracker, bad)
    assert tracker.no_progress_streak == 0  # a first refusal
    validate_turn([bad], REGISTRY, AUTH, guards=tracker)  # the same turn again
    assert tracker.no_progress_streak == 0
    _turn(tracker, _call("c1", "nope", {}, b"{ }"))  # same call, other spacing
    assert tracker.no_progress_streak == 1


def test_unparsed_arguments_are_compared_by_their_bytes() -> None:
    tracker = BudgetTracker(Budgets(no_progress_limit=5), now=0.0)
    _turn(tracker, _call("c0", "echo", None, b'{"n":'))
    _turn(tracker, _call("c1", "echo", None, b'{"n": '))  # other bytes: a new refusal
    assert tracker.no_progress_streak == 0
    _turn(tracker, _call("c2", "echo", None, b'{"n": '))
    assert tracker.no_progress_streak == 1


def test_remembered_refusals_survive_a_snapshot_and_stay_bounded() -> None:
    tracker = BudgetTracker(Budgets(no_progress_limit=5), now=0.0)
    _turn(tracker, _call("c0", "nope", {}, b"{}"))
    restored = BudgetTracker.restore(tracker.budgets, tracker.snapshot(1.0), now=1.0)
    _turn(restored, _call("c1", "nope", {}, b"{}"))
    assert restored.no_progress_streak == 1
    for i in range(600):
        restored.repeats_rejection(f"fp{i}")
    assert len(restored.snapshot(2.0)["rejections"]) == 512
