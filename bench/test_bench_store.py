"""Questions: how many approval pause/resume round trips and idempotent side-effect
records per second does each store backend sustain?

1. Round trip = what one approval costs the store: create_operation (paused) +
   create_approval + decide_approval + claim_operation + consume_approval +
   save_operation (resumed, released): six writes.
2. Ledger check-and-record = ledger_begin (new key) + ledger_finish; and a replay
   (ledger_begin on a finished key: what a retry costs).

Each on the in-memory store (the floor: the rules without I/O), SQLite with the default
``synchronous=FULL`` (an fsync per commit: survives power loss) and with ``NORMAL``
(survives process crashes only), and PostgreSQL when CALLGATE_PG_URL is set (durable
defaults of the server it points at). ``flows`` = concurrent coroutines, each running
its own sequence. Figures are per second of wall time, printed and stored in
``extra_info``. Run: ``pytest bench/test_bench_store.py --benchmark-only -s``.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import asyncpg
import pytest

from bench.harness import timed_median
from callgate.engine.store import (
    ApprovalRecord,
    Began,
    LedgerState,
    MemoryStore,
    OperationRecord,
    Replay,
    Store,
    open_store,
)

PG_URL = os.environ.get("CALLGATE_PG_URL")
NOW = 1_700_000_000.0
ROUNDS = 5
BACKENDS = ["memory", "sqlite-full", "sqlite-normal"] + (["postgres"] if PG_URL else [])
_ids = itertools.count()


@pytest.fixture(params=BACKENDS)
def portal_store(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[anyio.from_thread.BlockingPortal, Store, str]]:
    kind: str = request.param
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "memory":
            store: Store = MemoryStore()
        elif kind.startswith("sqlite"):
            sync = "NORMAL" if kind.endswith("normal") else "FULL"
            store = open_store(f"sqlite:///{Path(tmp) / 'bench.db'}?synchronous={sync}")
        else:
            assert PG_URL is not None
            store = open_store(f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={schema}")
        with anyio.from_thread.start_blocking_portal() as portal:
            portal.call(store.start)
            try:
                yield portal, store, kind
            finally:
                portal.call(store.aclose)
                if kind == "postgres":
                    portal.call(_drop_schema, schema)


async def _drop_schema(schema: str) -> None:
    conn = await asyncpg.connect(PG_URL)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def round_trip(store: Store) -> None:
    n = next(_ids)
    op_id, ap_id = f"op-{n}", f"ap-{n}"
    await store.create_operation(
        OperationRecord(
            operation_id=op_id,
            tenant="t",
            subject="s",
            state="WAITING_APPROVAL",
            snapshot=b'{"messages":[{"role":"user","content":"refund order 42"}]}',
            created_at=NOW,
            updated_at=NOW,
        )
    )
    await store.create_approval(
        ApprovalRecord(
            approval_id=ap_id,
            operation_id=op_id,
            call_id="call-1",
            tool="refund",
            schema_version="1",
            args_digest="d" * 64,
            policy_revision="p1",
            tenant="t",
            subject="s",
            created_at=NOW,
            expires_at=NOW + 3600,
        )
    )
    await store.decide_approval(ap_id, True, "alice", None, now=NOW + 1)
    token = await store.claim_operation(
        op_id, "worker", now=NOW + 2, from_states={"WAITING_APPROVAL"}
    )
    assert token == 1
    await store.consume_approval(ap_id, now=NOW + 2)
    record = await store.get_operation(op_id)
    assert record is not None
    await store.save_operation(
        OperationRecord(
            operation_id=op_id,
            tenant="t",
            subject="s",
            state="COMPLETED",
            snapshot=b'{"done":true}',
            created_at=NOW,
            updated_at=NOW + 3,
        ),
        record.version,
        token,
    )


async def ledger_record(store: Store) -> None:
    key = f"k-{next(_ids)}"
    decision = await store.ledger_begin("t", key, "digest", "w", now=NOW)
    assert isinstance(decision, Began)
    await store.ledger_finish("t", key, "w", LedgerState.SUCCEEDED, b'{"ok":1}', now=NOW)


async def ledger_replay(store: Store) -> None:
    decision = await store.ledger_begin("t", "replayed", "digest", "w", now=NOW)
    assert isinstance(decision, Replay)


def batch(
    store: Store, step: Callable[[Store], Awaitable[None]], flows: int, per_flow: int
) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        async def flow() -> None:
            for _ in range(per_flow):
                await step(store)

        async with anyio.create_task_group() as tg:
            for _ in range(flows):
                tg.start_soon(flow)

    return run


def measure(
    benchmark: Any,
    portal_store: tuple[anyio.from_thread.BlockingPortal, Store, str],
    what: str,
    step: Callable[[Store], Awaitable[None]],
    *,
    flows: int,
    per_round: int,
) -> None:
    portal, store, kind = portal_store
    run = batch(store, step, flows, max(1, per_round // flows))
    portal.call(run)  # warm-up: connections, prepared statements, page cache
    benchmark.group = f"store {what}"
    benchmark.name = f"{what}[{kind}-flows{flows}]"
    benchmark.pedantic(portal.call, args=(run,), rounds=ROUNDS, iterations=1)
    median = timed_median(benchmark)
    if median is None:
        return
    per_s = flows * max(1, per_round // flows) / median
    benchmark.extra_info.update({f"{what}_per_s": round(per_s, 1), "flows": flows})
    print(f"\n{what} {kind} flows={flows}: {per_s:,.0f}/s")


def per_round(kind: str, fast: int, slow: int) -> int:
    return fast if kind == "memory" else slow


@pytest.mark.parametrize("flows", [1, 16])
def test_bench_approval_round_trip(benchmark: Any, portal_store: Any, flows: int) -> None:
    kind = portal_store[2]
    measure(
        benchmark,
        portal_store,
        "round_trips",
        round_trip,
        flows=flows,
        per_round=per_round(kind, 2000, 64),
    )


@pytest.mark.parametrize("flows", [1, 16])
def test_bench_ledger_begin_finish(benchmark: Any, portal_store: Any, flows: int) -> None:
    kind = portal_store[2]
    measure(
        benchmark,
        portal_store,
        "ledger_records",
        ledger_record,
        flows=flows,
        per_round=per_round(kind, 5000, 128),
    )


def test_bench_ledger_replay(benchmark: Any, portal_store: Any) -> None:
    portal, store, kind = portal_store

    async def seed() -> None:
        await store.ledger_begin("t", "replayed", "digest", "w", now=NOW)
        await store.ledger_finish("t", "replayed", "w", LedgerState.SUCCEEDED, b"{}", now=NOW)

    portal.call(seed)
    measure(
        benchmark,
        portal_store,
        "ledger_replays",
        ledger_replay,
        flows=1,
        per_round=per_round(kind, 5000, 256),
    )
