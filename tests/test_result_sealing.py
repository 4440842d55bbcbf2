"""A result is bound to its call the moment its handler returns, under a binding context
callgate recorded before dispatch, and the turn's set is verified against those records
before anything is sent. So a defect that moves result bodies between calls after they
were produced cannot reach the model: the sealed bodies go (moving the dispatcher's copy
changes nothing), and a sealed body moved to another call fails the operation. The
binding digests are checked against a context this test builds itself, field by field
(not only their length). Real loopback replay server."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from callgate.engine import OpState, Registry, RiskClass, ToolContext, ToolSpec
from callgate.engine.core.binding import (
    BindingContext,
    binding_digest,
    request_digest,
    result_digest,
)
from callgate.engine.core.registry import Revisions
from callgate.engine.runtime import steps
from callgate.engine.runtime.audit_sink import MemoryAuditSink
from callgate.engine.runtime.replay import ReplayServer

from .loop_helpers import OrderArgs, chat_runner, make_runner, turn

pytestmark = pytest.mark.anyio
P = "openai_chat"
CALLS = [("c_1", "get_order", '{"order_id":"o1"}'), ("c_2", "get_order", '{"order_id":"o2"}')]
REVISIONS = Revisions(input="in-3", output="out-4", effect="eff-5", handler="h-7", producer="p-9")


def _registry() -> Registry:
    def get_order(args: OrderArgs, ctx: ToolContext) -> dict[str, str]:
        return {"order": args.order_id, "owner": "alice" if args.order_id == "o1" else "bob"}

    spec = ToolSpec(
        name="get_order",
        description="Look up an order.",
        args_type=OrderArgs,
        handler=get_order,
        revisions=REVISIONS,
    )
    return Registry([spec])


def _swapping(monkeypatch: pytest.MonkeyPatch, *, sealed: bool) -> None:
    """A defect after dispatch: the two results' bodies trade places (the dispatcher's
    copies, or the sealed ones)."""
    real = steps.execute_calls

    async def swapped(*args: Any, **kwargs: Any) -> Any:
        x, y = await real(*args, **kwargs)
        if not sealed:
            return [
                msgspec.structs.replace(x, model_result=y.model_result),
                msgspec.structs.replace(y, model_result=x.model_result),
            ]
        assert x.bound is not None and y.bound is not None
        bx = msgspec.structs.replace(x.bound, model_result=y.bound.model_result)
        by = msgspec.structs.replace(y.bound, model_result=x.bound.model_result)
        return [msgspec.structs.replace(x, bound=bx), msgspec.structs.replace(y, bound=by)]

    monkeypatch.setattr(steps, "execute_calls", swapped)


def _sent_bodies(request: Any) -> dict[str, Any]:
    return {
        m["tool_call_id"]: msgspec.json.decode(m["content"])
        for m in request.json()["messages"]
        if m["role"] == "tool"
    }


async def test_bodies_moved_after_they_were_produced_never_reach_the_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _swapping(monkeypatch, sealed=False)
    turns = [turn(P, calls=CALLS, response_id="chatcmpl-1"), turn(P, text="ok")]
    async with ReplayServer(turns) as server:
        result = await chat_runner(server.base_url, _registry(), None).start("Look up both")
        sent = _sent_bodies(server.requests[1])
    assert result.state is OpState.COMPLETED
    assert sent["c_1"]["result"] == {"order": "o1", "owner": "alice"}
    assert sent["c_2"]["result"] == {"order": "o2", "owner": "bob"}


async def test_sealed_bodies_moved_between_calls_fail_the_operation_sending_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _swapping(monkeypatch, sealed=True)
    turns = [turn(P, calls=CALLS, response_id="chatcmpl-1"), turn(P, text="ok")]
    async with ReplayServer(turns) as server:
        result = await chat_runner(server.base_url, _registry(), None).start("Look up both")
        requests = len(server.requests)
    assert result.state is OpState.FAILED
    assert result.stop is not None and "result binding failed" in result.stop.reason
    assert requests == 1  # no result went back to the model


@pytest.mark.parametrize("secret", [None, b"host-binding-secret-0123456789ab"])
async def test_every_binding_digest_is_the_one_recomputed_from_the_calls_own_context(
    secret: bytes | None,
) -> None:
    turns = [turn(P, calls=CALLS, response_id="chatcmpl-1"), turn(P, text="ok")]
    async with ReplayServer(turns) as server:
        runner = chat_runner(server.base_url, _registry(), None, binding_secret=secret)
        result = await runner.start(
            "Look up both", tenant="acme", subject="u-42", operation_id="op_fixed"
        )
        sent = _sent_bodies(server.requests[1])
    assert result.state is OpState.COMPLETED
    for summary, (call_id, _, text) in zip(result.calls, CALLS, strict=True):
        expected = BindingContext(
            provider=P,
            api_family="openai_chat",
            response_id="chatcmpl-1",
            call_id=call_id,
            operation_id="op_fixed",
            idempotency_key="",  # a read has none
            adapter_revision="openai_chat/1",
            tenant_ref="acme",
            subject_ref="u-42",
            input_revision="in-3",
            output_revision="out-4",
            effect_revision="eff-5",
            handler_revision="h-7",
            producer_revision="p-9",
            policy_revision="1",
        )
        request_sha = request_digest("get_order", msgspec.json.decode(text))
        result_sha = result_digest(sent[call_id])
        want = binding_digest(expected, request_sha, result_sha, secret, is_error=False)
        assert summary.call_id == call_id and summary.binding_sha256 == want
        # Any one field of the context changes the digest (none is left out).
        for field in BindingContext.__struct_fields__:
            other = msgspec.structs.replace(expected, **{field: "x"})
            assert binding_digest(other, request_sha, result_sha, secret) != want, field


@pytest.mark.parametrize("provider", ["anthropic", "openai_responses"])
async def test_the_trail_records_who_answered_and_what_each_binding_covers(provider: str) -> None:
    # The spec's adapter duty: record provider, API, SDK, model and adapter revision;
    # and an auditor can recompute an unkeyed binding from the trail alone.
    sink = MemoryAuditSink()
    turns = [
        turn(provider, calls=CALLS[:1], response_id="resp_1", model="served-model-7"),
        turn(provider, text="ok", model="served-model-7"),
    ]
    async with ReplayServer(turns) as server:
        runner, _ = make_runner(provider, server.base_url, _registry(), audit=sink.write)
        result = await runner.start("Look up o1", tenant="acme", subject="u-42")
    assert result.state is OpState.COMPLETED
    assert not any(b"test-key" in line for line in sink.lines)  # the key never
    responses = [r.data for r in sink.records if r.kind == "model_response"]
    assert len(responses) == 2
    first = responses[0]
    family = {"anthropic": "anthropic_messages"}.get(provider, provider)
    assert (first["provider"], first["api_family"]) == (provider, family)
    assert first["adapter_revision"] == f"{provider}/1"
    assert (first["model_requested"], first["model_served"]) == ("model-1", "served-model-7")
    assert (first["response_id"], first["kind"], first["attempts"]) == (
        "resp_1",
        "tool_proposals",
        1,
    )
    assert first["client"].startswith("callgate") and "httpx/" in first["client"]
    if provider == "anthropic":
        assert first["api_headers"] == {"anthropic-version": "2023-06-01"}
    (record,) = [r for r in sink.records if r.kind == "result"]
    bound = record.data["binding"]
    assert "idempotency_key" not in bound  # (in the executed record, as redaction allows)
    fields = {k: v for k, v in bound.items() if k != "hmac"}
    ctx = BindingContext(call_id="c_1", idempotency_key="", **fields)  # a read has no key
    assert (ctx.tenant_ref, ctx.subject_ref, ctx.response_id) == ("acme", "u-42", "resp_1")
    request_sha, result_sha = record.data["request_sha256"], record.data["result_sha256"]
    assert binding_digest(ctx, request_sha, result_sha, None) == record.data["binding_sha256"]
    assert result.calls[0].binding_sha256 == record.data["binding_sha256"]


class PinArgs(msgspec.Struct, forbid_unknown_fields=True):
    account: str
    pin: str


async def test_the_trail_never_holds_a_plain_idempotency_key_of_a_sensitive_write() -> None:
    # The key is a plain SHA-256 over the business arguments: in the trail, it would let a
    # redacted PIN be guessed back from its few thousand candidates.
    def pay(args: PinArgs, ctx: ToolContext) -> dict[str, bool]:
        return {"paid": True}

    spec = ToolSpec(
        name="pay",
        description="Pay.",
        args_type=PinArgs,
        handler=pay,
        risk=RiskClass.WRITE,
        sensitive_paths=("$.pin",),
    )
    sink = MemoryAuditSink()
    call = [("c_1", "pay", '{"account":"a1","pin":"4821"}')]
    async with ReplayServer([turn(P, calls=call), turn(P, text="ok")]) as server:
        runner = chat_runner(server.base_url, Registry([spec]), None, audit=sink.write)
        result = await runner.start("Pay", operation_id="op_pin")
    assert result.state is OpState.COMPLETED and result.calls[0].idempotency_key
    key = spec.idempotency_key("op_pin", PinArgs(account="a1", pin="4821"))
    assert key == result.calls[0].idempotency_key
    assert not any(key.encode() in line for line in sink.lines)
    assert not any(b'"4821"' in line for line in sink.lines)
