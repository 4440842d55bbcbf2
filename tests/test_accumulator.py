"""The accumulator and turn assembler: fragments join per index, parse only on done, caps
hold at their edges, and classification never reports an unfinished turn as complete."""

from __future__ import annotations

import pytest

from callgate.engine.core.accumulator import CallAccumulator
from callgate.engine.core.decode import TurnAssembler
from callgate.engine.core.errors import LimitExceeded, StreamProtocolError
from callgate.engine.core.events import (
    ArgumentsDelta,
    CallDone,
    CallStarted,
    Completion,
    ContinuationItem,
    EngineEvent,
    ProviderError,
    RefusalDelta,
    ResponseMeta,
    TextDelta,
)
from callgate.engine.core.ids import derive_call_id
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import OutcomeKind, ProviderErrorInfo, TurnOutcome

OK = Completion(OutcomeKind.FINAL_TEXT, "stop")


def run(events: list[EngineEvent], limits: Limits | None = None) -> TurnOutcome:
    turn = TurnAssembler(limits or Limits())
    for ev in events:
        turn.apply(ev)
    return turn.outcome()


def call(
    index: int, args: list[str], done: bool = True, call_id: str | None = "c"
) -> list[EngineEvent]:
    evs: list[EngineEvent] = [
        CallStarted(index=index, name="f", call_id=f"{call_id}{index}" if call_id else None)
    ]
    evs += [ArgumentsDelta(index, a) for a in args]
    if done:
        evs.append(CallDone(index))
    return evs


def test_fragments_join_per_index_even_interleaved() -> None:
    evs: list[EngineEvent] = [
        CallStarted(index=0, name="a", call_id="x"),
        CallStarted(index=3, name="b", call_id="y"),
        ArgumentsDelta(3, '{"q":'),
        ArgumentsDelta(0, '{"p":'),
        ArgumentsDelta(0, "1}"),
        ArgumentsDelta(3, '"z"}'),
        CallDone(3),
        CallDone(0),
        Completion(OutcomeKind.TOOL_PROPOSALS, "tool_calls"),
    ]
    out = run(evs)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    assert [(c.index, c.call_id, c.arguments) for c in out.calls] == [
        (0, "x", {"p": 1}),
        (3, "y", {"q": "z"}),
    ]
    assert out.calls[1].raw_arguments == b'{"q":"z"}'


def test_no_done_signal_means_no_complete_call_and_truncated() -> None:
    out = run([*call(0, ['{"a":1}'], done=False), OK])
    assert out.kind is OutcomeKind.TRUNCATED
    assert out.calls == ()
    assert [c.index for c in out.incomplete_calls] == [0]


def test_no_completion_is_truncated_even_with_done_calls() -> None:
    out = run(call(0, ["{}"]))
    assert out.kind is OutcomeKind.TRUNCATED
    assert len(out.calls) == 1  # listed as done, but the turn is not complete


def test_invalid_arguments_stay_in_calls_with_error_and_no_value() -> None:
    out = run([*call(0, ['{"a":1', ","]), Completion(OutcomeKind.TOOL_PROPOSALS, "tool_use")])
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    (c,) = out.calls
    assert c.arguments is None and c.error and "not valid JSON" in c.error
    assert c.raw_arguments == b'{"a":1,'


def test_done_event_arguments_used_when_no_fragments_and_checked_when_both() -> None:
    evs: list[EngineEvent] = [
        CallStarted(index=0, name="f", call_id="a"),
        CallDone(0, '{"k":1}'),
        CallDone(0, '{"k":1}'),  # repeated identical done: no-op
        CallStarted(index=1, name="f", call_id="b"),
        ArgumentsDelta(1, '{"k":1}'),
        CallDone(1, '{"k":2}'),
        OK,
    ]
    out = run(evs)
    assert out.calls[0].arguments == {"k": 1}
    assert out.calls[1].arguments is None and out.calls[1].error and "differ" in out.calls[1].error


def test_disagreeing_repeated_done_spoils_the_call() -> None:
    out = run([*call(0, ['{"k":1}']), CallDone(0, '{"k":9}'), OK])
    assert out.calls[0].arguments is None


@pytest.mark.parametrize(
    "events",
    [
        [CallStarted(index=0, name="f"), CallStarted(index=0, name="g")],
        [ArgumentsDelta(5, "{}")],
        [CallDone(2)],
        [*call(0, ["{}"]), ArgumentsDelta(0, "x")],
    ],
    ids=["index-reused", "fragment-unknown", "done-unknown", "fragment-after-done"],
)
def test_protocol_violations_raise(events: list[EngineEvent]) -> None:
    turn = TurnAssembler(Limits())
    with pytest.raises(StreamProtocolError):
        for ev in events:
            turn.apply(ev)


# A small cap, and one past the size at which held fragments are compacted (4,096 code
# points), reached by small fragments or by one that jumps straight to the cap.
@pytest.mark.parametrize("delta", [-1, 0, 1])
@pytest.mark.parametrize(("cap", "split"), [(64, 10), (10_000, 10), (10_000, 3_000)])
def test_per_call_byte_cap_edges(delta: int, cap: int, split: int) -> None:
    body = '{"s":"' + "x" * (cap - 8 + delta) + '"}'
    assert len(body) == cap + delta
    out = run([*call(0, [body[:split], body[split:]]), OK], Limits(max_call_argument_bytes=cap))
    (c,) = out.calls
    if delta <= 0:
        assert c.arguments == {"s": "x" * (cap - 8 + delta)}
    else:
        assert c.arguments is None and c.error and "max_call_argument_bytes" in c.error
        assert c.raw_arguments == b""  # fragments past the cap are not kept


def test_per_call_cap_counts_utf8_bytes_exactly_on_join() -> None:
    body = '{"s":"' + "é" * 10 + '"}'  # 18 code points, 28 bytes
    out = run([*call(0, [body]), OK], Limits(max_call_argument_bytes=20))
    assert out.calls[0].arguments is None


@pytest.mark.parametrize(("n", "fails"), [(3, False), (4, False), (5, True)])
def test_continuation_items_cap_edges(n: int, fails: bool) -> None:
    # The assembler's own count, whatever an adapter counts before it.
    turn = TurnAssembler(Limits(max_continuation_items=4))
    items = [ContinuationItem("reasoning", i, {"id": f"rs_{i}"}) for i in range(n)]
    if fails:
        with pytest.raises(LimitExceeded) as info:
            for item in items:
                turn.apply(item)
        assert info.value.limit == "max_continuation_items"
    else:
        for ev in [*items, OK]:
            turn.apply(ev)
        assert len(turn.outcome().continuation) == n


@pytest.mark.parametrize(("n", "fails"), [(3, False), (4, False), (5, True)])
def test_calls_per_response_cap_edges(n: int, fails: bool) -> None:
    turn = TurnAssembler(Limits(max_calls_per_response=4))
    evs = [ev for i in range(n) for ev in call(i, ["{}"])]
    if fails:
        with pytest.raises(LimitExceeded):
            for ev in evs:
                turn.apply(ev)
    else:
        for ev in [*evs, OK]:
            turn.apply(ev)
        assert len(turn.outcome().calls) == n


@pytest.mark.parametrize(("total", "fails"), [(99, False), (100, False), (101, True)])
def test_per_response_byte_cap_edges(total: int, fails: bool) -> None:
    acc = CallAccumulator(Limits(max_response_argument_bytes=100))
    acc.start(0, "f", "a", None)
    acc.start(1, "f", "b", None)
    acc.fragment(0, "x" * 50)
    if fails:
        with pytest.raises(LimitExceeded):
            acc.fragment(1, "x" * (total - 50))
    else:
        acc.fragment(1, "x" * (total - 50))


def test_ten_thousand_calls_hit_the_cap_not_memory() -> None:
    turn = TurnAssembler(Limits())
    with pytest.raises(LimitExceeded):
        for i in range(10_000):
            turn.apply(CallStarted(index=i, name="f", call_id=str(i)))


def test_missing_call_id_is_derived_deterministically() -> None:
    evs = [ResponseMeta("resp_1", "m"), *call(0, ["{}"], call_id=None), OK]
    a, b = run(evs), run(evs)
    assert a.calls[0].call_id == b.calls[0].call_id == derive_call_id("resp_1", 0)
    assert a.calls[0].call_id_derived
    assert derive_call_id("resp_1", 0) != derive_call_id("resp_1", 1)
    assert derive_call_id("resp_1", 0) != derive_call_id("resp_2", 0)


def test_refusal_wins_over_stop_and_over_calls() -> None:
    assert run([RefusalDelta("no"), OK]).kind is OutcomeKind.REFUSAL
    assert run([RefusalDelta("no"), *call(0, ["{}"]), OK]).kind is OutcomeKind.REFUSAL


def test_stop_with_complete_calls_is_tool_proposals() -> None:
    assert run([*call(0, ["{}"]), OK]).kind is OutcomeKind.TOOL_PROPOSALS


def test_tool_finish_without_calls_is_failed() -> None:
    out = run([Completion(OutcomeKind.TOOL_PROPOSALS, "tool_calls")])
    assert out.kind is OutcomeKind.FAILED


def test_provider_error_wins_over_completion() -> None:
    out = run([TextDelta("hi"), ProviderError(ProviderErrorInfo(code="overloaded_error")), OK])
    assert out.kind is OutcomeKind.FAILED and out.error and out.error.code == "overloaded_error"


def test_first_completion_counts() -> None:
    out = run([TextDelta("a"), Completion(OutcomeKind.TRUNCATED, "length"), OK])
    assert out.kind is OutcomeKind.TRUNCATED and out.raw_reason == "length"


@pytest.mark.parametrize(("size", "fails"), [(9, False), (10, False), (11, True)])
def test_text_cap_edges(size: int, fails: bool) -> None:
    turn = TurnAssembler(Limits(max_text_bytes=10))
    if fails:
        with pytest.raises(LimitExceeded):
            turn.apply(TextDelta("x" * size))
    else:
        turn.apply(TextDelta("x" * size))
