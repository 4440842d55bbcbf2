"""A provider that reports no usage (a Chat-compatible server ignoring ``include_usage``)
does not switch the token and cost budgets off: the turn is counted at an estimate (one
token per four bytes of the request, and of the text and arguments received), and the
trail says it was estimated. A turn refused before generation counts nothing."""

from __future__ import annotations

import msgspec
import pytest

from callgate.adapters.render import RenderCall, render_turn
from callgate.engine import Budgets, OpState
from callgate.engine.core.guards import estimated_usage
from callgate.engine.core.outcome import Usage
from callgate.engine.core.states import OpInput
from callgate.engine.runtime.audit_sink import MemoryAuditSink
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn

from .loop_helpers import make_runner, refund_and_lookup

pytestmark = pytest.mark.anyio
P = "openai_chat"


def _no_usage(body: bytes) -> bytes:
    return b"\n\n".join(f for f in body.split(b"\n\n") if b'"usage"' not in f)


def budgets_set(budgets: Budgets) -> list[str]:
    """The budget the test sets below its default (the one that must stop it)."""
    default = Budgets()
    names = ("max_input_tokens", "max_output_tokens", "max_cost")
    return [n for n in names if getattr(budgets, n) != getattr(default, n)]


def _lookup(n: int) -> ReplayTurn:
    call = RenderCall(f"c{n}", "get_order", f'{{"order_id":"{n}"}}')
    return ReplayTurn(body=_no_usage(render_turn(P, model="model-1", calls=[call])))


@pytest.mark.parametrize(
    "budgets",
    [
        Budgets(max_input_tokens=50),
        Budgets(max_output_tokens=12),
        Budgets(max_cost=0.0005, prices={"model-1": (10, 10)}),
    ],
    ids=["input", "output", "cost"],
)
async def test_a_provider_that_reports_no_usage_is_still_held_to_the_budgets(
    budgets: Budgets,
) -> None:
    ran: list[str] = []
    sink = MemoryAuditSink()
    turns = [_lookup(n) for n in range(8)]
    async with ReplayServer(turns) as server:
        runner, _ = make_runner(
            P,
            server.base_url,
            refund_and_lookup(ran).narrow(["get_order"]),
            budgets=budgets,
            audit=sink.write,
        )
        result = await runner.start("Look up every order")
        asked = len(server.requests)
    assert result.state is OpState.ESCALATED
    assert result.stop is not None and result.stop.input is OpInput.BUDGET_EXHAUSTED
    assert next(iter(budgets_set(budgets))) in result.stop.reason
    assert asked < len(turns)  # stopped long before the script ran out
    responses = [r.data for r in sink.records if r.kind == "model_response"]
    assert responses and all(d.get("usage_estimated") is True for d in responses)
    assert all(d["usage"]["input_tokens"] > 0 for d in responses)


def test_the_estimate_fills_only_what_is_missing_at_a_token_per_four_bytes() -> None:
    assert estimated_usage(Usage(), request_bytes=400, output_bytes=9) == Usage(
        input_tokens=100, output_tokens=3
    )
    kept = estimated_usage(Usage(input_tokens=7), request_bytes=400, output_bytes=0)
    assert kept == Usage(input_tokens=7, output_tokens=1)  # at least one token


async def test_a_request_refused_before_generation_counts_no_tokens() -> None:
    sink = MemoryAuditSink()
    refused = ReplayTurn(
        status=400, body=b'{"error":{"message":"bad"}}', content_type="application/json"
    )
    async with ReplayServer([refused]) as server:
        runner, _ = make_runner(
            P, server.base_url, refund_and_lookup([]).narrow(["get_order"]), audit=sink.write
        )
        result = await runner.start("hi")
    assert result.state is OpState.FAILED
    (data,) = [r.data for r in sink.records if r.kind == "model_response"]
    assert "usage_estimated" not in data
    assert msgspec.convert(data["usage"], Usage) == Usage()
