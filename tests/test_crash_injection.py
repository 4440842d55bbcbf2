"""Crash injection: a real worker process doing ledger_begin -> side effect -> ledger_finish
is SIGKILLed at hundreds of seeded points, and a recovery attempt after each kill must
leave 0 duplicate effects and every key terminal.

The side effect is a line appended to an "effects" file (the downstream system); the
tool's reconcile hook looks the line up by idempotency key. Workers are forked by a
thread-free zygote process (tests/store_subprocess.py) so each attempt is a separate
process without interpreter start-up cost. Two kinds of fault, both from one seed:

- checkpoint kills: the worker SIGKILLs itself at checkpoint N (before begin, after
  begin, between the effect and its record, after finish, inside reconciliation);
  every run is guaranteed to die, and every kind of point is hit many times;
- timer kills: the zygote SIGKILLs the worker after a seeded delay, which also lands
  inside SQLite/PostgreSQL commits and between arbitrary statements.

Some runs first plant a key a "ghost" attempt left unknown or in flight (with or without
its effect downstream), so kills also land inside a worker's reconciliation.

PostgreSQL outlives its client: a COMMIT the worker sent just before the kill is still
carried out by its server backend after the worker is gone. So the PostgreSQL campaign
waits for the dead worker's backends to exit before it reads the rows the kill left;
only then is "no row" proof that the effect cannot have happened.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from callgate.engine.store import (
    LEDGER_IN_FLIGHT_LEASE,
    Began,
    LedgerState,
    Store,
    open_store,
)

from .store_helpers import HELPER, PG_URL, drop_schema, require_postgres, with_schema
from .store_subprocess import Checkpoints, append_effect, run_key

SEED = int(os.environ.get("CALLGATE_CRASH_SEED", "20240605"))
NOW = 1_700_000_000.0
KEYS_PER_RUN = 3
CALIBRATION_RUNS = 3
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": False})], ids=["asyncio"]),
]

# Checkpoint labels in the order a worker passes them (see run_key).
FRESH = ["before-begin", "after-begin", "effect-unrecorded", "after-finish"]
PLANTED_ABSENT = [
    "before-begin",
    "after-begin(unknown)",
    "reconcile-before-effect",
    "effect-unrecorded",
    "after-resolve",
]
PLANTED_PRESENT = ["before-begin", "after-begin(unknown)", "after-resolve"]
PLANTED_KINDS = ["unknown-absent", "unknown-present", "stale-absent", "stale-present"]


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def effect_counts(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(path.read_text().splitlines())


class Zygote:
    def __init__(self, proc: Process) -> None:
        self.proc = proc
        assert proc.stdout is not None
        self.out = BufferedByteReceiveStream(proc.stdout)

    async def run(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        await self.proc.stdin.send(json.dumps(req).encode() + b"\n")
        with anyio.fail_after(60):
            reply: dict[str, Any] = json.loads(await self.out.receive_until(b"\n", 1 << 16))
        return reply


async def plant(store: Store, effects: Path, key: str, kind: str, now: float) -> None:
    """A previous attempt ("ghost") that left ``key`` unknown or stale in flight."""
    at = now - LEDGER_IN_FLIGHT_LEASE if kind.startswith("stale") else now
    d = await store.ledger_begin("t", key, digest(key), "ghost", now=at)
    assert isinstance(d, Began)
    if kind.endswith("present"):
        append_effect(str(effects), key)
    if kind.startswith("unknown"):
        await store.ledger_mark_unknown("t", key, "ghost", now=at)


class Tally:
    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.timer_runs = 0
        self.timer_kills = 0
        self.keys: list[str] = []


Settle = Callable[[], Awaitable[None]]


async def settled() -> None:
    """SQLite: a killed worker's commit either happened or did not; nothing to wait for."""


async def crash_lane(
    lane: int,
    url: str,
    effects: Path,
    *,
    checkpoint_runs: int,
    timer_runs: int,
    tally: Tally,
    worker_url: str | None = None,
    settle: Settle = settled,
) -> None:
    """One zygote, one database: calibration runs, then ``checkpoint_runs`` self-kills,
    then ``timer_runs`` kills after a seeded delay; recovery and checks after each run.
    Workers connect with ``worker_url`` (default ``url``); ``settle`` returns once the
    database has finished whatever the last worker left it doing."""
    rng = random.Random(SEED * 100 + lane)
    proc = await anyio.open_process(
        [sys.executable, HELPER, "zygote", worker_url or url, str(effects)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None,  # a worker's traceback goes straight to pytest's captured stderr
    )
    zygote = Zygote(proc)
    never = Checkpoints()
    never.crash_at = -1
    calibrated: list[float] = []  # how long an unkilled run's work takes
    store = open_store(url)
    await store.start()
    try:
        for run in range(CALIBRATION_RUNS + checkpoint_runs + timer_runs):
            mode = (
                "calibrate"
                if run < CALIBRATION_RUNS
                else "checkpoint"
                if run < CALIBRATION_RUNS + checkpoint_runs
                else "timer"
            )
            base = NOW + run * 10 * LEDGER_IN_FLIGHT_LEASE  # each run in its own era
            keys = [f"l{lane}-r{run}-k{j}" for j in range(KEYS_PER_RUN)]
            tally.keys.extend(keys)
            labels: list[str] = []
            for key in keys:
                kind = rng.choice(["fresh"] * 4 + PLANTED_KINDS)
                if kind == "fresh":
                    labels += FRESH
                else:
                    await plant(store, effects, key, kind, base)
                    labels += PLANTED_PRESENT if kind.endswith("present") else PLANTED_ABSENT
            crash_at = rng.randrange(len(labels)) if mode == "checkpoint" else None
            # The median, not the max: a cold first run (empty caches, a fresh server) would
            # stretch the range and send most timer kills after the work is done.
            work_time = statistics.median(calibrated) if calibrated else 0.0
            kill_after = rng.uniform(0, work_time) if mode == "timer" else None
            reply = await zygote.run(
                {"keys": keys, "now": base, "crash_at": crash_at, "kill_after": kill_after}
            )
            if mode == "calibrate":
                assert reply["code"] == 0 and reply["done"], reply
                calibrated.append(reply["ran_for"])
            elif mode == "checkpoint":
                assert crash_at is not None and reply["killed"], (run, reply)
                tally.hits[labels[crash_at]] += 1
            else:
                assert reply["killed"] or reply["code"] == 0, reply
                tally.timer_runs += 1
                tally.timer_kills += reply["killed"] and not reply["done"]
            await settle()
            await recover_and_check(store, effects, keys, base, never)
        assert proc.stdin is not None
        await proc.stdin.aclose()
        assert await proc.wait() == 0
    finally:
        await store.aclose()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def recover_and_check(
    store: Store, effects: Path, keys: list[str], base: float, never: Checkpoints
) -> None:
    """A later attempt (after the in-flight lease) at every key of the killed run."""
    rows = {k: await store.ledger_get("t", k) for k in keys}
    for key in keys:
        outcome = await run_key(
            store, str(effects), key, "recovery", now=base + LEDGER_IN_FLIGHT_LEASE, point=never
        )
        row = rows[key]
        if row is None:
            assert outcome == "began"  # no record: the effect cannot have happened
        elif row.state in (LedgerState.SUCCEEDED, LedgerState.FAILED):
            assert outcome == "replay"
        else:  # in flight or unknown: reconcile first, never a blind retry
            assert outcome == "reconciled", (key, row.state, outcome)
    counts = effect_counts(effects)
    for key in keys:
        row = await store.ledger_get("t", key)
        assert row is not None and row.state is LedgerState.SUCCEEDED, (key, row)
        assert counts[key] == 1, f"{key}: {counts[key]} effects"


async def crash_campaign(
    urls: list[str],
    tmp_path: Path,
    checkpoint_runs: int,
    timer_runs: int,
    *,
    worker_urls: list[str] | None = None,
    settle: Settle = settled,
) -> Tally:
    """One lane per URL, run side by side; each lane has its own effects file."""
    tally = Tally()
    files = [tmp_path / f"effects-{i}.txt" for i in range(len(urls))]
    async with anyio.create_task_group() as tg:
        for lane, (url, effects) in enumerate(zip(urls, files, strict=True)):
            tg.start_soon(
                functools.partial(
                    crash_lane,
                    lane,
                    url,
                    effects,
                    checkpoint_runs=checkpoint_runs,
                    timer_runs=timer_runs,
                    tally=tally,
                    worker_url=worker_urls[lane] if worker_urls else None,
                    settle=settle,
                )
            )
    print(
        f"kills at checkpoints: {dict(sorted(tally.hits.items()))}; "
        f"timer kills: {tally.timer_kills}/{tally.timer_runs}; keys: {len(tally.keys)}"
    )
    for effects in files:
        counts = effect_counts(effects)
        assert counts and max(counts.values()) == 1, "duplicate side effect"
    everything = Counter[str]()
    for effects in files:
        everything.update(effect_counts(effects))
    assert set(everything) == set(tally.keys)
    return tally


async def test_sqlite_worker_killed_at_300_seeded_points_never_duplicates(
    tmp_path: Path,
) -> None:
    # synchronous=NORMAL: in WAL mode a commit is in the OS before it returns, so a killed
    # *process* loses nothing under NORMAL or FULL alike; FULL only adds fsyncs (power
    # loss), which would make this test I/O-bound without testing anything more.
    urls = [f"sqlite:///{tmp_path / f'ledger-{i}.db'}?synchronous=NORMAL" for i in range(2)]
    tally = await crash_campaign(urls, tmp_path, checkpoint_runs=150, timer_runs=40)
    assert sum(tally.hits.values()) == 300
    # Every kind of point was hit, the effect-without-record gap many times.
    assert set(tally.hits) == set(FRESH) | set(PLANTED_ABSENT) | set(PLANTED_PRESENT)
    assert tally.hits["effect-unrecorded"] >= 30
    # Timer kills depend on scheduling; most land inside the work, a few after it.
    assert tally.timer_runs == 80 and tally.timer_kills >= 10


@pytest.mark.postgres
async def test_postgres_worker_killed_at_seeded_points_never_duplicates(tmp_path: Path) -> None:
    import asyncpg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    url = with_schema(require_postgres(), schema)
    name = f"callgate-crash-{schema}"  # the application_name the workers' backends carry
    worker_url = f"{url}&application_name={name}"

    async def backends(conn: Any) -> int:
        sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
        return int(await conn.fetchval(sql, name))

    async def backends_gone() -> None:
        conn = await asyncpg.connect(PG_URL)
        try:
            with anyio.fail_after(30):
                while await backends(conn):  # noqa: ASYNC110  # a server's state, no event
                    await anyio.sleep(0.002)
        finally:
            await conn.close()

    try:
        # The wait is only as good as the name: a worker's connection must carry it.
        async with open_store(worker_url):
            conn = await asyncpg.connect(PG_URL)
            try:
                assert await backends(conn) >= 1
            finally:
                await conn.close()
        tally = await crash_campaign(
            [url],
            tmp_path,
            checkpoint_runs=60,
            timer_runs=20,
            worker_urls=[worker_url],
            settle=backends_gone,
        )
        assert sum(tally.hits.values()) == 60
        assert tally.hits["effect-unrecorded"] >= 5
        assert tally.timer_kills >= 5
    finally:
        await drop_schema(schema)
