"""Many workers, one approved operation: exactly one of them resumes it.

    python examples/multi_worker_postgres.py --store postgresql://USER:PASS@HOST:5432/DB
    CALLGATE_PG_URL=postgresql://... python examples/multi_worker_postgres.py --workers 16
    python examples/multi_worker_postgres.py --store sqlite:////tmp/one-machine.db

PostgreSQL is the store for many workers on many machines (``open_store`` takes the URL;
add ``?schema=NAME`` to keep callgate's tables in their own schema). Each worker here is
what would run on its own machine: its own connection pool, its own ``Runner`` and
worker id. One operation is started, pauses for approval, and is approved; then every
worker calls ``resume(operation_id)`` at the same moment. The store's claim — a
conditional update that bumps a fencing token — lets exactly one through; the others get
the operation's state as it stands and run nothing. The downstream system counts refunds:
the answer must be one, however many workers raced.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

import anyio
import anyio.to_thread

from callgate.engine.core.errors import CallgateError
from callgate.engine.runtime.demo_scenarios import SCENARIOS, render_script
from callgate.engine.runtime.demo_tools import (
    DEMO_ROLES,
    DEMO_SUBJECT,
    DEMO_TENANT,
    Downstream,
    build_registry,
)
from callgate.engine.runtime.loop import OperationResult, Runner
from callgate.engine.runtime.progress import ProgressEvent, ProgressSink, StateChanged
from callgate.engine.runtime.replay import ReplayServer
from callgate.engine.runtime.transport import ProviderEndpoint
from callgate.engine.store import Store, open_store, redact_url

PROVIDER = "openai_responses"
MODEL = "gpt-4.1-mini"


async def main(args: argparse.Namespace) -> int:
    url: str = args.store
    workdir = tempfile.mkdtemp(prefix="callgate-workers-")
    downstream = Downstream(f"{workdir}/downstream.db")
    await anyio.to_thread.run_sync(downstream.reset)
    registry = build_registry(downstream)
    turns = render_script(SCENARIOS["refund"], PROVIDER, model=MODEL)
    async with ReplayServer(turns) as server:
        endpoint = ProviderEndpoint(base_url=server.base_url, api_key="unused")

        def runner(store: Store, worker_id: str, progress: ProgressSink | None = None) -> Runner:
            return Runner(
                provider=PROVIDER,
                model=MODEL,
                registry=registry,
                endpoint=endpoint,
                store=store,
                worker_id=worker_id,
                progress=progress,
            )

        print(f"store: {redact_url(url)}")
        async with open_store(url) as store:
            paused = await runner(store, "frontend").start(
                SCENARIOS["refund"].prompt,
                tenant=DEMO_TENANT,
                subject=DEMO_SUBJECT,
                roles=DEMO_ROLES,
            )
            (approval_id,) = paused.pending_approvals
            await store.decide_approval(approval_id, True, "alice", None, now=time.time())
        print(f"operation {paused.operation_id}: paused, then approved ({approval_id})")

        ready = 0
        go = anyio.Event()
        drove: dict[str, bool] = {}
        results: dict[str, OperationResult] = {}

        async def worker(n: int) -> None:
            nonlocal ready
            name = f"worker-{n:02d}"
            drove[name] = False

            async def progress(event: ProgressEvent) -> None:
                if isinstance(event, StateChanged) and event.input == "resumed":
                    drove[name] = True  # only the claim's winner revalidates and runs

            async with open_store(url) as own_store:  # one pool per worker, as per machine
                ready += 1
                if ready == args.workers:
                    go.set()
                await go.wait()
                r = runner(own_store, name, progress=progress)
                results[name] = await r.resume(paused.operation_id)

        async with anyio.create_task_group() as tg:
            for n in range(args.workers):
                tg.start_soon(worker, n)

    for name in sorted(results):
        result = results[name]
        role = "won the claim, resumed it" if drove[name] else "found it taken: did nothing"
        # A loser is told the operation is busy (another worker is driving it), or sees
        # it already ended; never a pause with approvals left to decide.
        seen = f"busy in {result.state.value}" if result.busy else result.state.value
        print(f"  {name}: {role} (saw {seen})")
    winners = sum(drove.values())
    refunds = len(await anyio.to_thread.run_sync(downstream.refunds))
    print(f"winners: {winners}; refunds paid: {refunds}")
    return 0 if winners == 1 and refunds == 1 else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--store",
        default=os.environ.get("CALLGATE_PG_URL"),
        metavar="URL",
        help="postgresql://user:pass@host:port/db (default: $CALLGATE_PG_URL)",
    )
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args(argv)
    if not args.store:
        parser.error("no store: pass --store postgresql://... or set CALLGATE_PG_URL")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    return args


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        try:
            sys.exit(anyio.run(main, parse_args()))
        except CallgateError as exc:
            sys.exit(f"multi_worker_postgres: {exc}")
