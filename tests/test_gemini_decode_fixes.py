"""Gemini ``generateContent`` decode fixes (found by a review). Each stream is fed whole,
one byte at a time and at seeded random chunk boundaries, with the same outcome:

- a Vertex streamed string still continuing (``willContinue``) when its call ends is no
  value: the turn fails, instead of proposing the call with the cut string; a number,
  boolean or null piece that says it continues fails too (only strings continue);
- a ``partialArgs`` piece carrying more than one value kind fails (none was already);
- a prompt ``blockReason`` makes the turn a refusal whatever the candidates say;
- a Vertex continuation chunk ends the same whether the fast path (a responseId known)
  or the full chunk handling reads it: a field of the wrong type fails both, and a text
  part inside a streamed call keeps its place in the part order on both;
- an empty ``responseId`` is no id: a later real one names the turn and its call ids;
- the bookkeeping of a streamed call (a path, a piece not yet joined) is charged to a
  budget the size of the argument cap, so many tiny paths or pieces are refused within a
  small multiple of the cap, and the build of a call under it stays small too (these
  memory tests feed their tens of megabytes one frame at a time).
"""

from __future__ import annotations

import json
import random
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from callgate.adapters._vertex_args import PartialArg, StreamedArguments
from callgate.engine import Limits, OutcomeKind, TurnOutcome, decode
from callgate.engine.core.errors import LimitExceeded
from callgate.engine.core.ids import derive_call_id

from .conftest import chunkings

MiB = 1024 * 1024
RID = "resp-1"


def _frame(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\r\n\r\n"


def _cand(
    *parts: dict[str, Any], finish: str | None = None, rid: str | None = RID
) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}}
    if finish is not None:
        cand["finishReason"] = finish
    chunk: dict[str, Any] = {"candidates": [cand], "modelVersion": "gemini-3-pro"}
    if rid is not None:
        chunk["responseId"] = rid
    return chunk


def _fc(**fields: Any) -> dict[str, Any]:
    return {"functionCall": fields}


def _more(*pieces: dict[str, Any], rid: str | None = RID) -> dict[str, Any]:
    """A chunk continuing the streamed call with ``pieces``."""
    return _cand(_fc(partialArgs=list(pieces), willContinue=True), rid=rid)


def _vertex(*pieces: dict[str, Any], rid: str | None = RID) -> bytes:
    """Open call ``f``, one chunk per piece, the empty terminator, then STOP."""
    chunks = [_cand(_fc(name="f", willContinue=True), rid=rid)]
    chunks += [_more(p, rid=rid) for p in pieces]
    chunks += [_cand(_fc(), rid=rid), _cand({"text": ""}, finish="STOP", rid=rid)]
    return b"".join(_frame(c) for c in chunks)


def _decode_all_ways(body: bytes, limits: Limits | None = None) -> TurnOutcome:
    outcomes = [decode("gemini", chunks, limits) for _, chunks in chunkings(body)]
    first = outcomes[0]
    assert all(o == first for o in outcomes[1:])  # whole, byte by byte, random cuts
    return first


def _failed(out: TurnOutcome, why: str) -> None:
    assert out.kind is OutcomeKind.FAILED, out
    assert out.calls == ()
    assert why in (out.stop_reason or ""), out.stop_reason


def _keys(value: dict[str, Any]) -> str:
    return "+".join(value)


# Through the fast path (a responseId known) and through the full chunk handling only.
PATHS = [pytest.param(RID, id="fast-path"), pytest.param(None, id="full-path")]


# --- f1: a value still open when its call ends ----------------------------------------------


@pytest.mark.parametrize("rid", PATHS)
def test_a_string_still_continuing_when_the_call_ends_fails(rid: str | None) -> None:
    cut = {"jsonPath": "$.cmd", "stringValue": "rm -rf /tmp/build", "willContinue": True}
    _failed(_decode_all_ways(_vertex(cut, rid=rid)), "still continues")
    # Another path after it does not end it either.
    body = _vertex(cut, {"jsonPath": "$.n", "numberValue": 1}, rid=rid)
    _failed(_decode_all_ways(body), "'$.cmd' still continues")
    # The recorded way to end a string: a last piece without willContinue.
    ok = _decode_all_ways(_vertex(cut, {"jsonPath": "$.cmd", "stringValue": "/x"}, rid=rid))
    assert ok.kind is OutcomeKind.TOOL_PROPOSALS
    assert ok.calls[0].arguments == {"cmd": "rm -rf /tmp/build/x"}


@pytest.mark.parametrize("rid", PATHS)
@pytest.mark.parametrize(
    "value", [{"numberValue": 1}, {"boolValue": False}, {"nullValue": None}], ids=_keys
)
def test_a_number_boolean_or_null_that_continues_fails(
    value: dict[str, Any], rid: str | None
) -> None:
    piece = {"jsonPath": "$.n", **value, "willContinue": True}
    _failed(_decode_all_ways(_vertex(piece, rid=rid)), "not a string")


# --- f3: one value kind per piece ---------------------------------------------------------


SEVERAL = [
    {"stringValue": "a", "numberValue": 1, "boolValue": True},
    {"stringValue": "a", "numberValue": 1},
    {"stringValue": "a", "boolValue": False},
    {"stringValue": "a", "nullValue": None},
    {"numberValue": 1, "boolValue": True},
    {"numberValue": 0, "nullValue": "NULL_VALUE"},
    {"boolValue": True, "nullValue": None},
]


@pytest.mark.parametrize("rid", PATHS)
@pytest.mark.parametrize("values", SEVERAL, ids=_keys)
def test_a_piece_with_several_values_fails(values: dict[str, Any], rid: str | None) -> None:
    out = _decode_all_ways(_vertex({"jsonPath": "$.n", **values}, rid=rid))
    _failed(out, "carries several values")


@pytest.mark.parametrize("rid", PATHS)
def test_a_continuing_string_piece_with_another_value_fails(rid: str | None) -> None:
    first = {"jsonPath": "$.s", "stringValue": "ab", "willContinue": True}
    second = {"jsonPath": "$.s", "stringValue": "c", "numberValue": 1}
    _failed(_decode_all_ways(_vertex(first, second, rid=rid)), "carries several values")


# --- f4: a blocked prompt -------------------------------------------------------------------


BLOCKED = {"promptFeedback": {"blockReason": "SAFETY"}, "responseId": RID}


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param([BLOCKED, _cand({"text": "Sure, here is"}, finish="STOP")], id="then-text"),
        pytest.param([BLOCKED, _cand(_fc(name="f", args={"a": 1}), finish="STOP")], id="then-call"),
        pytest.param([{**_cand({"text": "Sure"}, finish="STOP"), **BLOCKED}], id="same-chunk"),
        pytest.param(
            [_cand({"text": "Sure"}), BLOCKED, _cand({"text": ""}, finish="STOP")],
            id="between",
        ),
    ],
)
def test_a_blocked_prompt_is_a_refusal_whatever_follows(chunks: list[Any]) -> None:
    out = _decode_all_ways(b"".join(_frame(c) for c in chunks))
    assert (out.kind, out.raw_reason) == (OutcomeKind.REFUSAL, "SAFETY")


def test_an_unspecified_block_reason_is_no_block() -> None:
    # BLOCK_REASON_UNSPECIFIED is the enum's unused default, not a block.
    first = _cand({"text": "Hello"})
    first["promptFeedback"] = {"blockReason": "BLOCK_REASON_UNSPECIFIED"}
    body = _frame(first) + _frame(_cand({"text": ""}, finish="STOP"))
    out = _decode_all_ways(body)
    assert (out.kind, out.text) == (OutcomeKind.FINAL_TEXT, "Hello")


# --- f5: the outcome does not depend on the path that decoded a chunk ------------------------


def _mistyped(rid: str | None, where: str, key: str, value: Any) -> bytes:
    bad = _more({"jsonPath": "$.a", "stringValue": "x"}, rid=rid)
    target = bad if where == "chunk" else bad["candidates"][0]["content"]["parts"][0]
    target[key] = value
    return b"".join(
        _frame(c)
        for c in (
            _cand(_fc(name="f", willContinue=True), rid=rid),
            bad,
            _cand(_fc(), rid=rid),
            _cand({"text": ""}, finish="STOP", rid=rid),
        )
    )


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [
        ("part", "text", 5),
        ("part", "thought", "yes"),
        ("chunk", "modelVersion", 7),
        ("chunk", "responseId", 7),
        ("chunk", "promptFeedback", {"blockReason": 1}),
        ("chunk", "promptFeedback", []),
    ],
    ids=str,
)
def test_a_mistyped_field_fails_on_either_path(where: str, key: str, value: Any) -> None:
    fast = _decode_all_ways(_mistyped(RID, where, key, value))
    full = _decode_all_ways(_mistyped(None, where, key, value))
    _failed(fast, "undecodable")
    _failed(full, "undecodable")
    assert fast.stop_reason == full.stop_reason


def _comparable(out: TurnOutcome) -> tuple[Any, ...]:
    """The outcome without what the responseId itself names (derived call ids)."""
    return (
        out.kind,
        out.raw_reason,
        out.stop_reason,
        out.text,
        [(c.index, c.name, c.arguments, c.raw_arguments, c.error) for c in out.calls],
        [(c.index, c.name, c.reason) for c in out.incomplete_calls],
        out.continuation,
        out.usage,
    )


def test_text_inside_a_streamed_call_keeps_its_order_on_either_path() -> None:
    def body(rid: str | None) -> bytes:
        return b"".join(
            _frame(c)
            for c in (
                _cand(_fc(name="f", willContinue=True), rid=rid),
                _cand({"text": "a"}, rid=rid),
                _more({"jsonPath": "$.a", "stringValue": "x"}, rid=rid),
                _cand({"text": "b"}, rid=rid),
                _cand(_fc(), rid=rid),
                _cand({"text": ""}, finish="STOP", rid=rid),
            )
        )

    fast, full = _decode_all_ways(body(RID)), _decode_all_ways(body(None))
    assert _comparable(fast) == _comparable(full)
    (order,) = [d for d in fast.provider_details if d.kind == "gemini_part_order"]
    assert order.data == {"parts": [["call", 0], ["text", 0, 1], ["text", 1, 2]]}


def _random_part(rng: random.Random) -> dict[str, Any]:
    roll = rng.random()
    if roll < 0.1:
        return _fc(name=rng.choice("fg"), willContinue=True)
    if roll < 0.55:
        piece: dict[str, Any] = {"jsonPath": rng.choice(["$.a", "$.b", "$.c[0]", "$.d.e"])}
        kind = rng.random()
        if kind < 0.7:
            piece["stringValue"] = rng.choice(["", "x", "yz"])
        elif kind < 0.8:
            piece["numberValue"] = 2
        elif kind < 0.9:
            piece["boolValue"] = True
        if rng.random() < 0.6:
            piece["willContinue"] = True
        part = _fc(partialArgs=[piece], willContinue=rng.random() < 0.9)
        if rng.random() < 0.05:
            part[rng.choice(["text", "thought", "inlineData"])] = rng.choice([5, "t", True])
        return part
    if roll < 0.65:
        return _fc()
    if roll < 0.85:
        return {"text": rng.choice(["", "t", "uv"])}
    if roll < 0.95:
        return {"text": "th", "thought": True}
    return {"text": "", "thoughtSignature": "S"}


def test_random_vertex_streams_end_the_same_on_either_path() -> None:
    rng = random.Random(20260601)
    for _ in range(300):
        parts = [_random_part(rng) for _ in range(rng.randint(1, 14))]
        finish = rng.choice(["STOP", "STOP", "MAX_TOKENS", None])
        extra: dict[str, Any] = {}
        if rng.random() < 0.1:
            extra = rng.choice([{"modelVersion": 7}, {"promptFeedback": {"blockReason": "X"}}])
        at = rng.randrange(len(parts))
        outs = []
        for rid in (RID, None):
            chunks = [_cand(p, rid=rid) for p in parts]
            chunks[at].update(extra)
            chunks.append(_cand({"text": ""}, finish=finish, rid=rid))
            outs.append(decode("gemini", [b"".join(_frame(c) for c in chunks)]))
        assert _comparable(outs[0]) == _comparable(outs[1]), parts


# --- f6: an empty responseId ----------------------------------------------------------------


def test_an_empty_response_id_is_no_id() -> None:
    body = _frame(_cand(_fc(name="f", args={}), rid="")) + _frame(
        _cand({"text": ""}, finish="STOP", rid="R2")
    )
    out = _decode_all_ways(body)
    assert out.response_id == "R2" and out.model == "gemini-3-pro"
    (call,) = out.calls
    assert call.call_id_derived and call.call_id == derive_call_id("R2", 0)


def test_an_empty_response_id_does_not_open_the_fast_path() -> None:
    body = b"".join(
        _frame(c)
        for c in (
            _cand(_fc(name="f", willContinue=True), rid=""),
            _more({"jsonPath": "$.a", "stringValue": "x", "willContinue": True}, rid=""),
            _more({"jsonPath": "$.a", "stringValue": "y"}, rid="R2"),
            _cand(_fc(), rid="R2"),
            _cand({"text": ""}, finish="STOP", rid="R2"),
        )
    )
    out = _decode_all_ways(body)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS and out.response_id == "R2"
    (call,) = out.calls
    assert call.arguments == {"a": "xy"} and call.call_id == derive_call_id("R2", 0)


# --- f7: what a streamed call holds beside its bytes -----------------------------------------


def test_paths_beyond_the_bookkeeping_budget_fail() -> None:
    # 300 paths of 5 bytes: far under a 64 KiB cap in bytes, over it in bookkeeping.
    limits = Limits(max_call_argument_bytes=64 * 1024)
    pieces = [{"jsonPath": f"$.{i:03x}", "numberValue": i} for i in range(300)]
    chunks = [_cand(_fc(name="f", willContinue=True))]
    chunks += [_more(*pieces[i : i + 30]) for i in range(0, 300, 30)]
    chunks += [_cand(_fc()), _cand({"text": ""}, finish="STOP")]
    out = _decode_all_ways(b"".join(_frame(c) for c in chunks), limits)
    _failed(out, "max_call_argument_bytes")
    # Fewer paths fit (a path of one level is charged _PATH_COST + _LEVEL_COST).
    del chunks[5:11]
    assert _decode_all_ways(b"".join(_frame(c) for c in chunks), limits).calls


@pytest.mark.parametrize(
    ("limits", "piece", "error"),
    [
        (
            Limits(max_call_argument_bytes=64),
            {"jsonPath": "$.s", "stringValue": "x" * 100},
            "arguments exceed max_call_argument_bytes (64)",
        ),
        (
            Limits(max_json_depth=3),
            {"jsonPath": "$.a.b.c.d", "numberValue": 1},
            "arguments nest deeper than 3 levels",
        ),
    ],
    ids=["bytes", "depth"],
)
def test_a_streamed_call_past_a_per_call_cap_is_refused_alone(
    limits: Limits, piece: dict[str, Any], error: str
) -> None:
    # As for args sent whole: the call is listed, refused; the other call and the turn's
    # kind stand (the per-call caps judge one call, not the stream).
    chunks = [
        _cand(_fc(name="ok", args={"a": 1})),
        _cand(_fc(name="f", willContinue=True)),
        _more(piece),
        _more({"jsonPath": "$.t", "stringValue": "y" * 200}),  # skipped once refused
        _cand(_fc()),
        _cand({"text": ""}, finish="STOP"),
    ]
    out = _decode_all_ways(b"".join(_frame(c) for c in chunks), limits)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS, out.stop_reason
    assert [(c.name, c.arguments, c.raw_arguments, c.error) for c in out.calls] == [
        ("ok", {"a": 1}, b'{"a": 1}', None),
        ("f", None, b"", error),  # a refused call holds no bytes
    ]
    assert not out.incomplete_calls


def test_refused_streamed_calls_still_count_against_the_response_cap() -> None:
    # As refused whole args and spoiled fragment calls do: six calls of 100 bytes, each
    # over its 64-byte cap, are 600 bytes against a 300-byte response.
    limits = Limits(max_call_argument_bytes=64, max_response_argument_bytes=300)
    chunks = []
    for i in range(6):
        chunks += [
            _cand(_fc(name=f"f{i}", willContinue=True)),
            _more({"jsonPath": "$.s", "stringValue": "x" * 100}),
            _cand(_fc()),
        ]
    chunks.append(_cand({"text": ""}, finish="STOP"))
    out = _decode_all_ways(b"".join(_frame(c) for c in chunks), limits)
    assert out.kind is OutcomeKind.FAILED
    assert "max_response_argument_bytes" in (out.stop_reason or "")
    # Two of them fit.
    out = _decode_all_ways(b"".join(_frame(c) for c in [*chunks[:6], chunks[-1]]), limits)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS and len(out.calls) == 2


def _peak(run: Callable[[], object]) -> tuple[int, object]:
    tracemalloc.start()
    try:
        result = run()
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


CAP = 1 * MiB


def _hostile_call(pieces: Callable[[int], dict[str, Any]], n: int, per: int) -> Iterator[bytes]:
    """One streamed call of ``n`` pieces, ``per`` to a chunk, then its end."""
    yield _frame(_cand(_fc(name="f", willContinue=True)))
    for start in range(0, n, per):
        yield _frame(_more(*(pieces(i) for i in range(start, min(n, start + per)))))
    yield _frame(_cand(_fc()))
    yield _frame(_cand({"text": ""}, finish="STOP"))


@pytest.mark.parametrize(
    ("pieces", "n"),
    [
        # Within the byte cap (each path 6-7 bytes): 140k paths counted 0.9 MiB.
        pytest.param(lambda i: {"jsonPath": f"$.{i:x}", "numberValue": 1}, 140_000, id="numbers"),
        pytest.param(lambda i: {"jsonPath": f"$.{i:x}", "stringValue": "v"}, 120_000, id="strings"),
        pytest.param(
            lambda i: {"jsonPath": f"$.a[{i}].b", "numberValue": 0.5}, 70_000, id="array-objects"
        ),
        # 2000 strings left open, 500 one-character pieces each (never joined): 1.0 MiB.
        pytest.param(
            lambda i: {"jsonPath": f"$.{i % 2000:x}", "stringValue": "x", "willContinue": True},
            1_000_000,
            id="open-pieces",
        ),
    ],
)
def test_many_tiny_paths_or_pieces_hold_a_small_multiple_of_the_cap(
    pieces: Callable[[int], dict[str, Any]], n: int
) -> None:
    limits = Limits(max_call_argument_bytes=CAP)
    peak, out = _peak(lambda: decode("gemini", _hostile_call(pieces, n, 2000), limits))
    assert isinstance(out, TurnOutcome)
    _failed(out, "max_call_argument_bytes")
    assert peak < 3 * CAP, f"{peak / CAP:.1f} x the cap"


def test_a_call_just_under_the_budget_builds_within_twice_the_cap() -> None:
    # As many $.a[i].b paths (an object tree to build) as the bookkeeping budget admits
    # (a path of three levels is charged _PATH_COST + 3 * _LEVEL_COST), held and built.
    from callgate.adapters._vertex_args import _LEVEL_COST, _PATH_COST

    per_path = _PATH_COST + 3 * _LEVEL_COST
    limits = Limits(max_call_argument_bytes=CAP)
    n = CAP // per_path - 96

    def held_and_built() -> bytes | None:
        args = StreamedArguments(0, limits)
        for start in range(0, n, 1000):
            end = min(n, start + 1000)
            args.add([PartialArg(f"$.a[{i}].b", number_value=i) for i in range(start, end)])
        return args.build()

    peak, raw = _peak(held_and_built)
    assert isinstance(raw, bytes) and raw.count(b'{"b":') == n
    assert peak < 2 * CAP, f"{peak / CAP:.1f} x the cap"
    with pytest.raises(LimitExceeded):
        StreamedArguments(0, limits).add(
            [PartialArg(f"$.a[{i}].b", number_value=i) for i in range(CAP // per_path + 1)]
        )
