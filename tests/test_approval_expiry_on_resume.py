"""An approval authorizes its call only until it expires, also when a resume consumed it
and did not run the call then:

- a resume that failed after consuming (and perhaps running the call), replayed past the
  approval's expiry, escalates: the call may have run (the ledger forgets finished keys
  after its retention), and the expiry forbids running it now;
- a resume that pauses the turn again (another call needs approval now) ran nothing, so
  it asks again for the calls whose approvals it consumed: they never run later on an
  approval past its expiry.

Real SQLite file store, real loopback replay server, a clock the test moves."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import msgspec
import pytest

from callgate.engine.cli_audit import verify_file
from callgate.engine.core.registry import Decision, Registry
from callgate.engine.core.states import OpInput, OpState
from callgate.engine.runtime.audit_sink import JsonlAuditSink
from callgate.engine.runtime.loop import Runner
from callgate.engine.runtime.progress import ProgressEvent, StateChanged
from callgate.engine.runtime.replay import ReplayServer
from callgate.engine.store.base import ApprovalStatus
from callgate.engine.store.sqlite import SQLiteStore

from .loop_helpers import chat_runner, refund_and_lookup, turn

pytestmark = pytest.mark.anyio
P = "openai_chat"
T0 = 1_800_000_000.0
TTL = 3600.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def _runner(server: ReplayServer, reg: Registry, store: SQLiteStore, **kw: Any) -> Runner:
    return chat_runner(server.base_url, reg, store, approval_ttl=TTL, **kw)


class SinkFailed(Exception):
    pass


async def _fails_on_results(event: ProgressEvent) -> None:
    if isinstance(event, StateChanged) and event.new == "results_ready":
        raise SinkFailed  # after the approved call ran, before the model is asked again


@pytest.mark.parametrize("expired", [True, False], ids=["past-expiry", "before-expiry"])
async def test_a_replayed_resume_escalates_past_the_approvals_expiry_only(
    tmp_path: Path, expired: bool
) -> None:
    ran: list[str] = []
    reg, clock = refund_and_lookup(ran), Clock()
    turns = [turn(P, calls=[("c1", "refund", '{"order_id":"A"}')]), turn(P, text="Done.")]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        paused = await _runner(server, reg, store, clock=clock).start("Refund A")
        (approval_id,) = paused.pending_approvals
        await store.decide_approval(approval_id, True, "alice", "ok", now=T0 + 10)
        clock.t = T0 + 20
        failing = _runner(server, reg, store, clock=clock, progress=_fails_on_results)
        with pytest.raises(SinkFailed):
            await failing.resume(paused.operation_id)
        assert ran == ["refund A"]  # ran, and the pause is left to be replayed
        # Past the expiry (whatever the ledger still holds), or just before it.
        clock.t = T0 + TTL if expired else T0 + TTL - 1
        done = await _runner(server, reg, store, clock=clock).resume(paused.operation_id)
        if expired:
            assert len(server.requests) == 1  # the model was never asked again
    if expired:
        assert done.state is OpState.ESCALATED and done.stop is not None
        assert done.stop.input is OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE
        assert "c1" in done.stop.reason and "expired" in done.stop.reason
    else:  # answered by the ledger
        assert done.state is OpState.COMPLETED
        assert [c.status for c in done.calls] == ["replayed"]
    assert ran == ["refund A"]


async def test_a_resume_that_pauses_again_asks_again_for_what_it_consumed(tmp_path: Path) -> None:
    ran: list[str] = []
    base, clock = refund_and_lookup(ran), Clock()
    # Between the pause and the resume a deploy made get_order approval-gated.
    gated = Registry(
        [base.get("refund"), dataclasses.replace(base.get("get_order"), approval=True)]
    )
    calls = [
        ("c_refund", "refund", '{"order_id":"A"}'),
        ("c_read", "get_order", '{"order_id":"A"}'),
    ]
    async with (
        ReplayServer([turn(P, calls=calls), turn(P, text="Done.")]) as server,
        SQLiteStore(tmp_path / "db") as store,
    ):
        paused = await _runner(server, base, store, clock=clock).start("Refund A")
        (first,) = paused.pending_approvals
        await store.decide_approval(first, True, "alice", "ok", now=T0 + 60)
        clock.t = T0 + 120
        again = await _runner(server, gated, store, clock=clock).resume(paused.operation_id)
        assert again.state is OpState.WAITING_APPROVAL and ran == []
        assert first not in again.pending_approvals and len(again.pending_approvals) == 2
        for approval_id in again.pending_approvals:  # both asked for, from now
            record = await store.get_approval(approval_id)
            assert record is not None and record.status is ApprovalStatus.PENDING
            assert record.expires_at == clock.t + TTL
        clock.t = T0 + 86_400  # nobody decided: a day later, any worker resumes
        done = await _runner(server, gated, store, clock=clock).resume(paused.operation_id)
    assert done.state is OpState.COMPLETED
    assert sorted((c.call_id, c.status) for c in done.calls) == [
        ("c_read", "approval_expired"),
        ("c_refund", "approval_expired"),
    ]
    assert ran == []


async def test_a_consumed_approval_of_a_call_refused_at_a_repause_is_dropped(
    tmp_path: Path,
) -> None:
    # The resume that pauses again finished: the refund its policy refuses now ran
    # nothing, so its spent approval must not read, later, as one an unfinished resume
    # consumed (that would escalate an operation in which nothing ran).
    ran: list[str] = []
    frozen = [False]

    def refund_policy(ctx: Any, args: Any) -> Decision | bool:
        return Decision(allowed=False, reason="refunds frozen") if frozen[0] else True

    base, clock = refund_and_lookup(ran, refund_policy), Clock()
    gated = Registry(
        [base.get("refund"), dataclasses.replace(base.get("get_order"), approval=True)]
    )
    calls = [
        ("c_refund", "refund", '{"order_id":"A"}'),
        ("c_read", "get_order", '{"order_id":"A"}'),
    ]
    async with (
        ReplayServer([turn(P, calls=calls), turn(P, text="Done.")]) as server,
        SQLiteStore(tmp_path / "db") as store,
    ):
        paused = await _runner(server, base, store, clock=clock).start("Refund A")
        (first,) = paused.pending_approvals
        await store.decide_approval(first, True, "alice", "ok", now=T0 + 60)
        frozen[0] = True
        clock.t = T0 + 3000
        again = await _runner(server, gated, store, clock=clock).resume(paused.operation_id)
        assert again.state is OpState.WAITING_APPROVAL
        (read_approval,) = again.pending_approvals  # only what a person can still decide
        record = await store.get_approval(read_approval)
        assert record is not None and record.tool == "get_order"
        await store.decide_approval(read_approval, True, "bob", "ok", now=T0 + 5000)
        clock.t = T0 + 5000  # the refund's approval has expired; the new one holds
        done = await _runner(server, gated, store, clock=clock).resume(paused.operation_id)
    assert done.state is OpState.COMPLETED, done.stop
    assert sorted((c.call_id, c.status) for c in done.calls) == [
        ("c_read", "ok"),
        ("c_refund", "denied"),
    ]
    assert ran == ["get_order A"]


async def test_who_decided_is_in_the_chained_audit_trail(tmp_path: Path) -> None:
    ran: list[str] = []
    reg, clock = refund_and_lookup(ran), Clock()
    trail = tmp_path / "audit.jsonl"
    turns = [turn(P, calls=[("c1", "refund", '{"order_id":"A"}')]), turn(P, text="Done.")]
    async with (
        ReplayServer(turns) as server,
        SQLiteStore(tmp_path / "db") as store,
        JsonlAuditSink(trail) as sink,
    ):
        paused = await _runner(server, reg, store, clock=clock, audit=sink.write).start("Refund A")
        (approval_id,) = paused.pending_approvals
        await store.decide_approval(approval_id, True, "alice", "customer called", now=T0 + 10)
        clock.t = T0 + 20
        done = await _runner(server, reg, store, clock=clock, audit=sink.write).resume(
            paused.operation_id
        )
    assert done.state is OpState.COMPLETED and ran == ["refund A"]
    records = [msgspec.json.decode(line) for line in trail.read_bytes().splitlines()]
    (decided,) = [r for r in records if r["kind"] == "approval" and r["data"].get("decided")]
    assert decided["call_id"] == "c1"
    assert {k: decided["data"][k] for k in ("approval_id", "approved", "approver", "reason")} == {
        "approval_id": approval_id,
        "approved": True,
        "approver": "alice",
        "reason": "customer called",
    }
    assert decided["data"]["decided_at"] == T0 + 10
    # Chained before the call ran: an edited approvals row no longer rewrites who decided.
    executed = next(r for r in records if r["kind"] == "executed")
    assert decided["seq"] < executed["seq"]
    with trail.open("rb") as handle:
        (report,) = verify_file(handle)
    assert report.ok and report.records == len(records), report
