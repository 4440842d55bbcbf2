"""``SQLiteStore``: the embedded default store — one file, zero setup, stdlib sqlite3.

Owns: connections, transactions and the busy-retry for one SQLite file. It never decides
a state transition itself (``rules.py`` does) and never reads a clock.

Concurrency design:
- sqlite3 is blocking, so every call runs in a worker thread (``anyio.to_thread``).
  A per-store ``CapacityLimiter(pool_size)`` bounds those threads; a lock-protected list
  of at most ``pool_size`` connections (``check_same_thread=False``, each used by one
  thread at a time) serves them. Reads run in parallel (WAL lets readers proceed beside
  the writer).
- Writes are read-modify-write transactions opened with ``BEGIN IMMEDIATE``: the write
  lock is taken up front, so two writers never both read and then both try to upgrade
  (the deadlock SQLite answers with an immediate SQLITE_BUSY that no busy handler waits
  out). Inside one process a ``threading.Lock`` serializes writers before they reach
  SQLite, so only *other processes* ever meet SQLite's lock.
- ``busy_timeout`` makes SQLite wait for another process's lock; if it still reports
  BUSY/LOCKED, the whole transaction is rolled back and retried from the event loop
  after a jittered exponential backoff, a bounded number of times; then ``StoreBusy``.
  SQLITE_BUSY never escapes as a bare sqlite3 error.
- ``synchronous=FULL`` by default: a committed ledger row survives power loss, which is
  what stops a side effect from running twice after a host crash (NORMAL is faster but
  may lose the last commits on power loss; pass it only if a lost ``in_flight`` is fine).
- Cancellation: a call already in its worker thread runs to its COMMIT or ROLLBACK before
  the cancelled caller resumes; the caller then does not learn the outcome — the same
  as a lost reply from a database server, and why claims have ``stale_after`` and the
  ledger has leases.
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Literal, TypeVar

import anyio
import anyio.to_thread

from callgate.engine.core.errors import ConfigError, StoreError

from . import rules
from .base import (
    LEDGER_IN_FLIGHT_LEASE,
    LEDGER_RETENTION,
    ApprovalRecord,
    ApprovalStatus,
    Began,
    LedgerDecision,
    LedgerRecord,
    OperationRecord,
    Store,
)
from .errors import (
    ApprovalError,
    DuplicateRecord,
    RecordNotFound,
    StoreBusy,
    StoreUnavailable,
)
from .migrations import apply_sqlite, check_sqlite
from .rows import (
    APPROVAL_COLUMNS,
    LEDGER_COLUMNS,
    OPERATION_COLUMNS,
    approval_from_row,
    approval_values,
    ledger_from_row,
    ledger_values,
    operation_from_row,
    operation_values,
)

__all__ = ["SQLiteStore"]

_T = TypeVar("_T")

_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_PRUNE_BATCH = 1000

_OP_COLS = ", ".join(OPERATION_COLUMNS)
_AP_COLS = ", ".join(APPROVAL_COLUMNS)
_LG_COLS = ", ".join(LEDGER_COLUMNS)


def _placeholders(n: int) -> str:
    return ", ".join("?" * n)


def _assignments(columns: tuple[str, ...]) -> str:
    return ", ".join(f"{c} = ?" for c in columns)


_OP_INSERT = f"INSERT INTO operations ({_OP_COLS}) VALUES ({_placeholders(len(OPERATION_COLUMNS))})"
_OP_UPDATE = f"UPDATE operations SET {_assignments(OPERATION_COLUMNS[1:])} WHERE operation_id = ?"
_AP_INSERT = f"INSERT INTO approvals ({_AP_COLS}) VALUES ({_placeholders(len(APPROVAL_COLUMNS))})"
_AP_UPDATE = f"UPDATE approvals SET {_assignments(APPROVAL_COLUMNS[1:])} WHERE approval_id = ?"
_LG_INSERT = f"INSERT INTO ledger ({_LG_COLS}) VALUES ({_placeholders(len(LEDGER_COLUMNS))})"
_LG_UPDATE = f"UPDATE ledger SET {_assignments(LEDGER_COLUMNS[2:])} WHERE tenant = ? AND key = ?"


class _Busy(Exception):
    """Internal: this attempt met SQLITE_BUSY/LOCKED (or our own write lock timed out)
    and was rolled back; the event-loop side backs off and retries."""


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


class SQLiteStore(rules.LedgerMoves, Store):
    """A store in one SQLite file (created if missing, WAL mode). See the module docstring
    for the locking design; ``busy_timeout`` is seconds per attempt, ``max_attempts``
    bounds the retries of a transaction that keeps meeting a locked database.
    ``migrate=False`` (read-only commands): the file must exist and hold callgate's current
    schema (else ``StoreUnavailable``/``SchemaMissing``); start() changes nothing in it."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        pool_size: int = 4,
        busy_timeout: float = 5.0,
        max_attempts: int = 10,
        synchronous: Literal["FULL", "NORMAL", "EXTRA"] = "FULL",
        migrate: bool = True,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise ConfigError(f"synchronous must be FULL, NORMAL or EXTRA, not {synchronous!r}")
        self.path = os.fspath(path)
        self._pool_size = pool_size
        self._busy_timeout = busy_timeout
        self._max_attempts = max_attempts
        self._synchronous = synchronous
        self._migrate = migrate
        self._idle: list[sqlite3.Connection] = []
        self._pool_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._limiter: anyio.CapacityLimiter | None = None
        self._closed = False

    # -- plumbing ------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        # Read-only start (migrate=False): never create the file (mode=rw refuses to).
        target = self.path if self._migrate else Path(self.path).absolute().as_uri() + "?mode=rw"
        try:
            conn = sqlite3.connect(
                target,
                uri=not self._migrate,
                timeout=self._busy_timeout,
                isolation_level=None,  # autocommit: we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # one thread at a time, handed over by the pool
            )
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
        except sqlite3.Error as exc:
            if _is_busy(exc):
                raise _Busy from exc
            raise StoreUnavailable(f"cannot open SQLite database {self.path!r}: {exc}") from exc
        return conn

    def _acquire(self) -> sqlite3.Connection:
        with self._pool_lock:
            if self._closed:
                raise StoreError("store is closed")
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def _release(self, conn: sqlite3.Connection, broken: bool) -> None:
        with self._pool_lock:
            if not (broken or self._closed):
                self._idle.append(conn)
                return
        conn.close()

    def _in_thread(self, fn: Callable[[sqlite3.Connection], _T], write: bool) -> _T:
        conn = self._acquire()
        broken = False
        locked = False
        try:
            if write:
                # Bounded wait, so one stuck writer turns into a retry, not a hang.
                locked = self._write_lock.acquire(timeout=self._busy_timeout)
                if not locked:
                    raise _Busy
                conn.execute("BEGIN IMMEDIATE")
                result = fn(conn)
                conn.execute("COMMIT")
            else:
                result = fn(conn)
            return result
        except BaseException as exc:
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error:
                broken = True
            if isinstance(exc, sqlite3.Error):
                if _is_busy(exc):
                    raise _Busy from exc
                broken = True
                raise StoreUnavailable(f"SQLite error on {self.path!r}: {exc}") from exc
            if isinstance(exc, UnicodeEncodeError):
                # A str SQLite cannot hold (a lone surrogate from a host's input): no retry
                # helps, as with PostgreSQL's data errors. (The value is not quoted.)
                raise StoreError(
                    f"SQLite refused a value: it is not valid UTF-8 text ({exc.reason})"
                ) from None
            raise
        finally:
            if locked:
                self._write_lock.release()
            self._release(conn, broken)

    async def _run(self, fn: Callable[[sqlite3.Connection], _T], write: bool) -> _T:
        if self._limiter is None:
            raise StoreError("store not started: use `async with store:` or `await start()`")
        for attempt in range(self._max_attempts):
            try:
                return await anyio.to_thread.run_sync(
                    self._in_thread, fn, write, limiter=self._limiter
                )
            except _Busy:
                # Full jitter: concurrent losers spread out instead of colliding again.
                await anyio.sleep(random.uniform(0, min(0.5, 0.005 * 2**attempt)))
        raise StoreBusy(
            f"SQLite database {self.path!r} stayed locked for {self._max_attempts} attempts"
        )

    async def _read(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        return await self._run(fn, write=False)

    async def _write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        return await self._run(fn, write=True)

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        if self._limiter is not None:
            return
        self._limiter = anyio.CapacityLimiter(self._pool_size)

        def migrate(conn: sqlite3.Connection) -> None:
            if not self._migrate:
                check_sqlite(conn)  # read-only: neither the journal mode nor the schema
                return
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"SQLite refused WAL mode for {self.path!r} (got {mode!r})")
            apply_sqlite(conn)

        try:
            await self._read(migrate)  # apply_sqlite opens its own BEGIN IMMEDIATE
        except BaseException:
            self._limiter = None  # not started: a later start() may try again
            self._close_idle()
            raise

    async def aclose(self) -> None:
        with self._pool_lock:
            self._closed = True
        self._close_idle()

    def _close_idle(self) -> None:
        with self._pool_lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- operations ----------------------------------------------------------------------
    async def create_operation(self, record: OperationRecord) -> OperationRecord:
        row = rules.new_operation(record)

        def body(conn: sqlite3.Connection) -> OperationRecord:
            try:
                conn.execute(_OP_INSERT, operation_values(row))
            except sqlite3.IntegrityError as exc:
                raise _insert_error(exc, f"operation {row.operation_id!r}") from None
            return row

        return await self._write(body)

    async def get_operation(self, operation_id: str) -> OperationRecord | None:
        return await self._read(lambda conn: _get_operation(conn, operation_id))

    async def list_operations(
        self, state: str | None = None, limit: int = 100
    ) -> list[OperationRecord]:
        limit = rules.check_limit(limit)
        where, args = ("WHERE state = ?", [state]) if state is not None else ("", [])
        sql = f"SELECT {_OP_COLS} FROM operations {where} ORDER BY created_at, operation_id LIMIT ?"
        rows = await self._read(lambda conn: conn.execute(sql, [*args, limit]).fetchall())
        return [operation_from_row(r) for r in rows]

    async def save_operation(
        self, record: OperationRecord, expected_version: int, fencing_token: int
    ) -> OperationRecord:
        def body(conn: sqlite3.Connection) -> OperationRecord:
            current = _require_operation(conn, record.operation_id)
            new = rules.save(current, record, expected_version, fencing_token)
            _update_operation(conn, new)
            return new

        return await self._write(body)

    async def claim_operation(
        self,
        operation_id: str,
        worker_id: str,
        *,
        now: float,
        from_states: Collection[str] | None = None,
        stale_after: float | None = None,
    ) -> int | None:
        def body(conn: sqlite3.Connection) -> int | None:
            current = _require_operation(conn, operation_id)
            new = rules.claim(current, worker_id, now, from_states, stale_after)
            if new is None:
                return None
            _update_operation(conn, new)
            return new.fencing_token

        return await self._write(body)

    # -- approvals -----------------------------------------------------------------------
    async def create_approval(self, record: ApprovalRecord) -> ApprovalRecord:
        record = rules.new_approval(record)

        def body(conn: sqlite3.Connection) -> ApprovalRecord:
            try:
                conn.execute(_AP_INSERT, approval_values(record))
            except sqlite3.IntegrityError as exc:
                raise _insert_error(exc, f"approval {record.approval_id!r}") from None
            return record

        return await self._write(body)

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        return await self._read(lambda conn: _get_approval(conn, approval_id))

    async def list_approvals(
        self,
        status: ApprovalStatus | None = None,
        *,
        operation_id: str | None = None,
        limit: int = 100,
    ) -> list[ApprovalRecord]:
        limit = rules.check_limit(limit)
        clauses: list[str] = []
        args: list[object] = []
        if status is not None:
            clauses.append("status = ?")
            args.append(status.value)
        if operation_id is not None:
            clauses.append("operation_id = ?")
            args.append(operation_id)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT {_AP_COLS} FROM approvals {where} ORDER BY created_at, approval_id LIMIT ?"
        rows = await self._read(lambda conn: conn.execute(sql, [*args, limit]).fetchall())
        return [approval_from_row(r) for r in rows]

    async def decide_approval(
        self, approval_id: str, approve: bool, approver: str, reason: str | None, *, now: float
    ) -> ApprovalRecord:
        def body(conn: sqlite3.Connection) -> tuple[ApprovalRecord, ApprovalError | None]:
            current = _require_approval(conn, approval_id)
            new, error = rules.decide(current, approve, approver, reason, now)
            conn.execute(_AP_UPDATE, (*approval_values(new)[1:], approval_id))
            return new, error

        return rules.settle(await self._write(body))

    async def consume_approval(self, approval_id: str, *, now: float) -> ApprovalRecord:
        def body(conn: sqlite3.Connection) -> tuple[ApprovalRecord, ApprovalError | None]:
            current = _require_approval(conn, approval_id)
            new, error = rules.consume(current, now)
            conn.execute(_AP_UPDATE, (*approval_values(new)[1:], approval_id))
            return new, error

        return rules.settle(await self._write(body))

    # -- idempotency ledger --------------------------------------------------------------
    async def ledger_get(self, tenant: str, key: str) -> LedgerRecord | None:
        return await self._read(lambda conn: _get_ledger(conn, tenant, key))

    async def ledger_begin(
        self,
        tenant: str,
        key: str,
        request_digest: str,
        owner: str,
        *,
        now: float,
        lease: float = LEDGER_IN_FLIGHT_LEASE,
    ) -> LedgerDecision:
        # A decision that writes nothing (replay, conflict, live in-flight) is exact as of
        # the moment of the read: answer it without taking the write lock.
        seen = await self.ledger_get(tenant, key)
        if seen is not None:
            decision, write = rules.begin(seen, request_digest, owner, now, lease)
            if write is None:
                return decision

        def body(conn: sqlite3.Connection) -> LedgerDecision:
            current = _get_ledger(conn, tenant, key)
            if current is None:
                fresh = rules.fresh_ledger(tenant, key, request_digest, owner, now)
                conn.execute(_LG_INSERT, ledger_values(fresh))
                return Began(record=fresh)
            decision, write = rules.begin(current, request_digest, owner, now, lease)
            if write is not None:
                _update_ledger(conn, write)
            return decision

        return await self._write(body)

    async def _ledger_change(
        self, tenant: str, key: str, change: Callable[[LedgerRecord], LedgerRecord]
    ) -> LedgerRecord:
        def body(conn: sqlite3.Connection) -> LedgerRecord:
            current = _get_ledger(conn, tenant, key)
            if current is None:
                raise RecordNotFound(f"no ledger row for ({tenant!r}, {key!r})")
            new = change(current)
            _update_ledger(conn, new)
            return new

        return await self._write(body)

    async def prune_ledger(self, *, now: float, older_than: float = LEDGER_RETENTION) -> int:
        cutoff = now - older_than
        # Batches keep each write transaction (and the lock other processes wait on) short.
        sql = (
            "DELETE FROM ledger WHERE (tenant, key) IN (SELECT tenant, key FROM ledger "
            "WHERE state IN ('succeeded', 'failed') AND updated_at < ? LIMIT ?)"
        )
        total = 0
        while True:
            n = await self._write(lambda conn: conn.execute(sql, (cutoff, _PRUNE_BATCH)).rowcount)
            total += n
            if n < _PRUNE_BATCH:
                return total


# -- row helpers (run inside a worker thread) ------------------------------------------------
def _get_operation(conn: sqlite3.Connection, operation_id: str) -> OperationRecord | None:
    row = conn.execute(
        f"SELECT {_OP_COLS} FROM operations WHERE operation_id = ?", (operation_id,)
    ).fetchone()
    return None if row is None else operation_from_row(row)


def _require_operation(conn: sqlite3.Connection, operation_id: str) -> OperationRecord:
    current = _get_operation(conn, operation_id)
    if current is None:
        raise RecordNotFound(f"no operation {operation_id!r}")
    return current


def _update_operation(conn: sqlite3.Connection, new: OperationRecord) -> None:
    conn.execute(_OP_UPDATE, (*operation_values(new)[1:], new.operation_id))


def _get_approval(conn: sqlite3.Connection, approval_id: str) -> ApprovalRecord | None:
    row = conn.execute(
        f"SELECT {_AP_COLS} FROM approvals WHERE approval_id = ?", (approval_id,)
    ).fetchone()
    return None if row is None else approval_from_row(row)


def _require_approval(conn: sqlite3.Connection, approval_id: str) -> ApprovalRecord:
    current = _get_approval(conn, approval_id)
    if current is None:
        raise RecordNotFound(f"no approval {approval_id!r}")
    return current


def _get_ledger(conn: sqlite3.Connection, tenant: str, key: str) -> LedgerRecord | None:
    row = conn.execute(
        f"SELECT {_LG_COLS} FROM ledger WHERE tenant = ? AND key = ?", (tenant, key)
    ).fetchone()
    return None if row is None else ledger_from_row(row)


def _update_ledger(conn: sqlite3.Connection, new: LedgerRecord) -> None:
    conn.execute(_LG_UPDATE, (*ledger_values(new)[2:], new.tenant, new.key))


def _insert_error(exc: sqlite3.IntegrityError, what: str) -> StoreError:
    """A duplicate key is ``DuplicateRecord``; any other constraint (NOT NULL: a NaN time,
    which SQLite stores as NULL; a CHECK) names itself instead of claiming a duplicate."""
    if getattr(exc, "sqlite_errorname", "") in (
        "SQLITE_CONSTRAINT_PRIMARYKEY",
        "SQLITE_CONSTRAINT_UNIQUE",
    ):
        return DuplicateRecord(f"{what} exists")
    return StoreError(f"{what}: a value the store refuses ({exc})")
