"""The run loop's failure paths, end to end (a real Runner, a real SQLite file store, the
loopback replay server):

- a call whose earlier attempt still holds its idempotency key in flight (a worker killed
  mid-handler, a handler that raised past the engine) is ``outcome_unknown`` and stops the
  operation ``escalated``, never an ``idempotency_conflict`` the operation completes past;
  a real conflict (same key, other arguments) keeps its code;
- a resume that raises after its drive asked the model again ends ``escalated``
  (``DRIVE_FAILED``): replaying it from the pause would ask the model again, and a call
  reworded under a new key would repeat its side effect; one that raises before its first
  model request is still released to the pause. Tracked per drive, not per runner;
- a store failure inside dispatch reaches the host as itself, not as an ExceptionGroup;
- a side-effecting tool whose handler returned a value that is not JSON data tells the
  model the tool ran (``outcome_unknown``), not that it failed; a read tool keeps
  ``handler_error``.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from callgate.engine.core.errors import ConfigError, StoreError
from callgate.engine.core.guards import Budgets
from callgate.engine.core.registry import Registry, RiskClass, ToolContext, ToolSpec, args_digest
from callgate.engine.core.states import OpInput, OpState
from callgate.engine.runtime import steps
from callgate.engine.runtime.dispatch import _sole_failure
from callgate.engine.runtime.loop import Runner
from callgate.engine.runtime.operation import SNAPSHOT_DECODER
from callgate.engine.runtime.progress import ProgressEvent, StateChanged
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn
from callgate.engine.runtime.transport import ProviderEndpoint
from callgate.engine.store.base import ApprovalStatus, LedgerState
from callgate.engine.store.errors import StoreBusy, StoreUnavailable
from callgate.engine.store.sqlite import SQLiteStore

from .loop_helpers import FAST_RETRY, turn, wire_results

pytestmark = pytest.mark.anyio

P = "openai_chat"
JSON = "application/json"


class RefundArgs(msgspec.Struct, forbid_unknown_fields=True):
    order_id: str
    amount: int


class EmailArgs(msgspec.Struct, forbid_unknown_fields=True):
    to: str
    body: str


class OrderArgs(msgspec.Struct, forbid_unknown_fields=True):
    order_id: str


class HostBug(Exception):
    """What a host's progress sink raises here: a failure out of the drive."""


class WorkerExit(BaseException):
    """A handler's exit past the engine (what SystemExit or KeyboardInterrupt does to a
    worker), without stopping the test's own event loop."""


Handler = Callable[[Any, ToolContext], Awaitable[Any]]


class Tools:
    """A refund (irreversible: needs approval), an email (write), an order lookup (read);
    every handler run is counted, and any handler can be replaced."""

    def __init__(self, **handlers: Handler) -> None:
        self.ran: dict[str, list[Any]] = {"refund": [], "email": [], "get_order": []}
        self.handlers = handlers

    def _counted(self, name: str) -> Handler:
        async def run(args: Any, ctx: ToolContext) -> Any:
            self.ran[name].append(msgspec.to_builtins(args))
            custom = self.handlers.get(name)
            if custom is not None:
                return await custom(args, ctx)
            return {"ok": name}

        return run

    def registry(self, **refund: Any) -> Registry:
        return Registry(
            [
                ToolSpec(
                    name="refund",
                    description="Refund an order.",
                    args_type=RefundArgs,
                    handler=self._counted("refund"),
                    risk=RiskClass.IRREVERSIBLE,
                    timeout=5.0,
                    **refund,
                ),
                ToolSpec(
                    name="email",
                    description="Send an email.",
                    args_type=EmailArgs,
                    handler=self._counted("email"),
                    risk=RiskClass.WRITE,
                    timeout=5.0,
                ),
                ToolSpec(
                    name="get_order",
                    description="Look up an order.",
                    args_type=OrderArgs,
                    handler=self._counted("get_order"),
                    risk=RiskClass.READ,
                    timeout=5.0,
                ),
            ]
        )


def runner(base_url: str, reg: Registry, store: SQLiteStore, **kw: Any) -> Runner:
    kw.setdefault("retry", FAST_RETRY)
    return Runner(
        provider=P,
        model="model-1",
        registry=reg,
        endpoint=ProviderEndpoint(base_url=base_url, api_key="sk-test"),
        store=store,
        **kw,
    )


REFUND = turn(P, calls=[("c_ref", "refund", '{"order_id":"o1","amount":50}')])


def email(call_id: str, body: str) -> ReplayTurn:
    arguments = msgspec.json.encode({"to": "a@b", "body": body}).decode()
    return turn(P, calls=[(call_id, "email", arguments)])


def final(text: str = "Done.") -> ReplayTurn:
    return turn(P, text=text)


async def paused_and_approved(
    base_url: str, reg: Registry, store: SQLiteStore, operation_id: str = "op1"
) -> str:
    paused = await runner(base_url, reg, store).start("Refund o1", operation_id=operation_id)
    assert paused.state is OpState.WAITING_APPROVAL
    (approval_id,) = paused.pending_approvals
    await store.decide_approval(approval_id, True, "alice", "ok", now=time.time())
    return approval_id


def ledger_rows(db: Path) -> list[tuple[str, str | None]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT state, owner FROM ledger ORDER BY created_at").fetchall()
    return [(state, owner) for state, owner in rows]


async def stop_of(store: SQLiteStore, op_id: str) -> tuple[str, Any]:
    row = await store.get_operation(op_id)
    assert row is not None and row.owner is None
    snap = SNAPSHOT_DECODER.decode(row.snapshot)
    assert snap.state.value == row.state
    return row.state, snap.stop


def fail_on(state: str, nth: int = 1, exc: Exception | None = None) -> Any:
    """A progress sink that raises (HostBug, or ``exc``) the ``nth`` time the operation
    enters ``state``."""
    seen = [0]

    async def progress(event: ProgressEvent) -> None:
        if isinstance(event, StateChanged) and event.new == state:
            seen[0] += 1
            if seen[0] == nth:
                raise exc or HostBug(f"the progress sink failed on entering {state}")

    return progress


# --- 1. a previous attempt still in flight is an unknown outcome, not a conflict -------


async def test_a_resume_after_a_handler_exited_past_the_engine_escalates(tmp_path: Path) -> None:
    exits = [True]

    async def refund(args: RefundArgs, ctx: ToolContext) -> dict[str, str]:
        if exits.pop():  # the refund is made downstream, then the worker exits
            raise WorkerExit
        return {"refund": "r1"}

    tools = Tools(refund=refund)
    reg = tools.registry()
    db = tmp_path / "db"
    async with ReplayServer([REFUND, final("Refunded.")]) as server, SQLiteStore(db) as store:
        approval_id = await paused_and_approved(server.base_url, reg, store)
        with pytest.raises(BaseExceptionGroup) as raised:  # a BaseException keeps its group
            await runner(server.base_url, reg, store).resume("op1")
        assert raised.group_contains(WorkerExit)
        row = await store.get_operation("op1")
        assert row is not None and row.owner is None
        assert row.state == OpState.WAITING_APPROVAL.value  # released to the pause
        ((state, owner),) = ledger_rows(db)
        assert state == LedgerState.IN_FLIGHT.value and owner is not None  # still held
        asked = len(server.requests)

        exits.append(False)
        result = await runner(server.base_url, reg, store).resume("op1")
        assert len(server.requests) == asked  # nothing went back to the model
        state_now, stop = await stop_of(store, "op1")
    assert result.state is OpState.ESCALATED
    assert result.stop is not None
    assert result.stop.input is OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE
    assert "refund (c_ref)" in result.stop.reason
    assert "previous attempt of this call is still in flight" in result.stop.reason
    assert [(c.call_id, c.status, c.approval_id) for c in result.calls] == [
        ("c_ref", "outcome_unknown", approval_id)
    ]
    assert tools.ran["refund"] == [{"order_id": "o1", "amount": 50}]  # never a second time
    assert ledger_rows(db) == [(LedgerState.IN_FLIGHT.value, owner)]  # left for the human
    assert state_now == OpState.ESCALATED.value and stop == result.stop


async def test_a_worker_killed_mid_handler_is_escalated_by_the_worker_taking_over(
    tmp_path: Path,
) -> None:
    tools = Tools()
    reg = tools.registry()
    db = tmp_path / "db"
    clock = [time.time()]
    async with ReplayServer([REFUND, final("Refunded.")]) as server, SQLiteStore(db) as store:
        approval_id = await paused_and_approved(server.base_url, reg, store)
        # Worker A claimed, consumed the approval and began the refund under its key, then
        # was SIGKILLed inside the handler: nothing of it runs again.
        dead = await store.claim_operation(
            "op1", "w-dead", now=clock[0], from_states=[OpState.WAITING_APPROVAL.value]
        )
        assert dead is not None
        await store.consume_approval(approval_id, now=clock[0])
        args = RefundArgs(order_id="o1", amount=50)
        spec = reg.get("refund")
        assert spec is not None
        key = spec.idempotency_key("op1", args)
        await store.ledger_begin(
            "default", key, args_digest("refund", args), "w-dead/op1/c_ref", now=clock[0]
        )
        clock[0] += 60.0  # past claim_stale_after, well within the ledger's in-flight lease
        taker = runner(
            server.base_url,
            reg,
            store,
            worker_id="w-b",
            claim_stale_after=30.0,
            clock=lambda: clock[0],
        )
        asked = len(server.requests)
        result = await taker.resume("op1")
        assert len(server.requests) == asked
    assert result.state is OpState.ESCALATED
    assert result.stop is not None
    assert result.stop.input is OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE
    assert "w-dead/op1/c_ref" in result.stop.reason
    assert [c.status for c in result.calls] == ["outcome_unknown"]
    assert tools.ran["refund"] == []  # the takeover never ran it blindly
    assert ledger_rows(db) == [(LedgerState.IN_FLIGHT.value, "w-dead/op1/c_ref")]


async def test_a_real_conflict_keeps_its_code_and_the_operation_goes_on(tmp_path: Path) -> None:
    # The key covers the order only: the same order refunded with another amount is the
    # same intent with different arguments.
    tools = Tools()
    reg = tools.registry(approval=False, idempotency_fields=lambda a: {"order_id": a.order_id})
    turns = [
        REFUND,
        turn(P, calls=[("c_ref2", "refund", '{"order_id":"o1","amount":60}')]),
        final("Refunded once."),
    ]
    db = tmp_path / "db"
    async with ReplayServer(turns) as server, SQLiteStore(db) as store:
        result = await runner(server.base_url, reg, store).start("Refund o1")
        told = wire_results(P, server.requests[2])
    assert result.state is OpState.COMPLETED
    assert [(c.call_id, c.status) for c in result.calls] == [
        ("c_ref", "ok"),
        ("c_ref2", "idempotency_conflict"),
    ]
    assert told[-1].payload["error"]["code"] == "idempotency_conflict"
    assert tools.ran["refund"] == [{"order_id": "o1", "amount": 50}]
    assert ledger_rows(db) == [(LedgerState.SUCCEEDED.value, None)]


# --- 2. a resume that failed after asking the model again is escalated ----------------


async def test_a_resume_that_raised_after_asking_the_model_again_ends_escalated(
    tmp_path: Path,
) -> None:
    tools = Tools()
    reg = tools.registry()
    db = tmp_path / "db"
    # After the approved refund the model sends an email (write, no approval); the drive
    # fails after the email ran. Asked again, the model would word it differently.
    turns = [REFUND, email("c_mail", "hi"), final(), email("c_mail2", "hello again"), final()]
    async with ReplayServer(turns) as server, SQLiteStore(db) as store:
        approval_id = await paused_and_approved(server.base_url, reg, store)
        failing = runner(server.base_url, reg, store, progress=fail_on("results_ready", nth=2))
        with pytest.raises(HostBug):  # the failure reaches the host unchanged
            await failing.resume("op1")
        assert len(server.requests) == 2  # the pause's turn, then one request of the resume
        state, stop = await stop_of(store, "op1")
        assert state == OpState.ESCALATED.value
        assert stop is not None and stop.input is OpInput.DRIVE_FAILED
        assert "HostBug" in stop.reason and "asking the model" in stop.reason
        assert "progress sink failed" not in stop.reason  # the type only, never the text

        again = await runner(server.base_url, reg, store).resume("op1")
        assert len(server.requests) == 2  # never asked again
        approval = await store.get_approval(approval_id)
    assert again.state is OpState.ESCALATED and again.stop == stop
    assert tools.ran["refund"] == [{"order_id": "o1", "amount": 50}]
    assert tools.ran["email"] == [{"to": "a@b", "body": "hi"}]  # once, never reworded
    assert approval is not None and approval.status is ApprovalStatus.CONSUMED
    assert ledger_rows(db) == [(LedgerState.SUCCEEDED.value, None)] * 2


async def test_a_resume_that_raised_before_asking_the_model_is_released_to_the_pause(
    tmp_path: Path,
) -> None:
    tools = Tools()
    reg = tools.registry()
    db = tmp_path / "db"
    async with ReplayServer([REFUND, final("Refunded.")]) as server, SQLiteStore(db) as store:
        approval_id = await paused_and_approved(server.base_url, reg, store)
        failing = runner(server.base_url, reg, store, progress=fail_on("results_ready"))
        with pytest.raises(HostBug):
            await failing.resume("op1")
        assert len(server.requests) == 1  # the resume never reached the model
        state, stop = await stop_of(store, "op1")
        assert state == OpState.WAITING_APPROVAL.value and stop is None

        done = await runner(server.base_url, reg, store).resume("op1")
    assert done.state is OpState.COMPLETED
    assert [(c.status, c.approval_id) for c in done.calls] == [("replayed", approval_id)]
    assert tools.ran["refund"] == [{"order_id": "o1", "amount": 50}]


async def test_a_resume_by_a_runner_for_another_provider_is_refused(tmp_path: Path) -> None:
    # The pause's conversation and response ids are the starting provider's: results bound
    # and sent under another family would name the wrong one (after the refund ran).
    tools = Tools()
    reg = tools.registry()
    async with (
        ReplayServer([REFUND, final("Refunded.")]) as server,
        SQLiteStore(tmp_path / "db") as store,
    ):
        await paused_and_approved(server.base_url, reg, store)
        other = Runner(
            provider="anthropic",
            model="model-1",
            registry=reg,
            endpoint=ProviderEndpoint(base_url=server.base_url, api_key="sk-test"),
            store=store,
        )
        with pytest.raises(ConfigError, match="runs on provider 'openai_chat', not 'anthropic'"):
            await other.resume("op1")
        row = await store.get_operation("op1")
        assert row is not None and row.owner is None  # released, still paused
        assert row.state == OpState.WAITING_APPROVAL.value
        assert tools.ran["refund"] == [] and len(server.requests) == 1
        result = await runner(server.base_url, reg, store).resume("op1")
    assert result.state is OpState.COMPLETED
    assert tools.ran["refund"] == [{"order_id": "o1", "amount": 50}]


async def test_whether_a_resume_asked_the_model_is_tracked_per_drive(tmp_path: Path) -> None:
    """One runner resumes two operations at once. A has asked the model when B fails
    before its own first model request: B goes back to its pause, A (failing later) is
    escalated. A per-runner flag would escalate B too."""
    tools = Tools()
    reg = tools.registry()
    db = tmp_path / "db"
    a_asked = anyio.Event()

    async def progress(event: ProgressEvent) -> None:
        if not isinstance(event, StateChanged):
            return
        if event.operation_id == "op_a" and event.new == "validating" and a_asked.is_set():
            raise HostBug("A fails after its second model turn")
        if event.operation_id == "op_a" and event.new == "model_requested":
            a_asked.set()  # (the request goes out right after this)
        if event.operation_id == "op_b" and event.new == "executing":
            with anyio.fail_after(10):
                await a_asked.wait()
            await anyio.sleep(0.2)  # A's request is out meanwhile
            raise HostBug("B fails before asking the model")

    failures: dict[str, BaseException] = {}
    async with SQLiteStore(db) as store:
        async with ReplayServer([REFUND, REFUND]) as pauses:
            await paused_and_approved(pauses.base_url, reg, store, operation_id="op_a")
            await paused_and_approved(pauses.base_url, reg, store, operation_id="op_b")
        async with ReplayServer([email("c_mail", "hi"), final()]) as server:
            shared = runner(server.base_url, reg, store, progress=progress)

            async def resume(op_id: str) -> None:
                try:
                    await shared.resume(op_id)
                except HostBug as exc:
                    failures[op_id] = exc

            async with anyio.create_task_group() as tg:
                tg.start_soon(resume, "op_a")
                tg.start_soon(resume, "op_b")
            assert len(server.requests) == 1  # A's; B never asked
        a_state, a_stop = await stop_of(store, "op_a")
        b_state, b_stop = await stop_of(store, "op_b")
    assert sorted(failures) == ["op_a", "op_b"]
    assert a_state == OpState.ESCALATED.value
    assert a_stop is not None and a_stop.input is OpInput.DRIVE_FAILED
    assert b_state == OpState.WAITING_APPROVAL.value and b_stop is None


# --- 3. a store failure inside dispatch reaches the host as itself --------------------


async def test_a_store_failure_inside_dispatch_is_raised_as_itself(tmp_path: Path) -> None:
    tools = Tools()
    reg = tools.registry()
    db = tmp_path / "db"

    def ledger_away() -> None:  # the ledger table disappears under the running store
        with sqlite3.connect(db) as conn:
            conn.execute("ALTER TABLE ledger RENAME TO ledger_away")

    async def progress(event: ProgressEvent) -> None:
        if isinstance(event, StateChanged) and event.new == "executing":
            ledger_away()

    turns = [
        turn(
            P,
            calls=[
                ("c_mail", "email", '{"to":"a@b","body":"hi"}'),
                ("c_get", "get_order", '{"order_id":"o1"}'),
            ],
        ),
        final(),
    ]
    async with ReplayServer(turns) as server, SQLiteStore(db) as store:
        failing = runner(server.base_url, reg, store, progress=progress)
        with pytest.raises(StoreError) as raised:  # a host's `except StoreError` works
            await failing.start("Mail and look up", operation_id="op_store")
        state, stop = await stop_of(store, "op_store")
    assert type(raised.value) is StoreUnavailable
    assert isinstance(raised.value.__cause__, BaseExceptionGroup)  # chained from the group
    assert state == OpState.ESCALATED.value
    assert stop is not None and stop.input is OpInput.DRIVE_FAILED
    assert "the drive raised StoreUnavailable" in stop.reason
    assert "ExceptionGroup" not in stop.reason
    assert tools.ran["email"] == []  # never ran without its ledger row


async def _a_cancellation() -> BaseException:
    """A real cancellation of the running backend (trio's has no public constructor)."""
    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await anyio.sleep(1)
        except anyio.get_cancelled_exc_class() as exc:
            caught = exc
            raise
    assert scope.cancelled_caught
    return caught


async def test_only_a_sole_failure_is_taken_out_of_its_group() -> None:
    async def cancelled() -> BaseException:
        return await _a_cancellation()

    busy, gone = StoreBusy("busy"), StoreUnavailable("gone")
    assert _sole_failure(ExceptionGroup("g", [busy])) is busy
    assert _sole_failure(BaseExceptionGroup("g", [await cancelled(), busy])) is busy
    assert _sole_failure(ExceptionGroup("g", [ExceptionGroup("inner", [gone])])) is gone
    # Several store errors (a store that is down fails every parallel call): the first.
    assert _sole_failure(ExceptionGroup("g", [busy, ExceptionGroup("i", [gone])])) is busy
    assert busy.__notes__ == ["callgate: 1 more call(s) failed on the store (StoreUnavailable)"]
    assert _sole_failure(ExceptionGroup("g", [gone, ValueError()])) is None  # mixed: kept
    assert _sole_failure(BaseExceptionGroup("g", [await cancelled(), await cancelled()])) is None
    # A BaseException stays grouped: bare, asyncio would re-raise it out of the loop.
    assert _sole_failure(BaseExceptionGroup("g", [KeyboardInterrupt()])) is None


# --- 4. a side effect whose value cannot be returned did run ---------------------------


async def test_a_write_whose_value_is_not_json_tells_the_model_it_ran(tmp_path: Path) -> None:
    async def sends_then_returns_junk(args: EmailArgs, ctx: ToolContext) -> Any:
        return {"sent_at": object()}  # the email went out; the value cannot be sent back

    async def reads_junk(args: OrderArgs, ctx: ToolContext) -> Any:
        return {"status": object()}

    tools = Tools(email=sends_then_returns_junk, get_order=reads_junk)
    reg = tools.registry()
    db = tmp_path / "db"
    turns = [
        turn(
            P,
            calls=[
                ("c_mail", "email", '{"to":"a@b","body":"hi"}'),
                ("c_get", "get_order", '{"order_id":"o1"}'),
            ],
        ),
        email("c_mail2", "hi"),  # the model tries the same email again anyway
        final("I could not confirm the email."),
    ]
    async with ReplayServer(turns) as server, SQLiteStore(db) as store:
        result = await runner(server.base_url, reg, store).start("Mail and look up")
        first = wire_results(P, server.requests[1])
        second = wire_results(P, server.requests[2])
    # The repeat is answered by the ledger, which knows no more than "it ran": the
    # outcome stays unknown (a replay settles nothing), so the answer is no success.
    assert result.state is OpState.ESCALATED and result.stop is not None
    assert result.stop.input is OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE
    assert [(c.call_id, c.status) for c in result.calls] == [
        ("c_mail", "outcome_unknown"),
        ("c_get", "handler_error"),
        ("c_mail2", "outcome_unknown"),
    ]
    mail, get = (r.payload["error"] for r in first)
    assert mail["code"] == "outcome_unknown"
    assert "may or may not have taken effect" in mail["message"]
    assert "The tool ran, but its result could not be returned" in mail["message"]
    assert "failed" not in mail["message"]
    assert get == {"code": "handler_error", "message": "The tool failed while running."}
    assert second[-1].payload["error"] == mail  # the ledger's answer, replayed
    assert tools.ran["email"] == [{"to": "a@b", "body": "hi"}]  # never sent twice
    assert ledger_rows(db) == [(LedgerState.SUCCEEDED.value, None)]


# --- 5. a final answer while a side effect's outcome is unknown is not a success ------


async def test_a_final_answer_past_an_unknown_side_effect_ends_escalated(tmp_path: Path) -> None:
    async def hangs(args: EmailArgs, ctx: ToolContext) -> Any:
        await anyio.sleep(10)  # past the tool deadline: the email may or may not be out

    tools = Tools(email=hangs)
    reg = Registry([s if s.name != "email" else _fast_deadline(s) for s in tools.registry()])
    db = tmp_path / "db"
    turns = [email("c_mail", "hi"), final("All done, the email went out.")]
    async with ReplayServer(turns) as server, SQLiteStore(db) as store:
        result = await runner(server.base_url, reg, store).start("Mail Bob")
        state, stop = await stop_of(store, result.operation_id)
    assert [(c.call_id, c.status) for c in result.calls] == [("c_mail", "outcome_unknown")]
    assert result.state is OpState.ESCALATED and state == "escalated"
    assert stop.input is OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE
    assert "email (c_mail)" in stop.reason
    assert ledger_rows(db)[0][0] == LedgerState.UNKNOWN.value


@pytest.mark.parametrize(
    ("ending", "plain_state"),
    [
        pytest.param(turn(P, text="All done, the", finish="max_tokens"), "incomplete", id="cut"),
        pytest.param(turn(P, text="I can't help.", finish="refusal"), "refused", id="refusal"),
        pytest.param(
            ReplayTurn(status=400, body=b'{"error":{"message":"bad"}}', content_type=JSON),
            "failed",
            id="http-400",
        ),
    ],
)
async def test_any_ending_past_an_unknown_side_effect_ends_escalated(
    tmp_path: Path, ending: ReplayTurn, plain_state: str
) -> None:
    # Ending ``incomplete`` or ``failed`` would invite a fresh run of the operation, under
    # new idempotency keys: the effect that may have happened could happen again.
    async def hangs(args: EmailArgs, ctx: ToolContext) -> Any:
        await anyio.sleep(10)

    tools = Tools(email=hangs)
    reg = Registry([s if s.name != "email" else _fast_deadline(s) for s in tools.registry()])
    db = tmp_path / "db"
    async with ReplayServer([email("c_mail", "hi"), ending]) as server, SQLiteStore(db) as store:
        result = await runner(server.base_url, reg, store).start("Mail Bob")
        state, stop = await stop_of(store, result.operation_id)
    assert result.state is OpState.ESCALATED and state == "escalated"
    assert stop.input is OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE
    assert "email (c_mail)" in stop.reason
    assert plain_state != "escalated"  # what the same turn ends in without the open call
    async with ReplayServer([ending]) as server, SQLiteStore(tmp_path / "db2") as store:
        plain = await runner(server.base_url, reg, store).start("Mail Bob")
    assert plain.state.value == plain_state


async def test_an_unknown_side_effect_settled_by_a_retry_lets_the_answer_complete(
    tmp_path: Path,
) -> None:
    calls = [0]

    async def hangs_once(args: EmailArgs, ctx: ToolContext) -> Any:
        calls[0] += 1
        await anyio.sleep(10)

    tools = Tools(email=hangs_once)
    reg = Registry(
        [_fast_deadline(s, reconcile=_found) if s.name == "email" else s for s in tools.registry()]
    )
    turns = [email("c_mail", "hi"), email("c_mail2", "hi"), final("Sent.")]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        result = await runner(server.base_url, reg, store).start("Mail Bob")
    assert result.state is OpState.COMPLETED, result.stop
    first, retry = (c.status for c in result.calls)
    assert first == "outcome_unknown"
    assert retry in ("ok", "replayed")  # the retry was reconciled: settled
    assert calls[0] == 1  # reconciled, never sent again


async def _found(idempotency_key: str, args: Any) -> Any:
    return {"ok": "email", "found": True}  # the downstream system has the email


def _fast_deadline(spec: ToolSpec, **kw: Any) -> ToolSpec:
    return dataclasses.replace(spec, timeout=0.05, **kw)


async def test_a_write_whose_result_is_too_large_tells_the_model_it_ran(tmp_path: Path) -> None:
    async def sends_then_returns_a_lot(args: EmailArgs, ctx: ToolContext) -> Any:
        return {"log": "x" * 200_000}  # the email went out; the result is over the cap

    async def reads_a_lot(args: OrderArgs, ctx: ToolContext) -> Any:
        return {"order": "y" * 200_000}

    tools = Tools(email=sends_then_returns_a_lot, get_order=reads_a_lot)
    turns = [
        turn(
            P,
            calls=[
                ("c_mail", "email", '{"to":"a@b","body":"hi"}'),
                ("c_get", "get_order", '{"order_id":"o1"}'),
            ],
        ),
        final("Sent."),
    ]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        result = await runner(server.base_url, tools.registry(), store).start("Mail and look")
        mail, get = (r.payload["error"] for r in wire_results(P, server.requests[1]))
    assert result.state is OpState.COMPLETED
    assert [c.status for c in result.calls] == ["result_too_large", "result_too_large"]
    assert mail["code"] == get["code"] == "result_too_large"
    assert mail["message"] == (
        "The tool's result exceeded the size limit. "
        "The tool ran (its effect happened); do not call it again to see its result."
    )
    assert get["message"] == "The tool's result exceeded the size limit."  # a read: no effect


# --- 6. a result is checked against the call as validated, not against its own label ----


@pytest.mark.parametrize("swap", ["call", "idempotency_key"])
async def test_a_result_relabelled_for_another_call_fails_the_operation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: str
) -> None:
    # A defect between dispatch and binding that moves one call's label onto another's
    # result (the substitution the spec warns about) must not reach the model.
    async def looks_up(args: OrderArgs, ctx: ToolContext) -> Any:
        return {"order": args.order_id}

    real = steps.execute_calls

    async def relabelled(*args: Any, **kw: Any) -> list[Any]:
        a, b = await real(*args, **kw)
        if swap == "call":
            return [
                msgspec.structs.replace(a, call=b.call),
                msgspec.structs.replace(b, call=a.call),
            ]
        return [msgspec.structs.replace(a, idempotency_key="k" * 64), b]

    monkeypatch.setattr(steps, "execute_calls", relabelled)
    tools = Tools(get_order=looks_up)
    calls = [
        ("c_1", "get_order", '{"order_id":"o1"}'),
        ("c_2", "get_order", '{"order_id":"o2"}'),
    ]
    async with (
        ReplayServer([turn(P, calls=calls), final()]) as server,
        SQLiteStore(tmp_path / "db") as store,
    ):
        result = await runner(server.base_url, tools.registry(), store).start("Look up")
        asked = len(server.requests)
    assert result.state is OpState.FAILED
    assert result.stop is not None and result.stop.input is OpInput.BINDING_MISMATCH
    assert "answers another call" in result.stop.reason
    assert asked == 1  # no result went back to the model


async def test_a_write_cut_off_by_the_operation_deadline_keeps_its_key_and_escalates(
    tmp_path: Path,
) -> None:
    # Its result is made by the deadline, not the handler: it must still carry the call's
    # idempotency key, or binding would refuse it and the operation would end failed.
    async def hangs(args: EmailArgs, ctx: ToolContext) -> Any:
        await anyio.sleep(10)

    tools = Tools(email=hangs)
    async with (
        ReplayServer([email("c_mail", "hi"), final()]) as server,
        SQLiteStore(tmp_path / "db") as store,
    ):
        result = await runner(
            server.base_url, tools.registry(), store, budgets=Budgets(deadline_seconds=0.3)
        ).start("Mail Bob")
    assert result.state is OpState.ESCALATED
    assert result.stop is not None and result.stop.input is OpInput.DEADLINE
    assert [(c.call_id, c.status) for c in result.calls] == [("c_mail", "outcome_unknown")]
    assert result.calls[0].idempotency_key is not None


async def test_a_write_result_under_another_key_fails_the_operation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = steps.execute_calls

    async def rekeyed(*args: Any, **kw: Any) -> list[Any]:
        (res,) = await real(*args, **kw)
        return [msgspec.structs.replace(res, idempotency_key="0" * 64)]

    monkeypatch.setattr(steps, "execute_calls", rekeyed)
    tools = Tools()
    async with (
        ReplayServer([email("c_mail", "hi"), final()]) as server,
        SQLiteStore(tmp_path / "db") as store,
    ):
        result = await runner(server.base_url, tools.registry(), store).start("Mail Bob")
        asked = len(server.requests)
    assert result.state is OpState.FAILED and asked == 1
    assert result.stop is not None and result.stop.input is OpInput.BINDING_MISMATCH
