"""``callgate demo``: the specification's refund workflow, run for real, one scenario at a time.

    python -m callgate.engine.runtime.demo [--scenario NAME|all] [--provider NAME]
        [--interactive] [--live] [--store URL] [--workdir DIR] [--model NAME]

What is real: HTTP to a loopback replay server that streams scripted model turns in the
chosen provider's wire format (``--live``: the provider's own API), the run loop, the
registry with authorization, policy and approval rules, the dispatcher with the
idempotency ledger and the reconcile hook, the store (SQLite in the work directory, or
``--store``), the approvals, and a hash-chained JSONL audit trail that is verified at the
end. What is scripted: the model's words (``demo_scenarios``) and the downstream system
(``demo_tools``).

The processes: this one starts the operation and returns once it waits for approval —
nothing waits in memory. A separate approver process decides through the store
(``python -m callgate.engine.runtime.demo approve``, as a person would with ``callgate
approvals approve ID``; ``--interactive`` waits for a real person instead), and a fresh
process resumes the operation (``... demo resume``). Each scenario ends in a named state;
the exit code is 0 only when it is the expected one and every check holds, 2 for a
configuration problem (e.g. ``--live`` without an API key).

This module owns the command line and the orchestration of one run (the child entry
points live in ``demo_processes``). It never imports the adapters statically and never
decides anything the engine decides.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import anyio
import anyio.to_thread
import msgspec

from callgate.engine.core.adapter import PROVIDERS
from callgate.engine.core.audit import AuditRecord, VerifyReport, verify_trail
from callgate.engine.core.errors import CallgateError, ConfigError
from callgate.engine.core.ids import new_operation_id
from callgate.engine.core.states import OpState
from callgate.engine.store import ApprovalStatus, open_store, redact_url

from .audit_sink import JsonlAuditSink
from .demo_display import ProgressDisplay, header, summary_lines
from .demo_processes import (
    DEMO_MODULE,
    DemoPaths,
    child_main,
    make_endpoint,
    make_runner,
    read_result,
    run_child,
    write_result,
)
from .demo_scenarios import SCENARIOS, Facts, Scenario, render_script
from .demo_tools import DEMO_ROLES, DEMO_SUBJECT, DEMO_TENANT, Downstream
from .loop import OperationResult
from .replay import ReplayServer
from .transport import ProviderEndpoint

__all__ = ["DEFAULT_MODELS", "add_demo_arguments", "main", "run_demo"]

DEFAULT_MODELS: dict[str, str] = {
    "anthropic": "claude-sonnet-4-5",
    "gemini": "gemini-2.5-flash",
    "gemini_interactions": "gemini-2.5-flash",
    "openai_chat": "gpt-4.1-mini",
    "openai_responses": "gpt-4.1-mini",
}

_MAX_LIVE_PAUSES = 5
_PID = os.getpid()


@dataclass(frozen=True, kw_only=True)
class _Plan:
    """One demo run's settings, shared by the parent and (as arguments) its children."""

    scenario: Scenario
    provider: str
    model: str
    paths: DemoPaths
    store_url: str
    operation_id: str
    live: bool
    interactive: bool
    base_url: str | None = None


# --- command line ----------------------------------------------------------------------------


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options (``callgate demo`` and ``python -m callgate.engine.runtime.demo``),
    and the scenario list as the parser's epilog when it has none."""
    names = ", ".join(SCENARIOS)
    if parser.epilog is None:
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        rows = [f"  {s.name:<17} → {s.expected.name:<10} {s.branch}" for s in SCENARIOS.values()]
        parser.epilog = "scenarios (--scenario NAME), each ending in a named state:\n" + "\n".join(
            rows
        )
    parser.add_argument(
        "--provider",
        choices=PROVIDERS,
        default="openai_responses",
        help="which wire format the model speaks (default: openai_responses)",
    )
    parser.add_argument(
        "--scenario",
        choices=[*SCENARIOS, "all"],
        default="refund",
        metavar="NAME",
        help=f"one of: {names}; or all (default: refund)",
    )
    parser.add_argument(
        "--interactive",
        action="store_true",
        help="wait for a real person to decide with `callgate approvals approve|deny`",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="call the real provider API (OPENAI_API_KEY, ANTHROPIC_API_KEY or GEMINI_API_KEY)",
    )
    parser.add_argument("--model", default=None, help="model name (default: per provider)")
    parser.add_argument(
        "--store", metavar="URL", default=None, help="store URL (default: SQLite in --workdir)"
    )
    parser.add_argument(
        "--workdir", metavar="DIR", default=None, help="where files go (default: a new temp dir)"
    )


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo as ``args`` say; the process exit code (see the module docstring)."""
    try:
        if args.store is not None:
            open_store(args.store)  # a malformed URL is a ConfigError now, not mid-run
        workdir = _workdir(args.workdir)
        return anyio.run(_demo, args, workdir)
    except CallgateError as exc:
        print(f"callgate demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _workdir(arg: str | None) -> Path:
    try:
        workdir = Path(arg or tempfile.mkdtemp(prefix="callgate-demo-")).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"--workdir {arg} exists and is not a directory") from None
    except OSError as exc:
        raise ConfigError(f"--workdir {arg}: {exc.strerror or exc}") from None
    return workdir


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m callgate.engine.runtime.demo [approve|resume] ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    code = child_main(argv)
    if code is not None:
        return code
    parser = argparse.ArgumentParser(
        prog=f"python -m {DEMO_MODULE}",
        description="The refund workflow (look up order → refund draft → approval → submit "
        "→ explanation), run for real through callgate, one scenario at a time.",
    )
    add_demo_arguments(parser)
    return run_demo(parser.parse_args(argv))


# --- the parent: one scenario ----------------------------------------------------------------


async def _demo(args: argparse.Namespace, workdir: Path) -> int:
    provider: str = args.provider
    if args.live and args.scenario != "refund":
        raise ConfigError("--live runs the refund scenario only (the others script the model)")
    if args.live:
        try:
            ProviderEndpoint.from_env(provider)  # fail now, naming the variable
        except ConfigError as exc:
            raise ConfigError(
                f"{exc} (--live calls the real API; without it the model is scripted)"
            ) from None
    paths = DemoPaths(workdir)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    outcomes: list[tuple[str, str, str, bool]] = []
    for name in names:
        plan = _Plan(
            scenario=SCENARIOS[name],
            provider=provider,
            model=args.model or DEFAULT_MODELS[provider],
            paths=paths,
            store_url=args.store or paths.store_url,
            operation_id=new_operation_id(),
            live=args.live,
            interactive=args.interactive,
        )
        ok, actual = await _run_scenario(plan)
        expected = plan.scenario.expected_for(provider)[0]
        outcomes.append((name, expected.name, actual, ok))
        print(flush=True)
    if len(outcomes) > 1:
        print(header("all scenarios"))
        for name, expected_name, actual, ok in outcomes:
            mark = "✓" if ok else "✗"
            print(f"  {mark} {name:<18} expected {expected_name:<11} got {actual}")
    return 0 if all(ok for *_, ok in outcomes) else 1


async def _run_scenario(plan: _Plan) -> tuple[bool, str]:
    s = plan.scenario
    expected, note = s.expected_for(plan.provider)
    downstream = Downstream(plan.paths.downstream)
    await anyio.to_thread.run_sync(
        lambda: downstream.reset(ack_delay_s=s.ack_delay_s, slow_acks=s.slow_acks)
    )
    async with _model_server(plan) as base_url:
        plan = replace(plan, base_url=base_url)
        _print_intro(plan, expected, note)
        result = await _start(plan, downstream)
        decisions = list(s.decisions) if not plan.live else ["approve"] * _MAX_LIVE_PAUSES
        step = 2
        while result.state is OpState.WAITING_APPROVAL and decisions:
            decision = decisions.pop(0)
            ok = await _decide(plan, decision, step, result.pending_approvals)
            if not ok:
                break
            code = await run_child(f"{step + 1} · resume in a fresh process", _resume_args(plan))
            step += 2
            if code != 0:
                print(f"  ✗ the resume process exited with {code}")
                break
            result = read_result(plan.paths.result(plan.operation_id))
    checks = await _checks(plan, result, downstream)
    report = verify_trail(_audit_records(plan.paths.audit(plan.operation_id)))
    for line in await _summary(plan, result, expected, note, checks=checks, report=report):
        print(line)
    ok = result.state is expected and all(c for c, _ in checks) and report.ok
    print()
    mark = "✓" if ok else "✗"
    print(f"{mark} scenario {s.name}: expected {expected.name}, got {result.state.name}")
    return ok, result.state.name


@contextlib.asynccontextmanager
async def _model_server(plan: _Plan) -> AsyncIterator[str | None]:
    if plan.live:
        yield None
        return
    turns = render_script(plan.scenario, plan.provider, model=plan.model)
    async with ReplayServer(turns) as server:
        yield server.base_url


def _print_intro(plan: _Plan, expected: OpState, note: str) -> None:
    s = plan.scenario
    where = (
        "the provider's real API (--live)"
        if plan.live
        else f"scripted, streamed over real HTTP by the loopback replay server {plan.base_url}"
    )
    print(f"callgate demo · scenario {s.name}: {s.title}")
    rows = [
        ("branch", s.branch),
        ("provider", f"{plan.provider} · model {plan.model}"),
        ("model turns", where),
        ("store", redact_url(plan.store_url)),
        ("downstream", f"{plan.paths.downstream} (the fake order and payment system)"),
        ("audit", str(plan.paths.audit(plan.operation_id))),
        ("operation", plan.operation_id),
        ("expects", f"{expected.name} — {note}"),
    ]
    display = ProgressDisplay()
    for label, text in rows:
        display.line(label, text)
    display.line("user asks", f"“{s.prompt}”")


async def _start(plan: _Plan, downstream: Downstream) -> OperationResult:
    print(header(f"1 · start the operation (this process, pid {_PID})"), flush=True)
    audit_path = plan.paths.audit(plan.operation_id)
    async with open_store(plan.store_url) as store, JsonlAuditSink(audit_path) as sink:
        display = ProgressDisplay(sink)
        runner = make_runner(
            provider=plan.provider,
            model=plan.model,
            endpoint=make_endpoint(plan.provider, plan.live, plan.base_url),
            store=store,
            display=display,
            downstream=downstream,
            approval_ttl=plan.scenario.approval_ttl,
        )
        result = await runner.start(
            plan.scenario.prompt,
            tenant=DEMO_TENANT,
            subject=DEMO_SUBJECT,
            roles=DEMO_ROLES,
            operation_id=plan.operation_id,
        )
    write_result(plan.paths.result(plan.operation_id), result)
    if result.state is OpState.WAITING_APPROVAL:
        display.line(
            "paused",
            "the operation now lives in the store only: no coroutine, thread or process "
            "waits on it. This process's runner and store handle are closed.",
        )
    return result


async def _decide(plan: _Plan, decision: str, step: int, pending: Sequence[str]) -> bool:
    """One human decision, by the scenario's approver process, a real person
    (``--interactive``) or nobody in time (``late``). False: stop the demo."""
    if decision == "late":
        await _wait_for_expiry(plan, pending)
    elif plan.interactive:
        return await _wait_for_person(plan, step, pending)
    args = [
        "approve",
        "--store",
        plan.store_url,
        "--operation",
        plan.operation_id,
        "--workdir",
        str(plan.paths.workdir),
    ]
    if decision == "deny":
        args += ["--deny", "--reason", "a refund for this order was already issued by phone"]
    else:
        args += ["--reason", "checked the photos of the damage"]
    title = f"{step} · an approver decides in a separate process"
    if decision == "late":
        title = f"{step} · the approver arrives too late (separate process)"
    code = await run_child(title, args)
    return code == 0


async def _wait_for_expiry(plan: _Plan, pending: Sequence[str]) -> None:
    async with open_store(plan.store_url) as store:
        records = [await store.get_approval(a) for a in pending]
    expires = max((r.expires_at for r in records if r is not None), default=time.time())
    wait = max(0.0, expires - time.time())
    ProgressDisplay().line(
        "nobody", f"decides within the approval's lifetime; it expires in {wait:.1f} s…"
    )
    # Waiting on the clock is the scenario itself (an approval that expires), not a sync.
    await anyio.sleep(wait + 0.05)


async def _wait_for_person(plan: _Plan, step: int, pending: Sequence[str]) -> bool:
    display = ProgressDisplay()
    print(header(f"{step} · a person decides (--interactive)"), flush=True)
    display.line("decide", "in another terminal, run one of (python -m callgate.engine.cli …")
    display.line("", "works the same when callgate is not on your PATH):")
    # Never the password: the person substitutes it (or sets CALLGATE_STORE and drops --store).
    store = redact_url(plan.store_url)
    if store != plan.store_url:
        display.line("", "(the store URL's credentials are shown as ***: put yours in)")
    for approval_id in pending:
        print(f"    callgate approvals show {approval_id} --store {store}")
        print(f"    callgate approvals approve {approval_id} --store {store} --approver YOU")
        print(
            f"    callgate approvals deny {approval_id} --store {store} --approver YOU "
            '--reason "why"'
        )
    display.line("waiting", "for the decision; Ctrl-C stops the demo, the operation stays paused")
    async with open_store(plan.store_url) as st:
        while True:
            records = [await st.get_approval(a) for a in pending]
            now = time.time()
            if all(
                r is None or r.status is not ApprovalStatus.PENDING or now >= r.expires_at
                for r in records
            ):
                break
            await anyio.sleep(0.5)  # polling a human's decision, not synchronizing tasks
    for r in records:
        if r is not None:
            who = f" by {r.approver}" if r.approver else ""
            display.line("decided", f"{r.approval_id}: {r.status.value}{who}")
    return True


def _resume_args(plan: _Plan) -> list[str]:
    args = [
        "resume",
        "--store",
        plan.store_url,
        "--operation",
        plan.operation_id,
        "--workdir",
        str(plan.paths.workdir),
        "--provider",
        plan.provider,
        "--model",
        plan.model,
        "--approval-ttl",
        str(plan.scenario.approval_ttl),
    ]
    if plan.live:
        return [*args, "--live"]
    assert plan.base_url is not None
    return [*args, "--base-url", plan.base_url]


# --- the end: facts, checks, audit -----------------------------------------------------------


def _audit_records(path: Path) -> list[bytes]:
    try:
        return [line for line in path.read_bytes().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


async def _facts(plan: _Plan, result: OperationResult, downstream: Downstream) -> Facts:
    refunds = await anyio.to_thread.run_sync(downstream.refunds)
    drafts = await anyio.to_thread.run_sync(downstream.drafts)
    executed: list[tuple[str, str, bool]] = []
    for line in _audit_records(plan.paths.audit(plan.operation_id)):
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            rec = msgspec.json.decode(line, type=AuditRecord)
            if rec.kind == "executed":
                executed.append((rec.tool or "", rec.call_id or "", bool(rec.data.get("ran"))))
    return Facts(
        refunds=tuple(refunds), drafts=tuple(drafts), calls=result.calls, executed=tuple(executed)
    )


async def _checks(
    plan: _Plan, result: OperationResult, downstream: Downstream
) -> list[tuple[bool, str]]:
    facts = await _facts(plan, result, downstream)
    return [check(facts) for check in plan.scenario.checks]


async def _stored_head(plan: _Plan) -> str | None:
    """The audit head the run loop saved with the operation (to detect a cut-off tail)."""
    async with open_store(plan.store_url) as store:
        record = await store.get_operation(plan.operation_id)
    if record is None:
        return None
    with contextlib.suppress(msgspec.DecodeError):
        snapshot = msgspec.json.decode(record.snapshot)
        head = snapshot.get("audit_head") if isinstance(snapshot, dict) else None
        return head if isinstance(head, str) else None
    return None


async def _summary(
    plan: _Plan,
    result: OperationResult,
    expected: OpState,
    note: str,
    *,
    checks: list[tuple[bool, str]],
    report: VerifyReport,
) -> list[str]:
    head = await _stored_head(plan)
    return [
        "",
        *summary_lines(
            result=result,
            expected=expected,
            expected_note=note,
            checks=checks,
            audit_path=str(plan.paths.audit(plan.operation_id)),
            report=report,
            head_matches=None if head is None else head == report.head,
            result_path=str(plan.paths.result(plan.operation_id)),
        ),
    ]


if __name__ == "__main__":
    sys.exit(main())
