"""Child-process side of the store tests: a fresh interpreter that knows nothing but a
store URL, so a test can prove that state lives in the database alone and that several
processes race correctly.

    python tests/store_subprocess.py COMMAND URL [ARGS...]

Racing commands (claim, begin, migrate) open the store, print ``ready``, block until a
line arrives on stdin (the parent's start signal, sent once every child is ready), act,
and print one JSON line. ``zygote`` serves tests/test_crash_injection.py: it forks
workers that run keys through begin -> effect -> finish and, with CALLGATE_CRASH_AT=N,
SIGKILL themselves at their N-th checkpoint (or are killed after a seeded delay).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import time
import traceback
from typing import Any

import anyio

from callgate.engine.store import (
    Began,
    LedgerState,
    Replay,
    Store,
    Unknown,
    open_store,
)


def _out(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _barrier() -> None:
    _out("ready")
    await anyio.to_thread.run_sync(sys.stdin.readline)


async def dump(store: Store) -> None:
    ops = await store.list_operations(limit=10**6)
    loaded = [await store.get_operation(op.operation_id) for op in ops]
    _out(
        [
            [o.operation_id, o.state, o.version, hashlib.sha256(o.snapshot).hexdigest()]
            for o in loaded
            if o is not None
        ]
    )


async def claim(store: Store, operation_id: str, worker: str, now: str) -> None:
    await _barrier()
    token = await store.claim_operation(
        operation_id, worker, now=float(now), from_states={"WAITING_APPROVAL"}
    )
    _out({"worker": worker, "token": token})


async def begin(store: Store, tenant: str, key: str, digest: str, owner: str) -> None:
    await _barrier()
    decision = await store.ledger_begin(tenant, key, digest, owner, now=1000.0)
    _out({"owner": owner, "decision": type(decision).__name__})


# -- crash injection ------------------------------------------------------------------------
class Checkpoints:
    """Counts checkpoints; at number CALLGATE_CRASH_AT the process SIGKILLs itself (no
    cleanup, no flush: exactly what a power cut or OOM kill leaves behind)."""

    def __init__(self) -> None:
        raw = os.environ.get("CALLGATE_CRASH_AT")
        self.crash_at = int(raw) if raw is not None else -1
        self.count = 0

    def __call__(self) -> None:
        if self.count == self.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)
        self.count += 1


def append_effect(path: str, key: str) -> None:
    """The downstream side effect: one line, one O_APPEND write (atomic for a short line)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{key}\n".encode())
    finally:
        os.close(fd)


def effect_present(path: str, key: str) -> bool:
    """The tool's reconcile hook: look the effect up downstream by its idempotency key."""
    try:
        with open(path, encoding="utf-8") as f:
            return any(line.rstrip("\n") == key for line in f)
    except FileNotFoundError:
        return False


async def run_key(
    store: Store, effects: str, key: str, owner: str, *, now: float, point: Checkpoints
) -> str:
    """One attempt at one key's side effect, with a checkpoint between every step."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    point()
    decision = await store.ledger_begin("t", key, digest, owner, now=now)
    point()
    if isinstance(decision, Began):
        append_effect(effects, key)
        point()  # between the effect and its record: the dangerous gap
        await store.ledger_finish("t", key, owner, LedgerState.SUCCEEDED, b"ok", now=now)
        point()
        return "began"
    if isinstance(decision, Unknown):
        if not effect_present(effects, key):
            point()
            append_effect(effects, key)
            point()
        await store.ledger_resolve_unknown("t", key, owner, LedgerState.SUCCEEDED, b"ok", now=now)
        point()
        return "reconciled"
    if isinstance(decision, Replay):
        return "replay"
    return type(decision).__name__.lower()


async def effects_worker(url: str, effects: str, now: float, keys: list[str], ready: int) -> None:
    point = Checkpoints()
    owner = f"pid-{os.getpid()}"
    async with open_store(url) as store:
        os.write(ready, b"r")  # the zygote may time a kill from here
        for k in keys:
            await run_key(store, effects, k, owner, now=now, point=point)
        os.write(ready, b"d")  # work done (closing the store is not part of it)


def zygote(url: str, effects: str) -> None:
    """Fork one worker per request line and report how it ended.

    Forking from this small, thread-free process (it never opens the store or starts an
    event loop) gives every attempt a real, separate process without paying interpreter
    start-up each time, which is what lets the test afford hundreds of kills.
    Request: {"keys": [...], "now": float, "crash_at": int | null, "kill_after": float | null}
    Reply:   {"killed": bool, "code": int | null, "done": bool (the work finished),
              "ran_for": seconds from the store being open to the work's end or death}
    """
    for line in sys.stdin:
        req = json.loads(line)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            os.close(r)
            code = 0
            try:
                if req["crash_at"] is not None:
                    os.environ["CALLGATE_CRASH_AT"] = str(req["crash_at"])
                anyio.run(effects_worker, url, effects, req["now"], req["keys"], w)
            except BaseException:
                traceback.print_exc()
                code = 70
            os._exit(code)  # never run the zygote's cleanup in the worker
        os.close(w)
        os.read(r, 1)  # b"r" once the worker's store is open; b"" if it died first
        started = time.perf_counter()
        if req["kill_after"] is not None:
            time.sleep(req["kill_after"])  # the seeded delay *is* the injected fault
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        done = os.read(r, 1) == b"d"
        ran_for = time.perf_counter() - started
        _, status = os.waitpid(pid, 0)
        os.close(r)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        _out({"killed": killed, "code": code, "done": done, "ran_for": ran_for})


COMMANDS = {
    "dump": dump,
    "claim": claim,
    "begin": begin,
}


async def main(argv: list[str]) -> None:
    command, url, *args = argv
    if command == "migrate":
        await _barrier()
        async with open_store(url):
            pass
        _out({"ok": True})
        return
    async with open_store(url) as store:
        await COMMANDS[command](store, *args)  # type: ignore[operator]


if __name__ == "__main__":
    if sys.argv[1] == "zygote":
        zygote(*sys.argv[2:])
    else:
        anyio.run(main, sys.argv[1:])
