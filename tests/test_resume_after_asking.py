"""A resumed drive that has asked the model again can never be replayed from its pause:
the model may word a call that already ran differently (a new idempotency key), and its
side effect would run twice. Whether the resume raised, was cancelled (the host's request
timed out) or its worker died without a word, the operation ends ``escalated``, and every
side effect ran once. An operation a failed drive ended keeps the head of the audit
records that drive wrote, the last of them its move to escalated. Real SQLite file
store, real loopback replay server."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from callgate.adapters.render import RenderCall, render_turn
from callgate.engine.core.audit import verify_trail
from callgate.engine.core.registry import Registry, RiskClass, ToolContext, ToolSpec
from callgate.engine.core.states import OpInput, OpState
from callgate.engine.runtime.audit_sink import JsonlAuditSink, MemoryAuditSink
from callgate.engine.runtime.loop import Runner
from callgate.engine.runtime.operation import SNAPSHOT_DECODER
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn
from callgate.engine.runtime.transport import ProviderEndpoint
from callgate.engine.store.errors import StoreUnavailable
from callgate.engine.store.sqlite import SQLiteStore

from .loop_helpers import FAST_RETRY

pytestmark = pytest.mark.anyio


class RefundArgs(msgspec.Struct, forbid_unknown_fields=True):
    order_id: str
    amount: int


class EmailArgs(msgspec.Struct, forbid_unknown_fields=True):
    to: str
    body: str


def _registry(effects: list[str]) -> Registry:
    def submit_refund(args: RefundArgs, ctx: ToolContext) -> dict[str, object]:
        effects.append(f"refund {args.order_id}")
        return {"refund_id": "r-1"}

    async def send_email(args: EmailArgs, ctx: ToolContext) -> dict[str, object]:
        effects.append(f"email {args.body}")
        return {"sent": True}

    return Registry(
        [
            ToolSpec(
                name="submit_refund",
                description="Refund an order.",
                args_type=RefundArgs,
                handler=submit_refund,
                risk=RiskClass.IRREVERSIBLE,  # needs approval
            ),
            ToolSpec(
                name="send_email",
                description="Email the customer.",
                args_type=EmailArgs,
                handler=send_email,
                risk=RiskClass.WRITE,  # runs without approval, under an idempotency key
            ),
        ]
    )


def _turn(*calls: tuple[str, str, str], text: str = "", delay: float = 0.0) -> ReplayTurn:
    body = render_turn("openai_chat", text=text, calls=[RenderCall(*c) for c in calls])
    return ReplayTurn(body=body, first_byte_delay_s=delay)


def _turns() -> list[ReplayTurn]:
    return [
        _turn(("c1", "submit_refund", '{"order_id":"A1","amount":5}')),  # start: pauses
        _turn(("c2", "send_email", '{"to":"bob@x","body":"Refund issued."}')),  # resume
        _turn(text="Done.", delay=30.0),  # the model is slow: the resume is cut here
        # What a replay of the pause would get: the same email, reworded.
        _turn(("c9", "send_email", '{"to":"bob@x","body":"Hi Bob, refund on its way."}')),
        _turn(text="Done."),
    ]


def _runner(server: ReplayServer, reg: Registry, store: SQLiteStore, **kw: Any) -> Runner:
    return Runner(
        provider="openai_chat",
        model="gpt-4o",
        registry=reg,
        endpoint=ProviderEndpoint(base_url=server.base_url, api_key="sk-test"),
        store=store,
        retry=FAST_RETRY,
        **kw,
    )


async def _approved_pause(server: ReplayServer, reg: Registry, store: SQLiteStore) -> str:
    paused = await _runner(server, reg, store).start("Refund A1")
    assert paused.state is OpState.WAITING_APPROVAL
    (approval_id,) = paused.pending_approvals
    await store.decide_approval(approval_id, True, "alice", "ok", now=time.time())
    return paused.operation_id


async def _wait_for_requests(server: ReplayServer, n: int) -> None:
    with anyio.fail_after(10):
        await server.wait_for_requests(n)


async def _stop_of(store: SQLiteStore, op_id: str) -> str:
    row = await store.get_operation(op_id)
    assert row is not None and row.owner is None and row.state == OpState.ESCALATED.value
    snap = SNAPSHOT_DECODER.decode(row.snapshot)
    assert snap.stop is not None and snap.stop.input is OpInput.DRIVE_FAILED
    return snap.stop.reason


async def test_a_resume_cancelled_after_asking_the_model_ends_escalated(tmp_path: Path) -> None:
    effects: list[str] = []
    reg = _registry(effects)
    sink = MemoryAuditSink()
    async with ReplayServer(_turns()) as server, SQLiteStore(tmp_path / "db") as store:
        paused = await _runner(server, reg, store, audit=sink.write).start("Refund A1")
        (approval_id,) = paused.pending_approvals
        await store.decide_approval(approval_id, True, "alice", "ok", now=time.time())
        op_id = paused.operation_id
        with anyio.move_on_after(10) as scope:  # cut by the host, not by this bound
            async with anyio.create_task_group() as tg:
                tg.start_soon(_runner(server, reg, store, audit=sink.write).resume, op_id)
                await _wait_for_requests(server, 3)  # the slow final turn was asked for
                tg.cancel_scope.cancel()
        assert not scope.cancelled_caught
        reason = await _stop_of(store, op_id)  # worded alike on every backend
        assert "no verdict: the resumed drive was cancelled after asking the model;" in reason
        asked = len(server.requests)
        again = await _runner(server, reg, store, audit=sink.write).resume(op_id)
        assert again.state is OpState.ESCALATED
        assert len(server.requests) == asked  # never replayed: the model was not asked again
        row = await store.get_operation(op_id)
    assert effects == ["refund A1", "email Refund issued."]
    # One unbroken trail, its last record the cancelled drive's end, from where it stood.
    assert row is not None
    snap = SNAPSHOT_DECODER.decode(row.snapshot)
    report = verify_trail(sink.lines, expected_head=snap.audit_head)
    assert report.ok and report.count == len(sink.records), report.reason
    end = sink.records[-1]
    assert end.kind == "state" and end.data["input"] == OpInput.DRIVE_FAILED.value
    assert (end.data["from"], end.data["to"]) == ("model_requested", "escalated")
    assert end.data["reason"] == reason


async def test_a_resume_whose_worker_went_silent_is_settled_not_replayed(tmp_path: Path) -> None:
    effects: list[str] = []
    reg = _registry(effects)
    clock = [time.time()]
    async with ReplayServer(_turns()) as server, SQLiteStore(tmp_path / "db") as store:
        op_id = await _approved_pause(server, reg, store)
        async with anyio.create_task_group() as tg:
            doomed = _runner(server, reg, store, worker_id="w-doomed", clock=lambda: clock[0])
            tg.start_soon(doomed.resume, op_id)
            await _wait_for_requests(server, 3)
            # Before its first model request the drive made that durable: the row is
            # past its pause, so no resume can replay the approved calls from it.
            row = await store.get_operation(op_id)
            assert row is not None and row.owner == "w-doomed"
            assert row.state == OpState.MODEL_REQUESTED.value
            # The worker stops answering (as if SIGKILLed); another takes the claim over.
            clock[0] += 3600.0
            late = _runner(
                server,
                reg,
                store,
                worker_id="w-late",
                claim_stale_after=300.0,
                clock=lambda: clock[0],
            )
            taken = await late.resume(op_id)
            assert taken.state is OpState.ESCALATED
            assert "no drive holds it" in await _stop_of(store, op_id)
            tg.cancel_scope.cancel()  # the doomed drive's release finds the claim not its own
        assert len(server.requests) == 3
        row = await store.get_operation(op_id)
        assert row is not None and row.state == OpState.ESCALATED.value
    assert effects == ["refund A1", "email Refund issued."]


class _LedgerDown(SQLiteStore):
    """A store whose ledger fails: the drive raises mid-way, after writing audit records."""

    async def ledger_begin(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("database is locked (simulated)")


async def test_an_operation_a_failed_drive_ended_keeps_the_head_of_its_trail(
    tmp_path: Path,
) -> None:
    effects: list[str] = []
    trail = tmp_path / "audit.jsonl"
    turns = [_turn(("c1", "send_email", '{"to":"bob@x","body":"hi"}')), _turn(text="Done.")]
    async with (
        ReplayServer(turns) as server,
        _LedgerDown(tmp_path / "db") as store,
        JsonlAuditSink(trail) as sink,
    ):
        with pytest.raises(StoreUnavailable):
            await _runner(server, _registry(effects), store, audit=sink.write).start(
                "Email Bob", operation_id="op1"
            )
        assert "the drive raised StoreUnavailable" in await _stop_of(store, "op1")
        row = await store.get_operation("op1")
    assert row is not None and effects == []
    snap = SNAPSHOT_DECODER.decode(row.snapshot)
    lines = trail.read_bytes().splitlines()
    assert snap.audit_seq == len(lines) > 0
    # The trail's last record is the move to escalated, from the state the drive was in.
    last = msgspec.json.decode(lines[-1])
    assert last["kind"] == "state" and last["seq"] == len(lines) - 1
    assert last["data"]["from"] == OpState.EXECUTING.value
    assert last["data"]["to"] == OpState.ESCALATED.value
    assert last["data"]["input"] == OpInput.DRIVE_FAILED.value
    assert "the drive raised StoreUnavailable" in last["data"]["reason"]
    # The stored head is the trail's last record: `audit verify --expected-head` holds.
    verify = ["audit", "verify", str(trail), "--operation", "op1"]
    proc = await anyio.run_process(
        [sys.executable, "-m", "callgate.engine.cli", *verify, "--expected-head", snap.audit_head],
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


async def test_a_sink_that_fails_at_the_end_costs_only_the_record_of_the_end(
    tmp_path: Path,
) -> None:
    """The drive fails because its audit sink does; the record of its end cannot be
    written either. The operation still ends escalated, and the stored head is the last
    record the sink took, so the trail still verifies against it."""
    written: list[Any] = []
    full: list[bool] = []

    async def sink(record: Any) -> None:
        if full or (record.kind == "state" and record.data["to"] == OpState.EXECUTING.value):
            full.append(True)  # from here on the disk stays full
            raise OSError("disk full (simulated)")
        written.append(record)

    effects: list[str] = []
    turns = [_turn(("c1", "send_email", '{"to":"bob@x","body":"hi"}')), _turn(text="Done.")]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        with pytest.raises(OSError):
            await _runner(server, _registry(effects), store, audit=sink).start(
                "Email Bob", operation_id="op1"
            )
        assert "the drive raised OSError" in await _stop_of(store, "op1")
        row = await store.get_operation("op1")
    assert row is not None and effects == [] and written
    snap = SNAPSHOT_DECODER.decode(row.snapshot)
    assert row.state == OpState.ESCALATED.value
    assert (snap.audit_seq, snap.audit_head) == (len(written), written[-1].digest)
    assert [r.data.get("to") for r in written if r.kind == "state"][-1] == "validating"
    assert len(full) == 2  # the end's record was tried, and lost with the disk


class _Wrapped:
    """A store whose first ``save_operation`` misbehaves (then it is the store again)."""

    def __init__(self, inner: SQLiteStore, *, commit: bool) -> None:
        self.inner, self.commit, self.done = inner, commit, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def save_operation(self, *args: Any, **kwargs: Any) -> Any:
        if self.done:
            return await self.inner.save_operation(*args, **kwargs)
        self.done = True
        if self.commit:  # committed, then the acknowledgement was lost
            await self.inner.save_operation(*args, **kwargs)
        raise StoreUnavailable("injected")


async def test_a_resume_lost_at_its_mark_is_settled_with_the_head_of_its_records(
    tmp_path: Path,
) -> None:
    effects: list[str] = []
    reg = _registry(effects)
    trail = tmp_path / "audit.jsonl"
    async with (
        ReplayServer(_turns()) as server,
        SQLiteStore(tmp_path / "db") as store,
        JsonlAuditSink(trail) as sink,
    ):
        paused = await _runner(server, reg, store, audit=sink.write).start("Refund A1")
        (approval_id,) = paused.pending_approvals
        await store.decide_approval(approval_id, True, "alice", "ok", now=time.time())
        lossy: Any = _Wrapped(store, commit=True)  # the mark commits, its ack is lost
        with pytest.raises(StoreUnavailable):
            await _runner(server, reg, lossy, audit=sink.write).resume(paused.operation_id)
        assert effects == ["refund A1"] and len(server.requests) == 1  # never asked again
        # Settling it hits a transient failure: the store's own error, to retry on.
        flaky: Any = _Wrapped(store, commit=False)
        with pytest.raises(StoreUnavailable):
            await _runner(server, reg, flaky, claim_stale_after=1e-9).resume(paused.operation_id)
        done = await _runner(server, reg, store, claim_stale_after=1e-9).resume(paused.operation_id)
        assert done.state is OpState.ESCALATED
        row = await store.get_operation(paused.operation_id)
    assert row is not None and effects == ["refund A1"]
    snap = SNAPSHOT_DECODER.decode(row.snapshot)
    # The mark kept the head of the records the drive wrote (the refund's among them).
    assert snap.audit_seq == len(trail.read_bytes().splitlines())
