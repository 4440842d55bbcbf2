"""The run loop end to end over real HTTP (the loopback replay server): a two-turn tool
operation completes with correlated, bound results; rejected calls never run a handler;
approvals pause with nothing in memory and resume from the store in a new Runner."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from callgate.engine.core.guards import Budgets
from callgate.engine.core.registry import Registry, RiskClass, ToolContext, ToolSpec
from callgate.engine.core.states import OpState
from callgate.engine.runtime.audit_sink import MemoryAuditSink
from callgate.engine.runtime.loop import Runner
from callgate.engine.runtime.progress import CallPreparing, ProgressEvent, StateChanged
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn
from callgate.engine.runtime.transport import ProviderEndpoint
from callgate.engine.store.sqlite import SQLiteStore

from .conftest import FIXTURES

STREAMS = Path(__file__).parent / "streams"
WEATHER_CALL = FIXTURES / "openai_chat" / "single_tool_call_get_weather.sse"
FINAL = STREAMS / "openai_chat_final_text.sse"


class WeatherArgs(msgspec.Struct, forbid_unknown_fields=True):
    city: str


def make_registry(calls: list[str], *, risk: RiskClass = RiskClass.READ) -> Registry:
    def get_weather(args: WeatherArgs, ctx: ToolContext) -> dict[str, object]:
        calls.append(args.city)
        return {"city": args.city, "forecast": "sunny"}

    return Registry(
        [
            ToolSpec(
                name="get_weather",
                description="Current weather for a city.",
                args_type=WeatherArgs,
                handler=get_weather,
                risk=risk,
                timeout=5.0,
            )
        ]
    )


def runner(base_url: str, registry: Registry, **kw: object) -> Runner:
    return Runner(
        provider="openai_chat",
        model="gpt-4o",
        registry=registry,
        endpoint=ProviderEndpoint(base_url=base_url, api_key="sk-test"),
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.anyio
async def test_two_turn_operation_completes_with_bound_results() -> None:
    ran: list[str] = []
    events: list[ProgressEvent] = []
    audit = MemoryAuditSink()

    async def progress(ev: ProgressEvent) -> None:
        events.append(ev)

    turns = [ReplayTurn.from_file(WEATHER_CALL, chunk_size=7), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server:
        result = await runner(
            server.base_url, make_registry(ran), progress=progress, audit=audit.write
        ).start("Weather in NYC?")
        sent = server.requests[1].json()
    assert result.state is OpState.COMPLETED
    assert result.text == "It is sunny."
    assert ran == ["New York City"]
    (summary,) = result.calls
    assert summary.call_id == "call_4XzlGBLtUe9dy3GVNV4jhq7h" and summary.status == "ok"
    assert summary.binding_sha256 and len(summary.binding_sha256) == 64
    # The follow-up request carries the echo and exactly one tool message for the call.
    tool_msgs = [m for m in sent["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == [summary.call_id]
    assert msgspec.json.decode(tool_msgs[0]["content"]) == {
        "result": {"city": "New York City", "forecast": "sunny"}
    }
    assert any(isinstance(e, CallPreparing) and e.name == "get_weather" for e in events)
    states = [e.new for e in events if isinstance(e, StateChanged)]
    assert states[-1] == "completed" and "executing" in states
    assert audit.records and audit.records[-1].kind == "state"


@pytest.mark.anyio
async def test_unknown_tool_gets_an_envelope_and_the_handler_never_runs() -> None:
    ran: list[str] = []
    registry = Registry([])  # get_weather is not registered
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server:
        result = await runner(server.base_url, registry).start("Weather?")
        sent = server.requests[1].json()
    assert result.state is OpState.COMPLETED
    assert result.calls[0].status == "unknown_tool"
    tool_msg = next(m for m in sent["messages"] if m["role"] == "tool")
    assert msgspec.json.decode(tool_msg["content"])["error"]["code"] == "unknown_tool"
    assert ran == []


@pytest.mark.anyio
async def test_truncated_stream_ends_incomplete_and_executes_nothing() -> None:
    ran: list[str] = []
    body = WEATHER_CALL.read_bytes()
    turns = [ReplayTurn(body=body[: body.index(b"York")])]
    async with ReplayServer(turns) as server:
        result = await runner(server.base_url, make_registry(ran)).start("Weather?")
    assert result.state is OpState.INCOMPLETE
    assert result.stop is not None and result.stop.reason
    assert ran == []


@pytest.mark.anyio
async def test_turn_budget_ends_escalated_not_an_exception() -> None:
    ran: list[str] = []
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(WEATHER_CALL)]
    async with ReplayServer(turns) as server:
        result = await runner(
            server.base_url, make_registry(ran), budgets=Budgets(max_turns=1)
        ).start("Weather?")
    assert result.state is OpState.ESCALATED
    assert result.stop is not None and "max_turns" in result.stop.reason
    assert ran == ["New York City"]  # the partial result of turn 1 is kept
    assert len(result.calls) == 1


@pytest.mark.anyio
async def test_approval_pauses_persisted_and_resumes_in_a_new_runner(tmp_path: Path) -> None:
    ran: list[str] = []
    registry = make_registry(ran, risk=RiskClass.IRREVERSIBLE)
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    db = tmp_path / "callgate.db"
    async with ReplayServer(turns) as server:
        async with SQLiteStore(db) as store:
            paused = await runner(server.base_url, registry, store=store).start("Weather?")
            assert paused.state is OpState.WAITING_APPROVAL
            (approval_id,) = paused.pending_approvals
            assert ran == []
            await store.decide_approval(approval_id, True, "alice", "ok", now=_now())
        # A fresh store handle and runner: nothing survives in memory.
        async with SQLiteStore(db) as store2:
            resumed = await runner(server.base_url, registry, store=store2).resume(
                paused.operation_id
            )
            again = await runner(server.base_url, registry, store=store2).resume(
                paused.operation_id
            )
    assert resumed.state is OpState.COMPLETED
    assert ran == ["New York City"]  # exactly once
    assert resumed.calls[0].approval_id == approval_id
    assert resumed.calls[0].idempotency_key
    assert again.state is OpState.COMPLETED and ran == ["New York City"]


@pytest.mark.anyio
async def test_denied_approval_returns_an_envelope_and_never_runs(tmp_path: Path) -> None:
    ran: list[str] = []
    registry = make_registry(ran, risk=RiskClass.IRREVERSIBLE)
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        paused = await runner(server.base_url, registry, store=store).start("Weather?")
        await store.decide_approval(paused.pending_approvals[0], False, "bob", "no", now=_now())
        done = await runner(server.base_url, registry, store=store).resume(paused.operation_id)
        sent = server.requests[1].json()
    assert done.state is OpState.COMPLETED
    assert done.calls[0].status == "denied"
    assert ran == []
    tool_msg = next(m for m in sent["messages"] if m["role"] == "tool")
    assert msgspec.json.decode(tool_msg["content"])["error"]["code"] == "denied"


def _now() -> float:
    import time

    return time.time()


@pytest.mark.anyio
@pytest.mark.parametrize("approved", [False, True], ids=["undecided", "approved-then-lapsed"])
async def test_an_expired_approval_is_recorded_expired_and_never_runs(
    tmp_path: Path, approved: bool
) -> None:
    # Nobody decided in time, or the approval lapsed before its use: the call does not
    # run, and the model is not told that nobody decided (the approvals table may say
    # somebody did).
    ran: list[str] = []
    registry = make_registry(ran, risk=RiskClass.IRREVERSIBLE)
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    clock = [1000.0]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        paused = await runner(
            server.base_url, registry, store=store, approval_ttl=5.0, clock=lambda: clock[0]
        ).start("Weather?")
        (approval_id,) = paused.pending_approvals
        if approved:
            await store.decide_approval(approval_id, True, "alice", "ok", now=clock[0] + 1.0)
        clock[0] += 6.0 if approved else 5.0  # (undecided: exactly at expiry)
        done = await runner(server.base_url, registry, store=store, clock=lambda: clock[0]).resume(
            paused.operation_id
        )
        record = await store.get_approval(approval_id)
        told = server.requests[1].body
    assert done.state is OpState.COMPLETED
    assert done.calls[0].status == "approval_expired"
    assert ran == []
    assert record is not None and record.status.value == "expired"
    assert b"The approval expired before the call could run; it did not run." in told
    assert b"anyone decided" not in told


async def _paused_and_approved(
    base_url: str, registry: Registry, store: SQLiteStore
) -> tuple[str, str]:
    paused = await runner(base_url, registry, store=store).start("Weather?")
    (approval_id,) = paused.pending_approvals
    await store.decide_approval(approval_id, True, "alice", "ok", now=_now())
    return paused.operation_id, approval_id


def _tool(ran: list[str], **overrides: object) -> ToolSpec:
    def get_weather(args: WeatherArgs, ctx: ToolContext) -> dict[str, object]:
        ran.append(args.city)
        return {"city": args.city}

    fields: dict[str, object] = {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "args_type": WeatherArgs,
        "handler": get_weather,
        "risk": RiskClass.IRREVERSIBLE,
        "timeout": 5.0,
    }
    fields.update(overrides)
    return ToolSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("change", "status"),
    [
        ("policy-tightened", "denied"),
        ("tool-removed", "unknown_tool"),
        ("schema-changed", "denied"),
        ("unauthorized-now", "unauthorized"),
    ],
)
async def test_resume_revalidates_under_the_current_registry(
    tmp_path: Path, change: str, status: str
) -> None:
    ran: list[str] = []
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        op_id, _ = await _paused_and_approved(server.base_url, Registry([_tool(ran)]), store)
        if change == "policy-tightened":
            current = Registry([_tool(ran, policy=lambda ctx, args: False)])
        elif change == "tool-removed":
            current = Registry([])
        elif change == "schema-changed":
            current = Registry([_tool(ran, schema_version="2")])
        else:
            current = Registry([_tool(ran, authorize=lambda auth, args: False)])
        done = await runner(server.base_url, current, store=store).resume(op_id)
    assert done.state is OpState.COMPLETED
    assert done.calls[0].status == status
    assert ran == []  # approved before the change, never executed after it


@pytest.mark.anyio
async def test_sixteen_concurrent_resumes_dispatch_exactly_once(tmp_path: Path) -> None:
    import anyio

    ran: list[str] = []
    registry = make_registry(ran, risk=RiskClass.IRREVERSIBLE)
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    results: list[OpState] = []
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        op_id, _ = await _paused_and_approved(server.base_url, registry, store)

        async def worker(i: int) -> None:
            r = runner(server.base_url, registry, store=store, worker_id=f"w{i}")
            results.append((await r.resume(op_id)).state)

        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(worker, i)
        final = await store.get_operation(op_id)
    assert ran == ["New York City"]
    assert len(server.requests) == 2  # one model turn after the pause, not sixteen
    assert OpState.COMPLETED in results
    assert final is not None and final.state == "completed"


class PaymentArgs(msgspec.Struct, forbid_unknown_fields=True):
    city: str
    api_token: str


@pytest.mark.anyio
async def test_planted_secret_in_a_sensitive_field_never_reaches_the_audit(
    planted_secret_scan: list[str],
) -> None:
    from callgate.adapters.render import RenderCall, render_turn

    from .conftest import PLANTED_SECRET

    ran: list[str] = []

    def pay(args: PaymentArgs, ctx: ToolContext) -> dict[str, object]:
        ran.append(args.city)
        return {"city": args.city, "token_echo": args.api_token}

    registry = Registry(
        [
            ToolSpec(
                name="pay",
                description="Pay.",
                args_type=PaymentArgs,
                handler=pay,
                sensitive_paths=("$.api_token",),
                sensitive_result_paths=("$.token_echo",),
            )
        ]
    )
    arguments = msgspec.json.encode({"city": "Oslo", "api_token": PLANTED_SECRET}).decode()
    turns = [
        ReplayTurn(body=render_turn("openai_chat", calls=[RenderCall("call_p", "pay", arguments)])),
        ReplayTurn.from_file(FINAL),
    ]
    audit = MemoryAuditSink()
    before = len(planted_secret_scan)
    async with ReplayServer(turns) as server:
        result = await runner(server.base_url, registry, audit=audit.write).start("Pay")
    assert result.state is OpState.COMPLETED and ran == ["Oslo"]
    written = [msgspec.json.encode(r).decode() for r in audit.records]
    assert written and all(PLANTED_SECRET not in line for line in written)
    assert any("[REDACTED]" in line for line in written)
    assert len(planted_secret_scan) > before  # the session scan saw these records too


@pytest.mark.anyio
async def test_arguments_edited_in_the_store_during_the_pause_are_not_executed(
    tmp_path: Path,
) -> None:
    ran: list[str] = []
    registry = make_registry(ran, risk=RiskClass.IRREVERSIBLE)
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        op_id, _ = await _paused_and_approved(server.base_url, registry, store)
        record = await store.get_operation(op_id)
        assert record is not None
        snapshot = msgspec.json.decode(record.snapshot)
        snapshot["outcome"]["calls"][0]["arguments"] = {"city": "Atlantis"}  # tampered
        await store.save_operation(
            msgspec.structs.replace(record, snapshot=msgspec.json.encode(snapshot)),
            expected_version=record.version,
            fencing_token=record.fencing_token,
        )
        done = await runner(server.base_url, registry, store=store).resume(op_id)
    assert done.calls[0].status == "denied"  # the approval was for other arguments
    assert ran == []
