"""Review findings in strict argument parsing and the accumulator's caps: only JSON's own
whitespace means "no arguments" (not a form feed or vertical tab); ``max_json_depth`` is
bounded so the duplicate-key check can always walk every accepted depth, and a caller
deep in its own stack gets a rejection, not a RecursionError; the response's argument cap
holds in UTF-8 bytes once calls are joined (it counted code points only); fragments sent
to a call already over its own cap still count against the response's cap."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from callgate.engine.core.accumulator import CallAccumulator
from callgate.engine.core.arguments import ArgumentsRejected, parse_arguments
from callgate.engine.core.errors import ConfigError, LimitExceeded
from callgate.engine.core.limits import MAX_JSON_DEPTH, Limits


@pytest.mark.parametrize("raw", [b"\x0c", b"\x0b", b" \x0c\n", b"\t\x0b"])
def test_form_feed_and_vertical_tab_are_not_json_whitespace(raw: bytes) -> None:
    with pytest.raises(ArgumentsRejected, match="not valid JSON"):
        parse_arguments(raw, 64)


@pytest.mark.parametrize("raw", [b"", b" ", b"\t\r\n "])
def test_json_whitespace_alone_is_no_arguments(raw: bytes) -> None:
    assert parse_arguments(raw, 64) == {}


def test_max_json_depth_is_bounded() -> None:
    assert Limits(max_json_depth=MAX_JSON_DEPTH).max_json_depth == MAX_JSON_DEPTH
    with pytest.raises(ConfigError, match="max_json_depth"):
        Limits(max_json_depth=MAX_JSON_DEPTH + 1)


def _nested(depth: int) -> bytes:
    # An escaped colon takes the duplicate-key check's slow path (Python's json module).
    inner = b"[" * (depth - 1) + b"]" * (depth - 1)
    return b'{"k":"x:\\u003a","a":' + inner + b"}"


def _at_stack_depth(frames: int, fn: Callable[[], Any]) -> Any:
    if frames <= 0:
        return fn()
    return _at_stack_depth(frames - 1, fn)


def test_the_deepest_accepted_depth_parses_on_an_ordinary_stack() -> None:
    raw = _nested(MAX_JSON_DEPTH)
    value = parse_arguments(raw, MAX_JSON_DEPTH)
    assert value["k"] == "x::"
    with pytest.raises(ArgumentsRejected, match="deeper"):
        parse_arguments(_nested(MAX_JSON_DEPTH + 1), MAX_JSON_DEPTH)


def test_a_caller_deep_in_its_stack_gets_a_rejection_not_a_recursion_error() -> None:
    raw = _nested(MAX_JSON_DEPTH)
    frames = sys.getrecursionlimit() - MAX_JSON_DEPTH - 20
    with pytest.raises(ArgumentsRejected, match="deeper than can be"):
        _at_stack_depth(frames, lambda: parse_arguments(raw, MAX_JSON_DEPTH))


def _one_call(acc: CallAccumulator, index: int, text: str) -> None:
    acc.start(index, "f", f"c{index}", None)
    acc.fragment(index, text)
    acc.done(index, None)


def test_the_response_cap_holds_in_utf8_bytes_once_calls_are_joined() -> None:
    cap = 100
    limits = Limits(max_response_argument_bytes=cap, max_call_argument_bytes=1000)
    body = '{"s":"' + "\U0001f600" * (cap - 8) + '"}'  # 100 code points, 376 bytes
    acc = CallAccumulator(limits)
    _one_call(acc, 0, body)
    [call] = acc.complete("r")
    assert call.arguments is None and not call.raw_arguments
    assert call.error is not None and "max_response_argument_bytes" in call.error
    # Calls within their own cap but over the response's together: the first ones that
    # fit keep their arguments, the rest are refused (in output order).
    small = '{"s":"' + "\u00e9" * 16 + '"}'  # 40 bytes
    acc = CallAccumulator(Limits(max_response_argument_bytes=100, max_call_argument_bytes=40))
    for index in range(4):
        _one_call(acc, index, small)
    calls = acc.complete("r")
    assert [c.arguments is not None for c in calls] == [True, True, False, False]
    # ASCII is counted exactly while streaming: 100 bytes fit.
    acc = CallAccumulator(limits)
    _one_call(acc, 0, '{"s":"' + "x" * (cap - 8) + '"}')
    assert acc.complete("r")[0].arguments == {"s": "x" * (cap - 8)}


def test_fragments_of_a_spoiled_call_count_against_the_response_cap() -> None:
    acc = CallAccumulator(Limits(max_call_argument_bytes=10, max_response_argument_bytes=40))
    acc.start(0, "f", "c0", None)
    acc.fragment(0, "x" * 11)  # over its own cap: spoiled (11 counted)
    acc.fragment(0, "y" * 29)  # 40: at the response's cap
    with pytest.raises(LimitExceeded) as info:
        acc.fragment(0, "y")
    assert info.value.limit == "max_response_argument_bytes"
    acc = CallAccumulator(Limits(max_call_argument_bytes=10, max_response_argument_bytes=40))
    acc.start(0, "f", "c0", None)
    acc.fragment(0, "x" * 11)
    with pytest.raises(LimitExceeded):
        acc.fragments([0, 0], ["z" * 15, "z" * 15])  # 41
