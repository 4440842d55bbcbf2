"""The five ids, the dual projection of a result, and the digests that bind it to its call."""

from __future__ import annotations

import hashlib
import random
import re
import struct
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.engine.core.binding import (
    BINDING_FIELDS,
    BINDING_VERSION,
    BindingContext,
    BoundResult,
    ProtectedAudit,
    TrustedCall,
    bind,
    binding_digest,
    request_digest,
    result_digest,
    to_model_result,
)
from callgate.engine.core.canonical import canonical_json, digest_fields
from callgate.engine.core.correlation import verify_result_set
from callgate.engine.core.errors import BindingError, ConfigError
from callgate.engine.core.ids import derive_call_id, new_approval_id, new_operation_id
from callgate.engine.core.registry import RiskClass, ToolSpec

SECRET = b"host-secret-0123456789abcdef0123"


def make_ctx(**overrides: Any) -> BindingContext:
    fields: dict[str, Any] = {
        "provider": "openai",
        "api_family": "openai_responses",
        "response_id": "resp_1",
        "call_id": "call_a",
        "operation_id": "op_1",
        "idempotency_key": "idk_1",
        "adapter_revision": "adapter-7",
        "tenant_ref": "tenant-1",
        "subject_ref": "user-1",
        "input_revision": "get-order-v1",
        "output_revision": "order-v1",
        "effect_revision": "read",
        "handler_revision": "h-3",
        "producer_revision": "p-1",
        "policy_revision": "pol-9",
    }
    fields.update(overrides)
    return BindingContext(**fields)


# --- ids ----------------------------------------------------------------------------------


def test_random_ids_are_prefixed_128_bit_and_unique() -> None:
    ops = {new_operation_id() for _ in range(2000)}
    aprs = {new_approval_id() for _ in range(2000)}
    assert len(ops) == len(aprs) == 2000
    assert all(re.fullmatch(r"op_[0-9a-f]{32}", i) for i in ops)
    assert all(re.fullmatch(r"apr_[0-9a-f]{32}", i) for i in aprs)


def test_derived_call_id_is_deterministic_and_distinct_per_response_and_index() -> None:
    first = derive_call_id("resp_1", 0)
    assert first == derive_call_id("resp_1", 0)
    assert first == "cgcall_" + digest_fields("call-id", "resp_1", 0)[:24]
    ids = {derive_call_id(r, i) for r in ("resp_1", "resp_2", None, "") for i in range(50)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"cgcall_[0-9a-f]{24}", i) for i in ids)


class _Refund(msgspec.Struct, forbid_unknown_fields=True):
    order_id: str
    amount: int | float | None = None
    note: str = ""


def _refund_spec(name: str = "refund", **kw: Any) -> ToolSpec:
    return ToolSpec(
        name=name,
        description="Refund.",
        args_type=_Refund,
        handler=lambda args, ctx: {},
        risk=RiskClass.WRITE,
        **kw,
    )


def _key(spec: ToolSpec, operation_id: str, text: bytes) -> str:
    return spec.idempotency_key(operation_id, msgspec.json.decode(text, type=_Refund))


def test_idempotency_key_survives_a_model_retry_with_a_new_call_id() -> None:
    # The key the ledger uses. The retry carries another call id and another key order;
    # the intent is the same.
    spec = _refund_spec()
    first = _key(spec, "op_1", b'{"order_id":"A1","amount":5}')
    retry = _key(spec, "op_1", b'{"amount":5,"order_id":"A1"}')
    assert first == retry
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    others = {
        _key(spec, "op_2", b'{"order_id":"A1","amount":5}'),
        _key(_refund_spec("refund_v2"), "op_1", b'{"order_id":"A1","amount":5}'),
        _key(spec, "op_1", b'{"order_id":"A1","amount":6}'),
        _key(spec, "op_1", b'{"order_id":"A1","amount":5.0}'),
    }
    assert first not in others and len(others) == 4


def test_idempotency_key_uses_only_the_business_fields_the_tool_selects() -> None:
    spec = _refund_spec(idempotency_fields=lambda a: {"order_id": a.order_id, "amount": a.amount})
    base = _key(spec, "op_1", b'{"order_id":"A1","amount":5,"note":"x"}')
    assert base == _key(spec, "op_1", b'{"order_id":"A1","amount":5,"note":"y"}')
    assert base != _key(spec, "op_1", b'{"order_id":"A1","amount":7,"note":"x"}')
    assert base != _key(_refund_spec(), "op_1", b'{"order_id":"A1","amount":5,"note":"x"}')


def test_idempotency_key_rejects_a_selection_without_canonical_form() -> None:
    spec = _refund_spec(idempotency_fields=lambda a: {1.5: a.order_id})
    with pytest.raises(ConfigError):
        _key(spec, "op_1", b'{"order_id":"A1"}')


# --- digests and bind ---------------------------------------------------------------------


def test_binding_fields_name_exactly_the_context_fields_in_order() -> None:
    assert BindingContext.__struct_fields__ == BINDING_FIELDS
    audit_fields = ProtectedAudit.__struct_fields__
    assert audit_fields[: len(BINDING_FIELDS)] == BINDING_FIELDS
    assert audit_fields[len(BINDING_FIELDS) :] == (
        "tool",
        "request_sha256",
        "result_sha256",
        "binding_sha256",
        "hmac",
    )


def test_bind_produces_digests_an_auditor_can_recompute_by_hand() -> None:
    ctx = make_ctx()
    args = {"order_id": "A1", "lines": [1, 2]}
    body = {"status": "shipped", "total": 12.5}
    bound = bind(ctx, "get_order", args, body, False, None)
    audit = bound.protected_audit
    req = hashlib.sha256(canonical_json(["get_order", args])).hexdigest()
    res = hashlib.sha256(canonical_json(body)).hexdigest()
    fields = [BINDING_VERSION, *(getattr(ctx, f) for f in BINDING_FIELDS), req, res, False]
    assert audit.request_sha256 == req == request_digest("get_order", args)
    assert audit.result_sha256 == res == result_digest(body)
    assert audit.binding_sha256 == hashlib.sha256(canonical_json(fields)).hexdigest()
    assert audit.hmac is False and audit.tool == "get_order"
    assert msgspec.structs.astuple(audit)[: len(BINDING_FIELDS)] == msgspec.structs.astuple(ctx)
    assert bound.model_result is body and bound.is_error is False


def test_hmac_mode_differs_from_plain_and_requires_the_secret() -> None:
    ctx = make_ctx()
    plain = bind(ctx, "t", {"a": 1}, {"r": 1}, False, None).protected_audit
    keyed = bind(ctx, "t", {"a": 1}, {"r": 1}, False, SECRET).protected_audit
    other = bind(ctx, "t", {"a": 1}, {"r": 1}, False, SECRET[::-1]).protected_audit
    assert keyed.hmac and not plain.hmac
    assert len({plain.binding_sha256, keyed.binding_sha256, other.binding_sha256}) == 3
    # The request and result digests are plain SHA-256 either way (auditable without a key).
    assert keyed.request_sha256 == plain.request_sha256
    trusted = [TrustedCall.record(ctx, "t", {"a": 1})]
    keyed_result = bind(ctx, "t", {"a": 1}, {"r": 1}, False, SECRET)
    assert verify_result_set(trusted, [keyed_result], SECRET) == [keyed_result]
    for wrong in (None, SECRET[::-1], SECRET + b"x"):
        with pytest.raises(BindingError):
            verify_result_set(trusted, [keyed_result], wrong)
    with pytest.raises(ConfigError):
        binding_digest(ctx, "a", "b", b"")


def test_is_error_is_bound() -> None:
    ctx = make_ctx()
    ok = bind(ctx, "t", {}, {"error": "x"}, False, None)
    err = bind(ctx, "t", {}, {"error": "x"}, True, None)
    assert ok.protected_audit.binding_sha256 != err.protected_audit.binding_sha256
    flipped = msgspec.structs.replace(ok, is_error=True)
    with pytest.raises(BindingError):
        verify_result_set([TrustedCall.record(ctx, "t", {})], [flipped])


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"response_id": "ab", "call_id": "c"}, {"response_id": "a", "call_id": "bc"}),
        ({"tenant_ref": "x", "subject_ref": None}, {"tenant_ref": None, "subject_ref": "x"}),
        ({"tenant_ref": None}, {"tenant_ref": ""}),
        ({"tenant_ref": "t|u", "subject_ref": "v"}, {"tenant_ref": "t", "subject_ref": "u|v"}),
        ({"input_revision": "1", "output_revision": "2"}, {"input_revision": "12"}),
    ],
)
def test_contexts_that_collide_under_naive_concatenation_bind_differently(
    left: dict[str, Any], right: dict[str, Any]
) -> None:
    a = binding_digest(make_ctx(**left), "r" * 64, "s" * 64, None)
    b = binding_digest(make_ctx(**right), "r" * 64, "s" * 64, None)
    assert a != b


def test_request_digest_separates_tool_from_arguments() -> None:
    assert request_digest("ab", {"c": 1}) != request_digest("a", {"bc": 1})
    assert request_digest("t", {"a": "1"}) != request_digest("t", {"a": 1})


_args = st.dictionaries(
    st.text(max_size=6),
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.text(max_size=8),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
        max_leaves=10,
    ),
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(tool=st.text(max_size=10), args=_args)
def test_trusted_record_request_digest_equals_request_digest(
    tool: str, args: dict[str, Any]
) -> None:
    trusted = TrustedCall.record(make_ctx(), tool, args)
    assert trusted.request_sha256() == request_digest(tool, args)


def test_trusted_record_does_not_drift_when_the_handler_mutates_its_arguments() -> None:
    args: dict[str, Any] = {"items": [1, 2]}
    trusted = TrustedCall.record(make_ctx(), "t", args)
    before = trusted.request_sha256()
    args["items"].append(3)
    assert trusted.request_sha256() == before


def test_bind_rejects_results_without_a_canonical_form() -> None:
    with pytest.raises(ConfigError):
        bind(make_ctx(), "t", {}, {"x": float("nan")}, False, None)
    with pytest.raises(ConfigError):
        bind(make_ctx(), "t", {}, ["not", "an", "object"], False, None)  # type: ignore[arg-type]


def test_wire_projection_carries_only_the_model_result() -> None:
    ctx = make_ctx(tenant_ref="tenant-secret-ref", subject_ref="subject-secret-ref")
    bound = bind(ctx, "get_order", {"id": 1}, {"b": [1], "a": "é"}, True, SECRET)
    wire = to_model_result(bound)
    assert (wire.call_id, wire.name, wire.is_error) == ("call_a", "get_order", True)
    assert wire.content == '{"a":"é","b":[1]}'
    encoded = msgspec.json.encode(wire).decode()
    audit = bound.protected_audit
    for hidden in (
        "tenant-secret-ref",
        "subject-secret-ref",
        audit.binding_sha256,
        audit.request_sha256,
        audit.result_sha256,
        audit.idempotency_key,
        audit.policy_revision,
    ):
        assert hidden is not None and hidden not in encoded


# --- 10^5 seeded single-field and single-bit mutations --------------------------------------


def _flip_char(text: str, rng: random.Random) -> str:
    if not text:
        return "\x00"
    i = rng.randrange(len(text))
    code = ord(text[i])
    bit = rng.randrange(7 if code < 0x80 else code.bit_length())
    new = code ^ (1 << bit)
    if 0xD800 <= new <= 0xDFFF:
        new = code ^ 1
    return text[:i] + chr(new) + text[i + 1 :]


def _mutate(value: Any, rng: random.Random) -> Any:
    """A copy of ``value`` differing in exactly one place (one bit where possible)."""
    if value is None:
        return rng.choice(["", "x", 0])
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value ^ (1 << rng.randrange(16))
    if isinstance(value, float):
        (bits,) = struct.unpack("<Q", struct.pack("<d", value))
        return struct.unpack("<d", struct.pack("<Q", bits ^ (1 << rng.randrange(52))))[0]
    if isinstance(value, str):
        return _flip_char(value, rng)
    if isinstance(value, list):
        if not value or rng.random() < 0.15:
            return [*value, 0]
        i = rng.randrange(len(value))
        return [*value[:i], _mutate(value[i], rng), *value[i + 1 :]]
    if isinstance(value, dict):
        roll = rng.random()
        if not value or roll < 0.1:
            return {**value, f"added{rng.randrange(99)}": None}
        key = rng.choice(list(value))
        if roll < 0.2:
            return {k: v for k, v in value.items() if k != key}
        if roll < 0.3:
            return {(_flip_char(k, rng) if k == key else k): v for k, v in value.items()}
        return {**value, key: _mutate(value[key], rng)}
    raise AssertionError(type(value))


_BASES = [
    (make_ctx(), "get_order", {"order_id": "A1", "n": 3}, {"status": "shipped", "eta": 2.5}),
    (
        make_ctx(call_id="call_b", tenant_ref=None, subject_ref=None, policy_revision=None),
        "refund",
        {"order_id": "Ä2", "amount": 1999, "lines": [{"sku": "x", "qty": 1}], "ok": True},
        {"refund_id": "rf_1", "amount": 1999, "items": [1, None, "z"], "done": False},
    ),
    (
        make_ctx(response_id=None, call_id="cgcall_0", provider="gemini", api_family="gemini"),
        "search",
        {"q": "日本 \n tab\t", "filters": {"from": -1, "deep": [[{"a": 0.1}]]}},
        {"hits": [{"id": 7, "title": "t"}], "next": None, "text": "\u2028x"},
    ),
]

_KINDS = ("audit_field", "context", "tool", "arguments", "body", "is_error", "secret")


def test_every_single_field_and_single_bit_mutation_of_a_bound_result_is_detected() -> None:
    rng = random.Random(20240607)
    cases = []
    for ctx, tool, args, body in _BASES:
        for secret in (None, SECRET):
            trusted = [TrustedCall.record(ctx, tool, args)]
            bound = bind(ctx, tool, args, body, False, secret)
            assert verify_result_set(trusted, [bound], secret) == [bound]
            cases.append((ctx, tool, args, body, secret, trusted, bound))
    audit_fields = ProtectedAudit.__struct_fields__
    seen = dict.fromkeys(_KINDS, 0)
    for _ in range(100_000):
        ctx, tool, args, body, secret, trusted, bound = rng.choice(cases)
        kind = rng.choice(_KINDS)
        verify_secret = secret
        if kind == "audit_field":
            name = rng.choice(audit_fields)
            old = getattr(bound.protected_audit, name)
            audit = msgspec.structs.replace(bound.protected_audit, **{name: _mutate(old, rng)})
            candidate = msgspec.structs.replace(bound, protected_audit=audit)
        elif kind == "context":
            # A self-consistent result bound for another tenant/revision/call/response.
            name = rng.choice(BINDING_FIELDS)
            other = msgspec.structs.replace(ctx, **{name: _mutate(getattr(ctx, name), rng)})
            candidate = bind(other, tool, args, body, False, secret)
        elif kind == "tool":
            candidate = bind(ctx, _flip_char(tool, rng), args, body, False, secret)
        elif kind == "arguments":
            candidate = bind(ctx, tool, _mutate(args, rng), body, False, secret)
        elif kind == "body":
            candidate = msgspec.structs.replace(bound, model_result=_mutate(body, rng))
        elif kind == "is_error":
            candidate = msgspec.structs.replace(bound, is_error=True)
        else:
            candidate = bound
            verify_secret = SECRET if secret is None else _flip_char(secret.decode(), rng).encode()
        seen[kind] += 1
        try:
            verify_result_set(trusted, [candidate], verify_secret)
        except BindingError:
            continue
        raise AssertionError(f"undetected {kind} mutation: {candidate!r}")
    assert min(seen.values()) > 10_000


def test_bound_result_survives_a_msgpack_round_trip_through_a_store() -> None:
    ctx = make_ctx()
    bound = bind(ctx, "t", {"a": [1, 2.5]}, {"r": {"x": None}}, False, SECRET)
    restored = msgspec.msgpack.decode(msgspec.msgpack.encode(bound), type=BoundResult)
    trusted = [TrustedCall.record(ctx, "t", {"a": [1, 2.5]})]
    assert verify_result_set(trusted, [restored], SECRET) == [restored]
