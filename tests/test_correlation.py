"""Result-set verification: identity by (response_id, call_id), recomputed bindings,
exactly one result per proposed call, proposal order, and no `==` on digests anywhere."""

from __future__ import annotations

import ast
import random
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.engine.core.binding import BindingContext, BoundResult, TrustedCall, bind
from callgate.engine.core.correlation import CorrelationError, verify_result_set
from callgate.engine.core.errors import BindingError, CallgateError

SECRET = b"correlation-secret-7f3a9c"
ROOT = Path(__file__).resolve().parent.parent


def make_ctx(call_id: str, response_id: str | None = "resp_1", **more: Any) -> BindingContext:
    return BindingContext(
        provider="anthropic",
        api_family="anthropic",
        response_id=response_id,
        call_id=call_id,
        operation_id="op_1",
        idempotency_key=f"idk_{call_id}",
        adapter_revision="a1",
        tenant_ref=more.pop("tenant_ref", "tenant-1"),
        subject_ref="user-1",
        policy_revision="pol-1",
        **more,
    )


def make_turn(
    n: int, secret: bytes | None = SECRET, response_id: str | None = "resp_1"
) -> tuple[list[TrustedCall], list[BoundResult]]:
    trusted, results = [], []
    for i in range(n):
        ctx = make_ctx(f"call_{i}", response_id)
        args = {"order_id": f"A{i}", "i": i}
        trusted.append(TrustedCall.record(ctx, "get_order", args))
        results.append(bind(ctx, "get_order", args, {"order": f"A{i}", "n": i}, False, secret))
    return trusted, results


def with_audit(result: BoundResult, **changes: Any) -> BoundResult:
    audit = msgspec.structs.replace(result.protected_audit, **changes)
    return msgspec.structs.replace(result, protected_audit=audit)


def test_valid_set_is_returned_in_proposal_order() -> None:
    trusted, results = make_turn(3)
    assert verify_result_set(trusted, results[::-1], SECRET) == results
    assert verify_result_set([], [], SECRET) == []


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 8), seed=st.integers(0, 2**32))
def test_shuffled_valid_sets_are_accepted_in_proposal_order(n: int, seed: int) -> None:
    trusted, results = make_turn(n)
    shuffled = results[:]
    random.Random(seed).shuffle(shuffled)
    assert verify_result_set(trusted, shuffled, SECRET) == results


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 7),
    defect=st.sampled_from(["missing", "duplicate", "unknown"]),
    seed=st.integers(0, 2**32),
)
def test_missing_duplicate_and_unknown_members_are_rejected_in_any_order(
    n: int, defect: str, seed: int
) -> None:
    rng = random.Random(seed)
    trusted, results = make_turn(n)
    victim = rng.randrange(n)
    if defect == "missing":
        del results[victim]
    elif defect == "duplicate":
        results.append(results[victim])
    else:
        _, strangers = make_turn(n + 1)
        results.append(strangers[n])  # call_{n}: never proposed in this turn
    rng.shuffle(results)
    with pytest.raises(CorrelationError) as caught:
        verify_result_set(trusted, results, SECRET)
    assert caught.value.problem == defect
    key = caught.value.key
    assert key is not None and f"call_id={key[1]!r}" in str(caught.value)


def test_a_result_for_a_presented_as_b_is_rejected() -> None:
    trusted, (res_a, res_b) = make_turn(2)
    # A's body and binding under B's identity.
    relabelled = with_audit(res_a, call_id="call_1")
    with pytest.raises(CorrelationError) as caught:
        verify_result_set(trusted, [res_a, relabelled], SECRET)
    assert caught.value.problem == "mismatch" and caught.value.key == ("resp_1", "call_1")
    # A's body under B's whole protected projection (and vice versa): bodies swapped.
    swapped_a = msgspec.structs.replace(res_b, model_result=res_a.model_result)
    swapped_b = msgspec.structs.replace(res_a, model_result=res_b.model_result)
    with pytest.raises(CorrelationError, match="result_sha256"):
        verify_result_set(trusted, [swapped_b, swapped_a], SECRET)


def test_a_result_from_another_response_is_rejected() -> None:
    trusted, _ = make_turn(1, response_id="resp_2")
    _, (earlier,) = make_turn(1, response_id="resp_1")
    with pytest.raises(CorrelationError) as caught:
        verify_result_set(trusted, [earlier], SECRET)
    assert caught.value.problem == "unknown"
    # Relabelled to the current response, its binding still names the old one.
    with pytest.raises(CorrelationError) as caught:
        verify_result_set(trusted, [with_audit(earlier, response_id="resp_2")], SECRET)
    assert caught.value.problem == "mismatch"


def test_a_result_for_another_tenant_is_rejected() -> None:
    ctx_mine = make_ctx("call_0", tenant_ref="tenant-1")
    ctx_theirs = make_ctx("call_0", tenant_ref="tenant-2")
    args = {"order_id": "A0"}
    theirs = bind(ctx_theirs, "get_order", args, {"order": "A0"}, False, SECRET)
    with pytest.raises(CorrelationError, match="tenant_ref") as caught:
        verify_result_set([TrustedCall.record(ctx_mine, "get_order", args)], [theirs], SECRET)
    assert "tenant-2" not in str(caught.value) and "tenant-1" not in str(caught.value)


def test_binding_is_recomputed_from_the_trusted_record_not_the_result() -> None:
    ctx = make_ctx("call_0")
    trusted = [TrustedCall.record(ctx, "get_order", {"order_id": "A0"})]
    # A result executed with other arguments, self-consistently bound: its carried request
    # digest matches its own arguments, not the ones the model proposed.
    other = bind(ctx, "get_order", {"order_id": "ZZ"}, {"order": "ZZ"}, False, SECRET)
    with pytest.raises(CorrelationError, match="request_sha256"):
        verify_result_set(trusted, [other], SECRET)
    # The body edited after binding (the dict is mutable): caught from the body itself.
    good = bind(ctx, "get_order", {"order_id": "A0"}, {"order": "A0"}, False, SECRET)
    good.model_result["order"] = "A1"
    with pytest.raises(CorrelationError, match="result_sha256"):
        verify_result_set(trusted, [good], SECRET)


def test_duplicate_proposals_are_refused() -> None:
    trusted, results = make_turn(1)
    with pytest.raises(CorrelationError) as caught:
        verify_result_set(trusted * 2, results, SECRET)
    assert caught.value.problem == "duplicate_proposal"


@pytest.mark.parametrize(
    "break_it",
    [
        lambda r: msgspec.structs.replace(r, model_result=["x"]),
        lambda r: msgspec.structs.replace(r, model_result={"x": float("inf")}),
        lambda r: msgspec.structs.replace(r, is_error="no"),
        lambda r: msgspec.structs.replace(r, protected_audit=None),
        lambda r: with_audit(r, call_id=["call_0"]),
        lambda r: with_audit(r, tool=object()),
    ],
    ids=["list-body", "inf-body", "str-is-error", "no-audit", "unhashable-key", "odd-field"],
)
def test_malformed_results_raise_a_typed_error_never_a_crash(break_it: Any) -> None:
    trusted, (result,) = make_turn(1)
    with pytest.raises(CorrelationError) as caught:
        verify_result_set(trusted, [break_it(result)], SECRET)
    assert caught.value.problem in ("malformed", "mismatch")
    assert isinstance(caught.value, BindingError) and isinstance(caught.value, CallgateError)


def test_error_messages_name_the_call_but_never_a_secret_or_raw_control_characters() -> None:
    ctx = make_ctx("evil\n\x1b[31mcall\u2028")
    trusted = [TrustedCall.record(ctx, "t", {"pw": "hunter2"})]
    bound = bind(ctx, "t", {"pw": "hunter2"}, {"token": "sk-live-abc"}, False, SECRET)
    with pytest.raises(CorrelationError) as caught:
        verify_result_set(trusted, [bound], b"another-secret")
    message = str(caught.value)
    assert "binding_sha256" in message and "resp_1" in message
    for leaked in (SECRET.decode(), "another-secret", "hunter2", "sk-live-abc", "\n", "\x1b"):
        assert leaked not in message
    assert "\u2028" not in message
    assert bound.protected_audit.binding_sha256 not in message


def test_an_empty_secret_is_refused() -> None:
    trusted, results = make_turn(1)
    with pytest.raises(CallgateError):
        verify_result_set(trusted, results, b"")


# --- no `==` / `!=` on digests anywhere in engine/ and adapters/ ---------------------------

_DIGESTY = re.compile(r"digest|hmac|binding|(^|_)sha(\d+)?($|_)|mac($|_)", re.IGNORECASE)


def _operand_names(node: ast.expr) -> list[str]:
    """Identifiers an operand *is* (not what a call computes from): ``x.binding_sha256``,
    ``digest``, ``rec["digest"]``. ``len(digest) == 64`` compares a length, not a digest."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.Subscript):
        key = node.slice
        names = _operand_names(node.value)
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.append(key.value)
        return names
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        # foo.hexdigest() == other
        return [node.func.attr] if node.func.attr in ("hexdigest", "digest") else []
    return []


def digest_comparisons(source: str) -> list[tuple[int, str]]:
    hits = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        if not any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
            continue
        for operand in (node.left, *node.comparators):
            names = [n for n in _operand_names(operand) if _DIGESTY.search(n)]
            if names:
                hits.append((node.lineno, names[0]))
                break
    return hits


def test_the_checker_finds_digest_equality_in_every_spelling() -> None:
    bad = """
if a.binding_sha256 == b: pass
if digest != expected: pass
x = rec["digest"] == y
ok = h.hexdigest() == other
same = request_sha == carried
"""
    assert [line for line, _ in digest_comparisons(bad)] == [2, 3, 4, 5, 6]
    fine = "if len(digest) == 64: pass\nif kind == 'binding_failed': pass\nif shape == 1: pass\n"
    assert digest_comparisons(fine) == []


def test_no_digest_is_compared_with_eq_anywhere_in_engine_or_adapters() -> None:
    offenders = []
    for top in ("engine", "adapters"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for line, name in digest_comparisons(path.read_text(encoding="utf-8")):
                offenders.append(f"{path.relative_to(ROOT)}:{line} compares {name} with ==/!=")
    assert offenders == [], "use hmac.compare_digest:\n" + "\n".join(offenders)
