"""The forms a done event can take, as the accumulator reads them: a repeated argument
text as a raw JSON string literal (``CallDone.literal``: a short one decoded whole, a long
one compared a slice at a time), whole arguments without fragments (a literal, or the
exact bytes ``CallDone.raw``), a repeated done; and the two ways a call is rejected after
its fragments were accepted one by one: more UTF-8 bytes than its cap, a lone surrogate."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from callgate.engine.core.accumulator import CallAccumulator
from callgate.engine.core.decode import TurnAssembler
from callgate.engine.core.errors import LimitExceeded, StreamProtocolError
from callgate.engine.core.events import (
    ArgumentsDelta,
    CallDone,
    CallStarted,
    Completion,
    EngineEvent,
)
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import OutcomeKind, ProposedCall

DIFFER = "arguments in the done event differ from the streamed fragments"
DISAGREE = "done events disagree about the arguments"
SURROGATE = "arguments contain a lone surrogate"
NOT_A_STRING = "arguments in the done event are not a JSON string"
SLICE = 1 << 15  # a literal longer than this is compared a slice at a time

# How the literal spells each character of the argument text: escapes where the JSON
# rules need them or allow them (\u00e9, a surrogate pair), raw UTF-8 for the rest.
_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\t": "\\t",
    "é": "\\u00e9",
    "😀": "\\ud83d\\ude00",
}
# A stretch of argument text full of what a cut must not split: an escaped quote and an
# escaped backslash inside a JSON string (each doubled by the literal), \u00e9, a
# surrogate pair, raw 2-, 3- and 4-byte characters, and plain characters between them.
_MARK = 'a\\"b\\\\cé😀dü€🎉e\\"\\\\é'


def literal(text: str) -> bytes:
    """``text`` as a JSON string literal, quotes included, escapes as in ``_ESCAPES``."""
    return ('"' + "".join(_ESCAPES.get(c, c) for c in text) + '"').encode()


def raw(text: str) -> msgspec.Raw:
    return msgspec.Raw(literal(text))


def _lit_len(text: str) -> int:
    return len(literal(text)) - 1  # without the closing quote


def long_text(shift: int, boundaries: int = 3) -> str:
    """Argument text whose literal is over 32 KiB and has ``_MARK`` starting ``shift``
    bytes before each of the first nominal slice boundaries of the literal."""
    text = '{"s":"'
    for k in range(1, boundaries + 1):
        target = 1 + k * SLICE - shift  # literal offset where this mark should start
        text += "x" * (target - _lit_len(text))
        assert _lit_len(text) == target
        text += _MARK
    return text + 'y",\n"t":"\\\\\\tz"}'


SHORT_TEXT = '{"s":"' + _MARK + '",\n"t":[1,2]}'
SHIFTS = list(range(0, 40, 1))


def fragments(text: str, size: int = 8) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def accumulate(
    pieces: list[str],
    *dones: dict[str, Any],
    limits: Limits | None = None,
    read_between: bool = False,
) -> ProposedCall:
    """Call 0 gets ``pieces`` one fragment at a time, then one ``done`` per mapping of
    keyword arguments (``complete`` in between when ``read_between``); its result."""
    acc = CallAccumulator(limits or Limits())
    acc.start(0, "f", "c0", None)
    for piece in pieces:
        acc.fragment(0, piece)
    for i, done in enumerate(dones):
        if read_between and i:
            acc.complete(None)
        acc.done(0, done.get("arguments"), done.get("raw"), done.get("literal"))
    (call,) = acc.complete(None)
    return call


def test_the_long_texts_literals_are_long_and_the_short_ones_short() -> None:
    """The long cases really take the slice path (and the short ones the whole decode),
    and the literal really spells the text."""
    assert len(literal(SHORT_TEXT)) <= SLICE
    assert msgspec.json.decode(literal(SHORT_TEXT)) == SHORT_TEXT
    for shift in (0, 39):
        text = long_text(shift)
        assert len(literal(text)) > 3 * SLICE
        assert msgspec.json.decode(literal(text)) == text
        assert json.loads(text)["t"] == "\\\tz"


# --- a literal that repeats the streamed fragments ----------------------------------------


def _accepted(call: ProposedCall, text: str) -> None:
    assert call.error is None
    assert call.arguments == json.loads(text)
    assert call.raw_arguments == text.encode()


def test_short_literal_equal_to_the_fragments_is_accepted() -> None:
    call = accumulate(fragments(SHORT_TEXT), {"literal": raw(SHORT_TEXT)})
    _accepted(call, SHORT_TEXT)
    # The same text spelled with raw UTF-8 instead of escapes: still the same text.
    spelled = msgspec.Raw(msgspec.json.encode(SHORT_TEXT))
    assert bytes(spelled) != literal(SHORT_TEXT)
    _accepted(accumulate(fragments(SHORT_TEXT), {"literal": spelled}), SHORT_TEXT)


@pytest.mark.parametrize("shift", SHIFTS)
def test_long_literal_equal_to_the_fragments_is_accepted_wherever_slices_are_cut(
    shift: int,
) -> None:
    """Escapes, a surrogate pair and multi-byte characters straddle each slice boundary
    at every offset: the slice-by-slice comparison still finds the texts equal, and
    gives exactly what the decoded text given as ``arguments`` gives."""
    text = long_text(shift)
    call = accumulate(fragments(text), {"literal": raw(text)})
    _accepted(call, text)
    assert call == accumulate(fragments(text), {"arguments": text})


def test_long_literal_spelled_with_raw_utf8_is_the_same_text() -> None:
    text = long_text(5)
    spelled = msgspec.Raw(msgspec.json.encode(text))
    assert len(spelled) > SLICE and bytes(spelled) != literal(text)
    _accepted(accumulate(fragments(text), {"literal": spelled}), text)


def _differs(call: ProposedCall) -> None:
    assert call.error == DIFFER
    assert call.arguments is None
    assert call.raw_arguments == b""


def _changed(text: str, at: int) -> str:
    """``text`` with the ``é`` of the mark at or after ``at`` replaced by ``è``."""
    pos = text.index("é", at)
    return text[:pos] + "è" + text[pos + 1 :]


def test_short_literal_that_differs_from_the_fragments_rejects_the_call() -> None:
    for told in (_changed(SHORT_TEXT, 0), SHORT_TEXT[:-1], SHORT_TEXT + " ", ""):
        _differs(accumulate(fragments(SHORT_TEXT), {"literal": raw(told)}))
    # More fragments than the literal holds.
    _differs(accumulate([*fragments(SHORT_TEXT), " "], {"literal": raw(SHORT_TEXT)}))


@pytest.mark.parametrize("shift", [0, 3, 6, 11, 17, 29])
def test_long_literal_that_differs_from_the_fragments_rejects_the_call(shift: int) -> None:
    """A one-character difference inside any slice (next to its boundary), one character
    more or less at the end, or fragments longer than the literal: each is caught, and
    exactly as when the decoded text is given as ``arguments``."""
    text = long_text(shift)
    marks = [i for i in range(len(text)) if text.startswith(_MARK, i)]
    assert len(marks) == 3
    told = [*(_changed(text, m) for m in marks), text[:-1], text + " ", text[:SLICE]]
    for other in told:
        call = accumulate(fragments(text), {"literal": raw(other)})
        _differs(call)
        assert call == accumulate(fragments(text), {"arguments": other})
    _differs(accumulate([*fragments(text), " "], {"literal": raw(text)}))


# --- a literal that is not a valid JSON string --------------------------------------------


def _broken(text: str, at: int, bad: bytes) -> msgspec.Raw:
    """The literal of ``text`` with ``bad`` bytes inserted at literal offset ``at``."""
    good = literal(text)
    return msgspec.Raw(good[:at] + bad + good[at:])


BAD = [pytest.param(b"\\q", id="bad-escape"), pytest.param(b"\xff", id="invalid-utf8")]


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize(
    ("text", "where"),
    [
        pytest.param(SHORT_TEXT, 8, id="short"),
        pytest.param(long_text(0), 8, id="long-first-slice"),
        pytest.param(long_text(0), 2 * SLICE + 100, id="long-later-slice"),
        pytest.param(long_text(0), -2, id="long-last-bytes"),
    ],
)
def test_invalid_literal_is_a_protocol_error(text: str, where: int, bad: bytes) -> None:
    """A bad escape or invalid UTF-8 anywhere in the literal: ``StreamProtocolError``,
    whether the fragments equal the text (so the comparison reaches the bad bytes),
    differ from its first bytes (the literal is still read to its end), or are absent
    (whole arguments)."""
    at = where if where >= 0 else len(literal(text)) + where
    good = literal(text)
    # The bad bytes go between two of the literal's characters, never inside an escape:
    # a plain character there would leave the literal valid.
    assert len(msgspec.json.decode(good[:at] + b"Z" + good[at:])) == len(text) + 1
    told = _broken(text, at, bad)
    for pieces in (fragments(text), ["[", *fragments(text)], []):
        with pytest.raises(StreamProtocolError, match=NOT_A_STRING):
            accumulate(pieces, {"literal": told})


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("text", [SHORT_TEXT, long_text(7)], ids=["short", "long"])
def test_invalid_literal_is_a_protocol_error_even_for_a_spoiled_call(text: str, bad: bytes) -> None:
    """A call already over its cap has nothing to compare, but the literal is still
    checked for what it is."""
    limits = Limits(max_call_argument_bytes=16)
    told = _broken(text, len(literal(text)) - 2, bad)
    with pytest.raises(StreamProtocolError, match=NOT_A_STRING):
        accumulate(fragments(text), {"literal": told}, limits=limits)
    # The same literal, valid: no error, the call is spoiled by its cap.
    call = accumulate(fragments(text), {"literal": raw(text)}, limits=limits)
    assert call.error == "arguments exceed max_call_argument_bytes (16)"


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("text", [SHORT_TEXT, long_text(7)], ids=["short", "long"])
def test_invalid_literal_in_a_repeated_done_is_a_protocol_error(text: str, bad: bytes) -> None:
    told = _broken(text, len(literal(text)) - 2, bad)
    for read_between in (False, True):
        with pytest.raises(StreamProtocolError, match=NOT_A_STRING):
            accumulate(
                fragments(text),
                {"literal": raw(text)},
                {"literal": told},
                read_between=read_between,
            )


def test_escaped_lone_surrogate_in_a_literal_is_a_protocol_error_short_or_long() -> None:
    for n in (10, SLICE - 12, SLICE - 6, SLICE, 40_000):
        told = msgspec.Raw(b'"{\\"s\\":\\"' + b"x" * n + b'\\ud800\\"}"')
        for pieces in ([], ['{"s":"' + "x" * n + '\ud800"}']):
            with pytest.raises(StreamProtocolError, match=NOT_A_STRING):
                accumulate(pieces, {"literal": told})


# --- whole arguments in the done event ----------------------------------------------------


@pytest.mark.parametrize("text", [SHORT_TEXT, long_text(13)], ids=["short", "long"])
def test_literal_without_fragments_gives_the_whole_arguments(text: str) -> None:
    call = accumulate([], {"literal": raw(text)})
    _accepted(call, text)
    assert call == accumulate([], {"arguments": text})


def test_empty_literal_without_fragments_means_no_arguments() -> None:
    call = accumulate([], {"literal": msgspec.Raw(b'""')})
    assert call.error is None and call.arguments == {} and call.raw_arguments == b""


# --- a repeated done ----------------------------------------------------------------------


@pytest.mark.parametrize("text", [SHORT_TEXT, long_text(2)], ids=["short", "long"])
@pytest.mark.parametrize("read_between", [False, True], ids=["unread", "read"])
@pytest.mark.parametrize("streamed", [True, False], ids=["fragments", "whole"])
def test_repeated_done_with_an_equal_literal_keeps_the_call(
    text: str, read_between: bool, streamed: bool
) -> None:
    """Responses sends the text twice (arguments.done, output_item.done): an equal
    repetition changes nothing, whether the call was already read or not, and whether
    its text came in fragments or whole in the first done."""
    pieces = fragments(text) if streamed else []
    call = accumulate(
        pieces, {"literal": raw(text)}, {"literal": raw(text)}, read_between=read_between
    )
    _accepted(call, text)
    # A repeated done with no text at all is a no-op as well.
    _accepted(accumulate(pieces, {"literal": raw(text)}, {}, read_between=read_between), text)


@pytest.mark.parametrize("text", [SHORT_TEXT, long_text(2)], ids=["short", "long"])
@pytest.mark.parametrize("read_between", [False, True], ids=["unread", "read"])
@pytest.mark.parametrize("streamed", [True, False], ids=["fragments", "whole"])
def test_repeated_done_with_a_different_literal_rejects_the_call(
    text: str, read_between: bool, streamed: bool
) -> None:
    pieces = fragments(text) if streamed else []
    for other in (_changed(text, len(text) // 2), text[:-1], text + " "):
        call = accumulate(
            pieces, {"literal": raw(text)}, {"literal": raw(other)}, read_between=read_between
        )
        assert call.error == DISAGREE
        assert call.arguments is None


def test_repeated_done_disagreeing_on_invalid_arguments_reports_the_parse_error() -> None:
    """Unread arguments that are not JSON: the parse error comes first."""
    text = '{"a":'
    call = accumulate(fragments(text), {"literal": raw(text)}, {"literal": raw(text + "1}")})
    assert call.arguments is None
    assert call.error is not None and call.error.startswith("arguments are not valid JSON")


# --- exact bytes: CallDone(raw=...) -------------------------------------------------------


def _turn(events: list[EngineEvent], limits: Limits | None = None) -> tuple[ProposedCall, ...]:
    turn = TurnAssembler(limits or Limits())
    for event in [*events, Completion(OutcomeKind.FINAL_TEXT, "stop")]:
        turn.apply(event)
    outcome = turn.outcome()
    assert outcome.kind is OutcomeKind.TOOL_PROPOSALS
    return outcome.calls


@pytest.mark.parametrize(
    "body",
    [
        b'{"a":1}',
        b'{ "a" : 1 }',
        b'\n\t{"a":\r\n1}  ',
        b'{"a":1.0e0}',
        b'{"s":"\xc3\xa9\\u00e9"}',
        b"{}",
        b"",
    ],
)
def test_exact_bytes_without_fragments_are_kept_as_received(body: bytes) -> None:
    """A whole call (Gemini ``functionCall.args``, a Vertex object) keeps its exact bytes
    as ``raw_arguments``: never re-encoded, whitespace and spelling included."""
    (call,) = _turn([CallStarted(index=0, name="f", call_id="c"), CallDone(0, raw=body)])
    assert call.error is None
    assert call.raw_arguments == body
    assert call.arguments == (json.loads(body) if body else {})


def test_exact_bytes_after_fragments_reject_the_call() -> None:
    events: list[EngineEvent] = [
        CallStarted(index=0, name="f", call_id="c"),
        ArgumentsDelta(0, '{"a":1}'),
        CallDone(0, raw=b'{"a":1}'),
    ]
    (call,) = _turn(events)
    assert call.error == DIFFER and call.arguments is None and call.raw_arguments == b""


def test_exact_bytes_over_the_cap_reject_the_call_and_hold_nothing() -> None:
    body = b'{"s":"' + b"x" * 20 + b'"}'
    limits = Limits(max_call_argument_bytes=len(body) - 1)
    (call,) = _turn([CallStarted(index=0, name="f", call_id="c"), CallDone(0, raw=body)], limits)
    assert call.error == f"arguments exceed max_call_argument_bytes ({len(body) - 1})"
    assert call.arguments is None and call.raw_arguments == b""
    limits = Limits(max_call_argument_bytes=len(body))
    (call,) = _turn([CallStarted(index=0, name="f", call_id="c"), CallDone(0, raw=body)], limits)
    assert call.error is None and call.raw_arguments == body


# --- more UTF-8 bytes than code points ----------------------------------------------------


def _cap(limit: int) -> str:
    return f"arguments exceed max_call_argument_bytes ({limit})"


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        pytest.param('{"s":"' + "é" * 10 + '"}', 20, id="short"),  # 18 code points, 28 bytes
        pytest.param('{"s":"' + "€" * 5000 + '"}', 9000, id="compacted"),  # 5008 cp, 15008 B
    ],
)
@pytest.mark.parametrize("batched", [False, True], ids=["one-by-one", "run"])
def test_code_points_within_the_cap_but_bytes_over_it_hold_nothing(
    text: str, limit: int, batched: bool
) -> None:
    """Fragments are counted by code points while they stream; their UTF-8 bytes are
    measured when the call is read. Over the cap there: rejected, and ``raw_arguments``
    is empty (a call never reports more bytes than its cap)."""
    assert len(text) <= limit < len(text.encode())
    acc = CallAccumulator(Limits(max_call_argument_bytes=limit))
    acc.start(0, "f", "c", None)
    pieces = fragments(text)
    if batched:
        acc.fragments([0] * len(pieces), pieces)
    else:
        for piece in pieces:
            acc.fragment(0, piece)
    acc.done(0, None)
    (call,) = acc.complete(None)
    assert call.error == _cap(limit)
    assert call.arguments is None
    assert call.raw_arguments == b""
    # At exactly its byte size the same call is accepted.
    (call,) = _accepted_at(text, len(text.encode()))
    _accepted(call, text)


def _accepted_at(text: str, limit: int) -> tuple[ProposedCall, ...]:
    acc = CallAccumulator(Limits(max_call_argument_bytes=limit))
    acc.start(0, "f", "c", None)
    for piece in fragments(text):
        acc.fragment(0, piece)
    acc.done(0, None)
    return acc.complete(None)


@pytest.mark.parametrize(
    "text",
    [pytest.param('{"s":"' + "é" * 10 + '"}', id="short"), pytest.param(long_text(1), id="long")],
)
def test_whole_literal_with_more_bytes_than_the_cap_holds_nothing(text: str) -> None:
    limit = len(text.encode()) - 1
    call = accumulate([], {"literal": raw(text)}, limits=Limits(max_call_argument_bytes=limit))
    assert call.error == _cap(limit)
    assert call.arguments is None and call.raw_arguments == b""


# --- a lone surrogate ---------------------------------------------------------------------

_POSITIONS = {
    # (code points before the surrogate, after it), and whether it ends in a block.
    "tail": (10, 10, False),
    "first-block": (100, 5000, True),
    "later-block": (5000, 5000, True),
    "tail-after-blocks": (5000, 10, False),
}


@pytest.mark.parametrize("position", list(_POSITIONS))
@pytest.mark.parametrize("batched", [False, True], ids=["one-by-one", "run"])
def test_lone_surrogate_in_a_fragment_rejects_the_call(position: str, batched: bool) -> None:
    """A fragment that holds a lone surrogate (it cannot be UTF-8): the call is rejected
    with the same reason whichever batching, and whether the surrogate was compacted
    into a block (more than 4096 code points in) or is still among the held fragments."""
    before, after, in_block = _POSITIONS[position]
    text = '{"s":"' + "x" * before + "\ud800" + "y" * after + '"}'
    pieces = fragments(text)
    acc = CallAccumulator(Limits())
    acc.start(0, "f", "c", None)
    if batched:
        for start in range(0, len(pieces), 64):  # runs of 64 fragments, as a chunk gives
            acc.fragments([0] * len(pieces[start : start + 64]), pieces[start : start + 64])
    else:
        for piece in pieces:
            acc.fragment(0, piece)
    # Where the surrogate is held (private state, read only to show which path is taken).
    held = acc._calls[0]  # type: ignore[attr-defined]
    assert any(type(block) is str for block in held.blocks) is in_block
    acc.done(0, None)
    (call,) = acc.complete(None)
    assert call.error == SURROGATE
    assert call.arguments is None and call.raw_arguments == b""


def test_surrogate_pair_split_across_fragments_is_two_lone_surrogates() -> None:
    """Each fragment is its own JSON string: halves of a pair in two fragments never
    become one character."""
    call = accumulate(['{"s":"\ud83d', '\ude00"}'], {})
    assert call.error == SURROGATE


@pytest.mark.parametrize("length", [100, 40_000], ids=["short", "long"])
def test_whole_text_counts_the_same_toward_the_response_cap_however_it_arrives(
    length: int,
) -> None:
    """A whole argument text counts its code points toward
    ``max_response_argument_bytes`` while streaming, as fragments do, whether it comes as
    text or as a short or long JSON literal; once joined, the real bytes meet the cap
    (and the per-call cap) the same way for every form."""
    text = '{"s":"' + "é" * length + '"}'
    size = len(text.encode())
    for cap, accepted in ((len(text) + 10, False), (size, True)):
        # First: the code points fit, the UTF-8 bytes (about twice) do not.
        limits = Limits(max_response_argument_bytes=cap, max_call_argument_bytes=4 * cap)
        outcomes = []
        for form in ("text", "literal", "fragments"):
            acc = CallAccumulator(limits)
            acc.start(0, "f", "c", None)
            if form == "text":
                acc.done(0, text)
            elif form == "literal":
                acc.done(0, None, None, msgspec.Raw(msgspec.json.encode(text)))
            else:
                acc.fragment(0, text)
                acc.done(0, None)
            outcomes.append(acc.complete(None))
        assert outcomes[0] == outcomes[1] == outcomes[2]
        [call] = outcomes[0]
        if accepted:
            assert call.arguments == {"s": "é" * length} and call.error is None
        else:
            assert call.arguments is None
            assert call.error is not None and "max_response_argument_bytes" in call.error


def test_a_repeated_whole_bytes_done_that_differs_rejects_the_call() -> None:
    acc = CallAccumulator(Limits())
    acc.start(0, "f", "c", None)
    acc.done(0, None, b'{"a":1}')
    acc.done(0, None, b'{"a":1}')  # the same again: no-op
    assert acc.complete(None)[0].arguments == {"a": 1}
    acc = CallAccumulator(Limits())
    acc.start(0, "f", "c", None)
    acc.done(0, None, b'{"a":1}')
    acc.done(0, None, b'{"a":2}')
    (call,) = acc.complete(None)
    assert call.arguments is None and call.error == "done events disagree about the arguments"


@pytest.mark.parametrize("form", ["text", "literal", "raw"])
def test_whole_arguments_over_the_response_cap_leave_the_call_open(form: str) -> None:
    """Arguments that arrive whole and push the response over its cap fail the turn
    with the call still open: it is never listed as a complete call (fuzz finding)."""
    turn = TurnAssembler(Limits(max_response_argument_bytes=10))
    turn.apply(CallStarted(0, "f", "c0"))
    turn.apply(CallDone(0, raw=b'{"a":1}'))
    turn.apply(CallStarted(1, "f", "c1"))
    text = '{"b":22}'
    done = {
        "text": CallDone(1, text),
        "literal": CallDone(1, literal=msgspec.Raw(msgspec.json.encode(text))),
        "raw": CallDone(1, raw=text.encode()),
    }[form]
    with pytest.raises(LimitExceeded):
        turn.apply(done)
    turn.fail("limit exceeded")
    outcome = turn.outcome()
    assert [c.index for c in outcome.calls] == [0]
    assert [c.index for c in outcome.incomplete_calls] == [1]
