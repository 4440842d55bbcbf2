"""Dispatch under host faults: a sync handler abandoned at its deadline keeps its
concurrency slots until its thread really returns (and one whose thread had not started
never runs); a side effect that times out is ``outcome_unknown``, never a retryable
``timeout``, and without a store (nothing can reconcile a retry) it stops the operation;
a failing ``idempotency_fields`` fails that call closed instead of crashing the batch; a
handler that changes its arguments in place changes neither the request its result is
bound to nor the call echoed back to the provider."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import msgspec
import orjson
import pytest

from callgate.engine.core.binding import request_digest
from callgate.engine.core.guards import Budgets
from callgate.engine.core.outcome import ProposedCall
from callgate.engine.core.registry import AuthContext, Registry, RiskClass, ToolContext, ToolSpec
from callgate.engine.core.states import OpState
from callgate.engine.core.validation import Executable, validate_turn
from callgate.engine.runtime.audit_sink import MemoryAuditSink
from callgate.engine.runtime.dispatch import DispatchContext, execute_calls
from callgate.engine.runtime.replay import ReplayServer

from .loop_helpers import make_runner, turn


class N(msgspec.Struct, forbid_unknown_fields=True):
    n: int


AUTH = AuthContext(tenant="t", subject="s", operation_id="op_faults")


def _executables(registry: Registry, names: list[str]) -> list[Executable]:
    calls = [
        ProposedCall(
            index=i,
            call_id=f"call_{i}",
            name=name,
            arguments={"n": i},
            raw_arguments=f'{{"n":{i}}}'.encode(),
        )
        for i, name in enumerate(names)
    ]
    verdicts = validate_turn(calls, registry, AUTH)
    assert all(isinstance(v, Executable) for v in verdicts)
    return [v for v in verdicts if isinstance(v, Executable)]


def _store_ctx(store: Any) -> DispatchContext:
    """A context with an idempotency ledger (``store``) and a clock that stands still."""
    return DispatchContext(
        auth=AUTH,
        store=store,
        worker_id="w",
        max_parallelism=4,
        max_result_bytes=64 * 1024,
        clock=lambda: 3.0,
    )


def _ctx(parallelism: int = 8, limiters: dict[str, Any] | None = None) -> DispatchContext:
    return DispatchContext(
        auth=AUTH,
        store=None,
        worker_id="w",
        max_parallelism=parallelism,
        max_result_bytes=64 * 1024,
        clock=time.monotonic,
        tool_limiters=limiters,
    )


class _Blocking:
    """A sync handler that blocks until released; counts bodies running at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = self.entered = 0
        self.release = threading.Event()

    def __call__(self, args: N, ctx: ToolContext) -> int:
        with self.lock:
            self.now += 1
            self.entered += 1
            self.peak = max(self.peak, self.now)
        try:
            self.release.wait(5.0)
        finally:
            with self.lock:
                self.now -= 1
        return args.n


@pytest.mark.anyio
async def test_an_abandoned_sync_handler_keeps_its_tool_slot_until_it_returns() -> None:
    handler = _Blocking()
    spec = ToolSpec(
        name="one", description="d", args_type=N, handler=handler, timeout=0.1, max_concurrency=1
    )
    registry = Registry([spec])
    limiters: dict[str, Any] = {}
    with anyio.fail_after(10):
        first = await execute_calls(
            _executables(registry, ["one"] * 3), _ctx(limiters=limiters), remaining_seconds=0.5
        )
    # The first call timed out on time; the others waited for the slot its thread still
    # holds (and were answered by the operation deadline, never run alongside it).
    assert first[0].status == "timeout"
    assert [r.status for r in first[1:]] == ["timeout", "timeout"]
    assert handler.entered == 1 and handler.peak == 1
    limiter = limiters["one"]
    assert limiter.borrowed_tokens == 1  # still the thread's
    handler.release.set()
    with anyio.fail_after(5):
        async with limiter:  # waits until the thread hands the slot back
            pass
    # The slot is usable again.
    again = await execute_calls(
        _executables(registry, ["one"]), _ctx(limiters=limiters), remaining_seconds=5
    )
    assert [r.status for r in again] == ["ok"] and handler.peak == 1


@pytest.mark.anyio
async def test_sync_handlers_over_their_deadline_never_exceed_the_batch_limit() -> None:
    handler = _Blocking()
    registry = Registry(
        [ToolSpec(name="slow", description="d", args_type=N, handler=handler, timeout=0.05)]
    )
    try:
        results = await execute_calls(
            _executables(registry, ["slow"] * 6), _ctx(parallelism=2), remaining_seconds=0.6
        )
    finally:
        handler.release.set()
    assert len(results) == 6 and all(r.status == "timeout" for r in results)
    assert handler.peak <= 2 and handler.entered == 2  # the rest never got a slot


@pytest.mark.anyio
async def test_sync_handlers_over_their_deadline_count_against_the_next_turns_too() -> None:
    # The abandoned threads of one turn still run when the next turn's calls start: the
    # drive's max_parallelism bounds them all, not each turn's batch on its own.
    handler = _Blocking()
    registry = Registry(
        [ToolSpec(name="slow", description="d", args_type=N, handler=handler, timeout=0.05)]
    )
    threading.Timer(0.4, handler.release.set).start()  # the first threads return at 0.4 s
    turns = [
        turn("openai_chat", calls=[(f"c{t}{i}", "slow", f'{{"n": {t * 2 + i}}}') for i in (0, 1)])
        for t in range(3)
    ]
    try:
        async with ReplayServer([*turns, turn("openai_chat", text="done")]) as server:
            runner, _ = make_runner(
                "openai_chat", server.base_url, registry, budgets=Budgets(max_parallelism=2)
            )
            result = await runner.start("go")
    finally:
        handler.release.set()
    assert result.state is OpState.COMPLETED
    statuses = [c.status for c in result.calls]
    assert statuses[:2] == ["timeout", "timeout"] and len(statuses) == 6
    assert handler.entered == 6 and handler.peak == 2  # later turns waited for the slots


@pytest.mark.anyio
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_a_handler_raising_a_cancellation_of_its_own_fails_alone(sync: bool) -> None:
    # It awaited a task someone else cancelled: nobody cancelled this call, so it is the
    # handler failing, and its healthy sibling runs to its end. (On trio asyncio's
    # CancelledError is no cancellation at all: the same answer, not a crashed batch.)
    import asyncio

    def raises(args: N, ctx: ToolContext) -> int:
        raise asyncio.CancelledError

    async def raises_async(args: N, ctx: ToolContext) -> int:
        raise asyncio.CancelledError

    finished: list[int] = []

    async def healthy(args: N, ctx: ToolContext) -> int:
        await anyio.sleep(0.1)
        finished.append(args.n)
        return args.n

    registry = Registry(
        [
            ToolSpec(
                name="bad", description="d", args_type=N, handler=raises if sync else raises_async
            ),
            ToolSpec(name="good", description="d", args_type=N, handler=healthy),
        ]
    )
    results = await execute_calls(
        _executables(registry, ["bad", "good"]), _ctx(), remaining_seconds=5.0
    )
    assert [(r.status, r.detail) for r in results] == [
        ("handler_error", "CancelledError"),
        ("ok", ""),
    ]
    assert finished == [1]


@pytest.mark.anyio
async def test_a_handler_whose_thread_had_not_started_never_runs() -> None:
    from callgate.engine.runtime.slots import Slots as _Slots

    ran: list[int] = []
    slots = _Slots(anyio.CapacityLimiter(1))
    await slots.acquire()
    run = slots.guard(lambda: ran.append(1))
    slots.abandon()  # answered before any thread picked the work up
    assert run() is None and ran == []
    slots.release()  # the task gives the slot back itself
    assert slots._limiters[0].borrowed_tokens == 0


@pytest.mark.anyio
async def test_a_side_effect_past_its_deadline_is_outcome_unknown_without_a_store() -> None:
    async def write(args: N, ctx: ToolContext) -> int:
        await anyio.sleep(5)
        return args.n

    async def read(args: N, ctx: ToolContext) -> int:
        await anyio.sleep(5)
        return args.n

    registry = Registry(
        [
            ToolSpec(
                name="w",
                description="d",
                args_type=N,
                handler=write,
                risk=RiskClass.WRITE,
                timeout=0.05,
            ),
            ToolSpec(name="r", description="d", args_type=N, handler=read, timeout=0.05),
        ]
    )
    results = await execute_calls(_executables(registry, ["w", "r"]), _ctx(), remaining_seconds=5)
    assert [r.status for r in results] == ["outcome_unknown", "timeout"]
    assert results[0].unresolved and not results[1].unresolved
    assert results[0].model_result["error"]["code"] == "outcome_unknown"


@pytest.mark.anyio
async def test_without_a_store_a_timed_out_write_stops_the_operation_and_never_reruns() -> None:
    # The drive's own in-memory ledger holds the key as unknown: the model's retry (same
    # intent, new call id) is not run again but reconciled, and with no reconcile the
    # operation stops for a human, as it does with a store.
    effects: list[int] = []

    async def charge(args: N, ctx: ToolContext) -> str:
        effects.append(args.n)  # the effect happens, the confirmation is slow
        await anyio.sleep(5)
        return "charged"

    registry = Registry(
        [
            ToolSpec(
                name="charge",
                description="d",
                args_type=N,
                handler=charge,
                risk=RiskClass.WRITE,
                timeout=0.1,
            )
        ]
    )
    provider = "openai_chat"
    turns = [
        turn(provider, calls=[("c1", "charge", '{"n":5}')]),
        turn(provider, calls=[("c2", "charge", '{"n":5}')]),  # the model's retry
        turn(provider, text="done"),
    ]
    async with ReplayServer(turns) as server:
        runner, _ = make_runner(provider, server.base_url, registry)
        result = await runner.start("go")
        sent = len(server.requests)
    assert result.state is OpState.ESCALATED
    assert [(c.call_id, c.status) for c in result.calls] == [
        ("c1", "outcome_unknown"),
        ("c2", "outcome_unknown"),
    ]
    assert result.calls[0].idempotency_key == result.calls[1].idempotency_key
    assert effects == [5]  # never run again
    assert sent == 2  # nothing more was asked of the model after the retry


@pytest.mark.anyio
async def test_a_failing_idempotency_fields_fails_that_call_closed() -> None:
    ran: list[str] = []

    async def handler(args: N, ctx: ToolContext) -> int:
        ran.append(ctx.tool)
        return args.n

    def bad_fields(args: Any) -> Any:
        raise KeyError("x")

    registry = Registry(
        [
            ToolSpec(
                name="w",
                description="d",
                args_type=N,
                handler=handler,
                risk=RiskClass.WRITE,
                idempotency_fields=bad_fields,
            ),
            ToolSpec(name="r", description="d", args_type=N, handler=handler),
        ]
    )
    results = await execute_calls(_executables(registry, ["r", "w"]), _ctx(), remaining_seconds=5)
    assert [r.status for r in results] == ["ok", "handler_error"]
    assert results[1].ran is False and "KeyError" in results[1].detail
    assert ran == ["r"]  # the side effect never ran without its key


class _Order(msgspec.Struct, forbid_unknown_fields=True):
    order: dict[str, Any]


@pytest.mark.anyio
@pytest.mark.parametrize("provider", ["openai_chat", "anthropic", "gemini"])
async def test_a_handler_changing_its_arguments_changes_neither_binding_nor_echo(
    provider: str,
) -> None:
    async def place(args: _Order, ctx: ToolContext) -> str:
        args.order["items"].append("injected")  # host code normalising its input in place
        return "ok"

    registry = Registry([ToolSpec(name="place", description="d", args_type=_Order, handler=place)])
    proposed = {"order": {"items": ["a"]}}
    turns = [
        turn(provider, calls=[("c1", "place", msgspec.json.encode(proposed).decode())]),
        turn(provider, text="done"),
    ]
    sink = MemoryAuditSink()
    async with ReplayServer(turns) as server:
        runner, _ = make_runner(provider, server.base_url, registry, audit=sink.write)
        result = await runner.start("go")
        follow_up = server.requests[1].body
    assert result.state is OpState.COMPLETED
    bound = next(r for r in sink.records if r.kind == "result")
    assert bound.data["request_sha256"] == request_digest("place", proposed)
    assert b"injected" not in follow_up  # the echo carries what the model proposed


@pytest.mark.anyio
async def test_a_reconcile_that_finds_nothing_gives_the_key_back_as_unknown(
    tmp_path: Any,
) -> None:
    from callgate.engine.store.base import LedgerState
    from callgate.engine.store.sqlite import SQLiteStore

    async def charge(args: N, ctx: ToolContext) -> int:
        raise AssertionError("an unknown outcome is never retried blindly")

    async def nothing_found(key: str, args: Any) -> Any:
        return None

    spec = ToolSpec(
        name="charge",
        description="d",
        args_type=N,
        handler=charge,
        risk=RiskClass.WRITE,
        reconcile=nothing_found,
    )
    registry = Registry([spec])
    (item,) = _executables(registry, ["charge"])
    key = spec.idempotency_key(AUTH.operation_id, item.args)
    async with SQLiteStore(str(tmp_path / "cg.db")) as store:
        # An earlier attempt timed out: the key is unknown.
        await store.ledger_begin(AUTH.tenant, key, item.args_digest, "earlier", now=1.0)
        await store.ledger_mark_unknown(AUTH.tenant, key, "earlier", now=2.0)
        ctx = _store_ctx(store)
        (result,) = await execute_calls([item], ctx, remaining_seconds=5)
        row = await store.ledger_get(AUTH.tenant, key)
    assert result.status == "outcome_unknown" and result.unresolved and not result.ran
    assert row is not None and row.state is LedgerState.UNKNOWN and row.owner is None


@pytest.mark.anyio
async def test_a_write_whose_handler_raised_is_finished_failed_and_replayed(
    tmp_path: Any,
) -> None:
    """The handler ran and failed: the key is finished FAILED with the error the model got
    (never left in flight, which a retry would read as an outcome it cannot know), and a
    retry under the same key answers that error without running the write again."""
    from callgate.engine.store.base import LedgerState
    from callgate.engine.store.sqlite import SQLiteStore

    runs: list[int] = []

    async def charge(args: N, ctx: ToolContext) -> int:
        runs.append(args.n)
        raise RuntimeError("card declined")

    spec = ToolSpec(
        name="charge", description="d", args_type=N, handler=charge, risk=RiskClass.WRITE
    )
    (item,) = _executables(Registry([spec]), ["charge"])
    key = spec.idempotency_key(AUTH.operation_id, item.args)
    async with SQLiteStore(str(tmp_path / "cg.db")) as store:
        ctx = _store_ctx(store)
        (first,) = await execute_calls([item], ctx, remaining_seconds=5)
        row = await store.ledger_get(AUTH.tenant, key)
        (again,) = await execute_calls([item], ctx, remaining_seconds=5)
    assert first.status == "handler_error" and first.ran
    assert row is not None and row.state is LedgerState.FAILED and row.owner is None
    assert row.result is not None and orjson.loads(row.result) == first.model_result
    assert runs == [0]  # the retry replayed the failure
    assert again.model_result == first.model_result and not again.ran


_LOOP_STOPPED = """
import asyncio, threading, time, msgspec
from callgate.engine.core.registry import AuthContext, Registry, ToolSpec
from callgate.engine.core.outcome import ProposedCall
from callgate.engine.core.validation import validate_turn
from callgate.engine.runtime.dispatch import DispatchContext, execute_calls

class N(msgspec.Struct, forbid_unknown_fields=True):
    n: int

def handler(args, ctx):
    time.sleep(0.5)
    return 1

auth = AuthContext(tenant="t", subject="s", operation_id="op")
registry = Registry([ToolSpec(name="one", description="d", args_type=N, handler=handler,
                              timeout=0.05)])
calls = [ProposedCall(index=0, call_id="c0", name="one", arguments={"n": 0},
                      raw_arguments=b'{"n":0}')]

async def main():
    ctx = DispatchContext(auth=auth, store=None, worker_id="w", max_parallelism=8,
                          max_result_bytes=65536, clock=time.monotonic)
    (result,) = await execute_calls(validate_turn(calls, registry, auth), ctx,
                                    remaining_seconds=5)
    print(result.status)

loop = asyncio.new_event_loop()
loop.run_until_complete(main())  # a host that drives one batch per run_until_complete
time.sleep(1.0)  # the handler returns while the loop is not running
loop.close()
"""


def test_an_abandoned_thread_never_blocks_on_a_stopped_loop(tmp_path: Any) -> None:
    # The thread hands its slots back without waiting for the loop: a loop that stopped
    # (not closed yet) would never run a blocking call, and the process could not exit.
    import subprocess
    import sys

    script = tmp_path / "loop_stopped.py"
    script.write_text(_LOOP_STOPPED)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "timeout"


@pytest.mark.anyio
async def test_a_reconcile_whose_key_was_taken_meanwhile_is_still_outcome_unknown() -> None:
    from callgate.engine.store.base import LEDGER_IN_FLIGHT_LEASE
    from callgate.engine.store.memory import MemoryStore

    clock = [10.0]
    store = MemoryStore()

    async def charge(args: N, ctx: ToolContext) -> int:
        raise AssertionError("an unknown outcome is never retried blindly")

    async def slow_lookup(key: str, args: Any) -> Any:
        # Meanwhile the lease runs out and another worker takes the key to reconcile it.
        clock[0] += LEDGER_IN_FLIGHT_LEASE + 1
        await store.ledger_begin(AUTH.tenant, key, item.args_digest, "other", now=clock[0])
        return None

    spec = ToolSpec(
        name="charge",
        description="d",
        args_type=N,
        handler=charge,
        risk=RiskClass.WRITE,
        reconcile=slow_lookup,
        timeout=1e6,
    )
    (item,) = _executables(Registry([spec]), ["charge"])
    key = spec.idempotency_key(AUTH.operation_id, item.args)
    await store.ledger_begin(AUTH.tenant, key, item.args_digest, "earlier", now=1.0)
    await store.ledger_mark_unknown(AUTH.tenant, key, "earlier", now=2.0)
    ctx = DispatchContext(
        auth=AUTH,
        store=store,
        worker_id="w",
        max_parallelism=4,
        max_result_bytes=64 * 1024,
        clock=lambda: clock[0],
    )
    (result,) = await execute_calls([item], ctx, remaining_seconds=5)
    assert result.status == "outcome_unknown" and result.unresolved
