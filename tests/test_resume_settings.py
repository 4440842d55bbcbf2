"""An operation keeps the host's budgets, system prompt and max_tokens from its start:
a runner that resumes it knowing none of them (``callgate operations resume`` builds one
with defaults) still asks the model with the same instructions and stops at the same
budgets. A snapshot persisted before the settings were kept resumes under the runner's.
Real SQLite file store, real loopback replay server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from callgate.engine.core.guards import Budgets
from callgate.engine.core.registry import Registry
from callgate.engine.core.states import OpInput, OpState
from callgate.engine.runtime.loop import Runner
from callgate.engine.runtime.replay import ReplayServer
from callgate.engine.store.sqlite import SQLiteStore

from .loop_helpers import chat_runner, refund_and_lookup, turn

pytestmark = pytest.mark.anyio
P = "openai_chat"
RULES = "HOST RULES: never refund above 5."


def _runner(server: ReplayServer, reg: Registry, store: SQLiteStore, **kw: Any) -> Runner:
    return chat_runner(server.base_url, reg, store, **kw)


def _turns() -> list[Any]:
    return [
        turn(P, calls=[("c1", "refund", '{"order_id":"A1"}')]),  # start: pauses
        turn(P, calls=[("c2", "get_order", '{"order_id":"A1"}')]),  # the 2nd turn
        turn(P, calls=[("c3", "get_order", '{"order_id":"A2"}')]),  # past max_turns=2
        turn(P, text="Done."),
    ]


def _sent(server: ReplayServer, i: int) -> tuple[bool, object]:
    body = server.requests[i].json()
    has_rules = any(
        m.get("role") == "system" and m.get("content") == RULES for m in body["messages"]
    )
    return has_rules, body.get("max_completion_tokens", body.get("max_tokens"))


async def _approved(server: ReplayServer, reg: Registry, store: SQLiteStore, **kw: Any) -> str:
    paused = await _runner(server, reg, store, **kw).start("Refund A1")
    assert paused.state is OpState.WAITING_APPROVAL
    (approval_id,) = paused.pending_approvals
    await store.decide_approval(approval_id, True, "alice", "ok", now=time.time())
    return paused.operation_id


async def test_a_resume_by_a_runner_with_defaults_keeps_the_operations_settings(
    tmp_path: Path,
) -> None:
    ran: list[str] = []
    reg = refund_and_lookup(ran)
    settings = {
        "budgets": Budgets(max_turns=2),
        "system": RULES,
        "max_tokens": 77,
        "approval_ttl": 86_400.0,
    }
    async with ReplayServer(_turns()) as server, SQLiteStore(tmp_path / "db") as store:
        op_id = await _approved(server, reg, store, **settings)
        done = await _runner(server, reg, store).resume(op_id)  # knows none of them
        assert [_sent(server, i) for i in range(len(server.requests))] == [(True, 77)] * 2
    assert done.state is OpState.ESCALATED and done.stop is not None
    assert done.stop.input is OpInput.BUDGET_EXHAUSTED and "max_turns" in done.stop.reason
    assert ran == ["refund A1", "get_order A1"]  # stopped before a 3rd model request


async def test_a_snapshot_from_before_settings_were_kept_resumes_under_the_runners(
    tmp_path: Path,
) -> None:
    ran: list[str] = []
    reg = refund_and_lookup(ran)
    async with ReplayServer(_turns()) as server, SQLiteStore(tmp_path / "db") as store:
        op_id = await _approved(server, reg, store, system="another prompt")
        row = await store.get_operation(op_id)
        assert row is not None
        old = msgspec.json.decode(row.snapshot)
        del old["settings"]  # as written before callgate kept them
        await store.save_operation(
            msgspec.structs.replace(row, snapshot=msgspec.json.encode(old)),
            expected_version=row.version,
            fencing_token=row.fencing_token,
        )
        resumer = _runner(server, reg, store, system=RULES, max_tokens=77)
        done = await resumer.resume(op_id)
        assert _sent(server, 1) == (True, 77)
    assert done.state is OpState.COMPLETED
    assert ran == ["refund A1", "get_order A1", "get_order A2"]


async def test_approvals_a_resume_requests_keep_the_operations_approval_ttl(
    tmp_path: Path,
) -> None:
    ran: list[str] = []
    reg = refund_and_lookup(ran)
    turns = [
        turn(P, calls=[("c1", "refund", '{"order_id":"A1"}')]),
        turn(P, calls=[("c2", "refund", '{"order_id":"A2"}')]),  # needs approval again
    ]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        op_id = await _approved(server, reg, store, approval_ttl=86_400.0)
        again = await _runner(server, reg, store).resume(op_id)  # its own TTL: the default
        (approval_id,) = again.pending_approvals
        record = await store.get_approval(approval_id)
    assert record is not None
    assert record.expires_at - record.created_at == 86_400.0
    assert ran == ["refund A1"]
