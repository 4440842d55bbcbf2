"""Bounded dispatch: concurrency limits hold (measured over 1,000 calls), per-tool
deadlines overshoot little (p99 printed), cancellation leaks no task, a cancelled call
still gets a result, and results come back in proposal order."""

from __future__ import annotations

import asyncio
import math
import statistics
import threading
import time
from collections import Counter
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest

from callgate.adapters.render import RenderCall, render_turn
from callgate.engine.core.guards import Budgets
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import ProposedCall
from callgate.engine.core.registry import AuthContext, Registry, RiskClass, ToolContext, ToolSpec
from callgate.engine.core.states import OpState
from callgate.engine.core.validation import Executable, validate_turn
from callgate.engine.runtime.dispatch import DispatchContext, execute_calls
from callgate.engine.runtime.progress import CallFinished
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn

from .loop_helpers import make_runner, turn, wire_results


class N(msgspec.Struct, forbid_unknown_fields=True):
    n: int


AUTH = AuthContext(tenant="t", subject="s", operation_id="op_test")


class Gauge:
    """Counts handlers running right now, overall and per tool, and keeps the maxima."""

    def __init__(self) -> None:
        self.now: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.total = 0
        self.peak_total = 0
        self.calls = 0
        self._lock = threading.Lock()  # sync handlers run in worker threads

    def enter(self, tool: str) -> None:
        with self._lock:
            self.calls += 1
            self.now[tool] += 1
            self.total += 1
            self.peak[tool] = max(self.peak[tool], self.now[tool])
            self.peak_total = max(self.peak_total, self.total)

    def leave(self, tool: str) -> None:
        with self._lock:
            self.now[tool] -= 1
            self.total -= 1


def _calls(names: list[str]) -> list[ProposedCall]:
    return [
        ProposedCall(
            index=i,
            call_id=f"call_{i}",
            name=name,
            arguments={"n": i},
            raw_arguments=f'{{"n":{i}}}'.encode(),
        )
        for i, name in enumerate(names)
    ]


def _executables(registry: Registry, names: list[str]) -> list[Executable]:
    verdicts = validate_turn(_calls(names), registry, AUTH)
    assert all(isinstance(v, Executable) for v in verdicts)
    return [v for v in verdicts if isinstance(v, Executable)]


def _ctx(parallelism: int = 8, **kw: Any) -> DispatchContext:
    return DispatchContext(
        auth=AUTH,
        store=None,
        worker_id="w",
        max_parallelism=parallelism,
        max_result_bytes=64 * 1024,
        clock=time.monotonic,
        **kw,
    )


def _gauged_registry(gauge: Gauge, *, limited: int = 3, thread_limited: int = 2) -> Registry:
    async def work(args: N, ctx: ToolContext) -> int:
        gauge.enter(ctx.tool)
        try:
            # A few scheduling points so that many handlers are genuinely in flight.
            for _ in range(3):
                await anyio.lowlevel.checkpoint()
        finally:
            gauge.leave(ctx.tool)
        return args.n

    def blocking(args: N, ctx: ToolContext) -> int:
        gauge.enter(ctx.tool)
        try:
            time.sleep(0.0005)
        finally:
            gauge.leave(ctx.tool)
        return args.n

    return Registry(
        [
            ToolSpec(name="free", description="unlimited", args_type=N, handler=work),
            ToolSpec(
                name="limited",
                description="limited",
                args_type=N,
                handler=work,
                max_concurrency=limited,
            ),
            ToolSpec(
                name="blocking",
                description="sync, limited",
                args_type=N,
                handler=blocking,
                max_concurrency=thread_limited,
            ),
        ]
    )


MIX = (["free"] * 6 + ["limited"] * 3 + ["blocking"]) * 100  # 1,000 calls


@pytest.mark.anyio
async def test_concurrency_never_exceeds_limits_over_1000_calls() -> None:
    gauge = Gauge()
    registry = _gauged_registry(gauge)
    ctx = _ctx(parallelism=16)
    held: list[int] = []  # the batch's slots held, each time a handler begins
    enter = gauge.enter
    gauge.enter = lambda tool: (enter(tool), held.append(ctx.limiter.borrowed_tokens))[0]
    results = await execute_calls(_executables(registry, MIX), ctx, remaining_seconds=60)
    assert gauge.calls == 1000 and len(results) == 1000
    assert all(r.status == "ok" for r in results)
    # Never above the limits, and the limits were actually reached: all 16 slots held at
    # once. (Handlers in flight at once reach 15 or 16: a sync call holds its slot while
    # its worker thread starts, and the calls' fixed order can keep one there whenever
    # the others peak.)
    assert max(held) == 16
    assert 14 <= gauge.peak_total <= 16
    assert gauge.peak["limited"] == 3
    assert gauge.peak["blocking"] <= 2
    assert gauge.now == Counter({"free": 0, "limited": 0, "blocking": 0})
    # Proposal order, matched by id.
    assert [r.call.call_id for r in results] == [f"call_{i}" for i in range(1000)]
    assert [r.model_result for r in results] == [{"result": i} for i in range(1000)]


@pytest.mark.anyio
async def test_concurrency_limits_hold_end_to_end_in_one_turn_of_1000_calls() -> None:
    gauge = Gauge()
    registry = _gauged_registry(gauge, limited=4)
    calls = [RenderCall(f"c{i}", name, f'{{"n":{i}}}') for i, name in enumerate(MIX)]
    body = render_turn("openai_chat", calls=calls, fragment_size=64)
    turns = [ReplayTurn(body=body), turn("openai_chat", text="done")]
    async with ReplayServer(turns) as server:
        runner, progress = make_runner(
            "openai_chat",
            server.base_url,
            registry,
            limits=Limits(max_calls_per_response=1000),
            budgets=Budgets(max_tool_calls=1000, max_parallelism=12),
        )
        result = await runner.start("go")
        wire = wire_results("openai_chat", server.requests[1])
    assert result.state is OpState.COMPLETED
    assert gauge.calls == 1000
    # (See the test above: handlers in flight reach the limit or one below it.)
    assert 10 <= gauge.peak_total <= 12
    assert gauge.peak["limited"] == 4 and gauge.peak["blocking"] <= 2
    assert [w.call_id for w in wire] == [f"c{i}" for i in range(1000)]
    assert [w.payload for w in wire] == [{"result": i} for i in range(1000)]
    assert len(progress.of(CallFinished)) == 1000
    progress.path()


@pytest.mark.anyio
async def test_per_tool_limit_holds_across_concurrent_operations_of_one_runner() -> None:
    gauge = Gauge()
    ops = 4
    all_asked = anyio.Event()

    async def limited(args: N, ctx: ToolContext) -> int:
        # Hold the slot until every operation has asked its model: from then on all four
        # operations have calls queued at once (per-operation limiters would allow 8).
        await all_asked.wait()
        gauge.enter(ctx.tool)
        try:
            for _ in range(3):
                await anyio.lowlevel.checkpoint()
        finally:
            gauge.leave(ctx.tool)
        return args.n

    registry = Registry(
        [ToolSpec(name="limited", description="l", args_type=N, handler=limited, max_concurrency=2)]
    )
    calls = [(f"c{i}", "limited", f'{{"n":{i}}}') for i in range(10)]
    # One model turn per operation (max_turns=1): every request gets a tool turn.
    async with ReplayServer([turn("openai_chat", calls=calls)] * ops) as server:
        runner, _ = make_runner(
            "openai_chat", server.base_url, registry, budgets=Budgets(max_turns=1)
        )
        states: list[OpState] = []

        async def one() -> None:
            states.append((await runner.start("go")).state)

        async with anyio.create_task_group() as tg:
            for _ in range(ops):
                tg.start_soon(one)
            await server.wait_for_requests(ops)
            all_asked.set()
    assert states == [OpState.ESCALATED] * ops  # max_turns, after running the calls
    assert gauge.calls == 10 * ops
    assert gauge.peak["limited"] == 2


@pytest.mark.anyio
async def test_calls_queued_behind_a_limited_tool_do_not_starve_other_tools() -> None:
    gauge = Gauge()
    registry = _gauged_registry(gauge, limited=1)
    names = ["limited"] * 40 + ["free"] * 40
    results = await execute_calls(
        _executables(registry, names), _ctx(parallelism=6), remaining_seconds=30
    )
    assert all(r.status == "ok" for r in results)
    # The 39 queued "limited" calls hold no batch slot: "free" calls fill the other five.
    assert gauge.peak["limited"] == 1
    assert gauge.peak_total == 6


# --- deadlines ---------------------------------------------------------------------------


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


@pytest.mark.anyio
async def test_per_tool_deadline_overshoot_stays_small(anyio_backend: Any) -> None:
    timeout = 0.05
    release = threading.Event()

    async def sleeper(args: N, ctx: ToolContext) -> int:
        await anyio.sleep(60)
        return 0

    def blocker(args: N, ctx: ToolContext) -> int:
        release.wait(60)  # abandoned at the deadline; released at the end of the test
        return 0

    registry = Registry(
        [
            ToolSpec(
                name="sleeper", description="s", args_type=N, handler=sleeper, timeout=timeout
            ),
            ToolSpec(
                name="blocker", description="b", args_type=N, handler=blocker, timeout=timeout
            ),
        ]
    )
    names = ["sleeper"] * 200 + ["blocker"] * 20
    try:
        started = time.monotonic()
        results = await execute_calls(
            _executables(registry, names), _ctx(parallelism=220), remaining_seconds=30
        )
        wall = time.monotonic() - started
    finally:
        release.set()
    assert [r.status for r in results] == ["timeout"] * len(names)
    assert all(r.ran and r.is_error for r in results)
    assert all(r.model_result["error"]["code"] == "timeout" for r in results)
    over_async = [r.duration_ms / 1000 - timeout for r in results[:200]]
    over_sync = [r.duration_ms / 1000 - timeout for r in results[200:]]
    print(
        f"\n[{anyio_backend[1]}] per-tool deadline overshoot, timeout {timeout * 1000:.0f} ms: "
        f"async p50 {statistics.median(over_async) * 1000:.2f} ms, "
        f"p99 {_p99(over_async) * 1000:.2f} ms, max {max(over_async) * 1000:.2f} ms (200 calls); "
        f"sync p99 {_p99(over_sync) * 1000:.2f} ms (20 calls); batch wall {wall * 1000:.0f} ms"
    )
    assert min(over_async + over_sync) >= -0.001  # never cut early
    # Abandoned at the deadline, not after the bodies' 60 s: the bounds are loose on
    # purpose: a loaded CI machine schedules 220 tasks and 20 threads late (the run
    # prints the overshoot it measured; typical p99 is a few ms).
    # (A once-seen flake beside a CPU-bound neighbour: bounds far below the bodies' 60 s
    # still prove the abandonment without timing the machine.)
    assert _p99(over_async) < 10.0 and _p99(over_sync) < 10.0
    assert wall < 30.0


@pytest.mark.anyio
async def test_operation_deadline_cancels_running_calls_and_each_gets_a_result() -> None:
    entered: list[str] = []

    async def slow(args: N, ctx: ToolContext) -> int:
        entered.append(ctx.call_id)
        await anyio.sleep(60)
        return 0

    async def fast(args: N, ctx: ToolContext) -> int:
        return args.n

    registry = Registry(
        [
            ToolSpec(name="slow_read", description="r", args_type=N, handler=slow, timeout=30),
            ToolSpec(
                name="slow_write",
                description="w",
                args_type=N,
                handler=slow,
                timeout=30,
                risk=RiskClass.WRITE,
            ),
            ToolSpec(name="fast", description="f", args_type=N, handler=fast),
        ]
    )
    names = ["slow_read", "fast", "slow_write", "slow_read", "fast"]
    # Parallelism 2: the last slow_read is still waiting for a slot at the deadline.
    started = time.monotonic()
    # (2 s, not less: on a loaded machine the fast call must still get its slot and finish
    # before the deadline; it seemed flaky at 0.2 s beside CPU-bound neighbours.)
    results = await execute_calls(
        _executables(registry, names), _ctx(parallelism=2), remaining_seconds=2.0
    )
    elapsed = time.monotonic() - started
    assert elapsed < 20  # cut at the 2 s deadline, never after the bodies' 60 s
    assert [r.call.call_id for r in results] == [f"call_{i}" for i in range(5)]
    statuses = [r.status for r in results]
    # A read that was running or never started times out; a side effect that had started
    # may have happened: outcome_unknown, never a blind "timeout" that invites a retry.
    # (On a loaded machine the write may still wait for its slot at the deadline: then it
    # never started, and a plain timeout is the truth.)
    assert statuses[0] == "timeout" and statuses[1] == "ok" and statuses[4] in ("ok", "timeout")
    if "call_2" in entered:
        assert statuses[2] == "outcome_unknown"
        assert results[2].model_result["error"]["code"] == "outcome_unknown"
    else:
        assert statuses[2] == "timeout" and not results[2].ran
    assert statuses[3] == "timeout" and results[3].ran is ("call_3" in entered)
    assert all(r.is_error for r, s in zip(results, statuses, strict=True) if s != "ok")


@pytest.mark.anyio
async def test_zero_time_left_answers_every_call_without_running_it() -> None:
    ran: list[int] = []

    async def handler(args: N, ctx: ToolContext) -> int:
        ran.append(args.n)
        return args.n

    registry = Registry([ToolSpec(name="t", description="t", args_type=N, handler=handler)])
    results = await execute_calls(_executables(registry, ["t"] * 3), _ctx(), remaining_seconds=0.0)
    assert ran == []
    assert [(r.status, r.ran) for r in results] == [("timeout", False)] * 3


# --- cancellation ------------------------------------------------------------------------


@pytest.mark.anyio
# Counts asyncio's tasks (asyncio.all_tasks): asyncio and uvloop only. On trio a task
# cannot outlive the nursery that started it, so there is no leak to count.
@pytest.mark.parametrize(
    "anyio_backend",
    [("asyncio", {"use_uvloop": False}), ("asyncio", {"use_uvloop": True})],
    ids=["asyncio", "uvloop"],
)
async def test_cancelling_an_operation_mid_dispatch_leaks_no_task() -> None:
    n = 12
    running = 0
    finished_normally = 0
    all_in = anyio.Event()

    async def handler(args: N, ctx: ToolContext) -> int:
        nonlocal running, finished_normally
        running += 1
        try:
            if running == n:
                all_in.set()
            await anyio.sleep(60)
            finished_normally += 1
        finally:
            running -= 1
        return args.n

    registry = Registry([ToolSpec(name="t", description="t", args_type=N, handler=handler)])
    calls = [(f"c{i}", "t", f'{{"n":{i}}}') for i in range(n)]
    before = len(asyncio.all_tasks())
    async with ReplayServer([turn("anthropic", calls=calls)]) as server:
        runner, progress = make_runner(
            "anthropic", server.base_url, registry, budgets=Budgets(max_parallelism=n)
        )
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(runner.start, "go")
                await all_in.wait()
                scope.cancel()
        assert scope.cancelled_caught
    await anyio.wait_all_tasks_blocked()
    assert running == 0 and finished_normally == 0
    # Every task the operation started is gone (the server's tasks ended with it too).
    assert len(asyncio.all_tasks()) == before
    assert [c.new for c in progress.events if hasattr(c, "new")][-1] == "executing"


@pytest.mark.anyio
async def test_handler_errors_become_safe_envelopes() -> None:
    async def boom(args: N, ctx: ToolContext) -> int:
        raise RuntimeError("db password=hunter2")

    def sync_boom(args: N, ctx: ToolContext) -> int:
        raise ValueError("secret")

    async def not_json(args: N, ctx: ToolContext) -> object:
        return object()

    registry = Registry(
        [
            ToolSpec(name="boom", description="b", args_type=N, handler=boom),
            ToolSpec(name="sync_boom", description="b", args_type=N, handler=sync_boom),
            ToolSpec(name="not_json", description="b", args_type=N, handler=not_json),
        ]
    )
    results = await execute_calls(
        _executables(registry, ["boom", "sync_boom", "not_json"]), _ctx(), remaining_seconds=5
    )
    assert [r.status for r in results] == ["handler_error"] * 3
    for r in results:
        text = msgspec.json.encode(r.model_result)
        assert b"hunter2" not in text and b"secret" not in text
        assert r.model_result["error"]["code"] == "handler_error"
    assert results[0].detail == "RuntimeError"  # audit-only detail: the type, not the text


@pytest.mark.anyio
async def test_per_tool_result_limit_applies_below_the_operation_limit() -> None:
    async def big(args: N, ctx: ToolContext) -> str:
        return "x" * args.n

    registry = Registry(
        [ToolSpec(name="big", description="b", args_type=N, handler=big, max_result_bytes=100)]
    )
    # {"result":"xx..."} is 13 bytes of framing plus the string: 100 and 101 bytes.
    calls = [
        ProposedCall(index=i, call_id=f"c{i}", name="big", arguments={"n": n}, raw_arguments=b"")
        for i, n in enumerate([87, 88])
    ]
    verdicts = [v for v in validate_turn(calls, registry, AUTH) if isinstance(v, Executable)]
    results = await execute_calls(verdicts, _ctx(), remaining_seconds=5)
    assert [r.status for r in results] == ["ok", "result_too_large"]
