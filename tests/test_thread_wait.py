"""A sync handler's wait for one of anyio's worker threads is not part of its deadline.

Under load (the default thread limiter's 40 threads busy, here shrunk to one) a sync
write used to time out while queued for a thread and end ``outcome_unknown``, an
escalation, though it never ran. The wait now counts against the operation's deadline
only; a call answered by that deadline while still queued never runs later; and the
thread token is never held across a store call (a host store on the same thread pool
would deadlock)."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator

import anyio
import anyio.to_thread
import pytest

from callgate.engine.core.registry import Registry, RiskClass, ToolContext, ToolSpec
from callgate.engine.runtime.dispatch import DispatchContext, execute_calls
from callgate.engine.runtime.replay import ReplayServer
from callgate.engine.store.base import LedgerState
from callgate.engine.store.memory import MemoryStore

from .test_dispatch_faults import AUTH, N, _executables


@pytest.fixture
async def one_thread() -> AsyncIterator[None]:
    limiter = anyio.to_thread.current_default_thread_limiter()
    before = limiter.total_tokens
    limiter.total_tokens = 1
    try:
        yield
    finally:
        limiter.total_tokens = before


def _ctx(store: MemoryStore | None) -> DispatchContext:
    return DispatchContext(
        auth=AUTH,
        store=store,
        worker_id="w",
        max_parallelism=8,
        max_result_bytes=64 * 1024,
        clock=time.monotonic,
    )


class _Clocked:
    """Sync handlers that note when each body started."""

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self.t0 = time.monotonic()
        self.started: dict[str, float] = {}
        self.holding = threading.Event()

    def hold_thread(self, args: N, ctx: ToolContext) -> int:
        self.started[ctx.tool] = time.monotonic() - self.t0
        self.holding.set()
        time.sleep(self.hold)
        return args.n

    def write(self, args: N, ctx: ToolContext) -> int:
        self.started[ctx.tool] = time.monotonic() - self.t0
        return args.n


def _registry(handlers: _Clocked, write_timeout: float) -> Registry:
    return Registry(
        [
            ToolSpec(
                name="hold", description="d", args_type=N, handler=handlers.hold_thread, timeout=5
            ),
            ToolSpec(
                name="w",
                description="d",
                args_type=N,
                handler=handlers.write,
                risk=RiskClass.WRITE,
                timeout=write_timeout,
            ),
        ]
    )


@pytest.mark.anyio
@pytest.mark.usefixtures("one_thread")
async def test_a_sync_write_queued_for_a_thread_past_its_timeout_runs_once_a_thread_frees() -> None:
    handlers = _Clocked(hold=0.6)
    store = MemoryStore()
    with anyio.fail_after(10):
        results = await execute_calls(
            _executables(_registry(handlers, write_timeout=0.2), ["hold", "w"]),
            _ctx(store),
            remaining_seconds=5,
        )
    assert [r.status for r in results] == ["ok", "ok"]
    # It waited for the only thread (longer than its own 0.2 s deadline), then ran once.
    assert handlers.started["w"] >= handlers.started["hold"] + 0.5
    key = results[1].idempotency_key
    assert key is not None
    record = await store.ledger_get("t", key)
    assert record is not None and record.state is LedgerState.SUCCEEDED


@pytest.mark.anyio
@pytest.mark.usefixtures("one_thread")
async def test_a_call_still_queued_at_the_operation_deadline_never_runs_later() -> None:
    handlers = _Clocked(hold=0.8)
    store = MemoryStore()
    with anyio.fail_after(10):
        results = await execute_calls(
            _executables(_registry(handlers, write_timeout=5), ["hold", "w"]),
            _ctx(store),
            remaining_seconds=0.3,
        )
        await anyio.sleep(0.8)  # the held thread is free again
    # Not outcome_unknown (an escalation): the write provably never ran.
    assert [r.status for r in results] == ["timeout", "timeout"]
    assert not results[1].ran and "w" not in handlers.started
    key = results[1].idempotency_key
    assert key is not None
    record = await store.ledger_get("t", key)
    assert record is not None and record.state is LedgerState.FAILED


class _ThreadedStore(MemoryStore):
    """A host's store whose ledger writes hop through anyio's default thread pool."""

    async def ledger_begin(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        await anyio.to_thread.run_sync(time.sleep, 0.01)
        return await super().ledger_begin(*args, **kwargs)  # type: ignore[arg-type]

    async def ledger_finish(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        await anyio.to_thread.run_sync(time.sleep, 0.01)
        return await super().ledger_finish(*args, **kwargs)  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.usefixtures("one_thread")
async def test_the_thread_token_is_never_held_across_a_store_call() -> None:
    handlers = _Clocked(hold=0.05)
    registry = _registry(handlers, write_timeout=2)
    store = _ThreadedStore()
    with anyio.fail_after(10):  # a token held across ledger_finish would deadlock here
        results = await execute_calls(
            _executables(registry, ["w", "w", "w", "hold"]), _ctx(store), remaining_seconds=8
        )
    assert [r.status for r in results] == ["ok", "ok", "ok", "ok"]


@pytest.mark.anyio
@pytest.mark.usefixtures("one_thread")
async def test_a_thread_running_past_its_deadline_keeps_its_token_until_it_returns() -> None:
    release = threading.Event()
    ran: list[int] = []

    def stuck(args: N, ctx: ToolContext) -> int:
        release.wait(5)
        return args.n

    def quick(args: N, ctx: ToolContext) -> int:
        ran.append(args.n)
        return args.n

    registry = Registry(
        [
            ToolSpec(name="stuck", description="d", args_type=N, handler=stuck, timeout=0.1),
            ToolSpec(name="quick", description="d", args_type=N, handler=quick, timeout=5),
        ]
    )
    threads = anyio.to_thread.current_default_thread_limiter()
    with anyio.fail_after(10):
        first = await execute_calls(
            _executables(registry, ["stuck"]), _ctx(None), remaining_seconds=5
        )
        assert [r.status for r in first] == ["timeout"]
        assert threads.borrowed_tokens == 1  # the abandoned thread still runs: its token
        threading.Timer(0.3, release.set).start()
        second = await execute_calls(
            _executables(registry, ["quick"]), _ctx(None), remaining_seconds=5
        )
    # The quick call waited for the only thread (not past its deadline), then ran.
    assert [r.status for r in second] == ["ok"] and ran == [0]
    await anyio.sleep(0.05)
    assert threads.borrowed_tokens == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_runner_reused_across_event_loops_keeps_its_tool_slots(backend: str) -> None:
    # A sync host calls anyio.run(runner.start, ...) per request with one runner. The
    # first run's timed-out thread outlived its loop, and the tool's slot, given back on
    # that dead loop, was lost for good: every later call of the tool waited out its
    # operation's deadline. (On trio every run shared one set of limiters, keyed by no
    # loop, and lost the slot the same way.)
    from .loop_helpers import make_runner, turn

    release = threading.Event()

    def slow(args: N, ctx: ToolContext) -> int:
        release.wait(args.n)
        return args.n

    registry = Registry(
        [
            ToolSpec(
                name="s", description="d", args_type=N, handler=slow, timeout=0.2, max_concurrency=1
            )
        ]
    )
    turns = [
        turn("openai_chat", calls=[("c1", "s", '{"n": 5}')]),
        turn("openai_chat", text="ok"),
        turn("openai_chat", calls=[("c2", "s", '{"n": 0}')]),
        turn("openai_chat", text="ok"),
    ]
    with ReplayServer.run_in_thread(turns) as server:
        runner, _ = make_runner("openai_chat", server.base_url, registry)

        async def go() -> list[str]:
            with anyio.fail_after(5):
                result = await runner.start("go")
            return [c.status for c in result.calls]

        assert anyio.run(go, backend=backend) == ["timeout"]  # its thread outlives the loop
        release.set()
        time.sleep(0.2)  # that thread has returned, its loop long gone
        assert anyio.run(go, backend=backend) == ["ok"]
