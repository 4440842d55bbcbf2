"""Strict argument parsing: one JSON object exactly as written, or a named rejection."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.engine.core.arguments import ArgumentsRejected, parse_arguments

DEPTH = 64


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", {}),
        (b"  \n", {}),
        (b"{}", {}),
        (b'{"city":"New York City"}', {"city": "New York City"}),
        (b'{"a:":"x:y","b":[":",{"c":1}]}', {"a:": "x:y", "b": [":", {"c": 1}]}),
        (b'{"n":123456789012345678901234567890}', {"n": 123456789012345678901234567890}),
        (b'{"a\\u003a":1,"b":2}', {"a:": 1, "b": 2}),
        ('{"é":"ü"}'.encode(), {"é": "ü"}),
        (b'{"pair":"\\ud83d\\ude00"}', {"pair": "\U0001f600"}),
    ],
)
def test_accepts_exact_objects(raw: bytes, expected: dict[str, object]) -> None:
    assert parse_arguments(raw, DEPTH) == expected


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"a":1', "not valid JSON"),  # cut off: never closed for the model
        (b'{"a":1}}', "not valid JSON"),  # trailing data
        (b'{"a":1} {"b":2}', "not valid JSON"),
        (b'{"a":NaN}', "not valid JSON"),
        (b'{"a":Infinity}', "not valid JSON"),
        (b'{"a":-Infinity}', "not valid JSON"),
        (b'{"a":1e400}', "not valid JSON"),
        (b'{"a":1,"a":2}', "duplicate key"),
        (b'{"a":{"b":1,"b":1}}', "duplicate key"),
        (b'{"x":[{"k":1,"k":2}]}', "duplicate key"),
        (b'{"a\\u003a":1,"a:":2}', "duplicate key"),
        (b'{"a":"\\ud800"}', "not valid JSON"),  # escaped lone surrogate
        (b'{"a":"\xed\xa0\x80"}', "not valid JSON"),  # UTF-8-encoded surrogate
        (b'{"a":"\xff"}', "not valid JSON"),  # invalid UTF-8
        (b"[1,2]", "JSON object"),
        (b'"text"', "JSON object"),
        (b"null", "JSON object"),
        (b"42", "JSON object"),
        (b"{'a':1}", "not valid JSON"),
    ],
)
def test_rejects_without_repair(raw: bytes, reason: str) -> None:
    with pytest.raises(ArgumentsRejected) as info:
        parse_arguments(raw, DEPTH)
    assert reason in info.value.reason


def _nested(depth: int) -> bytes:
    # depth counts objects/arrays including the top-level object
    return b'{"a":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_depth_cap_at_limit_minus_one_limit_and_plus_one() -> None:
    assert parse_arguments(_nested(DEPTH - 1), DEPTH)
    assert parse_arguments(_nested(DEPTH), DEPTH)
    with pytest.raises(ArgumentsRejected, match="deeper"):
        parse_arguments(_nested(DEPTH + 1), DEPTH)


def test_depth_cap_of_zero_refuses_every_object_and_one_allows_a_flat_one() -> None:
    # (Limits accepts 0 as a test's cap: it refuses everything but "no arguments".)
    with pytest.raises(ArgumentsRejected, match="deeper"):
        parse_arguments(b'{"a":1}', 0)
    assert parse_arguments(b"", 0) == {}
    assert parse_arguments(b'{"a":1}', 1) == {"a": 1}
    with pytest.raises(ArgumentsRejected, match="deeper"):
        parse_arguments(b'{"a":[]}', 1)


def test_hostile_deep_nesting_is_rejected_not_a_crash() -> None:
    with pytest.raises(ArgumentsRejected):
        parse_arguments(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", DEPTH)


def test_rejection_reason_never_echoes_the_value() -> None:
    with pytest.raises(ArgumentsRejected) as info:
        parse_arguments(b'{"password":"hunter2","password":"x"}', DEPTH)
    assert "hunter2" not in info.value.reason


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(), json_values, max_size=6))
def test_round_trips_any_json_object(obj: dict[str, object]) -> None:
    raw = json.dumps(obj, ensure_ascii=False).encode()
    assert parse_arguments(raw, 1000) == json.loads(raw)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(min_size=1), json_values, min_size=1, max_size=5), st.data())
def test_any_duplicated_key_is_found(obj: dict[str, object], data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(sorted(obj)))
    body = json.dumps(obj, ensure_ascii=data.draw(st.booleans()))
    dup = json.dumps({key: 0})[1:-1]
    raw = ("{" + dup + "," + body[1:]).encode()
    with pytest.raises(ArgumentsRejected, match="duplicate"):
        parse_arguments(raw, 1000)
