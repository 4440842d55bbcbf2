"""Parent-side helpers for the store tests: the PostgreSQL switch (skip locally, fail in
CI) with one schema per test, and racing child processes (tests/store_subprocess.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

HELPER = str(Path(__file__).with_name("store_subprocess.py"))
PG_URL = os.environ.get("CALLGATE_PG_URL")
IN_CI = bool(os.environ.get("CI"))


def require_postgres() -> str:
    if PG_URL:
        return PG_URL
    if IN_CI:
        pytest.fail("CI is set but CALLGATE_PG_URL is not: .ci/postgres.sh must start a server")
    pytest.skip("no PostgreSQL server configured (set CALLGATE_PG_URL, or CI to require it)")


def with_schema(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


async def drop_schema(schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_URL)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def read_json(stream: BufferedByteReceiveStream) -> Any:
    return json.loads(await stream.receive_until(b"\n", 1 << 24))


async def race_processes(
    argvs: list[list[str]], during: Callable[[], Any] | None = None
) -> list[Any]:
    """Start one child per argv, wait until every child is ready, release them all at
    once (and run ``during`` in this process at the same moment), collect their output."""
    procs = [
        await anyio.open_process(
            [sys.executable, HELPER, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for argv in argvs
    ]
    try:
        with anyio.fail_after(120):
            outs = [BufferedByteReceiveStream(p.stdout) for p in procs]  # type: ignore[arg-type]
            for out in outs:
                assert await read_json(out) == "ready"
            async with anyio.create_task_group() as tg:
                for p in procs:
                    assert p.stdin is not None
                    await p.stdin.send(b"go\n")
                if during is not None:
                    tg.start_soon(during)
            results = [await read_json(out) for out in outs]
            for p in procs:
                assert await p.wait() == 0
        return results
    except BaseException:
        for p in procs:
            if p.returncode is None:
                p.kill()
            await p.wait()
            if p.stderr is not None:
                err = (await p.stderr.receive(1 << 16)) if p.returncode else b""
                if err:
                    print(err.decode(errors="replace"), file=sys.stderr)
        raise
