"""An operation no drive holds any more, in a state a drive only passes through (its start
was cancelled, or its worker died mid-start), is ended ``escalated`` (at the cancellation,
or by a later ``resume``): never driven again (asking the model again could propose
another call than one that already ran) and never left non-terminal for ever. A live
drive's operation is left alone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from callgate.engine.core.states import OpInput, OpState
from callgate.engine.runtime import recovery
from callgate.engine.runtime.operation import SNAPSHOT_DECODER
from callgate.engine.runtime.progress import ProgressEvent, StateChanged
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn
from callgate.engine.store.errors import StoreUnavailable
from callgate.engine.store.memory import MemoryStore
from callgate.engine.store.sqlite import SQLiteStore

from .test_resume_recovery import FINAL, WEATHER_CALL, registry, runner

pytestmark = pytest.mark.anyio


def _turns() -> list[ReplayTurn]:
    return [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]


async def _escalated(store: SQLiteStore, op_id: str) -> str:
    row = await store.get_operation(op_id)
    assert row is not None and row.owner is None
    assert row.state == OpState.ESCALATED.value
    snap = SNAPSHOT_DECODER.decode(row.snapshot)
    assert snap.stop is not None and snap.stop.input is OpInput.DRIVE_FAILED
    return snap.stop.reason


async def test_resume_escalates_a_start_that_was_cancelled(tmp_path: Path) -> None:
    ran: list[str] = []
    reg = registry(ran)
    validating = anyio.Event()

    async def progress(event: ProgressEvent) -> None:
        if isinstance(event, StateChanged) and event.new == "validating":
            validating.set()
            await anyio.sleep_forever()  # the host is shutting down: cancelled here

    async with ReplayServer(_turns()) as server, SQLiteStore(tmp_path / "db") as store:
        async with anyio.create_task_group() as tg:
            first = runner(server.base_url, reg, store, progress=progress)
            tg.start_soon(lambda: first.start("Weather?", operation_id="op_cancelled"))
            with anyio.fail_after(10):
                await validating.wait()
            tg.cancel_scope.cancel()
        # Ended escalated as it was cancelled (released, never left for a replay).
        # Worded alike on every backend (not asyncio's CancelledError or trio's Cancelled).
        assert "no verdict: the drive was cancelled;" in await _escalated(store, "op_cancelled")
        asked = server.completed
        result = await runner(server.base_url, reg, store).resume("op_cancelled")
        assert result.state is OpState.ESCALATED
        again = await runner(server.base_url, reg, store).resume("op_cancelled")
        assert again.state is OpState.ESCALATED
        assert server.completed == asked  # the model was not asked again
    assert ran == []


async def _dead_start(store: SQLiteStore, server: ReplayServer, reg: Any, now: float) -> None:
    """A start whose worker died after creating (and owning) the operation."""
    result = await runner(server.base_url, reg, store).start("Weather?", operation_id="op_dead")
    assert result.state is OpState.WAITING_APPROVAL  # (then forced back, as if mid-start)
    row = await store.get_operation("op_dead")
    assert row is not None
    snap = SNAPSHOT_DECODER.decode(row.snapshot)
    snap.state, snap.approvals = OpState.MODEL_REQUESTED, {}
    await store.save_operation(
        msgspec.structs.replace(
            row,
            state=snap.state.value,
            snapshot=msgspec.json.encode(snap),
            owner="w-dead",
            updated_at=now,
        ),
        expected_version=row.version,
        fencing_token=row.fencing_token,
    )


async def test_a_dead_start_is_escalated_only_once_its_claim_is_stale(tmp_path: Path) -> None:
    ran: list[str] = []
    reg = registry(ran)
    clock = [time.time()]
    async with ReplayServer(_turns()) as server, SQLiteStore(tmp_path / "db") as store:
        await _dead_start(store, server, reg, clock[0])
        asked = server.completed

        def resume_as(worker: str, **kw: Any) -> Any:
            r = runner(server.base_url, reg, store, worker_id=worker, clock=lambda: clock[0], **kw)
            return r.resume("op_dead")

        clock[0] += 3600.0
        untouched = await resume_as("w-default")  # no takeover without the option
        assert untouched.state is OpState.MODEL_REQUESTED
        early = await resume_as("w-early", claim_stale_after=7200.0)  # not silent long enough
        assert early.state is OpState.MODEL_REQUESTED
        row = await store.get_operation("op_dead")
        assert row is not None and row.owner == "w-dead"
        late = await resume_as("w-late", claim_stale_after=600.0)
        assert late.state is OpState.ESCALATED
        await _escalated(store, "op_dead")
        assert server.completed == asked
    assert ran == []


class _HangingStore(MemoryStore):
    mode = "ok"

    async def save_operation(self, record: Any, expected_version: int, fencing_token: int) -> Any:
        if self.mode == "fail":
            raise StoreUnavailable("db down")
        if self.mode == "hang":
            await anyio.sleep(3600)
        return await super().save_operation(record, expected_version, fencing_token)


async def test_a_settle_whose_release_times_out_raises_a_store_error(monkeypatch: Any) -> None:
    monkeypatch.setattr(recovery, "_RELEASE_TIMEOUT", 0.3)
    store = _HangingStore()

    async def boom(event: ProgressEvent) -> None:  # the sink fails, and the store is down
        store.mode = "fail"
        raise HostFailure

    async with ReplayServer([ReplayTurn.from_file(FINAL)]) as server:
        with pytest.raises(HostFailure):
            await runner(server.base_url, registry([]), store, progress=boom).start("hi")
        (stuck,) = await store.list_operations()
        assert stuck.owner is not None  # the start could not release it
        store.mode = "hang"
        late = runner(server.base_url, registry([]), store, claim_stale_after=1e-6)
        await anyio.sleep(0.01)
        # A retry policy keyed on the store's errors must see this one (not a bare
        # TimeoutError of callgate's own making).
        with pytest.raises(StoreUnavailable, match="timed out"):
            await late.resume(stuck.operation_id)


class HostFailure(Exception):
    pass
