"""A resume that finds the operation held by another live drive did nothing, and says so:
``busy`` with no approvals to decide (a double-clicked Approve must not show the button
again), whether the other drive is still acting on the decisions (the row says
``waiting_approval``) or has moved past the pause. Real SQLite file, real loopback
replay server; the winner is held mid-drive by a slow model turn."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from callgate.engine.core.states import OpState
from callgate.engine.runtime.loop import Runner
from callgate.engine.runtime.progress import ProgressEvent, StateChanged
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn
from callgate.engine.store.sqlite import SQLiteStore

from .loop_helpers import chat_runner, refund_and_lookup, turn

pytestmark = pytest.mark.anyio
P = "openai_chat"


async def _approved(runner: Runner, store: SQLiteStore) -> str:
    paused = await runner.start("Refund o1", operation_id="op1")
    assert paused.state is OpState.WAITING_APPROVAL and not paused.busy
    (approval_id,) = paused.pending_approvals
    await store.decide_approval(approval_id, True, "alice", "ok", now=time.time())
    return paused.operation_id


@pytest.mark.parametrize("at", ["executing", "model_requested"])
async def test_a_resume_that_finds_another_drive_holding_the_operation_is_busy(
    tmp_path: Path, at: str
) -> None:
    ran: list[str] = []
    reg = refund_and_lookup(ran)
    reached = anyio.Event()
    release = anyio.Event()

    async def hold(event: ProgressEvent) -> None:
        # The winner stops at ``at``: with the row still ``waiting_approval`` (executing
        # the approved refund) or past the pause (its next model request is on its way).
        if isinstance(event, StateChanged) and event.new == at and not reached.is_set():
            reached.set()
            await release.wait()

    turns: list[ReplayTurn] = [
        turn(P, calls=[("c1", "refund", '{"order_id":"o1"}')]),
        turn(P, text="Refunded."),
    ]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        op_id = await _approved(chat_runner(server.base_url, reg, store), store)
        winner = chat_runner(server.base_url, reg, store, worker_id="w-win", progress=hold)
        loser = chat_runner(server.base_url, reg, store, worker_id="w-lose")
        outcome: dict[str, object] = {}

        async def drive() -> None:
            outcome["winner"] = await winner.resume(op_id)

        async with anyio.create_task_group() as tg:
            tg.start_soon(drive)
            with anyio.fail_after(10):
                await reached.wait()
            seen = await loser.resume(op_id)
            release.set()
        row = await store.get_operation(op_id)
    assert seen.busy and not seen.terminal
    assert seen.pending_approvals == ()  # nothing is left for a person to decide
    assert seen.state.value in ("waiting_approval", "model_requested")
    done = outcome["winner"]
    assert isinstance(done, type(seen)) and done.state is OpState.COMPLETED and not done.busy
    assert row is not None and row.state == OpState.COMPLETED.value
    assert ran == ["refund o1"]


async def test_a_resume_of_an_operation_that_ended_is_not_busy(tmp_path: Path) -> None:
    ran: list[str] = []
    reg = refund_and_lookup(ran)
    turns = [turn(P, calls=[("c1", "refund", '{"order_id":"o1"}')]), turn(P, text="Refunded.")]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        runner = chat_runner(server.base_url, reg, store)
        op_id = await _approved(runner, store)
        assert (await runner.resume(op_id)).state is OpState.COMPLETED
        again = await runner.resume(op_id)
    assert again.state is OpState.COMPLETED and not again.busy and again.terminal
    assert ran == ["refund o1"]
