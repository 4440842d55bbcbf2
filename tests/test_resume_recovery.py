"""Recovering a paused operation across partial, failed and abandoned resumes, end to end
(real SQLite file store, real loopback replay server, no store doubles):

- a resume while one approval of the turn is still pending consumes none of them, so the
  ones already decided still count on the next resume;
- an approval already consumed by an earlier, unfinished resume of the same operation
  still counts (the idempotency ledger keeps the side effect single);
- a start or resume that raised (or was cancelled) gives its claim back, so the next
  resume by any worker proceeds; a claim whose owner went silent is taken over only with
  ``claim_stale_after``;
- an approval counts only under the policy revision it was given for.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from callgate.engine.core.audit import verify_trail
from callgate.engine.core.errors import ConfigError
from callgate.engine.core.registry import Registry, Revisions, RiskClass, ToolContext, ToolSpec
from callgate.engine.core.states import OpInput, OpState
from callgate.engine.runtime.audit_sink import MemoryAuditSink
from callgate.engine.runtime.loop import Runner
from callgate.engine.runtime.operation import SNAPSHOT_DECODER
from callgate.engine.runtime.progress import ProgressEvent, StateChanged
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn
from callgate.engine.runtime.transport import ProviderEndpoint
from callgate.engine.store.base import ApprovalStatus
from callgate.engine.store.errors import StoreBusy
from callgate.engine.store.sqlite import SQLiteStore

from .conftest import FIXTURES
from .loop_helpers import FAST_RETRY, turn

WEATHER_CALL = FIXTURES / "openai_chat" / "single_tool_call_get_weather.sse"
FINAL = Path(__file__).parent / "streams" / "openai_chat_final_text.sse"
CITY = "New York City"  # the city WEATHER_CALL asks about

pytestmark = pytest.mark.anyio


class WeatherArgs(msgspec.Struct, forbid_unknown_fields=True):
    city: str


class HostBug(Exception):
    """What a host's progress sink raises in these tests: a failure out of the drive."""


def registry(ran: list[str], *, policy_revision: str = "1", handler: Any = None) -> Registry:
    def get_weather(args: WeatherArgs, ctx: ToolContext) -> dict[str, object]:
        ran.append(args.city)
        return {"city": args.city, "forecast": "sunny"}

    return Registry(
        [
            ToolSpec(
                name="get_weather",
                description="Current weather for a city.",
                args_type=WeatherArgs,
                handler=handler or get_weather,
                risk=RiskClass.IRREVERSIBLE,
                timeout=5.0,
                revisions=Revisions(policy=policy_revision),
            )
        ]
    )


def runner(base_url: str, reg: Registry, store: SQLiteStore, **kw: Any) -> Runner:
    kw.setdefault("retry", FAST_RETRY)
    return Runner(
        provider="openai_chat",
        model="gpt-4o",
        registry=reg,
        endpoint=ProviderEndpoint(base_url=base_url, api_key="sk-test"),
        store=store,
        **kw,
    )


def fail_when(entered: str, action: Callable[[], None] | None = None) -> Any:
    """A progress sink that, the first time the operation enters state ``entered``, runs
    ``action`` (if given) or raises HostBug."""
    fired: list[bool] = []

    async def progress(event: ProgressEvent) -> None:
        if isinstance(event, StateChanged) and event.new == entered and not fired:
            fired.append(True)
            if action is not None:
                action()
            else:
                raise HostBug(f"progress sink failed on entering {entered}")

    return progress


async def paused_and_approved(base_url: str, reg: Registry, store: SQLiteStore) -> tuple[str, str]:
    paused = await runner(base_url, reg, store).start("Weather?")
    assert paused.state is OpState.WAITING_APPROVAL
    (approval_id,) = paused.pending_approvals
    await store.decide_approval(approval_id, True, "alice", "ok", now=time.time())
    return paused.operation_id, approval_id


# --- decisions are read whole, and a consumed approval of this operation stands ---------


async def test_a_partial_decision_consumes_nothing_and_both_approved_calls_run(
    tmp_path: Path,
) -> None:
    ran: list[str] = []
    reg = registry(ran)
    two_calls = turn(
        "openai_chat",
        calls=[
            ("call_paris", "get_weather", '{"city":"Paris"}'),
            ("call_rome", "get_weather", '{"city":"Rome"}'),
        ],
    )
    turns = [two_calls, turn("openai_chat", text="Both sunny.")]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        paused = await runner(server.base_url, reg, store).start("Paris and Rome?")
        assert paused.state is OpState.WAITING_APPROVAL
        paris, rome = paused.pending_approvals
        await store.decide_approval(paris, True, "alice", "ok", now=time.time())

        waiting = await runner(server.base_url, reg, store).resume(paused.operation_id)
        assert waiting.state is OpState.WAITING_APPROVAL
        assert waiting.pending_approvals == (rome,)  # what a person must still decide
        paris_row = await store.get_approval(paris)
        assert paris_row is not None and paris_row.status is ApprovalStatus.APPROVED  # unspent

        await store.decide_approval(rome, True, "bob", "ok", now=time.time())
        done = await runner(server.base_url, reg, store).resume(paused.operation_id)
        rows = [await store.get_approval(a) for a in (paris, rome)]
    assert done.state is OpState.COMPLETED
    assert [(c.call_id, c.status, c.approval_id) for c in done.calls] == [
        ("call_paris", "ok", paris),
        ("call_rome", "ok", rome),
    ]
    assert sorted(ran) == ["Paris", "Rome"]
    assert all(r is not None and r.status is ApprovalStatus.CONSUMED for r in rows)


async def test_an_approval_consumed_by_an_unfinished_resume_still_counts(tmp_path: Path) -> None:
    ran: list[str] = []
    reg = registry(ran)
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        op_id, approval_id = await paused_and_approved(server.base_url, reg, store)
        # What an earlier resume of this operation leaves when it consumed the approval
        # and then failed before persisting: the pause as it was, the approval spent.
        await store.consume_approval(approval_id, now=time.time())
        done = await runner(server.base_url, reg, store).resume(op_id)
    assert done.state is OpState.COMPLETED
    assert [(c.status, c.approval_id) for c in done.calls] == [("ok", approval_id)]
    assert ran == [CITY]


# --- a failed drive gives its claim back ------------------------------------------------


async def test_a_resume_that_raised_gives_its_claim_back_and_the_next_resume_completes(
    tmp_path: Path,
) -> None:
    ran: list[str] = []
    reg = registry(ran)
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        op_id, approval_id = await paused_and_approved(server.base_url, reg, store)
        failing = runner(server.base_url, reg, store, progress=fail_when("executing"))
        with pytest.raises(HostBug):  # the failure reaches the host unchanged
            await failing.resume(op_id)
        row = await store.get_operation(op_id)
        approval = await store.get_approval(approval_id)
        assert row is not None and row.owner is None  # released
        assert row.state == OpState.WAITING_APPROVAL.value  # the pause as last persisted
        assert approval is not None and approval.status is ApprovalStatus.CONSUMED
        assert ran == []

        done = await runner(server.base_url, reg, store).resume(op_id)
    assert done.state is OpState.COMPLETED
    assert [(c.status, c.approval_id) for c in done.calls] == [("ok", approval_id)]
    assert ran == [CITY]


async def test_a_retry_after_the_handler_ran_replays_the_ledger_not_the_side_effect(
    tmp_path: Path,
) -> None:
    ran: list[str] = []
    reg = registry(ran)
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        op_id, _ = await paused_and_approved(server.base_url, reg, store)
        failing = runner(server.base_url, reg, store, progress=fail_when("results_ready"))
        with pytest.raises(HostBug):
            await failing.resume(op_id)
        assert ran == [CITY]  # the side effect happened, the drive did not finish
        done = await runner(server.base_url, reg, store).resume(op_id)
    assert done.state is OpState.COMPLETED
    assert [c.status for c in done.calls] == ["replayed"]  # answered by the ledger
    assert ran == [CITY]


async def test_a_failed_start_ends_escalated_and_releases_its_claim(tmp_path: Path) -> None:
    # Nothing could replay a start (resume takes paused operations; asking the model again
    # could propose another call than one that ran): it ends escalated, for a human.
    ran: list[str] = []
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        failing = runner(server.base_url, registry(ran), store, progress=fail_when("validating"))
        with pytest.raises(HostBug):
            await failing.start("Weather?", operation_id="op_failed_start")
        row = await store.get_operation("op_failed_start")
    assert row is not None and row.owner is None
    assert row.state == OpState.ESCALATED.value
    snap = SNAPSHOT_DECODER.decode(row.snapshot)
    assert snap.state is OpState.ESCALATED and snap.stop is not None
    assert snap.stop.input is OpInput.DRIVE_FAILED and "HostBug" in snap.stop.reason
    assert "progress sink failed" not in snap.stop.reason  # the type only, never the text
    assert ran == []


async def test_a_cancelled_resume_still_gives_its_claim_back(tmp_path: Path) -> None:
    entered = anyio.Event()

    async def hangs(args: WeatherArgs, ctx: ToolContext) -> dict[str, object]:
        entered.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    reg = registry([], handler=hangs)
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        op_id, _ = await paused_and_approved(server.base_url, reg, store)
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner(server.base_url, reg, store).resume, op_id)
            with anyio.fail_after(10):
                await entered.wait()
            tg.cancel_scope.cancel()
        row = await store.get_operation(op_id)
    assert row is not None and row.owner is None
    assert row.state == OpState.WAITING_APPROVAL.value


async def test_a_failed_start_taken_over_meanwhile_leaves_the_new_owner_alone(
    tmp_path: Path,
) -> None:
    """Another worker took the operation over (its claim fenced this one out) while this
    start was failing: the failed drive neither releases the new owner's claim nor chains
    its own end into the trail (the operation is no longer its to end)."""
    ran: list[str] = []
    sink = MemoryAuditSink()
    taken: list[int | None] = []

    async def taken_over_then_failing(event: ProgressEvent) -> None:
        if isinstance(event, StateChanged) and event.new == "validating" and not taken:
            taken.append(
                await store.claim_operation(
                    "op_taken", "w-new", now=time.time() + 3600, stale_after=1.0
                )
            )
            raise HostBug("progress sink failed after the takeover")

    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        failing = runner(
            server.base_url,
            registry(ran),
            store,
            progress=taken_over_then_failing,
            audit=sink.write,
            worker_id="w-old",
        )
        with pytest.raises(HostBug):
            await failing.start("Weather?", operation_id="op_taken")
        row = await store.get_operation("op_taken")
    assert taken and taken[0] is not None  # the takeover happened, with a new token
    assert row is not None and (row.owner, row.fencing_token) == ("w-new", taken[0])
    states = [r.data["to"] for r in sink.records if r.kind == "state"]
    assert OpState.ESCALATED.value not in states and states[-1] == "validating"
    assert verify_trail(sink.lines).ok
    assert ran == []


# --- a claim whose owner went silent ----------------------------------------------------


async def test_a_silent_owner_is_taken_over_only_with_claim_stale_after(tmp_path: Path) -> None:
    ran: list[str] = []
    reg = registry(ran)
    clock = [time.time()]
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        op_id, approval_id = await paused_and_approved(server.base_url, reg, store)
        # A worker claims and consumes, as resume does, then its process dies (SIGKILL):
        # nothing of it runs again, so nothing releases the claim.
        dead = await store.claim_operation(
            op_id, "w-dead", now=clock[0], from_states=[OpState.WAITING_APPROVAL.value]
        )
        assert dead is not None
        await store.consume_approval(approval_id, now=clock[0])

        def resume_as(worker: str, **kw: Any) -> Any:
            r = runner(server.base_url, reg, store, worker_id=worker, clock=lambda: clock[0], **kw)
            return r.resume(op_id)

        clock[0] += 24 * 3600.0
        untouched = await resume_as("w-default")  # no option: today's behaviour
        assert untouched.state is OpState.WAITING_APPROVAL
        row = await store.get_operation(op_id)
        assert row is not None and row.owner == "w-dead"

        clock[0] = row.updated_at + 299.0  # silent for less than the option allows
        early = await resume_as("w-early", claim_stale_after=300.0)
        assert early.state is OpState.WAITING_APPROVAL
        row = await store.get_operation(op_id)
        assert row is not None and row.owner == "w-dead"

        clock[0] = row.updated_at + 300.0
        done = await resume_as("w-late", claim_stale_after=300.0)
        row = await store.get_operation(op_id)
    assert done.state is OpState.COMPLETED
    assert [(c.status, c.approval_id) for c in done.calls] == [("ok", approval_id)]
    assert ran == [CITY]
    assert row is not None and row.owner is None and row.fencing_token == dead + 1


async def test_a_locked_database_that_also_blocks_the_release_is_recovered_by_takeover(
    tmp_path: Path,
) -> None:
    """The reviewer's scenario with a real lock: another process holds SQLite's write lock
    from the moment the resumed call starts executing, so the ledger write fails and so
    does the release. The claim is left behind; ``claim_stale_after`` recovers it."""
    ran: list[str] = []
    reg = registry(ran)
    db = tmp_path / "db"
    clock = [time.time()]
    holder: list[sqlite3.Connection] = []

    def take_write_lock() -> None:
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        holder.append(conn)

    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with (
        ReplayServer(turns) as server,
        SQLiteStore(db) as store,
        SQLiteStore(db, busy_timeout=0.01, max_attempts=2) as impatient,
    ):
        op_id, approval_id = await paused_and_approved(server.base_url, reg, store)
        progress = fail_when("executing", take_write_lock)
        failing = runner(
            server.base_url,
            reg,
            impatient,
            worker_id="w2",
            progress=progress,
            clock=lambda: clock[0],
        )
        try:
            with pytest.raises(BaseException) as raised:
                await failing.resume(op_id)
        finally:
            for conn in holder:
                conn.rollback()
                conn.close()
        assert (
            raised.group_contains(StoreBusy)
            if isinstance(raised.value, BaseExceptionGroup)
            else isinstance(raised.value, StoreBusy)
        )
        notes = " ".join(getattr(raised.value, "__notes__", []))
        assert "releasing the claim" in notes  # the host learns it is still held
        row = await store.get_operation(op_id)
        assert row is not None and row.owner == "w2"

        clock[0] += 600.0
        done = await runner(
            server.base_url,
            reg,
            store,
            worker_id="w3",
            clock=lambda: clock[0],
            claim_stale_after=300.0,
        ).resume(op_id)
    assert done.state is OpState.COMPLETED
    assert [(c.status, c.approval_id) for c in done.calls] == [("ok", approval_id)]
    assert ran == [CITY]


@pytest.mark.parametrize("option", ["claim_stale_after", "approval_ttl"])
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
async def test_claim_stale_after_and_approval_ttl_must_be_positive_finite_numbers(
    option: str, bad: float
) -> None:
    # Refused at construction: approval_ttl used to fail only at the first pause, after a
    # paid model turn, leaving the operation escalated (inf has no JSON form).
    with pytest.raises(ConfigError, match=option):
        Runner(
            provider="openai_chat",
            model="gpt-4o",
            registry=registry([]),
            endpoint=ProviderEndpoint(base_url="http://127.0.0.1:9", api_key="sk-test"),
            **{option: bad},
        )


@pytest.mark.parametrize("model", ["", "gemini\n2", " gpt-4o", "\x1b[31mgpt", 4])
def test_a_model_name_that_no_request_can_carry_is_refused_at_construction(model: object) -> None:
    # It used to fail in the HTTP library at the first turn (Gemini puts the model in the
    # URL path): an httpx traceback to the host and an operation stored escalated.
    with pytest.raises(ConfigError, match="model must be"):
        Runner(
            provider="gemini",
            model=model,  # type: ignore[arg-type]
            registry=registry([]),
            endpoint=ProviderEndpoint(base_url="http://127.0.0.1:9", api_key="k"),
        )


# --- an approval is bound to the policy revision it was given under ---------------------


@pytest.mark.parametrize(("revision_at_resume", "status"), [("1", "ok"), ("2", "denied")])
async def test_an_approval_counts_only_under_the_policy_revision_it_was_given_for(
    tmp_path: Path, revision_at_resume: str, status: str
) -> None:
    ran: list[str] = []
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        op_id, approval_id = await paused_and_approved(
            server.base_url, registry(ran, policy_revision="1"), store
        )
        current = registry(ran, policy_revision=revision_at_resume)
        done = await runner(server.base_url, current, store).resume(op_id)
        record = await store.get_approval(approval_id)
    assert done.state is OpState.COMPLETED
    assert [(c.status, c.approval_id) for c in done.calls] == [(status, approval_id)]
    assert ran == ([CITY] if status == "ok" else [])
    # Consumed only when it authorized the run: the one that did not carry over is left
    # approved (a consumed row reads, in `approvals list`, as an approval that was used).
    assert record is not None
    assert record.status is (ApprovalStatus.CONSUMED if status == "ok" else ApprovalStatus.APPROVED)


async def test_a_consumed_approval_whose_policy_changed_escalates(tmp_path: Path) -> None:
    """Consumed by a resume that failed (and may have run the call), then the policy
    revision changed: the call may not run now, and it may have run."""
    ran: list[str] = []
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        op_id, _ = await paused_and_approved(server.base_url, registry(ran), store)
        failing = runner(server.base_url, registry(ran), store, progress=fail_when("results_ready"))
        with pytest.raises(HostBug):
            await failing.resume(op_id)
        assert ran == [CITY]
        done = await runner(server.base_url, registry(ran, policy_revision="2"), store).resume(
            op_id
        )
    assert done.state is OpState.ESCALATED and done.stop is not None
    assert done.stop.input is OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE
    assert ran == [CITY]


# --- an approval row counts only for the call and operation it was created for ---------


@pytest.mark.parametrize("forged_field", ["operation_id", "call_id"])
async def test_an_approval_row_of_another_call_or_operation_never_authorizes(
    tmp_path: Path, forged_field: str
) -> None:
    """A snapshot whose approval id points at a row made for another operation or another
    call (a corrupted or tampered snapshot), the row approved, and everything else about it
    the same (tool, schema, policy, argument digest): the call is not authorized and never
    runs, and the row is left as it was, never consumed."""
    ran: list[str] = []
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        paused = await runner(server.base_url, registry(ran), store).start("Weather?")
        assert paused.state is OpState.WAITING_APPROVAL
        (own_id,) = paused.pending_approvals
        own = await store.get_approval(own_id)
        assert own is not None
        forged_values = {"operation_id": "op-someone-else", "call_id": "call_someone_else"}
        forged = msgspec.structs.replace(
            own, approval_id="ap-forged", **{forged_field: forged_values[forged_field]}
        )
        await store.create_approval(forged)
        await store.decide_approval("ap-forged", True, "alice", "ok", now=time.time())
        await store.decide_approval(own_id, False, "bob", "no", now=time.time())

        row = await store.get_operation(paused.operation_id)
        assert row is not None
        snap = SNAPSHOT_DECODER.decode(row.snapshot)
        assert snap.approvals == {own.call_id: own_id}
        snap.approvals = {own.call_id: "ap-forged"}
        await store.save_operation(
            msgspec.structs.replace(row, snapshot=msgspec.json.encode(snap)),
            expected_version=row.version,
            fencing_token=row.fencing_token,
        )

        done = await runner(server.base_url, registry(ran), store).resume(paused.operation_id)
        left = await store.get_approval("ap-forged")
    assert done.state is OpState.COMPLETED
    assert [(c.call_id, c.status) for c in done.calls] == [(own.call_id, "denied")]
    assert ran == []
    assert left is not None and left.status is ApprovalStatus.APPROVED
