"""A Runner without a store: its operation lives in one drive (it cannot pause), so
callgate keeps that drive's idempotency ledger in memory. A write the model proposes
again under a new call id (same business intent, same key) runs once; the repeat is
answered from the ledger. A tool that needs a person's approval cannot be served at all
(the pause must persist): refused when the Runner is made, before any paid model turn.
Real loopback replay server."""

from __future__ import annotations

import msgspec
import pytest

from callgate.engine import ConfigError, Registry, RiskClass, Runner, ToolContext, ToolSpec
from callgate.engine.runtime.replay import ReplayServer
from callgate.engine.runtime.transport import ProviderEndpoint

from .loop_helpers import FAST_RETRY, OrderArgs, turn

pytestmark = pytest.mark.anyio
P = "openai_chat"


class RefundArgs(msgspec.Struct, forbid_unknown_fields=True):
    order_id: str
    cents: int


def _registry(effects: list[str], **refund: object) -> Registry:
    def refund_fn(args: RefundArgs, ctx: ToolContext) -> dict[str, object]:
        effects.append(f"refund {args.order_id} {args.cents}")
        return {"refunded": True}

    looked = [0]

    def get_order(args: OrderArgs, ctx: ToolContext) -> dict[str, object]:
        looked[0] += 1
        return {"lookups": looked[0]}  # a fresh result each time: new information

    options: dict[str, object] = {"risk": RiskClass.WRITE, **refund}
    return Registry(
        [
            ToolSpec(
                name="refund",
                description="Refund an order.",
                args_type=RefundArgs,
                handler=refund_fn,
                **options,  # type: ignore[arg-type]
            ),
            ToolSpec(
                name="get_order", description="Look up.", args_type=OrderArgs, handler=get_order
            ),
        ]
    )


def _runner(base_url: str, registry: Registry) -> Runner:
    return Runner(
        provider=P,
        model="gpt-4o",
        registry=registry,
        endpoint=ProviderEndpoint(base_url=base_url, api_key="sk-test"),
        retry=FAST_RETRY,
    )


async def test_a_write_proposed_again_under_a_new_call_id_runs_once_without_a_store() -> None:
    effects: list[str] = []
    turns = [
        turn(P, calls=[("c1", "refund", '{"order_id":"7","cents":500}')]),
        turn(P, calls=[("c2", "get_order", '{"order_id":"7"}')]),
        turn(P, calls=[("c3", "refund", '{"cents":500,"order_id":"7"}')]),  # same intent
        turn(P, text="Refunded."),
    ]
    async with ReplayServer(turns) as server:
        result = await _runner(server.base_url, _registry(effects)).start("Refund order 7")
    assert effects == ["refund 7 500"]
    refunds = [c for c in result.calls if c.tool == "refund"]
    assert [(c.call_id, c.status) for c in refunds] == [("c1", "ok"), ("c3", "replayed")]
    assert refunds[0].idempotency_key == refunds[1].idempotency_key


async def test_two_storeless_operations_keep_apart_ledgers() -> None:
    # The same intent in another operation is another key: it runs there too.
    effects: list[str] = []
    call = turn(P, calls=[("c1", "refund", '{"order_id":"7","cents":500}')])
    async with ReplayServer([call, turn(P, text="ok"), call, turn(P, text="ok")]) as server:
        runner = _runner(server.base_url, _registry(effects))
        await runner.start("Refund order 7")
        await runner.start("Refund order 7")
    assert effects == ["refund 7 500", "refund 7 500"]


@pytest.mark.parametrize(
    "refund",
    [
        {"risk": RiskClass.IRREVERSIBLE},
        {"risk": RiskClass.WRITE, "approval": True},
    ],
)
def test_a_tool_that_always_needs_approval_is_refused_by_a_storeless_runner(
    refund: dict[str, object],
) -> None:
    with pytest.raises(ConfigError, match=r"refund.*store"):
        _runner("http://127.0.0.1:9", _registry([], **refund))


def test_a_storeless_runner_takes_tools_that_never_or_only_sometimes_need_approval() -> None:
    # An irreversible tool whose spec waives approval, and a rule that decides per call
    # (checked when the call comes: it may never ask for a person).
    _runner("http://127.0.0.1:9", _registry([], risk=RiskClass.IRREVERSIBLE, approval=False))
    _runner("http://127.0.0.1:9", _registry([], approval=lambda args, ctx: args.cents > 10_000))
