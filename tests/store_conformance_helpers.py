"""Shared fixtures and records for the store conformance suite
(tests/test_store_conformance.py, tests/test_store_conformance_ledger.py): every test runs
on the memory, SQLite and PostgreSQL backends (``all_backends``) or on the durable ones
only (``durable``), each PostgreSQL test in its own schema."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from callgate.engine.store import MemoryStore, Store, open_store

from .store_helpers import drop_schema, require_postgres, with_schema

NOW = 1_700_000_000.0
T = "tenant-a"


BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]
DURABLE = BACKENDS[1:]


@pytest.fixture(name="store_url")
async def store_url_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    kind = request.param
    if kind == "memory":
        yield "memory:"
    elif kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    else:
        url = require_postgres()
        schema = f"t_{uuid.uuid4().hex[:16]}"
        yield with_schema(url, schema)
        await drop_schema(schema)


def make_store(url: str) -> Store:
    return MemoryStore() if url == "memory:" else open_store(url)


@pytest.fixture(name="store")
async def store_fixture(store_url: str) -> AsyncIterator[Store]:
    async with make_store(store_url) as s:
        yield s


def durable(fn: Callable[..., Any]) -> Callable[..., Any]:
    return pytest.mark.parametrize("store_url", DURABLE, indirect=True)(fn)


# Tests whose cost is child processes run on one event loop only: the children do not
# care which loop the parent uses, and process start-up dominates their run time.
one_loop = pytest.mark.parametrize(
    "anyio_backend", [("asyncio", {"use_uvloop": False})], ids=["asyncio"]
)


all_backends = pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
