"""Questions: what does the engine add per tool call, and what does a whole operation cost?

1. Engine overhead per call: one turn of 1,000 no-op calls through the same stages the
   run loop uses, without HTTP — ``validate_turn`` (with the budget tracker), bounded
   dispatch (``execute_calls``), binding + ``verify_result_set`` + the wire projection,
   and the adapter's ``encode_results`` — on asyncio and on asyncio + uvloop, each round
   inside its own ``anyio.run``. Async and sync (worker thread) no-op handlers. Reports
   µs per call, calls/s and the share of each stage; the event loop's own start-up is
   measured separately (``loop floor``) so it can be told apart.
2. A whole operation against the loopback replay server: two model turns over real
   HTTP (a tool call, then the final answer), per backend; ms per operation.

Run: ``pytest bench/test_bench_dispatch.py --benchmark-only -s`` (figures are printed and
stored in each result's ``extra_info``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from bench.harness import timed_median
from callgate.adapters.render import RenderCall, render_turn
from callgate.engine.core.adapter import load_adapter
from callgate.engine.core.binding import BindingContext, TrustedCall, bind, to_model_result
from callgate.engine.core.correlation import verify_result_set
from callgate.engine.core.guards import Budgets, BudgetTracker
from callgate.engine.core.outcome import OutcomeKind, ProposedCall, TurnOutcome
from callgate.engine.core.registry import AuthContext, Registry, ToolContext, ToolSpec
from callgate.engine.core.states import OpState
from callgate.engine.core.validation import Executable, validate_turn
from callgate.engine.runtime.dispatch import DispatchContext, execute_calls
from callgate.engine.runtime.loop import Runner
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn
from callgate.engine.runtime.transport import ProviderEndpoint

CALLS = 1_000
BACKENDS = {"asyncio": False, "uvloop": True}
AUTH = AuthContext(tenant="t", subject="s", operation_id="op_bench")
BUDGETS = Budgets(max_tool_calls=CALLS, max_parallelism=64)
SECRET = b"bench-secret-0123456789abcdef"


class Args(msgspec.Struct, forbid_unknown_fields=True):
    order_id: str
    amount: int


async def noop_async(args: Args, ctx: ToolContext) -> dict[str, Any]:
    return {"ok": True}


def noop_sync(args: Args, ctx: ToolContext) -> dict[str, Any]:
    return {"ok": True}


REGISTRIES = {
    "async": Registry(
        [ToolSpec(name="refund", description="r", args_type=Args, handler=noop_async)]
    ),
    "sync": Registry([ToolSpec(name="refund", description="r", args_type=Args, handler=noop_sync)]),
}

PROPOSED = tuple(
    ProposedCall(
        index=i,
        call_id=f"call_{i:04d}",
        name="refund",
        arguments={"order_id": f"A-{i:06d}", "amount": i},
        raw_arguments=f'{{"order_id":"A-{i:06d}","amount":{i}}}'.encode(),
    )
    for i in range(CALLS)
)
OUTCOME = TurnOutcome(
    kind=OutcomeKind.TOOL_PROPOSALS,
    raw_reason="tool_use",
    stop_reason="bench",
    response_id="msg_bench",
    calls=PROPOSED,
)
ADAPTER: Any = load_adapter("anthropic")


def _binding_ctx(call_id: str, key: str | None) -> BindingContext:
    return BindingContext(
        provider="anthropic",
        api_family=ADAPTER.family,
        response_id=OUTCOME.response_id,
        call_id=call_id,
        operation_id=AUTH.operation_id,
        idempotency_key=key or "",
        adapter_revision=ADAPTER.revision,
        tenant_ref=AUTH.tenant,
        subject_ref=AUTH.subject,
        input_revision="1",
        output_revision="1",
        effect_revision="1",
        handler_revision="1",
        producer_revision="1",
        policy_revision="1",
    )


async def one_turn(registry: Registry, stages: dict[str, list[float]]) -> int:
    """Validation → dispatch → bind/verify → encode for ``CALLS`` calls; returns the
    number of wire items (so nothing is optimised away)."""
    t0 = time.perf_counter()
    tracker = BudgetTracker(BUDGETS, now=0.0)
    verdicts = validate_turn(PROPOSED, registry, AUTH, tracker)
    executables = [v for v in verdicts if isinstance(v, Executable)]
    t1 = time.perf_counter()
    ctx = DispatchContext(
        auth=AUTH,
        store=None,
        worker_id="w",
        max_parallelism=BUDGETS.max_parallelism,
        max_result_bytes=BUDGETS.max_result_bytes,
        clock=time.monotonic,
    )
    results = await execute_calls(executables, ctx, remaining_seconds=60.0)
    t2 = time.perf_counter()
    trusted, bound = [], []
    for res in results:
        bctx = _binding_ctx(res.call.call_id, res.idempotency_key)
        args = res.call.arguments or {}
        trusted.append(TrustedCall.record(bctx, res.tool, args))
        bound.append(bind(bctx, res.tool, args, res.model_result, res.is_error, SECRET))
    wire = [to_model_result(b) for b in verify_result_set(trusted, bound, SECRET)]
    t3 = time.perf_counter()
    items = ADAPTER.encode_results(OUTCOME, wire)
    t4 = time.perf_counter()
    assert len(executables) == CALLS and all(r.status == "ok" for r in results)
    for name, value in (
        ("validate", t1 - t0),
        ("dispatch", t2 - t1),
        ("bind+verify", t3 - t2),
        ("encode", t4 - t3),
    ):
        stages.setdefault(name, []).append(value)
    return len(items[0]["content"])


def _run(fn: Callable[[], Awaitable[Any]], uvloop: bool) -> Any:
    return anyio.run(fn, backend="asyncio", backend_options={"use_uvloop": uvloop})


@pytest.mark.parametrize("handler", ["async", "sync"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_engine_overhead_per_tool_call(benchmark: Any, backend: str, handler: str) -> None:
    uvloop = BACKENDS[backend]
    registry = REGISTRIES[handler]
    stages: dict[str, list[float]] = {}

    def round_() -> int:
        return int(_run(lambda: one_turn(registry, stages), uvloop))

    benchmark.group = "engine overhead per call (1,000 no-op calls)"
    benchmark.name = f"{handler} handlers on {backend}"
    count = benchmark.pedantic(round_, rounds=15, iterations=1, warmup_rounds=2)
    assert count == CALLS
    median = timed_median(benchmark)
    if median is None:
        return
    per_call_us = median / CALLS * 1e6
    parts = {k: statistics.median(v) / CALLS * 1e6 for k, v in stages.items()}
    info = {
        "us_per_call": round(per_call_us, 2),
        "calls_per_s": round(CALLS / median),
        **{f"{k}_us_per_call": round(v, 2) for k, v in parts.items()},
    }
    benchmark.extra_info.update(info)
    print(
        f"\nengine overhead, {handler} handlers on {backend}: {per_call_us:.1f} µs/call, "
        f"{CALLS / median:,.0f} calls/s (incl. loop start-up); stages µs/call: "
        + ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
    )


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_loop_floor(benchmark: Any, backend: str) -> None:
    """The cost of ``anyio.run`` itself, included once per round above."""

    async def nothing() -> None:
        await anyio.lowlevel.checkpoint()

    benchmark.group = "engine overhead per call (1,000 no-op calls)"
    benchmark.name = f"loop floor on {backend}"
    benchmark.pedantic(lambda: _run(nothing, BACKENDS[backend]), rounds=15, warmup_rounds=2)
    median = timed_median(benchmark)
    if median is not None:
        print(f"\nanyio.run start-up on {backend}: {median * 1e3:.2f} ms")


# --- a whole operation over loopback HTTP ------------------------------------------------

OPS_PER_ROUND = 20
PROVIDER = "anthropic"
TOOL_TURN = render_turn(
    PROVIDER,
    text="Let me refund that.",
    calls=[RenderCall("toolu_1", "refund", '{"order_id":"A-000001","amount":1999}')],
)
FINAL_TURN = render_turn(PROVIDER, text="The refund is done.")


async def operations(uvloop_label: str, shared_client: bool, timings: list[float]) -> None:
    script = [ReplayTurn(body=TOOL_TURN), ReplayTurn(body=FINAL_TURN)] * OPS_PER_ROUND
    async with ReplayServer(script) as server, httpx.AsyncClient() as client:
        runner = Runner(
            provider=PROVIDER,
            model="claude-bench",
            registry=REGISTRIES["async"],
            endpoint=ProviderEndpoint(base_url=server.base_url, api_key="k"),
            client=client if shared_client else None,
        )
        for _ in range(OPS_PER_ROUND):
            start = time.perf_counter()
            result = await runner.start("Refund order A-000001")
            timings.append(time.perf_counter() - start)
            assert result.state is OpState.COMPLETED, uvloop_label


@pytest.mark.parametrize("client", ["shared client", "runner's own client"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_whole_operation_against_loopback(benchmark: Any, backend: str, client: str) -> None:
    timings: list[float] = []
    shared = client == "shared client"

    def round_() -> None:
        _run(lambda: operations(backend, shared, timings), BACKENDS[backend])

    benchmark.group = "whole operation (2 turns, loopback HTTP)"
    benchmark.name = f"{backend}, {client}"
    benchmark.pedantic(round_, rounds=5, iterations=1, warmup_rounds=1)
    per_op = statistics.median(timings)
    benchmark.extra_info.update(
        {"ms_per_operation": round(per_op * 1e3, 2), "operations_per_s": round(1 / per_op, 1)}
    )
    print(
        f"\nwhole operation on {backend} ({client}): {per_op * 1e3:.2f} ms/op median, "
        f"{1 / per_op:,.0f} ops/s sequential (2 HTTP turns + 1 call)"
    )
