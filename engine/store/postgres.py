"""``PostgresStore``: the store for many workers on many machines (asyncpg, pooled).

Owns: the connection pool, transactions and row locking on PostgreSQL. It never decides a
state transition itself (``rules.py`` does) and never reads a clock.

Locking design (READ COMMITTED, PostgreSQL's default):
- Every read-modify-write locks its row first (``SELECT ... FOR UPDATE``), applies the
  pure rule, writes, commits: concurrent deciders/consumers/finishers queue on the row
  lock and the second one sees the first one's result.
- ``claim_operation`` uses ``FOR UPDATE SKIP LOCKED``: a claimer that finds the row
  locked by another transaction gives up at once (returns None) instead of queueing, so
  16 workers resuming the same operation cost one winner and 15 instant "no"s.
- ``ledger_begin`` inserts with ``INSERT ... ON CONFLICT DO NOTHING``: of concurrent
  first attempts exactly one insert wins (the others wait on the unique index, then see
  the conflict) — correct under any isolation level, no upsert race, no deadlock.
  Losers lock the existing row and apply ``rules.begin``.
- Serialization failures and deadlocks (possible only if a caller raises the isolation
  level or under unusual plans) are retried a bounded number of times.
- ``schema``: an optional PostgreSQL schema (created on start) so several deployments or
  test runs share one database; it is put on every pooled connection's ``search_path``.
- ``migrate=False`` (read-only commands): start() creates no schema or table and refuses
  a database without callgate's current schema (``SchemaMissing``).
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

import anyio

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
from .errors import ApprovalError, DuplicateRecord, RecordNotFound, StoreUnavailable
from .migrations import apply_postgres, check_postgres
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

__all__ = ["PostgresStore"]

_T = TypeVar("_T")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_PRUNE_BATCH = 1000

_OP_COLS = ", ".join(OPERATION_COLUMNS)
_AP_COLS = ", ".join(APPROVAL_COLUMNS)
_LG_COLS = ", ".join(LEDGER_COLUMNS)


def _params(n: int, start: int = 1) -> str:
    return ", ".join(f"${i}" for i in range(start, start + n))


def _assign(columns: tuple[str, ...]) -> str:
    return ", ".join(f"{c} = ${i}" for i, c in enumerate(columns, start=1))


_OP_INSERT = f"INSERT INTO operations ({_OP_COLS}) VALUES ({_params(len(OPERATION_COLUMNS))})"
_OP_UPDATE = (
    f"UPDATE operations SET {_assign(OPERATION_COLUMNS[1:])} "
    f"WHERE operation_id = ${len(OPERATION_COLUMNS)}"
)
_OP_GET = f"SELECT {_OP_COLS} FROM operations WHERE operation_id = $1"
_AP_INSERT = f"INSERT INTO approvals ({_AP_COLS}) VALUES ({_params(len(APPROVAL_COLUMNS))})"
_AP_UPDATE = (
    f"UPDATE approvals SET {_assign(APPROVAL_COLUMNS[1:])} "
    f"WHERE approval_id = ${len(APPROVAL_COLUMNS)}"
)
_AP_GET = f"SELECT {_AP_COLS} FROM approvals WHERE approval_id = $1"
_LG_INSERT = (
    f"INSERT INTO ledger ({_LG_COLS}) VALUES ({_params(len(LEDGER_COLUMNS))}) "
    "ON CONFLICT (tenant, key) DO NOTHING RETURNING tenant"
)
_LG_UPDATE = (
    f"UPDATE ledger SET {_assign(LEDGER_COLUMNS[2:])} "
    f"WHERE tenant = ${len(LEDGER_COLUMNS) - 1} AND key = ${len(LEDGER_COLUMNS)}"
)
_LG_GET = f"SELECT {_LG_COLS} FROM ledger WHERE tenant = $1 AND key = $2"


def _driver() -> Any:
    """asyncpg, imported on first use: it is the optional ``postgres`` extra, and a
    SQLite-only install must be able to import this package."""
    import asyncpg  # type: ignore[import-untyped]  # noqa: PLC0415  # no stubs upstream

    return asyncpg


class PostgresStore(rules.LedgerMoves, Store):
    """A store in a PostgreSQL database (``postgresql://user@host:port/db``)."""

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        min_size: int = 1,
        max_size: int = 10,
        command_timeout: float = 30.0,
        max_attempts: int = 5,
        migrate: bool = True,
    ) -> None:
        if schema is not None and not _SCHEMA_NAME.fullmatch(schema):
            raise ConfigError(f"schema must match {_SCHEMA_NAME.pattern}, got {schema!r}")
        self.url = url
        self.schema = schema
        self._min_size = min_size
        self._max_size = max_size
        self._command_timeout = command_timeout
        self._max_attempts = max_attempts
        self._migrate = migrate
        self._pool: Any = None
        self._closed = False  # after aclose(): refuse with "closed", as the other stores

    # -- plumbing ------------------------------------------------------------------------
    async def start(self) -> None:
        if self._pool is not None:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            # asyncpg runs on asyncio only: on trio it failed deep inside its pool with a
            # bare "no running event loop" RuntimeError.
            raise ConfigError(
                "the PostgreSQL store needs anyio's asyncio backend (asyncpg runs on "
                "asyncio and uvloop only); on trio use the SQLite store"
            ) from None
        asyncpg = _driver()
        settings = {"search_path": self.schema} if self.schema is not None else None
        try:
            pool = await asyncpg.create_pool(
                self.url,
                min_size=self._min_size,
                max_size=self._max_size,
                command_timeout=self._command_timeout,
                server_settings=settings,
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc
        except ValueError as exc:  # asyncpg's DSN parser (a bad port, an unknown option)
            raise ConfigError(f"malformed PostgreSQL URL: {exc}") from None
        try:
            async with pool.acquire() as conn:
                if self._migrate:
                    await apply_postgres(conn, self.schema)
                else:
                    await check_postgres(conn)  # read-only: creates no schema or table
        except BaseException:
            await pool.close()
            raise
        self._pool = pool

    async def aclose(self) -> None:
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def _run(self, fn: Callable[[Any], Awaitable[_T]], *, transaction: bool) -> _T:
        """Run ``fn(conn)`` on a pooled connection (in a transaction if asked), retrying
        serialization failures/deadlocks; map driver errors to StoreUnavailable."""
        if self._pool is None:
            if self._closed:
                raise StoreError("store is closed")
            raise StoreError("store not started: use `async with store:` or `await start()`")
        asyncpg = _driver()
        retryable = (asyncpg.SerializationError, asyncpg.DeadlockDetectedError)
        for attempt in range(self._max_attempts):
            try:
                async with self._pool.acquire() as conn:
                    if not transaction:
                        return await fn(conn)
                    async with conn.transaction():
                        return await fn(conn)
            except retryable:
                await anyio.sleep(random.uniform(0, min(0.5, 0.005 * 2**attempt)))
            except asyncpg.DataError as exc:
                # A value PostgreSQL cannot hold (SQLSTATE class 22): no retry helps, and
                # "unavailable" would invite one.
                raise StoreError(f"PostgreSQL refused a value: {exc}") from exc
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                raise StoreUnavailable(f"PostgreSQL error: {exc}") from exc
        raise StoreUnavailable(f"PostgreSQL kept aborting after {self._max_attempts} attempts")

    async def _tx(self, fn: Callable[[Any], Awaitable[_T]]) -> _T:
        return await self._run(fn, transaction=True)

    async def _fetch(self, fn: Callable[[Any], Awaitable[_T]]) -> _T:
        return await self._run(fn, transaction=False)

    async def _insert(self, sql: str, values: tuple[Any, ...], what: str) -> None:
        asyncpg = _driver()

        async def body(conn: Any) -> None:
            try:
                await conn.execute(sql, *values)
            except asyncpg.UniqueViolationError:
                raise DuplicateRecord(f"{what} exists") from None

        await self._fetch(body)

    # -- operations ----------------------------------------------------------------------
    async def create_operation(self, record: OperationRecord) -> OperationRecord:
        row = rules.new_operation(record)
        await self._insert(_OP_INSERT, operation_values(row), f"operation {row.operation_id!r}")
        return row

    async def get_operation(self, operation_id: str) -> OperationRecord | None:
        row = await self._fetch(lambda conn: conn.fetchrow(_OP_GET, operation_id))
        return None if row is None else operation_from_row(row)

    async def list_operations(
        self, state: str | None = None, limit: int = 100
    ) -> list[OperationRecord]:
        limit = rules.check_limit(limit)
        if state is None:
            sql = f"SELECT {_OP_COLS} FROM operations ORDER BY created_at, operation_id LIMIT $1"
            args: tuple[Any, ...] = (limit,)
        else:
            sql = (
                f"SELECT {_OP_COLS} FROM operations WHERE state = $2 "
                "ORDER BY created_at, operation_id LIMIT $1"
            )
            args = (limit, state)
        rows = await self._fetch(lambda conn: conn.fetch(sql, *args))
        return [operation_from_row(r) for r in rows]

    async def save_operation(
        self, record: OperationRecord, expected_version: int, fencing_token: int
    ) -> OperationRecord:
        async def body(conn: Any) -> OperationRecord:
            row = await conn.fetchrow(_OP_GET + " FOR UPDATE", record.operation_id)
            if row is None:
                raise RecordNotFound(f"no operation {record.operation_id!r}")
            new = rules.save(operation_from_row(row), record, expected_version, fencing_token)
            await conn.execute(_OP_UPDATE, *operation_values(new)[1:], new.operation_id)
            return new

        return await self._tx(body)

    async def claim_operation(
        self,
        operation_id: str,
        worker_id: str,
        *,
        now: float,
        from_states: Collection[str] | None = None,
        stale_after: float | None = None,
    ) -> int | None:
        async def body(conn: Any) -> int | None:
            row = await conn.fetchrow(_OP_GET + " FOR UPDATE SKIP LOCKED", operation_id)
            if row is None:
                # Locked by another transaction right now (not ours to take), or missing.
                exists = await conn.fetchval(
                    "SELECT 1 FROM operations WHERE operation_id = $1", operation_id
                )
                if exists is None:
                    raise RecordNotFound(f"no operation {operation_id!r}")
                return None
            new = rules.claim(operation_from_row(row), worker_id, now, from_states, stale_after)
            if new is None:
                return None
            await conn.execute(_OP_UPDATE, *operation_values(new)[1:], operation_id)
            return new.fencing_token

        return await self._tx(body)

    # -- approvals -----------------------------------------------------------------------
    async def create_approval(self, record: ApprovalRecord) -> ApprovalRecord:
        record = rules.new_approval(record)
        await self._insert(_AP_INSERT, approval_values(record), f"approval {record.approval_id!r}")
        return record

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        row = await self._fetch(lambda conn: conn.fetchrow(_AP_GET, approval_id))
        return None if row is None else approval_from_row(row)

    async def list_approvals(
        self,
        status: ApprovalStatus | None = None,
        *,
        operation_id: str | None = None,
        limit: int = 100,
    ) -> list[ApprovalRecord]:
        clauses: list[str] = []
        args: list[Any] = [rules.check_limit(limit)]
        if status is not None:
            args.append(status.value)
            clauses.append(f"status = ${len(args)}")
        if operation_id is not None:
            args.append(operation_id)
            clauses.append(f"operation_id = ${len(args)}")
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT {_AP_COLS} FROM approvals {where} ORDER BY created_at, approval_id LIMIT $1"
        rows = await self._fetch(lambda conn: conn.fetch(sql, *args))
        return [approval_from_row(r) for r in rows]

    async def _approval_change(
        self,
        approval_id: str,
        change: Callable[[ApprovalRecord], tuple[ApprovalRecord, ApprovalError | None]],
    ) -> ApprovalRecord:
        async def body(conn: Any) -> tuple[ApprovalRecord, ApprovalError | None]:
            row = await conn.fetchrow(_AP_GET + " FOR UPDATE", approval_id)
            if row is None:
                raise RecordNotFound(f"no approval {approval_id!r}")
            new, error = change(approval_from_row(row))
            await conn.execute(_AP_UPDATE, *approval_values(new)[1:], approval_id)
            return new, error

        # The row (e.g. marked expired) is committed before its error is raised.
        return rules.settle(await self._tx(body))

    async def decide_approval(
        self, approval_id: str, approve: bool, approver: str, reason: str | None, *, now: float
    ) -> ApprovalRecord:
        return await self._approval_change(
            approval_id, lambda cur: rules.decide(cur, approve, approver, reason, now)
        )

    async def consume_approval(self, approval_id: str, *, now: float) -> ApprovalRecord:
        return await self._approval_change(approval_id, lambda cur: rules.consume(cur, now))

    # -- idempotency ledger --------------------------------------------------------------
    async def ledger_get(self, tenant: str, key: str) -> LedgerRecord | None:
        row = await self._fetch(lambda conn: conn.fetchrow(_LG_GET, tenant, key))
        return None if row is None else ledger_from_row(row)

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
        # A decision that writes nothing is exact as of the read: no transaction needed.
        seen = await self.ledger_get(tenant, key)
        if seen is not None:
            decision, write = rules.begin(seen, request_digest, owner, now, lease)
            if write is None:
                return decision
        fresh = rules.fresh_ledger(tenant, key, request_digest, owner, now)

        async def body(conn: Any) -> LedgerDecision:
            # Loop: a row can be pruned between our conflicting insert and our lock.
            for _ in range(3):
                if await conn.fetchval(_LG_INSERT, *ledger_values(fresh)) is not None:
                    return Began(record=fresh)
                row = await conn.fetchrow(_LG_GET + " FOR UPDATE", tenant, key)
                if row is None:
                    continue
                decision, write = rules.begin(
                    ledger_from_row(row), request_digest, owner, now, lease
                )
                if write is not None:
                    await conn.execute(_LG_UPDATE, *ledger_values(write)[2:], tenant, key)
                return decision
            raise StoreUnavailable(f"ledger ({tenant!r}, {key!r}) kept vanishing")

        return await self._tx(body)

    async def _ledger_change(
        self, tenant: str, key: str, change: Callable[[LedgerRecord], LedgerRecord]
    ) -> LedgerRecord:
        async def body(conn: Any) -> LedgerRecord:
            row = await conn.fetchrow(_LG_GET + " FOR UPDATE", tenant, key)
            if row is None:
                raise RecordNotFound(f"no ledger row for ({tenant!r}, {key!r})")
            new = change(ledger_from_row(row))
            await conn.execute(_LG_UPDATE, *ledger_values(new)[2:], tenant, key)
            return new

        return await self._tx(body)

    async def prune_ledger(self, *, now: float, older_than: float = LEDGER_RETENTION) -> int:
        cutoff = now - older_than
        # Finished rows never change again, so deleting them needs no coordination; batches
        # keep each statement's locks and WAL volume small.
        sql = (
            "WITH doomed AS (SELECT tenant, key FROM ledger "
            "WHERE state IN ('succeeded', 'failed') AND updated_at < $1 LIMIT $2) "
            "DELETE FROM ledger l USING doomed d WHERE l.tenant = d.tenant AND l.key = d.key "
            "AND l.state IN ('succeeded', 'failed')"
        )
        total = 0
        while True:
            status = await self._fetch(lambda conn: conn.execute(sql, cutoff, _PRUNE_BATCH))
            n = int(str(status).rsplit(" ", 1)[-1])
            total += n
            if n < _PRUNE_BATCH:
                return total
