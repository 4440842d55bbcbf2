"""Rows edited by hand (the sqlite3 shell) or written by another tool: a value of the
wrong type is a ``StoreError`` naming its column, in the library and the CLI (one line on
stderr, no traceback), never a bare ``TypeError``/``ValueError``; JSON written as TEXT
reads as its bytes; a snapshot that does not decode is a ``StoreError`` too."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from callgate.engine.core.errors import StoreError
from callgate.engine.runtime.operation import decode_snapshot
from callgate.engine.store.base import (
    ApprovalRecord,
    LedgerState,
    OperationRecord,
)
from callgate.engine.store.errors import DuplicateRecord
from callgate.engine.store.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio
NOW = 1_800_000_000.0
SNAPSHOT = b'{"operation_id":"op1"}'


async def _store_with_rows(db: Path) -> None:
    async with SQLiteStore(db) as store:
        await store.create_operation(
            OperationRecord(
                operation_id="op1",
                tenant="t",
                subject="s",
                state="waiting_approval",
                snapshot=SNAPSHOT,
                created_at=NOW,
                updated_at=NOW,
            )
        )
        await store.create_approval(
            ApprovalRecord(
                approval_id="apr1",
                operation_id="op1",
                call_id="c1",
                tool="refund",
                schema_version="1",
                args_digest="d" * 64,
                policy_revision="1",
                tenant="t",
                subject="s",
                created_at=NOW,
                expires_at=NOW + 3600,
            )
        )
        await store.ledger_begin("t", "k1", "r" * 64, "w1", now=NOW)
        await store.ledger_finish("t", "k1", "w1", LedgerState.SUCCEEDED, b'{"ok":1}', now=NOW)


def _edit(db: Path, sql: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(sql)


@pytest.mark.parametrize(
    ("sql", "column"),
    [
        ("UPDATE operations SET version = 'x'", "operations.version"),
        ("UPDATE operations SET fencing_token = 1.5", "operations.fencing_token"),
        ("UPDATE operations SET updated_at = 'yesterday'", "operations.updated_at"),
        ("UPDATE operations SET snapshot = 7", "operations.snapshot"),
    ],
)
async def test_a_bad_operation_column_is_a_store_error_naming_it(
    tmp_path: Path, sql: str, column: str
) -> None:
    db = tmp_path / "db"
    await _store_with_rows(db)
    _edit(db, sql)
    async with SQLiteStore(db) as store:
        with pytest.raises(StoreError, match=re.escape(column)):
            await store.get_operation("op1")
        with pytest.raises(StoreError, match=re.escape(column)):
            await store.list_operations()
    proc = await anyio.to_thread.run_sync(lambda: _cli_list(db))
    assert proc.returncode != 0
    assert column in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def _cli_list(db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "callgate.engine.cli",
            "operations",
            "list",
            "--store",
            f"sqlite:///{db}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )


async def test_a_bad_approval_column_is_a_store_error_naming_it(tmp_path: Path) -> None:
    db = tmp_path / "db"
    await _store_with_rows(db)
    _edit(db, "UPDATE approvals SET expires_at = 'tomorrow'")
    async with SQLiteStore(db) as store:
        with pytest.raises(StoreError, match=re.escape("approvals.expires_at")):
            await store.get_approval("apr1")


async def test_json_columns_written_as_text_read_as_their_bytes(tmp_path: Path) -> None:
    db = tmp_path / "db"
    await _store_with_rows(db)
    _edit(db, "UPDATE operations SET snapshot = CAST(snapshot AS TEXT)")
    _edit(db, "UPDATE ledger SET result = CAST(result AS TEXT)")
    async with SQLiteStore(db) as store:
        record = await store.get_operation("op1")
        assert record is not None and record.snapshot == SNAPSHOT
        replay = await store.ledger_begin("t", "k1", "r" * 64, "w2", now=NOW + 1)
    assert getattr(replay, "result", None) == b'{"ok":1}'


async def test_non_ascii_json_written_as_text_reads_as_its_utf8_bytes(tmp_path: Path) -> None:
    # The sqlite3 shell stores a typed-in JSON value as TEXT: its bytes are the UTF-8 of
    # that text (the encoding every JSON reader expects), also past ASCII.
    db = tmp_path / "db"
    await _store_with_rows(db)
    _edit(db, """UPDATE ledger SET result = '{"city":"Zürich €"}'""")
    async with SQLiteStore(db) as store:
        replay = await store.ledger_begin("t", "k1", "r" * 64, "w2", now=NOW + 1)
    assert getattr(replay, "result", None) == '{"city":"Zürich €"}'.encode()


def test_a_snapshot_that_does_not_decode_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="op1"):
        decode_snapshot(b'{"operation_id": 5}', "op1")
    # A value a stored type's own checks refuse (Budgets.__post_init__: ConfigError).
    refused = (
        b'{"operation_id":"op1","tenant":"t","subject":"s","roles":[],"provider":"p",'
        b'"model":"m","state":"waiting_approval","messages":[],'
        b'"settings":{"budgets":{"max_cost":"NaN"}}}'
    )
    with pytest.raises(StoreError, match="refused value"):
        decode_snapshot(refused, "op1")
    with pytest.raises(StoreError, match="op1"):
        decode_snapshot(b"not json", "op1")


async def test_a_constraint_other_than_the_key_is_not_reported_as_a_duplicate(
    tmp_path: Path,
) -> None:
    async with SQLiteStore(tmp_path / "db") as store:
        nan_time = OperationRecord(
            operation_id="op2",
            tenant="t",
            subject="s",
            state="model_requested",
            snapshot=SNAPSHOT,
            created_at=float("nan"),  # SQLite stores NaN as NULL: NOT NULL fails
            updated_at=NOW,
        )
        with pytest.raises(StoreError, match="NOT NULL") as caught:
            await store.create_operation(nan_time)
        assert not isinstance(caught.value, DuplicateRecord)
        assert await store.get_operation("op2") is None
