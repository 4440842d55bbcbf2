"""The store conformance suite, idempotency ledger: a key's handler runs once however often
it is replayed or raced (coroutines and processes), a changed request is a conflict, an
in-flight row past its lease is unknown (never free), writes need ownership, and pruning
keeps unknown and in-flight rows. Runs on SQLite, PostgreSQL (CALLGATE_PG_URL; skipped
only when unset and CI is not set) and the in-memory store; see tests/test_store_conformance.py.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from callgate.engine.core.errors import ConfigError
from callgate.engine.store import (
    LEDGER_IN_FLIGHT_LEASE,
    LEDGER_RETENTION,
    Began,
    Conflict,
    InFlight,
    LedgerOwnershipLost,
    LedgerState,
    RecordNotFound,
    Replay,
    Store,
    Unknown,
)

from .store_conformance_helpers import (
    NOW,
    T,
    all_backends,
    durable,
    one_loop,
    store_fixture,  # noqa: F401 - a pytest fixture
    store_url_fixture,  # noqa: F401 - a pytest fixture
)
from .store_helpers import race_processes

pytestmark = pytest.mark.anyio


# -- idempotency ledger ---------------------------------------------------------------------
@all_backends
async def test_same_key_replayed_1000_times_handler_runs_once(store: Store) -> None:
    runs = 0
    decisions: list[str] = []
    for i in range(1001):
        d = await store.ledger_begin(T, "refund-42", "digest-A", f"attempt-{i}", now=NOW + i)
        decisions.append(type(d).__name__)
        if isinstance(d, Began):
            runs += 1
            await store.ledger_finish(
                T, "refund-42", f"attempt-{i}", LedgerState.SUCCEEDED, b'{"id":7}', now=NOW
            )
        else:
            assert d == Replay(state=LedgerState.SUCCEEDED, result=b'{"id":7}')
    assert runs == 1 and decisions.count("Replay") == 1000


@all_backends
async def test_same_key_changed_request_is_a_conflict(store: Store) -> None:
    d = await store.ledger_begin(T, "k", "digest-A", "a1", now=NOW)
    assert isinstance(d, Began) and d.record.owner == "a1"
    assert await store.ledger_begin(T, "k", "digest-B", "a2", now=NOW) == Conflict(
        stored_digest="digest-A"
    )
    await store.ledger_finish(T, "k", "a1", LedgerState.FAILED, b"boom", now=NOW + 1)
    assert await store.ledger_begin(T, "k", "digest-B", "a3", now=NOW + 2) == Conflict(
        stored_digest="digest-A"
    )
    assert await store.ledger_begin(T, "k", "digest-A", "a3", now=NOW + 2) == Replay(
        state=LedgerState.FAILED, result=b"boom"
    )
    # Keys are per tenant.
    assert isinstance(await store.ledger_begin("tenant-b", "k", "digest-B", "b", now=NOW), Began)


@all_backends
async def test_64_coroutines_on_one_key_one_began(store: Store) -> None:
    decisions: list[Any] = []

    async def attempt(i: int) -> None:
        decisions.append(await store.ledger_begin(T, "k", "D", f"c{i}", now=NOW))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(64):
                tg.start_soon(attempt, i)
    began = [d for d in decisions if isinstance(d, Began)]
    assert len(began) == 1
    assert all(
        isinstance(d, InFlight) and d.owner == began[0].record.owner
        for d in decisions
        if d is not began[0]
    )


@one_loop
@durable
async def test_64_coroutines_and_8_processes_on_one_key_one_began(
    store: Store, store_url: str
) -> None:
    local: list[str] = []

    async def coroutines() -> None:
        async def attempt(i: int) -> None:
            d = await store.ledger_begin(T, "k", "D", f"c{i}", now=1000.0)
            local.append(type(d).__name__)

        async with anyio.create_task_group() as tg:
            for i in range(64):
                tg.start_soon(attempt, i)

    remote = await race_processes(
        [["begin", store_url, T, "k", "D", f"p{i}"] for i in range(8)], during=coroutines
    )
    names = local + [r["decision"] for r in remote]
    assert len(names) == 72
    assert names.count("Began") == 1 and names.count("InFlight") == 71


@all_backends
async def test_in_flight_past_lease_is_unknown_never_free(store: Store) -> None:
    await store.ledger_begin(T, "k", "D", "dead", now=NOW)
    almost = NOW + LEDGER_IN_FLIGHT_LEASE - 1
    assert isinstance(await store.ledger_begin(T, "k", "D", "r1", now=almost), InFlight)
    d = await store.ledger_begin(T, "k", "D", "r1", now=NOW + LEDGER_IN_FLIGHT_LEASE)
    assert isinstance(d, Unknown) and d.stale_in_flight and d.record.owner == "r1"
    # The reconciler holds it: another attempt is told "in flight", not handed the key.
    other = await store.ledger_begin(T, "k", "D", "r2", now=NOW + LEDGER_IN_FLIGHT_LEASE + 1)
    assert isinstance(other, InFlight) and other.state is LedgerState.UNKNOWN
    # The presumed-dead owner comes back: its record write is refused.
    with pytest.raises(LedgerOwnershipLost):
        await store.ledger_finish(T, "k", "dead", LedgerState.SUCCEEDED, b"x", now=NOW + 1)
    done = await store.ledger_resolve_unknown(
        T, "k", "r1", LedgerState.SUCCEEDED, b"found", now=NOW + LEDGER_IN_FLIGHT_LEASE + 2
    )
    assert (done.state, done.owner, done.result) == (LedgerState.SUCCEEDED, None, b"found")
    assert await store.ledger_begin(T, "k", "D", "r3", now=NOW) == Replay(
        state=LedgerState.SUCCEEDED, result=b"found"
    )


@all_backends
async def test_marked_unknown_goes_to_reconcile_immediately(store: Store) -> None:
    await store.ledger_begin(T, "k", "D", "a1", now=NOW)
    row = await store.ledger_mark_unknown(T, "k", "a1", now=NOW + 1)
    assert (row.state, row.owner) == (LedgerState.UNKNOWN, None)
    d = await store.ledger_begin(T, "k", "D", "a2", now=NOW + 2)
    assert isinstance(d, Unknown) and not d.stale_in_flight and d.record.owner == "a2"
    # While a2 reconciles, others are kept out; a2 itself may simply retry its reconcile.
    assert isinstance(await store.ledger_begin(T, "k", "D", "x", now=NOW + 2), InFlight)
    again = await store.ledger_begin(T, "k", "D", "a2", now=NOW + 2.5)
    assert isinstance(again, Unknown) and again.record.owner == "a2"
    # A reconciler that itself gives up releases the key again.
    await store.ledger_mark_unknown(T, "k", "a2", now=NOW + 3)
    d3 = await store.ledger_begin(T, "k", "D", "a3", now=NOW + 4)
    assert isinstance(d3, Unknown) and d3.record.owner == "a3"
    with pytest.raises(LedgerOwnershipLost):  # a2 no longer owns it
        await store.ledger_resolve_unknown(T, "k", "a2", LedgerState.FAILED, None, now=NOW + 5)
    await store.ledger_resolve_unknown(T, "k", "a3", LedgerState.FAILED, b"absent", now=NOW + 5)
    assert (await store.ledger_get(T, "k")) is not None


@all_backends
async def test_ledger_writes_require_ownership_and_terminal_states(store: Store) -> None:
    await store.ledger_begin(T, "k", "D", "a1", now=NOW)
    with pytest.raises(LedgerOwnershipLost):
        await store.ledger_finish(T, "k", "intruder", LedgerState.SUCCEEDED, None, now=NOW)
    with pytest.raises(ConfigError):
        await store.ledger_finish(T, "k", "a1", LedgerState.UNKNOWN, None, now=NOW)
    with pytest.raises(LedgerOwnershipLost):  # resolve is only for unknown rows
        await store.ledger_resolve_unknown(T, "k", "a1", LedgerState.SUCCEEDED, None, now=NOW)
    await store.ledger_finish(T, "k", "a1", LedgerState.SUCCEEDED, None, now=NOW)
    with pytest.raises(LedgerOwnershipLost):  # finished is final
        await store.ledger_finish(T, "k", "a1", LedgerState.FAILED, None, now=NOW)
    with pytest.raises(LedgerOwnershipLost):
        await store.ledger_mark_unknown(T, "k", "a1", now=NOW)
    with pytest.raises(RecordNotFound):
        await store.ledger_finish(T, "nope", "a1", LedgerState.SUCCEEDED, None, now=NOW)


@all_backends
async def test_the_same_key_of_two_tenants_is_two_separate_rows(store: Store) -> None:
    # An idempotency key is scoped to its tenant: one tenant's begin must not meet the
    # other's row, and finishing one row must not overwrite the other tenant's row of the
    # same key.
    other = "tenant-b"
    assert isinstance(await store.ledger_begin(T, "k", "digest-A", "a1", now=NOW), Began)
    assert isinstance(await store.ledger_begin(other, "k", "digest-B", "b1", now=NOW + 1), Began)
    await store.ledger_finish(T, "k", "a1", LedgerState.SUCCEEDED, b"a", now=NOW + 2)
    b = await store.ledger_get(other, "k")
    assert b is not None
    assert (b.state, b.request_digest, b.owner, b.result) == (
        LedgerState.IN_FLIGHT,
        "digest-B",
        "b1",
        None,
    )
    await store.ledger_finish(other, "k", "b1", LedgerState.FAILED, b"b", now=NOW + 3)
    a = await store.ledger_get(T, "k")
    assert a is not None
    assert (a.state, a.request_digest, a.result) == (LedgerState.SUCCEEDED, "digest-A", b"a")
    replay = await store.ledger_begin(other, "k", "digest-B", "b2", now=NOW + 4)
    assert replay == Replay(state=LedgerState.FAILED, result=b"b")


@all_backends
async def test_prune_removes_only_old_finished_rows(store: Store) -> None:
    old, recent = NOW, NOW + LEDGER_RETENTION
    for key, state in (
        ("old-ok", LedgerState.SUCCEEDED),
        ("old-failed", LedgerState.FAILED),
        ("old-unknown", LedgerState.UNKNOWN),
        ("old-in-flight", LedgerState.IN_FLIGHT),
        ("new-ok", LedgerState.SUCCEEDED),
    ):
        at = recent if key.startswith("new") else old
        await store.ledger_begin(T, key, "D", "o", now=at)
        if state in (LedgerState.SUCCEEDED, LedgerState.FAILED):
            await store.ledger_finish(T, key, "o", state, b"r", now=at)
        elif state is LedgerState.UNKNOWN:
            await store.ledger_mark_unknown(T, key, "o", now=at)
    now = recent + 1  # old rows are LEDGER_RETENTION + 1 s old, new ones 1 s
    assert await store.prune_ledger(now=now) == 2
    left = {
        k
        for k in ("old-ok", "old-failed", "old-unknown", "old-in-flight", "new-ok")
        if await store.ledger_get(T, k) is not None
    }
    assert left == {"old-unknown", "old-in-flight", "new-ok"}
    # Even a window of zero never touches unknown or in-flight rows.
    assert await store.prune_ledger(now=now + 10**9, older_than=0) == 1
    assert await store.ledger_get(T, "old-unknown") is not None
    assert await store.ledger_get(T, "old-in-flight") is not None
    # The window is exclusive: a row exactly ``older_than`` old stays, one a second older
    # goes (integral times, so the cutoff's arithmetic is exact on every backend).
    for key, at in (("edge", now + 1000.0), ("past-edge", now + 999.0)):
        await store.ledger_begin(T, key, "D", "o", now=at)
        await store.ledger_finish(T, key, "o", LedgerState.SUCCEEDED, b"r", now=at)
    assert await store.prune_ledger(now=now + 1100.0, older_than=100.0) == 1
    assert await store.ledger_get(T, "edge") is not None
    assert await store.ledger_get(T, "past-edge") is None
