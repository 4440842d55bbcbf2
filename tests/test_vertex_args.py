"""Vertex ``partialArgs`` assembly: the one-encode build of a small flat object gives the
very bytes of the general build (paths rebuilt into a tree, written piece by piece), and
any other shape takes the general build."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.adapters import _vertex_args
from callgate.adapters._vertex_args import PartialArg, StreamedArguments
from callgate.engine.core.errors import LimitExceeded, StreamProtocolError
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits

# Keys as _parse_path reads them, plus characters it rejects (a non-simple path).
_KEY = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=8)
_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
_SCALAR = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
)


def _piece(path: str, value: Any, more: bool = False) -> PartialArg:
    if isinstance(value, str):
        return PartialArg(path, string_value=value, will_continue=more)
    if isinstance(value, bool):
        return PartialArg(path, bool_value=value)
    if value is None:
        return PartialArg(path, null_value=None)
    return PartialArg(path, number_value=value)


@st.composite
def _streams(draw: st.DrawFn) -> list[list[PartialArg]]:
    """Members in arrival order: strings in 1-3 pieces, scalars whole."""
    chunks: list[list[PartialArg]] = []
    paths = draw(st.lists(_KEY, min_size=1, max_size=6, unique=True))
    nested = draw(st.booleans())
    for i, key in enumerate(paths):
        path = f"$.{key}" if not (nested and i == 0) else f"$.{key}[0]"
        if draw(st.booleans()):
            texts = draw(st.lists(_TEXT, min_size=1, max_size=3))
            for k, text in enumerate(texts):
                chunks.append([_piece(path, text, more=k < len(texts) - 1)])
        else:
            chunks.append([_piece(path, draw(_SCALAR))])
    return chunks


def _build(chunks: list[list[PartialArg]], limits: Limits = DEFAULT_LIMITS) -> bytes | None:
    args = StreamedArguments(0, limits)
    for chunk in chunks:
        args.add(chunk)
    return args.build()


def _outcome(chunks: list[list[PartialArg]]) -> tuple[str, Any]:
    args = StreamedArguments(0, DEFAULT_LIMITS)
    try:
        for chunk in chunks:
            args.add(chunk)
        raw = args.build()
    except Exception as exc:  # the general build's errors must be the fast one's too
        return type(exc).__name__, str(exc)
    return ("refused", args.error) if args.error is not None else ("ok", raw)


@settings(max_examples=400, deadline=None)
@given(_streams())
def test_flat_build_equals_the_general_build(chunks: list[list[PartialArg]]) -> None:
    fast = _outcome(chunks)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_vertex_args, "_FLAT", -1)  # every build takes the general path
        general = _outcome(chunks)
    assert fast == general


def test_flat_build_is_one_object_in_arrival_order() -> None:
    chunks = [
        [_piece("$.b", "Ber", more=True)],
        [_piece("$.b", 'l"in\n')],
        [_piece("$.a", 7)],
        [_piece("$.c", None)],
    ]
    raw = _build(chunks)
    assert raw == b'{"b":"Berl\\"in\\n","a":7,"c":null}'
    assert list(json.loads(raw)) == ["b", "a", "c"]


def test_a_path_that_is_not_one_member_takes_the_general_build() -> None:
    raw = _build([[_piece("$.a.b", 1)], [_piece("$.c[0]", "x")]])
    assert raw == b'{"a":{"b":1},"c":["x"]}'


def test_depth_cap_zero_refuses_even_a_flat_object() -> None:
    args = StreamedArguments(0, Limits(max_json_depth=0))
    args.add([_piece("$.a", 1)])
    assert args.build() is None
    assert args.error == "arguments nest deeper than 0 levels"


def test_a_call_over_its_cap_is_refused_alone_and_holds_nothing() -> None:
    args = StreamedArguments(3, Limits(max_call_argument_bytes=12))
    args.add([_piece("$.ab", "1234", True), _piece("$.ab", "1234")])  # 4 + 4 + 4: the cap
    assert args.error is None
    args.add([_piece("$.c", "")])  # one byte more
    assert args.error == "arguments exceed max_call_argument_bytes (12)"
    assert args._leaves == {} and args.nbytes == 15  # what it held is dropped, not its size
    args.add([_piece("$.d", "x" * 1000)])  # later pieces are skipped, only measured
    assert args._leaves == {} and args.nbytes == 15 + 3 + 1000
    assert args.build() is None


def test_large_arguments_take_the_general_build(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = _vertex_args._write

    def spy(value: Any, out: list[Any]) -> None:
        calls.append(1)
        real(value, out)

    monkeypatch.setattr(_vertex_args, "_write", spy)
    text = "x" * (_vertex_args._FLAT + 1)
    raw = _build([[_piece("$.a", text)]])
    assert raw is not None and msgspec.json.decode(raw) == {"a": text}
    assert calls  # over the size bound: written piece by piece
    calls.clear()
    assert _build([[_piece("$.a", "small")]]) == b'{"a":"small"}'
    assert not calls  # small and flat: one encode


def test_deep_paths_are_charged_for_their_levels() -> None:
    # 16,000 distinct paths of 63 levels (2.6 MB) held 188 MB at build: a path was
    # charged the same whatever its depth. Each level now counts against the budget.
    args = StreamedArguments(0, DEFAULT_LIMITS)
    deep = ".a" * 62
    with pytest.raises(LimitExceeded, match="bookkeeping"):
        for start in range(0, 8000, 500):
            args.add(
                [PartialArg(f"$.k{i}{deep}", number_value=i) for i in range(start, start + 500)]
            )


def test_a_path_deeper_than_the_cap_is_refused_when_it_arrives() -> None:
    # Not split into its levels at build first (a path of N levels built N segments).
    args = StreamedArguments(0, DEFAULT_LIMITS)
    args.add([PartialArg("$" + ".ab" * (DEFAULT_LIMITS.max_json_depth + 1), number_value=1)])
    assert args.error == f"arguments nest deeper than {DEFAULT_LIMITS.max_json_depth} levels"
    assert args.build() is None


def test_a_path_exactly_at_the_depth_cap_is_kept() -> None:
    # "." and "[" each open a level: $.a.b[0] is 3 levels, so a cap of 3 admits it and
    # only a fourth level is refused (the cap is the deepest nesting allowed).
    args = StreamedArguments(0, Limits(max_json_depth=3))
    args.add([PartialArg("$.a.b[0]", number_value=1)])
    assert args.error is None
    assert args.build() == b'{"a":{"b":[1]}}'
    deeper = StreamedArguments(0, Limits(max_json_depth=3))
    deeper.add([PartialArg("$.a.b[0].c", number_value=1)])
    assert deeper.error == "arguments nest deeper than 3 levels"


def test_a_long_string_in_tiny_pieces_stays_within_the_bookkeeping_budget() -> None:
    # Every _COMPACT pieces of a string are joined into one and their charge given back:
    # a string streamed a character at a time holds about its size, so 5,000 pieces
    # (320,000 bytes of piece charges if never given back) fit a 64 KiB budget.
    n = 5000
    pieces = [[_piece("$.s", "x", more=True)] for _ in range(n - 1)] + [[_piece("$.s", "x")]]
    args = StreamedArguments(0, Limits(max_call_argument_bytes=65536))
    for chunk in pieces:
        args.add(chunk)
    assert args.error is None and args.nbytes == len("$.s") + n
    assert args.build() == b'{"s":"' + b"x" * n + b'"}'


def test_a_refused_calls_later_pieces_count_a_repeated_path_once() -> None:
    # Once refused, a streamed string's pieces (each repeating its path) add their text
    # and the path only where it changes: the measure keeps nothing per path seen.
    args = StreamedArguments(0, Limits(max_call_argument_bytes=4))
    args.add([_piece("$.ab", "123", True)])  # 4 + 3 bytes: over the cap
    assert args.error is not None and args.nbytes == 7
    args.add([_piece("$.ab", "x", True), _piece("$.ab", "y", True), _piece("$.ab", "z")])
    assert args.nbytes == 7 + 3  # the same path as before: only the text counts
    args.add([_piece("$.cd", "u", True), _piece("$.cd", "v")])
    assert args.nbytes == 10 + 4 + 2  # a new path counts once, then each piece's text


@pytest.mark.parametrize("path", ["$.a[2]", "$.a[2].b"])
def test_a_skipped_array_index_is_a_protocol_error(path: str) -> None:
    # Arrays only grow by appending: index 2 after index 0 would need a guessed index 1,
    # whether it is the path's last segment or a step on the way to a deeper member.
    chunks = [[_piece("$.a[0]", 1)], [_piece(path, 2)]]
    with pytest.raises(StreamProtocolError, match="skips an index"):
        _build(chunks)


def test_the_bookkeeping_budget_admits_a_charge_exactly_at_it() -> None:
    # 127 scalar paths of one level (256 + 192 each), one string path (its first piece
    # 64 + 448) and 127 more pieces of it (64 each) are charged 65,536: the budget (the
    # call's cap) exactly, which is within it; one piece more is past it.
    args = StreamedArguments(0, Limits(max_call_argument_bytes=65536))
    args.add([PartialArg(f"$.k{i}", number_value=i) for i in range(127)])
    args.add([_piece("$.s", "x", more=True) for _ in range(128)])
    assert args.error is None
    with pytest.raises(LimitExceeded, match="bookkeeping"):
        args.add([_piece("$.s", "y", more=True)])
