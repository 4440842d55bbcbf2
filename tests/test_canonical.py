"""Canonical JSON: one byte form per value, stable across input formatting, length-safe."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import random
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.engine.core.canonical import canonical_json, digest_fields, hmac_fields, sha256_hex
from callgate.engine.core.errors import ConfigError

# JSON values as a model could send them: finite floats, 64-bit ints, any Unicode text
# without lone surrogates (which no valid UTF-8 input can carry).
_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(_text, children, max_size=5),
    max_leaves=30,
)


def _reformat(value: Any, rng: random.Random) -> str:
    """The same JSON value as text with shuffled keys and arbitrary whitespace/escaping."""
    ws = rng.choice(["", " ", "\n", "\t ", "\r\n  "])
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        body = f"{ws},{ws}".join(
            f"{json.dumps(k, ensure_ascii=rng.random() < 0.5)}{ws}:{ws}{_reformat(v, rng)}"
            for k, v in items
        )
        return "{" + ws + body + ws + "}"
    if isinstance(value, list):
        return "[" + ws + f"{ws},{ws}".join(_reformat(v, rng) for v in value) + ws + "]"
    return json.dumps(value, ensure_ascii=rng.random() < 0.5)


@settings(max_examples=300, deadline=None)
@given(value=json_values, seed=st.integers(0, 2**32))
def test_canonical_form_is_stable_across_key_order_and_whitespace(value: Any, seed: int) -> None:
    text = _reformat(value, random.Random(seed))
    assert canonical_json(json.loads(text)) == canonical_json(value)


@settings(max_examples=200, deadline=None)
@given(value=json_values)
def test_canonical_form_round_trips_to_itself(value: Any) -> None:
    once = canonical_json(value)
    assert canonical_json(json.loads(once)) == once
    outside_strings = re.sub(rb'"(?:[^"\\]|\\.)*"', b"", once)
    assert re.search(rb"\s", outside_strings) is None


def test_documented_form_sorted_keys_minimal_escapes_raw_utf8_fixed_numbers() -> None:
    value = {"b": 1, "a": [1.5, 1.0, 10**20 // 10**5, -0.0, 1e100], "é": 'é\n"\\\u2028'}
    assert canonical_json(value) == (
        b'{"a":[1.5,1.0,1000000000000000,-0.0,1e+100],"b":1,'
        b'"\xc3\xa9":"\xc3\xa9\\n\\"\\\\\xe2\x80\xa8"}'
    )
    # 1 and 1.0 and true are three different values with three different forms.
    assert len({canonical_json(1), canonical_json(1.0), canonical_json(True)}) == 3


def test_keys_sort_by_code_point_not_utf16() -> None:
    # In UTF-16 order U+10000 (a surrogate pair D800 DC00) sorts before U+FFFF.
    value = {"\U00010000": 1, "\uffff": 2, "B": 3, "a": 4}
    keys = list(json.loads(canonical_json(value)))
    assert keys == sorted(value) == ["B", "a", "\uffff", "\U00010000"]


class _Dict(dict):  # type: ignore[type-arg]
    pass


class _List(list):  # type: ignore[type-arg]
    pass


@pytest.mark.parametrize(
    "bad",
    [
        math.nan,
        [1, {"x": math.inf}],
        {"deep": [[-math.inf]]},
        {1: "non-string key"},
        {"s": {1, 2}},
        {"b": b"bytes"},
        {"o": object()},
        "lone \ud800 surrogate",
        2**64,
        _Dict(a=None, b=_List([None, math.nan])),
    ],
    ids=[
        "nan",
        "inf",
        "neg-inf",
        "int-key",
        "set",
        "bytes",
        "object",
        "surrogate",
        "bigint",
        "nan-in-subclasses",
    ],
)
def test_values_without_a_canonical_form_are_rejected(bad: Any) -> None:
    with pytest.raises(ConfigError):
        canonical_json(bad)


def test_null_in_output_is_not_mistaken_for_nan() -> None:
    assert canonical_json({"a": None, "b": "null"}) == b'{"a":null,"b":"null"}'


def test_tuples_that_collide_under_naive_concatenation_get_distinct_digests() -> None:
    pairs = [(("ab", "c"), ("a", "bc")), (("a", ""), ("", "a")), (("a,b",), ("a", "b"))]
    for left, right in pairs:
        assert "".join(left) == "".join(right) or ",".join(left) == ",".join(right)
        assert digest_fields(*left) != digest_fields(*right)
    # Type is part of the encoding: 1, "1", 1.0 and [1] are different fields.
    forms = {digest_fields(v) for v in (1, "1", 1.0, [1], None, "null", True, "true")}
    assert len(forms) == 8


@settings(max_examples=300, deadline=None)
@given(left=st.lists(_text, max_size=4), right=st.lists(_text, max_size=4))
def test_field_tuples_encode_injectively(left: list[str], right: list[str]) -> None:
    same_bytes = canonical_json(left) == canonical_json(right)
    assert same_bytes == (left == right)
    assert (digest_fields(*left) == digest_fields(*right)) == (left == right)


def test_digest_helpers_are_sha256_and_hmac_sha256_over_the_canonical_array() -> None:
    data = canonical_json(["x", 1, {"b": 2, "a": 1}])
    assert digest_fields("x", 1, {"a": 1, "b": 2}) == hashlib.sha256(data).hexdigest()
    assert sha256_hex(data) == hashlib.sha256(data).hexdigest()
    keyed = hmac_fields(b"k" * 32, "x", 1, {"a": 1, "b": 2})
    assert keyed == hmac.new(b"k" * 32, data, hashlib.sha256).hexdigest()
    assert keyed != digest_fields("x", 1, {"a": 1, "b": 2})
    assert keyed != hmac_fields(b"j" * 32, "x", 1, {"a": 1, "b": 2})
