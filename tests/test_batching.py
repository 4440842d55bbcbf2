"""Batching never changes what a stream means: an adapter's ``decode_batch`` (runs of
argument fragments as ``ArgumentsRun``) gives exactly what the same adapter gives when
driven one SSE event at a time; ``CallAccumulator.fragments`` has exactly the effect of
``fragment`` on each piece in turn, errors and spoiled calls included; and callers of
``StreamDecoder.feed`` only ever see ``ArgumentsDelta``, never a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from callgate.engine.core.accumulator import CallAccumulator
from callgate.engine.core.adapter import Adapter, load_adapter
from callgate.engine.core.decode import StreamDecoder
from callgate.engine.core.errors import CallgateError, LimitExceeded, StreamProtocolError
from callgate.engine.core.events import ArgumentsDelta, ArgumentsRun, EngineEvent
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import OutcomeKind, TurnOutcome
from callgate.engine.core.sse import SSEEvent

from .conftest import chunkings, coalesced, fixture_files

FILES = fixture_files()
IDS = [f"{fam}/{p.name}" for fam, p in FILES]


# --- an adapter driven one event at a time ------------------------------------------------


class _EventByEventStream:
    """An adapter stream with only ``decode`` and ``end``: no ``decode_batch``."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def decode(self, event: SSEEvent) -> list[EngineEvent]:
        out: list[EngineEvent] = self._inner.decode(event)
        return out

    def end(self) -> list[EngineEvent]:
        out: list[EngineEvent] = self._inner.end()
        return out


class EventByEventAdapter:
    """The same adapter, but ``StreamDecoder`` must fall back to one event at a time."""

    def __init__(self, inner: Adapter) -> None:
        self.name = inner.name
        self.family = inner.family
        self.revision = inner.revision
        self.sse_unframed = inner.sse_unframed
        self.finish_reasons = inner.finish_reasons
        self._inner = inner

    def new_stream(self, limits: Limits) -> _EventByEventStream:
        return _EventByEventStream(self._inner.new_stream(limits))


def _run(adapter: Any, chunks: list[bytes]) -> tuple[list[EngineEvent], TurnOutcome]:
    decoder = StreamDecoder(adapter, Limits())
    events: list[EngineEvent] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    return events, decoder.finish()


def test_the_wrapper_really_has_no_decode_batch_and_every_real_adapter_has_one() -> None:
    """The comparison below is between two different code paths, for every family."""
    for provider in sorted({fam for fam, _ in FILES}):
        adapter = load_adapter(provider)
        assert callable(getattr(adapter.new_stream(Limits()), "decode_batch", None)), provider
        wrapped = EventByEventAdapter(adapter).new_stream(Limits())
        assert not hasattr(wrapped, "decode_batch"), provider


@pytest.mark.parametrize(("provider", "path"), FILES, ids=IDS)
def test_decode_batch_and_event_by_event_give_the_same_outcome_and_events(
    provider: str, path: Path
) -> None:
    """For every recorded stream in every feeding mode: the outcome is identical, and so
    are the fed events once each stretch of fragments is joined per call."""
    body = path.read_bytes()
    adapter = load_adapter(provider)
    for mode, chunks in chunkings(body, seed=len(body)):
        batch_events, batch_outcome = _run(adapter, chunks)
        single_events, single_outcome = _run(EventByEventAdapter(adapter), chunks)
        assert batch_outcome == single_outcome, mode
        assert coalesced(batch_events) == coalesced(single_events), mode
        assert not any(type(e) is ArgumentsRun for e in batch_events), mode


def test_whole_chunk_decoding_really_batches_fragments_somewhere() -> None:
    """At least one recorded stream, fed whole, yields fewer fragment events through
    ``decode_batch`` than event by event (so the test above compares two paths that
    actually differ in granularity)."""
    fewer = []
    for provider, path in FILES:
        body = path.read_bytes()
        adapter = load_adapter(provider)
        batch_events, _ = _run(adapter, [body])
        single_events, _ = _run(EventByEventAdapter(adapter), [body])
        n_batch = sum(type(e) is ArgumentsDelta for e in batch_events)
        n_single = sum(type(e) is ArgumentsDelta for e in single_events)
        assert n_batch <= n_single, path.name
        if n_batch < n_single:
            fewer.append(path.name)
    assert fewer


# --- fragments(indexes, pieces) == fragment(index, piece) one by one ----------------------

_NEVER, _OPEN, _DONE = "never", "open", "done"
_ERR = tuple[type, str] | None


def _attempt(fn: Any, *args: Any) -> _ERR:
    try:
        fn(*args)
    except CallgateError as exc:
        return type(exc), str(exc)
    return None


def _accumulator(limits: Limits, states: list[str]) -> CallAccumulator:
    acc = CallAccumulator(limits)
    for index, state in enumerate(states):
        if state != _NEVER:
            acc.start(index, f"f{index}", f"c{index}", None)
        if state == _DONE:
            acc.done(index, None)
    return acc


def _one_by_one(acc: CallAccumulator, indexes: list[int], pieces: list[str]) -> _ERR:
    for index, piece in zip(indexes, pieces, strict=True):
        err = _attempt(acc.fragment, index, piece)
        if err is not None:
            return err
    return None


def _observe(acc: CallAccumulator, states: list[str]) -> tuple[Any, ...]:
    """All that can be observed of the calls: as they stand, then after closing every
    started call still open (its error caught), complete and incomplete."""
    before = (acc.incomplete("x"), acc.open_count, acc.any_done)
    closing = [
        _attempt(acc.done, index, None) for index, state in enumerate(states) if state == _OPEN
    ]
    return (before, closing, acc.complete(None), acc.incomplete("x"), acc.open_count)


def _both_ways(
    limits: Limits, states: list[str], indexes: list[int], pieces: list[str], runs: int = 1
) -> tuple[tuple[_ERR, tuple[Any, ...]], tuple[_ERR, tuple[Any, ...]]]:
    """(error, observed state) after the fragments, applied as ``runs`` consecutive
    ``fragments`` calls (stopping at the first error) and applied one by one."""
    batched = _accumulator(limits, states)
    run_error: _ERR = None
    size = -(-len(pieces) // runs)
    for start in range(0, len(pieces), size):
        run_error = _attempt(
            batched.fragments, indexes[start : start + size], pieces[start : start + size]
        )
        if run_error is not None:
            break
    single = _accumulator(limits, states)
    one_error = _one_by_one(single, indexes, pieces)
    return (run_error, _observe(batched, states)), (one_error, _observe(single, states))


_PIECE_CHARS = st.sampled_from(["{", "}", '"', ":", "1", "a", " ", "é", "€", "😀", "\ud800", "\\"])
_PIECES = st.tuples(
    st.text(_PIECE_CHARS, min_size=1, max_size=6),
    # Mostly short pieces; sometimes long enough to pass the 4096-code-point compaction.
    st.sampled_from([1, 1, 1, 1, 700, 1500]),
).map(lambda t: t[0] * t[1])


@st.composite
def _scenarios(draw: st.DrawFn) -> tuple[Limits, list[str], list[int], list[str], int]:
    states = draw(st.lists(st.sampled_from([_NEVER, _OPEN, _OPEN, _DONE]), min_size=4, max_size=4))
    opened = [i for i, state in enumerate(states) if state == _OPEN]
    # Mostly fragments for open calls (so that runs take the batched path), sometimes
    # for any index (a call never started or already done).
    anywhere = st.integers(0, 3)
    index = st.one_of(st.sampled_from(opened), st.sampled_from(opened), anywhere)
    frags = draw(
        st.lists(st.tuples(index if opened else anywhere, _PIECES), min_size=1, max_size=24)
    )
    indexes, pieces = [i for i, _ in frags], [p for _, p in frags]
    runs = draw(st.integers(1, len(frags)))

    def cap(every_call: bool, most: int) -> int:
        # An edge most of the time: one code point around what a call (or the response)
        # has received after some fragment, so that a cap is crossed by exactly one.
        if draw(st.booleans()):
            k = draw(st.integers(0, len(frags) - 1))
            one = indexes[k]
            sizes = [len(p) for i, p in frags[: k + 1] if every_call or i == one]
            return max(1, sum(sizes) + draw(st.integers(-1, 1)))
        return draw(st.integers(1, most))

    short = len("".join(pieces)) <= 256  # else room for compaction, caps still reachable
    max_call = cap(False, 64 if short else 12_000)
    max_total = cap(True, 64 if short else 24_000)
    limits = Limits(max_call_argument_bytes=max_call, max_response_argument_bytes=max_total)
    return limits, states, indexes, pieces, runs


@settings(max_examples=600, deadline=None)
@given(_scenarios())
@example(
    (
        Limits(max_call_argument_bytes=64, max_response_argument_bytes=64),
        [_OPEN, _OPEN, _NEVER, _DONE],
        [0, 1, 0, 1],
        ['{"a":', '{"b":', "1}", "2}"],
        1,
    )
)
def test_a_run_of_fragments_has_exactly_the_effect_of_each_fragment_in_turn(
    scenario: tuple[Limits, list[str], list[int], list[str], int],
) -> None:
    """Random caps, calls (never started, open, done before any fragment) and fragments
    (non-ASCII, a lone surrogate), cut into consecutive runs: ``fragments`` on each run
    and ``fragment`` one by one raise the same error (or none) and leave the same
    calls, as they stand and once closed, complete and incomplete."""
    limits, states, indexes, pieces, runs = scenario
    batched, single = _both_ways(limits, states, indexes, pieces, runs)
    assert batched == single


def test_a_run_that_crosses_the_per_call_cap_spoils_that_call_at_the_same_fragment() -> None:
    """Call 0 passes its cap at the third of its pieces, in the middle of a run that
    interleaves it with call 1: call 0 is spoiled (and holds nothing), its later pieces
    are dropped silently, call 1 is untouched; exactly as one fragment at a time."""
    limits = Limits(max_call_argument_bytes=12)
    indexes = [0, 1, 0, 1, 0, 0, 1, 0, 1]
    # Call 0 receives 5, 7, then 13 code points (over 12) at the fifth piece; its pieces
    # after that are dropped. Call 1 receives '{"b"', ":", "2", "}".
    pieces = ['{"a":', '{"b"', "12", ":", "345678", "9}", "2", "x", "}"]
    batched, single = _both_ways(limits, [_OPEN, _OPEN], indexes, pieces)
    assert batched == single
    run_error, (before, closing, complete, incomplete, open_count) = batched
    assert run_error is None and closing == [None, None]
    # Before the done signals: call 0 stopped counting at the piece that spoiled it.
    assert [c.received_bytes for c in before[0]] == [13, 7]
    assert incomplete == () and open_count == 0
    call0, call1 = complete
    assert call0.arguments is None and call0.raw_arguments == b""
    assert call0.error == "arguments exceed max_call_argument_bytes (12)"
    assert call1.error is None and call1.arguments == {"b": 2}
    assert call1.raw_arguments == b'{"b":2}'


def test_a_run_that_crosses_the_per_call_cap_in_its_middle_for_one_call() -> None:
    """A run for one call only: the cap is crossed by a piece in the middle, later pieces
    are dropped, and the call's received size stops where it was spoiled."""
    limits = Limits(max_call_argument_bytes=10)
    pieces = ['{"k":', '"abc', 'def"', "}"]  # 5, 9, 13 (over), then 1 more
    batched = _accumulator(limits, [_OPEN])
    assert _attempt(batched.fragments, [0, 0, 0, 0], list(pieces)) is None
    single = _accumulator(limits, [_OPEN])
    assert _one_by_one(single, [0, 0, 0, 0], pieces) is None
    assert batched.incomplete("x") == single.incomplete("x")
    (call,) = batched.incomplete("x")
    assert call.received_bytes == 13  # counted up to the fragment that spoiled it
    assert _observe(batched, [_OPEN]) == _observe(single, [_OPEN])


def test_a_run_that_crosses_the_per_response_cap_fails_at_the_same_fragment() -> None:
    """The response's total passes its cap at the fourth piece of an interleaved run:
    ``LimitExceeded`` is raised there, the three pieces before it are applied, and the
    pieces after it are not; the same as one fragment at a time."""
    limits = Limits(max_response_argument_bytes=20)
    indexes = [0, 1, 0, 1, 0]
    pieces = ["123456", "abcdef", "7890", "ghijklm", "x"]  # 6, 12, 16, then 23 > 20
    batched, single = _both_ways(limits, [_OPEN, _OPEN], indexes, pieces)
    assert batched == single
    run_error, _ = batched
    assert run_error == (LimitExceeded, "limit max_response_argument_bytes=20 exceeded")
    after = _accumulator(limits, [_OPEN, _OPEN])
    assert _attempt(after.fragments, list(indexes), list(pieces)) is not None
    assert [c.received_bytes for c in after.incomplete("x")] == [10, 6]


def test_a_run_that_reaches_a_call_never_started_fails_there() -> None:
    """A protocol error in the middle of a run: the same error, the same pieces applied."""
    indexes, pieces = [0, 0, 2, 0], ["{", '"a"', "x", ":1}"]
    batched, single = _both_ways(Limits(), [_OPEN, _OPEN], indexes, pieces)
    assert batched == single
    assert batched[0] == (
        StreamProtocolError,
        "argument fragment for call index 2 that never started",
    )
    acc = _accumulator(Limits(), [_OPEN, _OPEN])
    _attempt(acc.fragments, indexes, pieces)
    assert [c.received_bytes for c in acc.incomplete("x")] == [4, 0]


def test_a_run_that_reaches_a_done_call_fails_there() -> None:
    indexes, pieces = [1, 0], ["{}", "x"]
    batched, single = _both_ways(Limits(), [_DONE, _OPEN], indexes, pieces)
    assert batched == single
    assert batched[0] == (
        StreamProtocolError,
        "argument fragment for call index 0 after its done signal",
    )


# --- what feed hands out ------------------------------------------------------------------


def _responses_two_interleaved_calls(texts: list[str], size: int) -> bytes:
    def ev(kind: str, body: dict[str, Any]) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **body})}\n\n"

    out = [ev("response.created", {"response": {"id": "resp_1", "model": "m"}})]
    for k in range(len(texts)):
        item = {"id": f"fc_{k}", "type": "function_call", "status": "in_progress"}
        item |= {"arguments": "", "call_id": f"call_{k}", "name": f"tool{k}"}
        out.append(ev("response.output_item.added", {"output_index": k, "item": item}))
    frags = [[t[i : i + size] for i in range(0, len(t), size)] for t in texts]
    for i in range(max(map(len, frags))):
        for k, parts in enumerate(frags):
            if i < len(parts):
                delta = {"item_id": f"fc_{k}", "output_index": k, "delta": parts[i]}
                out.append(ev("response.function_call_arguments.delta", delta))
    for k, text in enumerate(texts):
        done = {"item_id": f"fc_{k}", "output_index": k, "arguments": text}
        out.append(ev("response.function_call_arguments.done", done))
        item = {"id": f"fc_{k}", "type": "function_call", "status": "completed"}
        item |= {"arguments": text, "call_id": f"call_{k}", "name": f"tool{k}"}
        out.append(ev("response.output_item.done", {"output_index": k, "item": item}))
    out.append(ev("response.completed", {"response": {"id": "resp_1", "status": "completed"}}))
    return "".join(out).encode()


def _anthropic_two_interleaved_calls(texts: list[str], size: int) -> bytes:
    def ev(kind: str, body: dict[str, Any]) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **body})}\n\n"

    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m"}
    message |= {"content": [], "stop_reason": None, "usage": {"input_tokens": 1}}
    out = [ev("message_start", {"message": message})]
    for k in range(len(texts)):
        block = {"type": "tool_use", "id": f"toolu_{k}", "name": f"tool{k}", "input": {}}
        out.append(ev("content_block_start", {"index": k, "content_block": block}))
    frags = [[t[i : i + size] for i in range(0, len(t), size)] for t in texts]
    for i in range(max(map(len, frags))):
        for k, parts in enumerate(frags):
            if i < len(parts):
                delta = {"type": "input_json_delta", "partial_json": parts[i]}
                out.append(ev("content_block_delta", {"index": k, "delta": delta}))
    out += [ev("content_block_stop", {"index": k}) for k in range(len(texts))]
    out.append(ev("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {}}))
    out.append(ev("message_stop", {}))
    return "".join(out).encode()


_TEXTS = [
    json.dumps({"path": "src/é.txt", "content": "line\n" * 40 + 'say "hi" 😀 \\ done'}),
    json.dumps({"q": "€" * 90, "n": [1, 2, 3]}, ensure_ascii=False),
]


@pytest.mark.parametrize(
    ("provider", "build"),
    [
        ("openai_responses", _responses_two_interleaved_calls),
        ("anthropic", _anthropic_two_interleaved_calls),
    ],
)
def test_feed_joins_one_chunks_interleaved_fragments_per_call(provider: str, build: Any) -> None:
    """One chunk with many interleaved fragments of two calls: ``feed`` hands out one
    ``ArgumentsDelta`` per call (never a run), whose text is that call's raw arguments."""
    body = build(_TEXTS, 7)
    decoder = StreamDecoder(load_adapter(provider), Limits())
    events = decoder.feed(body)
    outcome = decoder.finish()
    assert outcome.kind is OutcomeKind.TOOL_PROPOSALS
    assert not any(type(e) is ArgumentsRun for e in events)
    deltas = [e for e in events if type(e) is ArgumentsDelta]
    assert [d.index for d in deltas] == [0, 1]  # the run, one delta per call
    for call, text in zip(outcome.calls, _TEXTS, strict=True):
        joined = "".join(d.fragment for d in deltas if d.index == call.index)
        assert joined.encode() == call.raw_arguments == text.encode()
        assert call.arguments == json.loads(text)


@pytest.mark.parametrize(
    ("provider", "build"),
    [
        ("openai_responses", _responses_two_interleaved_calls),
        ("anthropic", _anthropic_two_interleaved_calls),
    ],
)
def test_feed_in_any_chunking_gives_each_calls_text_and_never_a_run(
    provider: str, build: Any
) -> None:
    body = build(_TEXTS, 5)
    for mode, chunks in chunkings(body, seed=3):
        decoder = StreamDecoder(load_adapter(provider), Limits())
        events: list[EngineEvent] = []
        for chunk in chunks:
            events += decoder.feed(chunk)
        outcome = decoder.finish()
        assert all(type(e) is not ArgumentsRun for e in events), mode
        for call, text in zip(outcome.calls, _TEXTS, strict=True):
            joined = "".join(
                e.fragment for e in events if type(e) is ArgumentsDelta and e.index == call.index
            )
            assert joined == text == call.raw_arguments.decode(), mode


def test_the_assembler_applies_a_run_given_to_it_directly() -> None:
    """``TurnAssembler.apply`` takes an ``ArgumentsRun`` too (its public face), with the
    effect of the fragments one by one."""
    from callgate.engine.core.decode import TurnAssembler
    from callgate.engine.core.events import ArgumentsRun, CallDone, CallStarted, Completion
    from callgate.engine.core.outcome import OutcomeKind

    turn = TurnAssembler()
    turn.apply(CallStarted(0, "f", "c0"))
    turn.apply(CallStarted(1, "g", "c1"))
    turn.apply(ArgumentsRun([0, 1, 0, 1], ['{"a"', '{"b"', ":1}", ":2}"]))
    turn.apply(CallDone(0))
    turn.apply(CallDone(1))
    turn.apply(Completion(OutcomeKind.TOOL_PROPOSALS, "tool_calls"))
    outcome = turn.outcome()
    assert [c.arguments for c in outcome.calls] == [{"a": 1}, {"b": 2}]
