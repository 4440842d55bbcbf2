"""The demo's processes: the runner every process builds the same way, and the two child
entry points the demo launches — the approver and the fresh process that resumes.

    python -m callgate.engine.runtime.demo approve --store URL --operation ID [--deny]
    python -m callgate.engine.runtime.demo resume --store URL --operation ID --workdir DIR
        --provider NAME --model NAME (--base-url URL | --live)

The approver decides through the store exactly as a person would with ``callgate
approvals approve|deny``; the resume process starts from the store alone, with nothing
handed over in memory (the only thing it writes back for the parent is the operation's
result, as JSON in the work directory). ``run_child`` launches one of them and relays
its output line by line.

This module owns those entry points and their plumbing; it never decides for the engine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec

from callgate.engine.core.adapter import PROVIDERS
from callgate.engine.core.audit import AuditRecord
from callgate.engine.core.errors import CallgateError, ConfigError
from callgate.engine.core.states import OpState
from callgate.engine.store import ApprovalError, ApprovalStatus, Store, open_store

from .audit_sink import JsonlAuditSink
from .demo_display import ProgressDisplay, header
from .demo_tools import Downstream, build_registry
from .loop import OperationResult, Runner
from .transport import ProviderEndpoint

__all__ = [
    "DEMO_MODULE",
    "SYSTEM_PROMPT",
    "DemoPaths",
    "child_main",
    "make_endpoint",
    "make_runner",
    "read_result",
    "run_child",
    "write_result",
]

DEMO_MODULE = "callgate.engine.runtime.demo"
SYSTEM_PROMPT = (
    "You are ACME's support assistant. Use the tools: look the order up, create a refund "
    "draft, then submit it (a person approves every submission). Finish with a short "
    "explanation for the support agent of what was done and what was not."
)

_SCRIPTED_KEY = "demo-key-for-the-loopback-server"  # the replay server ignores it


@dataclass(frozen=True)
class DemoPaths:
    """Where one demo run keeps its files (every process derives them from the workdir)."""

    workdir: Path

    @property
    def downstream(self) -> Path:
        return self.workdir / "downstream.db"

    @property
    def store_url(self) -> str:
        return f"sqlite:///{(self.workdir / 'store.db').resolve()}"

    def audit(self, operation_id: str) -> Path:
        return self.workdir / f"audit-{operation_id}.jsonl"

    def result(self, operation_id: str) -> Path:
        return self.workdir / f"result-{operation_id}.json"


def _approve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {DEMO_MODULE} approve")
    p.add_argument("--store", required=True, metavar="URL")
    p.add_argument("--operation", required=True, metavar="ID")
    p.add_argument("--approver", default="sam (approver)", metavar="NAME")
    p.add_argument("--deny", action="store_true", help="deny instead of approving")
    p.add_argument("--reason", default=None, metavar="TEXT")
    p.add_argument("--workdir", default=None, help="show the call's arguments from the audit")
    return p


def _resume_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {DEMO_MODULE} resume")
    p.add_argument("--store", required=True, metavar="URL")
    p.add_argument("--operation", required=True, metavar="ID")
    p.add_argument("--workdir", required=True)
    p.add_argument("--provider", required=True, choices=PROVIDERS)
    p.add_argument("--model", required=True)
    p.add_argument("--approval-ttl", type=float, default=900.0)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="the scripted model server")
    where.add_argument("--live", action="store_true", help="the real provider API")
    return p


def child_main(argv: list[str]) -> int | None:
    """Run ``approve ...`` or ``resume ...`` and return the exit code; None for any other
    command line (the caller runs the demo itself)."""
    if argv[:1] == ["approve"]:
        fn: Any = _approve_main
        ns = _approve_parser().parse_args(argv[1:])
    elif argv[:1] == ["resume"]:
        fn = _resume_main
        ns = _resume_parser().parse_args(argv[1:])
    else:
        return None
    try:
        code: int = anyio.run(fn, ns)
    except CallgateError as exc:
        print(f"  error       {exc}", flush=True)
        return 2
    return code


# --- the runner, the same in every process ---------------------------------------------------


def make_runner(
    *,
    provider: str,
    model: str,
    endpoint: ProviderEndpoint,
    store: Store,
    display: ProgressDisplay,
    downstream: Downstream,
    approval_ttl: float,
) -> Runner:
    return Runner(
        provider=provider,
        model=model,
        registry=build_registry(downstream),
        endpoint=endpoint,
        store=store,
        system=SYSTEM_PROMPT,
        max_tokens=1024,
        audit=display.audit,
        progress=display.progress,
        approval_ttl=approval_ttl,
        worker_id=f"demo-pid-{os.getpid()}",
    )


def make_endpoint(provider: str, live: bool, base_url: str | None) -> ProviderEndpoint:
    if live:
        return ProviderEndpoint.from_env(provider)
    if base_url is None:
        raise ConfigError("the scripted demo needs the replay server's base URL")
    return ProviderEndpoint(base_url=base_url, api_key=_SCRIPTED_KEY)


def write_result(path: Path, result: OperationResult) -> None:
    path.write_bytes(msgspec.json.encode(result))


def read_result(path: Path) -> OperationResult:
    return msgspec.json.decode(path.read_bytes(), type=OperationResult)


# --- child processes -------------------------------------------------------------------------


async def _resume_main(ns: argparse.Namespace) -> int:
    """A fresh process: load the operation from the store alone and continue it."""
    paths = DemoPaths(Path(ns.workdir))
    endpoint = make_endpoint(ns.provider, ns.live, ns.base_url)
    async with open_store(ns.store) as store, JsonlAuditSink(paths.audit(ns.operation)) as sink:
        display = ProgressDisplay(sink)
        display.line("resuming", f"{ns.operation}, loaded from the store")
        runner = make_runner(
            provider=ns.provider,
            model=ns.model,
            endpoint=endpoint,
            store=store,
            display=display,
            downstream=Downstream(paths.downstream),
            approval_ttl=ns.approval_ttl,
        )
        result = await runner.resume(ns.operation)
    write_result(paths.result(ns.operation), result)
    if result.state is OpState.WAITING_APPROVAL:
        display.line("paused", "waiting for approval again: " + ", ".join(result.pending_approvals))
    return 0


async def _approve_main(ns: argparse.Namespace) -> int:
    """The approver: decide every pending approval of the operation, through the store."""
    out = ProgressDisplay()
    verb = "denies" if ns.deny else "approves"
    async with open_store(ns.store) as store:
        pending = await store.list_approvals(ApprovalStatus.PENDING, operation_id=ns.operation)
        if not pending:
            out.line("approver", f"nothing pending for {ns.operation}")
            return 1
        for approval in pending:
            shown = _requested_arguments(ns.workdir, ns.operation, approval.call_id)
            out.line("reviews", f"{approval.approval_id}: {approval.tool} {shown}".rstrip())
            out.line(
                "",
                f"tool schema {approval.schema_version}, policy {approval.policy_revision}, "
                f"arguments digest {approval.args_digest[:16]}…",
            )
            try:
                await store.decide_approval(
                    approval.approval_id, not ns.deny, ns.approver, ns.reason, now=time.time()
                )
            except ApprovalError as exc:
                out.line("refused", f"the store refused the decision: {exc.status} ({exc.code})")
                continue
            reason = f" — “{ns.reason}”" if ns.reason else ""
            out.line("decided", f"{ns.approver} {verb} {approval.approval_id}{reason}")
    return 0


def _requested_arguments(workdir: str | None, operation_id: str, call_id: str) -> str:
    """The call's arguments as the audit recorded them (what the approver is shown)."""
    if workdir is None:
        return ""
    path = DemoPaths(Path(workdir)).audit(operation_id)
    with contextlib.suppress(OSError, msgspec.DecodeError):
        for line in path.read_bytes().splitlines():
            rec = msgspec.json.decode(line, type=AuditRecord)
            if rec.kind == "requested" and rec.call_id == call_id:
                return msgspec.json.encode(rec.data.get("arguments")).decode()
    return ""


async def run_child(title: str, args: list[str]) -> int:
    """Run ``python -m <this module> ARGS`` and relay its output line by line."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8"}
    cmd = [sys.executable, "-m", DEMO_MODULE, *args]
    async with await anyio.open_process(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
    ) as proc:
        print(header(f"{title} (pid {proc.pid})"), flush=True)
        assert proc.stdout is not None
        pending = b""
        async for chunk in proc.stdout:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                print(line.decode("utf-8", "replace"), flush=True)
        if pending:
            print(pending.decode("utf-8", "replace"), flush=True)
        code = await proc.wait()
    return code
