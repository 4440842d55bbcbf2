"""Findings of a review of this stop's own changes, each with its test: the record of a
failed drive's end is never a move out of a terminal state, nor from a state the trail
never recorded; an empty binding secret is refused when the Runner is made (binding
runs as each handler returns); a busy resume still lists the approvals nobody has
decided; a transient failure that got no retry is no "retries exhausted". Real SQLite
file, real loopback replay server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from callgate.engine import ConfigError, OpState
from callgate.engine.core.audit import verify_trail
from callgate.engine.core.states import TRANSITIONS, OpInput
from callgate.engine.runtime.audit_sink import MemoryAuditSink
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn
from callgate.engine.store.errors import StoreUnavailable
from callgate.engine.store.sqlite import SQLiteStore

from .loop_helpers import chat_runner, make_runner, refund_and_lookup, turn

pytestmark = pytest.mark.anyio
P = "openai_chat"


def _legal(records: list[Any]) -> bool:
    moves = [r.data for r in records if r.kind == "state"]
    return all((OpState(m["from"]), OpInput(m["input"])) in TRANSITIONS for m in moves)


class _FailsOnceAt:
    """A store whose first save of an operation in ``state`` fails (then it is itself)."""

    def __init__(self, inner: SQLiteStore, state: str) -> None:
        self.inner, self.state, self.failed = inner, state, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def save_operation(self, record: Any, *args: Any, **kwargs: Any) -> Any:
        if record.state == self.state and not self.failed:
            self.failed = True
            raise StoreUnavailable("a blip (simulated)")
        return await self.inner.save_operation(record, *args, **kwargs)


async def test_a_drive_that_ended_but_could_not_persist_it_records_no_move_out_of_the_end(
    tmp_path: Path,
) -> None:
    sink = MemoryAuditSink()
    async with (
        ReplayServer([turn(P, text="Done.")]) as server,
        SQLiteStore(tmp_path / "db") as inner,
    ):
        store: Any = _FailsOnceAt(inner, OpState.COMPLETED.value)
        runner = chat_runner(server.base_url, refund_and_lookup([]), store, audit=sink.write)
        with pytest.raises(StoreUnavailable):
            await runner.start("Hi", operation_id="op1")
        row = await inner.get_operation("op1")
    assert row is not None and row.state == OpState.ESCALATED.value
    last = [r for r in sink.records if r.kind == "state"][-1]
    assert last.data["to"] == OpState.COMPLETED.value  # the trail ends where the drive did
    assert _legal(sink.records)
    assert verify_trail(sink.lines).ok


async def test_the_end_record_starts_from_the_last_state_the_trail_holds(tmp_path: Path) -> None:
    # The sink fails (once) on the record of the move to completed: the drive raises, and
    # the record of its end must not claim a move from a state the trail never showed.
    written: list[Any] = []
    lines: list[bytes] = []
    sink = MemoryAuditSink()
    failed: list[bool] = []

    async def flaky(record: Any) -> None:
        if record.kind == "state" and record.data["to"] == "completed" and not failed:
            failed.append(True)
            raise OSError("disk hiccup (simulated)")
        written.append(record)
        await sink.write(record)
        lines.extend(sink.lines[len(lines) :])

    async with ReplayServer([turn(P, text="Done.")]) as server, SQLiteStore(tmp_path / "db") as s:
        runner = chat_runner(server.base_url, refund_and_lookup([]), s, audit=flaky)
        with pytest.raises(OSError):
            await runner.start("Hi", operation_id="op1")
    states = [r.data for r in written if r.kind == "state"]
    assert states[-1]["to"] == "escalated"
    assert states[-1]["from"] == states[-2]["to"] if len(states) > 1 else True
    assert "completed" not in [m["to"] for m in states]
    assert _legal(written)
    assert verify_trail(lines).ok


def test_an_empty_binding_secret_is_refused_when_the_runner_is_made() -> None:
    with pytest.raises(ConfigError, match="binding secret"):
        chat_runner("http://127.0.0.1:9", refund_and_lookup([]).narrow(["get_order"]), None,
                    binding_secret=b"")  # fmt: skip


class _SlowApprovals:
    """The winner's store: reading an approval waits until released (holding the claim)."""

    def __init__(self, inner: SQLiteStore) -> None:
        self.inner = inner
        self.reading = anyio.Event()
        self.go = anyio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get_approval(self, approval_id: str) -> Any:
        self.reading.set()
        await self.go.wait()
        return await self.inner.get_approval(approval_id)


async def test_a_busy_resume_still_lists_the_approvals_nobody_has_decided(tmp_path: Path) -> None:
    ran: list[str] = []
    reg = refund_and_lookup(ran)
    turns = [turn(P, calls=[("c1", "refund", '{"order_id":"o1"}')])]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        paused = await chat_runner(server.base_url, reg, store).start("Refund o1")
        (approval_id,) = paused.pending_approvals
        slow = _SlowApprovals(store)
        winner = chat_runner(server.base_url, reg, slow, worker_id="w-win")  # type: ignore[arg-type]
        loser = chat_runner(server.base_url, reg, store, worker_id="w-lose")
        out: dict[str, Any] = {}

        async def win() -> None:
            out["winner"] = await winner.resume(paused.operation_id)

        async with anyio.create_task_group() as tg:
            tg.start_soon(win)
            with anyio.fail_after(10):
                await slow.reading.wait()  # the winner holds the claim, reading approvals
            seen = await loser.resume(paused.operation_id)
            slow.go.set()
    assert seen.busy and seen.state is OpState.WAITING_APPROVAL
    assert seen.pending_approvals == (approval_id,)  # still a person's to decide
    assert out["winner"].state is OpState.WAITING_APPROVAL and not out["winner"].busy
    assert ran == []


async def test_a_transient_failure_that_got_no_retry_is_not_retries_exhausted() -> None:
    from callgate.engine.runtime.transport import RetryPolicy

    busy = ReplayTurn(
        status=503, body=b'{"error":{"message":"busy"}}', content_type="application/json"
    )
    async with ReplayServer([busy]) as server:
        runner, progress = make_runner(
            P,
            server.base_url,
            refund_and_lookup([]).narrow(["get_order"]),
            retry=RetryPolicy(max_attempts=1),
        )
        result = await runner.start("go")
    assert result.state is OpState.FAILED
    assert result.stop is not None and result.stop.input is OpInput.API_FAILURE
    assert progress.path() == ["model_requested", "failed"]


async def test_decided_approvals_of_a_busy_resume_are_not_listed(tmp_path: Path) -> None:
    # The complement: once decided, the busy resume lists nothing (the winner acts on it).
    ran: list[str] = []
    reg = refund_and_lookup(ran)
    turns = [turn(P, calls=[("c1", "refund", '{"order_id":"o1"}')]), turn(P, text="Done.")]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        paused = await chat_runner(server.base_url, reg, store).start("Refund o1")
        (approval_id,) = paused.pending_approvals
        await store.decide_approval(approval_id, True, "alice", "ok", now=time.time())
        slow = _SlowApprovals(store)
        winner = chat_runner(server.base_url, reg, slow, worker_id="w-win")  # type: ignore[arg-type]
        loser = chat_runner(server.base_url, reg, store, worker_id="w-lose")

        async with anyio.create_task_group() as tg:
            tg.start_soon(winner.resume, paused.operation_id)
            with anyio.fail_after(10):
                await slow.reading.wait()
            seen = await loser.resume(paused.operation_id)
            slow.go.set()
    assert seen.busy and seen.pending_approvals == ()
    assert ran == ["refund o1"]
