"""Versioned schema migrations for each SQL dialect, and the two runners that apply them.

A migration is ``(version, description, statements)``; versions start at 1 and only ever
grow, and a released migration is never edited (add a new one instead). The applied
versions are rows of ``schema_version``. ``start()`` of a backend runs its runner:

- SQLite: inside ``BEGIN IMMEDIATE`` — the database's single write lock — so a second
  process starting at the same moment waits, then finds the work done.
- PostgreSQL: inside one transaction holding ``pg_advisory_xact_lock`` on a key derived
  from the schema name, so concurrent starters serialize (plain ``CREATE ... IF NOT
  EXISTS`` alone races on the catalog's unique indexes).

Both are idempotent. ``check_sqlite``/``check_postgres`` are their read-only twins, for a
store started with ``migrate=False`` (the CLI's listings): they change nothing, and refuse
a database that callgate has not migrated to this version (``SchemaMissing``) — a listing
pointed at the wrong file or a mistyped ``?schema=`` must not turn it into a store.

A database whose newest version is above ``LATEST_VERSION`` was
migrated by a newer callgate: refuse (``SchemaTooNew``) rather than write old-shaped rows.
``schema_version.applied_at`` is the one timestamp the store takes from a clock — the
database server's — because no caller is there to pass one in.
"""

from __future__ import annotations

import sqlite3
from typing import Any, ClassVar, Literal

import msgspec

from callgate.engine.core.errors import StoreError

from .errors import SchemaTooNew

__all__ = [
    "LATEST_VERSION",
    "MIGRATIONS",
    "Dialect",
    "Migration",
    "SchemaMissing",
    "apply_postgres",
    "apply_sqlite",
    "check_postgres",
    "check_sqlite",
]


class SchemaMissing(StoreError):
    """A store started without migrating (``migrate=False``) found no callgate schema, or
    an older one: it is not (yet) a callgate store of this version."""

    code: ClassVar[str] = "schema_missing"


Dialect = Literal["sqlite", "postgres"]


class Migration(msgspec.Struct, frozen=True):
    version: int
    description: str
    statements: tuple[str, ...]


_APPROVAL_STATUSES = "('pending', 'approved', 'denied', 'consumed', 'expired')"
_LEDGER_STATES = "('in_flight', 'succeeded', 'failed', 'unknown')"


def _v1(text: str, blob: str, real: str, big: str, ledger_suffix: str) -> tuple[str, ...]:
    return (
        f"""CREATE TABLE operations (
            operation_id {text} PRIMARY KEY NOT NULL,
            tenant {text} NOT NULL,
            subject {text} NOT NULL,
            state {text} NOT NULL,
            version {big} NOT NULL,
            owner {text},
            fencing_token {big} NOT NULL,
            snapshot {blob} NOT NULL,
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL
        )""",
        "CREATE INDEX operations_by_created ON operations (created_at, operation_id)",
        "CREATE INDEX operations_by_state ON operations (state, created_at, operation_id)",
        f"""CREATE TABLE approvals (
            approval_id {text} PRIMARY KEY NOT NULL,
            operation_id {text} NOT NULL,
            call_id {text} NOT NULL,
            tool {text} NOT NULL,
            schema_version {text} NOT NULL,
            args_digest {text} NOT NULL,
            policy_revision {text} NOT NULL,
            tenant {text} NOT NULL,
            subject {text} NOT NULL,
            status {text} NOT NULL CHECK (status IN {_APPROVAL_STATUSES}),
            approver {text},
            reason {text},
            created_at {real} NOT NULL,
            expires_at {real} NOT NULL,
            decided_at {real},
            consumed_at {real}
        )""",
        "CREATE INDEX approvals_by_created ON approvals (created_at, approval_id)",
        "CREATE INDEX approvals_by_status ON approvals (status, created_at, approval_id)",
        "CREATE INDEX approvals_by_operation ON approvals (operation_id, created_at)",
        f"""CREATE TABLE ledger (
            tenant {text} NOT NULL,
            key {text} NOT NULL,
            request_digest {text} NOT NULL,
            state {text} NOT NULL CHECK (state IN {_LEDGER_STATES}),
            result {blob},
            owner {text},
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL,
            PRIMARY KEY (tenant, key)
        ){ledger_suffix}""",
        # Pruning scans finished rows by age; the state prefix keeps unknown rows out.
        "CREATE INDEX ledger_by_state_age ON ledger (state, updated_at)",
    )


MIGRATIONS: dict[Dialect, tuple[Migration, ...]] = {
    "sqlite": (
        Migration(
            1,
            "operations, approvals, idempotency ledger",
            _v1("TEXT", "BLOB", "REAL", "INTEGER", " WITHOUT ROWID"),
        ),
    ),
    "postgres": (
        Migration(
            1,
            "operations, approvals, idempotency ledger",
            _v1("text", "bytea", "double precision", "bigint", ""),
        ),
    ),
}

LATEST_VERSION = max(m.version for ms in MIGRATIONS.values() for m in ms)

_SQLITE_VERSION_TABLE = """CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER PRIMARY KEY NOT NULL,
    description TEXT NOT NULL,
    applied_at REAL NOT NULL
)"""
_PG_VERSION_TABLE = """CREATE TABLE IF NOT EXISTS schema_version (
    version integer PRIMARY KEY NOT NULL,
    description text NOT NULL,
    applied_at double precision NOT NULL
)"""


def _check_not_newer(current: int) -> None:
    if current > LATEST_VERSION:
        raise SchemaTooNew(
            f"database schema is at version {current}; this callgate knows up to "
            f"{LATEST_VERSION}: upgrade callgate"
        )


def _check_current(current: int | None) -> int:
    if current is None:
        raise SchemaMissing("no callgate schema in this database (no schema_version table)")
    _check_not_newer(current)
    if current < LATEST_VERSION:
        raise SchemaMissing(
            f"the callgate schema is at version {current}, this callgate needs "
            f"{LATEST_VERSION}: start a store that migrates (e.g. run the engine) first"
        )
    return current


_SQLITE_HAS_VERSIONS = (
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
)
_CURRENT_VERSION = "SELECT coalesce(max(version), 0) FROM schema_version"


def check_sqlite(conn: sqlite3.Connection) -> int:
    """The schema version, read without writing; ``SchemaMissing`` unless it is current."""
    if conn.execute(_SQLITE_HAS_VERSIONS).fetchone() is None:
        return _check_current(None)
    return _check_current(int(conn.execute(_CURRENT_VERSION).fetchone()[0]))


async def check_postgres(conn: Any) -> int:
    """``check_sqlite`` for PostgreSQL (the connection's ``search_path`` names the schema;
    a schema that does not exist simply has no ``schema_version``)."""
    if await conn.fetchval("SELECT to_regclass('schema_version')") is None:
        return _check_current(None)
    return _check_current(int(await conn.fetchval(_CURRENT_VERSION)))


def apply_sqlite(conn: sqlite3.Connection) -> int:
    """Apply pending migrations on an autocommit connection; return the schema version.
    SQLITE_BUSY propagates (as sqlite3.OperationalError) for the caller's busy-retry."""
    # Common case first, without the write lock: a process starting next to busy writers
    # must not queue behind them just to learn that there is nothing to do.
    has_table = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    if has_table is not None:
        current = int(
            conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
        )
        _check_not_newer(current)
        if current == LATEST_VERSION:
            return current
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(_SQLITE_VERSION_TABLE)
        current = int(
            conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
        )
        _check_not_newer(current)
        for migration in MIGRATIONS["sqlite"]:
            if migration.version <= current:
                continue
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_version VALUES "
                "(?, ?, (julianday('now') - 2440587.5) * 86400.0)",
                (migration.version, migration.description),
            )
            current = migration.version
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return current


async def apply_postgres(conn: Any, schema: str | None) -> int:
    """Apply pending migrations through an asyncpg connection whose ``search_path`` already
    names ``schema`` (created here if missing); return the schema version."""
    # Common case first, without the advisory lock (see apply_sqlite).
    if await conn.fetchval("SELECT to_regclass('schema_version')") is not None:
        current = int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_version"))
        _check_not_newer(current)
        if current == LATEST_VERSION:
            return current
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext($1))", f"callgate.migrate:{schema or ''}"
        )
        if schema is not None:
            # ``schema`` was validated as a plain identifier by the caller.
            await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(_PG_VERSION_TABLE)
        current = int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_version"))
        _check_not_newer(current)
        for migration in MIGRATIONS["postgres"]:
            if migration.version <= current:
                continue
            for statement in migration.statements:
                await conn.execute(statement)
            await conn.execute(
                "INSERT INTO schema_version VALUES ($1, $2, extract(epoch FROM clock_timestamp()))",
                migration.version,
                migration.description,
            )
            current = migration.version
    return current
