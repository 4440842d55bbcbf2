"""One conformance suite for every store backend: SQLite (a temp file), PostgreSQL (a real
server: CALLGATE_PG_URL; each test in its own schema) and the in-memory test store. This
module covers operations (claims, fencing), approvals (decide, consume, expiry),
migrations, store URLs and busy handling; the idempotency ledger is in
tests/test_store_conformance_ledger.py, the shared fixtures in
tests/store_conformance_helpers.py.

PostgreSQL is skipped only when no URL is configured *and* CI is not set; in CI a missing
URL fails the run. Cross-process scenarios (a fresh process reading the database alone,
racing processes) run on the durable backends only.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from callgate.engine.core.errors import ConfigError, StaleWriteError, StoreError
from callgate.engine.store import (
    LEDGER_RETENTION,
    ApprovalAlreadyConsumed,
    ApprovalAlreadyDecided,
    ApprovalExpired,
    ApprovalNotApproved,
    ApprovalRecord,
    ApprovalStatus,
    DuplicateRecord,
    OperationRecord,
    PostgresStore,
    RecordNotFound,
    SchemaTooNew,
    SQLiteStore,
    Store,
    StoreBusy,
    StoreUnavailable,
    open_store,
)
from callgate.engine.store.migrations import SchemaMissing

from .store_conformance_helpers import (
    NOW,
    T,
    all_backends,
    durable,
    make_store,
    one_loop,
    store_fixture,  # noqa: F401 - a pytest fixture
    store_url_fixture,  # noqa: F401 - a pytest fixture
)
from .store_helpers import HELPER, race_processes

pytestmark = pytest.mark.anyio


def op(operation_id: str = "op-1", state: str = "WAITING_APPROVAL", **kw: Any) -> OperationRecord:
    base: dict[str, Any] = {
        "operation_id": operation_id,
        "tenant": T,
        "subject": "user-1",
        "state": state,
        "snapshot": b'{"turn":1}',
        "created_at": NOW,
        "updated_at": NOW,
    }
    return OperationRecord(**(base | kw))


def approval(approval_id: str = "ap-1", expires_at: float = NOW + 60, **kw: Any) -> ApprovalRecord:
    base: dict[str, Any] = {
        "approval_id": approval_id,
        "operation_id": "op-1",
        "call_id": "call-1",
        "tool": "refund",
        "schema_version": "3",
        "args_digest": "d" * 64,
        "policy_revision": "rev-7",
        "tenant": T,
        "subject": "user-1",
        "created_at": NOW,
        "expires_at": expires_at,
    }
    return ApprovalRecord(**(base | kw))


# -- operations -----------------------------------------------------------------------------
@all_backends
async def test_operation_create_get_list_and_duplicate(store: Store) -> None:
    created = await store.create_operation(op(version=42))
    assert created.version == 1
    assert await store.get_operation("op-1") == created
    assert await store.get_operation("nope") is None
    with pytest.raises(DuplicateRecord):
        await store.create_operation(op())
    await store.create_operation(op("op-0", state="COMPLETED", created_at=NOW - 1))
    assert [o.operation_id for o in await store.list_operations()] == ["op-0", "op-1"]
    assert [o.operation_id for o in await store.list_operations("COMPLETED")] == ["op-0"]
    assert len(await store.list_operations(limit=1)) == 1


@pytest.mark.parametrize(
    "store_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_value_postgresql_cannot_hold_is_a_store_error_not_unavailable(
    store: Store,
) -> None:
    # PostgreSQL text holds no NUL: no retry helps, and StoreUnavailable would invite one.
    with pytest.raises(StoreError, match="refused a value") as caught:
        await store.create_operation(op("op-\x00"))
    assert not isinstance(caught.value, StoreUnavailable)


@all_backends
async def test_listings_are_oldest_first_ties_by_id_and_cut_at_the_limit(store: Store) -> None:
    # Creation time first, the id only breaks a tie: the ids are chosen so that neither
    # id order, a reversed tie-break nor insertion order gives the expected list. The CLI
    # reads "more than N" from a listing of N + 1, so a limit must be exact.
    for oid, at in (("op-a", NOW + 1), ("op-c", NOW), ("op-b", NOW)):
        await store.create_operation(op(oid, created_at=at, updated_at=at))
    assert [o.operation_id for o in await store.list_operations()] == ["op-b", "op-c", "op-a"]
    assert [o.operation_id for o in await store.list_operations(limit=2)] == ["op-b", "op-c"]
    for aid, at in (("ap-a", NOW + 1), ("ap-c", NOW), ("ap-b", NOW)):
        await store.create_approval(approval(aid, created_at=at))
    assert [a.approval_id for a in await store.list_approvals()] == ["ap-b", "ap-c", "ap-a"]
    assert [a.approval_id for a in await store.list_approvals(limit=1)] == ["ap-b"]
    assert [a.approval_id for a in await store.list_approvals(limit=2)] == ["ap-b", "ap-c"]


@all_backends
@pytest.mark.parametrize("limit", [0, -1, True, 1.5])
async def test_a_listing_limit_must_be_a_positive_int(store: Store, limit: Any) -> None:
    # A negative limit meant all rows (SQLite), all but the last (memory), an error (PG).
    await store.create_operation(op())
    with pytest.raises(ConfigError, match="limit"):
        await store.list_operations(limit=limit)
    with pytest.raises(ConfigError, match="limit"):
        await store.list_approvals(limit=limit)


@all_backends
async def test_save_checks_version_and_fencing_token(store: Store) -> None:
    await store.create_operation(op(owner="w1", fencing_token=5))
    saved = await store.save_operation(
        op(state="EXECUTING", owner="w1", snapshot=b"{}", updated_at=NOW + 1), 1, 5
    )
    assert (saved.version, saved.state, saved.snapshot, saved.fencing_token) == (
        2,
        "EXECUTING",
        b"{}",
        5,
    )
    assert await store.get_operation("op-1") == saved
    with pytest.raises(StaleWriteError):
        await store.save_operation(op(state="X"), 1, 5)  # old version
    with pytest.raises(StaleWriteError):
        await store.save_operation(op(state="X"), 2, 4)  # old token
    with pytest.raises(RecordNotFound):
        await store.save_operation(op("missing"), 1, 0)
    assert (await store.get_operation("op-1")) == saved


@all_backends
async def test_claim_only_from_listed_states_and_only_when_free(store: Store) -> None:
    await store.create_operation(op())
    assert await store.claim_operation("op-1", "w1", now=NOW, from_states={"EXECUTING"}) is None
    token = await store.claim_operation("op-1", "w1", now=NOW, from_states={"WAITING_APPROVAL"})
    assert token == 1
    assert await store.claim_operation("op-1", "w2", now=NOW + 1) is None  # owned
    row = await store.get_operation("op-1")
    assert row is not None and (row.owner, row.fencing_token, row.version) == ("w1", 1, 2)
    # Releasing (owner=None) makes it claimable again, with a new token.
    await store.save_operation(op(owner=None, updated_at=NOW + 2), row.version, 1)
    assert await store.claim_operation("op-1", "w2", now=NOW + 3) == 2
    with pytest.raises(RecordNotFound):
        await store.claim_operation("missing", "w1", now=NOW)


@all_backends
async def test_16_coroutines_claim_one_operation_exactly_one_wins(store: Store) -> None:
    await store.create_operation(op())
    tokens: dict[str, int | None] = {}

    async def worker(name: str) -> None:
        tokens[name] = await store.claim_operation(
            "op-1", name, now=NOW, from_states={"WAITING_APPROVAL"}
        )

    async with anyio.create_task_group() as tg:
        for i in range(16):
            tg.start_soon(worker, f"w{i}")
    winners = [w for w, t in tokens.items() if t is not None]
    assert len(winners) == 1 and tokens[winners[0]] == 1
    row = await store.get_operation("op-1")
    assert row is not None and row.owner == winners[0] and row.fencing_token == 1


@one_loop
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_16_processes_claim_one_operation_exactly_one_wins(
    store: Store, store_url: str
) -> None:
    # PostgreSQL's claim race is covered by the coroutine test above: its pool gives
    # the coroutines separate server sessions. SQLite's cross-process locking is not.
    await store.create_operation(op())
    results = await race_processes(
        [["claim", store_url, "op-1", f"p{i}", str(NOW)] for i in range(16)]
    )
    winners = [r for r in results if r["token"] is not None]
    assert len(winners) == 1 and winners[0]["token"] == 1
    row = await store.get_operation("op-1")
    assert row is not None and row.owner == winners[0]["worker"]


@all_backends
async def test_stale_worker_is_fenced_after_takeover(store: Store) -> None:
    await store.create_operation(op(state="EXECUTING"))
    t1 = await store.claim_operation("op-1", "w1", now=NOW)
    assert t1 == 1
    a = await store.save_operation(op(state="EXECUTING", owner="w1", updated_at=NOW + 1), 2, t1)
    # w1 goes silent; before the staleness window nobody may take over ...
    assert await store.claim_operation("op-1", "w2", now=NOW + 10, stale_after=30) is None
    # ... after it, w2 does, with a new token.
    t2 = await store.claim_operation("op-1", "w2", now=NOW + 31, stale_after=30)
    assert t2 == 2
    with pytest.raises(StaleWriteError):  # w1 wakes up: even with the right version, fenced
        await store.save_operation(op(state="DONE", owner="w1"), a.version + 1, t1)
    b = await store.save_operation(op(state="DONE", owner=None, updated_at=NOW + 40), 4, t2)
    assert (b.state, b.owner, b.fencing_token) == ("DONE", None, 2)


@one_loop
@durable
async def test_1000_operations_resume_from_the_database_alone(store: Store, store_url: str) -> None:
    expected = []
    limiter = anyio.CapacityLimiter(16)

    async def create(i: int, snap: bytes) -> None:
        async with limiter:
            rec = await store.create_operation(
                op(f"op-{i:04d}", snapshot=snap, created_at=NOW + i, updated_at=NOW + i)
            )
        assert rec.version == 1

    async with anyio.create_task_group() as tg:
        for i in range(1000):
            snap = json.dumps({"i": i, "continuation": [{"id": f"item-{i}"}]}).encode()
            expected.append(
                [f"op-{i:04d}", "WAITING_APPROVAL", 1, hashlib.sha256(snap).hexdigest()]
            )
            tg.start_soon(create, i, snap)
    # A fresh interpreter, given only the URL, lists and loads every operation.
    proc = await anyio.run_process([sys.executable, HELPER, "dump", store_url])
    assert json.loads(proc.stdout) == expected


# -- approvals ------------------------------------------------------------------------------
@all_backends
async def test_approval_create_get_list(store: Store) -> None:
    rec = await store.create_approval(approval())
    assert rec.status is ApprovalStatus.PENDING
    assert await store.get_approval("ap-1") == rec
    assert await store.get_approval("nope") is None
    with pytest.raises(DuplicateRecord):
        await store.create_approval(approval())
    await store.create_approval(approval("ap-2", operation_id="op-2", created_at=NOW + 1))
    await store.decide_approval("ap-2", False, "bob", "no", now=NOW + 2)
    assert [a.approval_id for a in await store.list_approvals()] == ["ap-1", "ap-2"]
    pending = await store.list_approvals(ApprovalStatus.PENDING)
    assert [a.approval_id for a in pending] == ["ap-1"]
    assert [a.approval_id for a in await store.list_approvals(operation_id="op-2")] == ["ap-2"]


@all_backends
async def test_approval_must_be_created_pending_and_undecided(store: Store) -> None:
    for forged in (
        approval(status=ApprovalStatus.APPROVED),
        approval(approver="mallory"),
        approval(decided_at=NOW),
    ):
        with pytest.raises(ConfigError):
            await store.create_approval(forged)
    assert await store.get_approval("ap-1") is None


@all_backends
async def test_decide_1ms_before_expiry_is_recorded(store: Store) -> None:
    await store.create_approval(approval(expires_at=NOW + 60))
    rec = await store.decide_approval("ap-1", True, "alice", "ok", now=NOW + 60 - 0.001)
    assert (rec.status, rec.approver, rec.reason) == (ApprovalStatus.APPROVED, "alice", "ok")
    assert rec.decided_at == NOW + 60 - 0.001
    assert await store.get_approval("ap-1") == rec


@all_backends
async def test_decide_1ms_after_expiry_is_expired(store: Store) -> None:
    await store.create_approval(approval(expires_at=NOW + 60))
    with pytest.raises(ApprovalExpired) as info:
        await store.decide_approval("ap-1", True, "alice", None, now=NOW + 60 + 0.001)
    assert info.value.code == "approval_expired"
    row = await store.get_approval("ap-1")
    assert row is not None and row.status is ApprovalStatus.EXPIRED and row.approver is None
    with pytest.raises(ApprovalExpired):  # and stays expired
        await store.decide_approval("ap-1", True, "alice", None, now=NOW)


@all_backends
async def test_a_decision_at_the_exact_expiry_instant_is_expired(store: Store) -> None:
    """Expiry is inclusive (``now >= expires_at``) for deciding, as for consuming."""
    await store.create_approval(approval(expires_at=NOW + 60))
    with pytest.raises(ApprovalExpired):
        await store.decide_approval("ap-1", True, "alice", None, now=NOW + 60)
    row = await store.get_approval("ap-1")
    assert row is not None and row.status is ApprovalStatus.EXPIRED and row.approver is None


@all_backends
async def test_consume_1ms_before_and_after_expiry(store: Store) -> None:
    await store.create_approval(approval("ap-1", expires_at=NOW + 60))
    await store.create_approval(approval("ap-2", expires_at=NOW + 60))
    for a in ("ap-1", "ap-2"):
        await store.decide_approval(a, True, "alice", None, now=NOW)
    ok = await store.consume_approval("ap-1", now=NOW + 60 - 0.001)
    assert ok.status is ApprovalStatus.CONSUMED and ok.consumed_at == NOW + 60 - 0.001
    with pytest.raises(ApprovalExpired):
        await store.consume_approval("ap-2", now=NOW + 60 + 0.001)
    row = await store.get_approval("ap-2")
    assert row is not None and row.status is ApprovalStatus.EXPIRED and row.approver == "alice"


@all_backends
async def test_double_approve_first_decision_wins(store: Store) -> None:
    await store.create_approval(approval())
    first = await store.decide_approval("ap-1", True, "alice", "fine", now=NOW + 1)
    with pytest.raises(ApprovalAlreadyDecided):
        await store.decide_approval("ap-1", True, "bob", "me too", now=NOW + 2)
    with pytest.raises(ApprovalAlreadyDecided):
        await store.decide_approval("ap-1", False, "carol", "no", now=NOW + 3)
    assert await store.get_approval("ap-1") == first
    with pytest.raises(RecordNotFound):
        await store.decide_approval("missing", True, "alice", None, now=NOW)


@all_backends
@pytest.mark.parametrize(
    ("approver", "reason"), [("caf\udce9", None), ("alice", "caf\udce9 ok"), ("alice", 7)]
)
async def test_a_decision_whose_text_cannot_be_kept_is_refused(
    store: Store, approver: Any, reason: Any
) -> None:
    # A lone surrogate (surrogateescape'd argv bytes) goes neither into the audit trail's
    # canonical JSON nor into UTF-8 text: accepted, it failed every later resume.
    await store.create_approval(approval())
    with pytest.raises(ConfigError, match="not text"):
        await store.decide_approval("ap-1", False, approver, reason, now=NOW + 1)
    record = await store.get_approval("ap-1")
    assert record is not None and record.status is ApprovalStatus.PENDING


@all_backends
@pytest.mark.parametrize("approver", ["", "   ", None])
async def test_an_anonymous_decision_is_refused(store: Store, approver: Any) -> None:
    await store.create_approval(approval())
    with pytest.raises(ConfigError, match="approver"):
        await store.decide_approval("ap-1", True, approver, None, now=NOW + 1)
    record = await store.get_approval("ap-1")
    assert record is not None and record.status is ApprovalStatus.PENDING


@all_backends
async def test_approve_vs_deny_race_exactly_one_decision(store: Store) -> None:
    await store.create_approval(approval())
    wins: list[tuple[str, bool]] = []
    losses = 0

    async def decide(name: str, approve: bool) -> None:
        nonlocal losses
        try:
            await store.decide_approval("ap-1", approve, name, None, now=NOW + 1)
            wins.append((name, approve))
        except ApprovalAlreadyDecided:
            losses += 1

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(decide, f"approver-{i}", True)
            tg.start_soon(decide, f"denier-{i}", False)
    assert len(wins) == 1 and losses == 15
    row = await store.get_approval("ap-1")
    name, approve = wins[0]
    assert row is not None and row.approver == name
    assert row.status is (ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED)


@all_backends
async def test_consume_is_single_use_under_concurrency(store: Store) -> None:
    await store.create_approval(approval())
    await store.decide_approval("ap-1", True, "alice", None, now=NOW)
    outcomes: list[str] = []

    async def consume() -> None:
        try:
            await store.consume_approval("ap-1", now=NOW + 1)
            outcomes.append("consumed")
        except ApprovalAlreadyConsumed:
            outcomes.append("refused")

    async with anyio.create_task_group() as tg:
        for _ in range(16):
            tg.start_soon(consume)
    assert sorted(outcomes) == ["consumed"] + ["refused"] * 15


@all_backends
async def test_consume_refuses_pending_and_denied(store: Store) -> None:
    await store.create_approval(approval("ap-p"))
    await store.create_approval(approval("ap-d"))
    await store.decide_approval("ap-d", False, "bob", "too big", now=NOW)
    for a, status in (("ap-p", "pending"), ("ap-d", "denied")):
        with pytest.raises(ApprovalNotApproved) as info:
            await store.consume_approval(a, now=NOW + 1)
        assert info.value.status == status
    with pytest.raises(RecordNotFound):
        await store.consume_approval("missing", now=NOW)


# -- migrations, URLs, busy handling --------------------------------------------------------
@one_loop
@durable
async def test_migrations_are_idempotent_and_safe_for_concurrent_starters(
    store_url: str,
) -> None:
    # 4 fresh processes start on an empty database at the same moment.
    results = await race_processes([["migrate", store_url] for _ in range(4)])
    assert results == [{"ok": True}] * 4
    async with make_store(store_url) as s:  # and once more, in-process
        await s.create_operation(op())
    rows = await schema_versions(store_url)
    assert rows == [1]


async def schema_versions(url: str) -> list[int]:
    s = open_store(url)
    if isinstance(s, SQLiteStore):
        with sqlite3.connect(s.path) as conn:
            return [r[0] for r in conn.execute("SELECT version FROM schema_version")]
    assert isinstance(s, PostgresStore)
    import asyncpg

    conn = await asyncpg.connect(s.url, server_settings={"search_path": s.schema or "public"})
    try:
        return [r[0] for r in await conn.fetch("SELECT version FROM schema_version")]
    finally:
        await conn.close()


@durable
async def test_schema_newer_than_code_is_refused(store: Store, store_url: str) -> None:
    if isinstance(store, SQLiteStore):
        with sqlite3.connect(store.path) as conn:
            conn.execute("INSERT INTO schema_version VALUES (999, 'future', 0)")
    else:
        assert isinstance(store, PostgresStore)
        import asyncpg

        conn = await asyncpg.connect(store.url, server_settings={"search_path": store.schema})
        await conn.execute("INSERT INTO schema_version VALUES (999, 'future', 0)")
        await conn.close()
    with pytest.raises(SchemaTooNew):
        async with make_store(store_url):
            pass


async def test_sqlite_busy_never_escapes_untyped(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    async with SQLiteStore(path):
        pass
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process holding the write lock
    try:
        async with SQLiteStore(path, busy_timeout=0.01, max_attempts=3) as s:
            assert await s.get_operation("x") is None  # WAL: readers still read
            with pytest.raises(StoreBusy) as info:
                await s.create_operation(op())
            assert isinstance(info.value, StoreError)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


async def test_sqlite_prune_runs_every_batch_not_only_the_first(tmp_path: Path) -> None:
    # Pruning deletes 1000 rows per write transaction; a ledger holding exactly two
    # batches of finished rows must lose all of them (not only the first batch, nor stop
    # at a full batch without trying the next).
    path = tmp_path / "prune.db"
    async with SQLiteStore(path) as s:
        conn = sqlite3.connect(path)
        with conn:
            conn.executemany(
                "INSERT INTO ledger VALUES (?, ?, 'D', 'succeeded', NULL, NULL, ?, ?)",
                [(T, f"k{i}", NOW, NOW) for i in range(2000)],
            )
        conn.close()
        assert await s.prune_ledger(now=NOW + LEDGER_RETENTION + 1) == 2000
        assert await s.ledger_get(T, "k0") is None
        assert await s.ledger_get(T, "k1999") is None


async def test_a_read_only_sqlite_start_never_creates_the_file(tmp_path: Path) -> None:
    # migrate=False (the CLI's listings) opens with mode=rw: a mistyped path is an error,
    # never a new empty database.
    path = tmp_path / "missing.db"
    with pytest.raises(StoreUnavailable):
        async with SQLiteStore(path, migrate=False):
            pass
    assert not path.exists()


async def test_a_failed_read_only_start_can_be_retried_and_fails_again(tmp_path: Path) -> None:
    # A start() that failed leaves the store unstarted: a second start() checks the file
    # again (it must not report success on a file that still has no callgate schema), and
    # succeeds once the engine has migrated the file.
    path = tmp_path / "later.db"
    sqlite3.connect(path).close()  # exists, holds nothing
    s = SQLiteStore(path, migrate=False)
    for _ in range(2):
        with pytest.raises(SchemaMissing):
            await s.start()
    async with SQLiteStore(path):  # the engine migrates it
        pass
    await s.start()
    try:
        assert await s.list_operations() == []
    finally:
        await s.aclose()


async def test_a_read_only_start_refuses_an_older_schema(tmp_path: Path) -> None:
    # A schema_version table without the current version (here: empty, version 0) is not
    # a callgate store of this version: a listing must refuse it, not read old-shaped rows.
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE schema_version (version INTEGER PRIMARY KEY NOT NULL, "
        "description TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    conn.close()
    with pytest.raises(SchemaMissing, match="version 0"):
        async with SQLiteStore(path, migrate=False):
            pass


@pytest.mark.parametrize(("mode", "level"), [("NORMAL", 1), ("EXTRA", 3)])
async def test_sqlite_synchronous_setting_is_applied(tmp_path: Path, mode: Any, level: int) -> None:
    # synchronous decides whether a committed ledger row survives power loss: the mode
    # asked for must be the one every connection runs with (SQLite's default is FULL, so
    # only another mode shows whether it was applied). Read through the store's own
    # connection: no public API reports it.
    async with SQLiteStore(tmp_path / "sync.db", synchronous=mode) as s:
        got = await s._read(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0])
    assert got == level


@all_backends
async def test_a_closed_store_refuses_every_call(store_url: str) -> None:
    # A store used after aclose() (a host that kept a reference past `async with`) must
    # refuse, never keep answering (the memory store's dicts would still be there), and
    # say it was closed, not that it was never started.
    s = make_store(store_url)
    async with s:
        await s.create_operation(op())
    with pytest.raises(StoreError, match="closed"):
        await s.get_operation("op-1")
    with pytest.raises(StoreError, match="closed"):
        await s.create_operation(op("op-2"))


async def test_store_refuses_use_before_start(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="not started"):
        await SQLiteStore(tmp_path / "x.db").get_operation("x")


def test_open_store_urls(tmp_path: Path) -> None:
    s = open_store(f"sqlite:///{tmp_path}/a.db")
    assert isinstance(s, SQLiteStore) and s.path == f"{tmp_path}/a.db"
    rel = open_store("sqlite:///rel/a.db")
    assert isinstance(rel, SQLiteStore) and rel.path == "rel/a.db"
    d = open_store(None, default_path=tmp_path / "d.db")
    assert isinstance(d, SQLiteStore) and d.path == str(tmp_path / "d.db")
    pg = open_store("postgresql://u:p@h:5/db?schema=cg&sslmode=disable")
    assert isinstance(pg, PostgresStore)
    assert (pg.schema, pg.url) == ("cg", "postgresql://u:p@h:5/db?sslmode=disable")
    assert isinstance(open_store("postgres://h/db"), PostgresStore)
    for bad in ("mysql://h/db", "sqlite://", "sqlite:///", "sqlite://host/x.db"):
        with pytest.raises(ConfigError):
            open_store(bad)
    with pytest.raises(ConfigError):
        open_store(None)
    with pytest.raises(ConfigError):
        open_store("postgresql://h/db?schema=Robert'); DROP")
