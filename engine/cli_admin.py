"""``callgate approvals …`` and ``callgate operations …``: the operator's view of the durable
store — list, show and decide approvals; list, show and resume operations.

It owns: the store URL option (``--store``, else env ``CALLGATE_STORE``, else
``sqlite:///./callgate.db``), the aligned-text and ``--json`` views of store records, the
defensive reading of an operation's snapshot, loading a host's tool registry for
``operations resume`` (``--registry MODULE:ATTR``), and turning every refusal into one line
on stderr with exit status 1 (usage problems: 2) — never a traceback (the mapping is in
``cli_errors``).

It must never: show a store URL except through ``redact_url`` (nor a password quoted inside
a driver's error text), print a conversation or a call's arguments (they may hold personal
data; the redacted audit trail is the place for those), create a SQLite database on a
listing or a decision (a mistyped path would quietly show an empty store), migrate a
database (every command opens the store with ``migrate=False``: the engine migrates), or
import ``callgate.adapters`` (the run loop resolves providers by name).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import msgspec
import orjson

from .cli_audit import CliFailure, secret_from_env
from .cli_errors import failure_text, innermost, refuse_undecodable, scrub
from .cli_views import operation_json, snapshot_view
from .core.adapter import PROVIDERS
from .core.audit import escape_controls
from .core.registry import Registry
from .core.states import TERMINAL, OpState
from .store.base import ApprovalRecord, ApprovalStatus, OperationRecord, Store
from .store.errors import ApprovalAlreadyDecided, ApprovalExpired
from .store.sqlite import SQLiteStore
from .store.url import open_store, redact_url

__all__ = [
    "DEFAULT_STORE_URL",
    "STORE_ENV",
    "add_admin_commands",
    "approval_json",
    "load_registry",
    "operation_json",
    "snapshot_view",
]

STORE_ENV = "CALLGATE_STORE"
DEFAULT_STORE_URL = "sqlite:///./callgate.db"
# A model's final answer can be long: the text view shows its start, --json all of it.
_TEXT_PREVIEW = 200
_R = TypeVar("_R")

Handler = Callable[[argparse.Namespace, Store], Awaitable[int]]


# --- plumbing -----------------------------------------------------------------------------


def _store_url(args: argparse.Namespace) -> str:
    url: str = args.store or os.environ.get(STORE_ENV) or DEFAULT_STORE_URL
    return url


def _run_with_store(args: argparse.Namespace, handler: Handler) -> int:
    """Open the store of ``args``, run ``handler`` with it, and map every refusal to a line
    on stderr and an exit status. No command migrates: a database without callgate's
    current schema holds no approval to decide nor operation to resume, and a foreign file
    (a mistyped --store) must be left exactly as it was."""
    url = _store_url(args)
    command: str = args.command_name
    try:
        refuse_undecodable(args, url)
        store = open_store(url, migrate=False)
        if isinstance(store, SQLiteStore) and not Path(store.path).is_file():
            raise CliFailure(
                f"no SQLite database at {store.path!r} (store {redact_url(url)}); "
                f"pass --store URL or set {STORE_ENV}"
            )

        async def main() -> int:
            async with store:
                return await handler(args, store)

        return anyio.run(main)
    except Exception as exc:
        refusal = failure_text(innermost(exc), url)
        if refusal is None:
            raise
        status, text = refusal
        print(f"{command}: {scrub(text, url)}", file=sys.stderr)
        return status


def _emit_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value).decode() + "\n")


def _s(value: object) -> str:
    """A value for the text view: control characters escaped, so that nothing stored (a
    model's call id, an approver's reason) can drive the terminal."""
    return "-" if value is None else escape_controls(str(value))


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    try:
        moment = datetime.datetime.fromtimestamp(ts, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return repr(ts)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    )


def _pairs(items: Sequence[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in items)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in items)


def _preview(text: str) -> str:
    return text if len(text) <= _TEXT_PREVIEW else text[:_TEXT_PREVIEW] + "…"


# --- approvals ----------------------------------------------------------------------------


def approval_json(record: ApprovalRecord, now: float) -> dict[str, Any]:
    """The ``--json`` view of an approval: every stored field, plus ``past_expiry`` (a
    pending approval stays ``pending`` in the store until a decision finds it expired)."""
    out: dict[str, Any] = msgspec.to_builtins(record)
    out["past_expiry"] = now >= record.expires_at
    return out


def _status_text(record: ApprovalRecord, now: float) -> str:
    if record.status is ApprovalStatus.PENDING and now >= record.expires_at:
        return "pending (expired)"
    return record.status.value


def _approval_rows(records: Sequence[ApprovalRecord], now: float) -> list[list[str]]:
    return [
        [
            _s(r.approval_id),
            _status_text(r, now),
            _s(r.operation_id),
            _s(r.tool),
            _s(r.call_id),
            _when(r.expires_at),
            _s(r.approver),
        ]
        for r in records
    ]


_APPROVAL_HEADERS = ("APPROVAL", "STATUS", "OPERATION", "TOOL", "CALL", "EXPIRES", "DECIDED BY")


def _cut(records: list[_R], limit: int, what: str) -> list[_R]:
    """The first ``limit`` of ``records`` (asked for one more than that); a note on stderr
    when more match, so a long list never looks complete (oldest first: the newest
    entries are the ones left out)."""
    if len(records) <= limit:
        return records
    print(
        f"more than {limit} {what} match: the oldest {limit} are shown (pass --limit N)",
        file=sys.stderr,
    )
    return records[:limit]


async def _approvals_list(args: argparse.Namespace, store: Store) -> int:
    status = None if args.status is None else ApprovalStatus(args.status)
    found = await store.list_approvals(status, operation_id=args.operation, limit=args.limit + 1)
    records = _cut(list(found), args.limit, "approvals")
    now = time.time()
    if args.json:
        _emit_json([approval_json(r, now) for r in records])
    elif records:
        print(_table(_APPROVAL_HEADERS, _approval_rows(records, now)))
    else:
        print("no approvals match")
    return 0


async def _get_approval(store: Store, approval_id: str) -> ApprovalRecord:
    record = await store.get_approval(approval_id)
    if record is None:
        raise CliFailure(f"no approval {_s(approval_id)!r} in this store")
    return record


def _approval_text(r: ApprovalRecord, now: float) -> str:
    decided = "-"
    if r.decided_at is not None:
        decided = f"{_when(r.decided_at)} by {_s(r.approver)}"
        if r.reason:
            decided += f": {_s(r.reason)}"
    return _pairs(
        [
            ("approval", _s(r.approval_id)),
            ("status", _status_text(r, now)),
            ("operation", _s(r.operation_id)),
            ("call", _s(r.call_id)),
            ("tool", f"{_s(r.tool)} (schema {_s(r.schema_version)})"),
            ("arguments", f"sha256 {_s(r.args_digest)}"),
            ("policy", _s(r.policy_revision)),
            ("tenant", _s(r.tenant)),
            ("subject", _s(r.subject)),
            ("created", _when(r.created_at)),
            ("expires", _when(r.expires_at)),
            ("decided", decided),
            ("consumed", _when(r.consumed_at)),
        ]
    )


async def _approvals_show(args: argparse.Namespace, store: Store) -> int:
    record = await _get_approval(store, args.approval_id)
    now = time.time()
    if args.json:
        _emit_json(approval_json(record, now))
    else:
        print(_approval_text(record, now))
    return 0


async def _approvals_decide(args: argparse.Namespace, store: Store) -> int:
    approve: bool = args.approve
    approval_id: str = args.approval_id
    if not args.approver.strip():
        raise CliFailure("--approver must name who decides (the approval audits it)", 2)
    if not approve and not (args.reason or "").strip():
        raise CliFailure("--reason must say why the call is denied", 2)
    await _get_approval(store, approval_id)
    now = time.time()
    try:
        record = await store.decide_approval(
            approval_id, approve, args.approver, args.reason, now=now
        )
    except ApprovalAlreadyDecided:
        current = await _get_approval(store, approval_id)
        raise CliFailure(
            f"approval {_s(approval_id)!r} was already decided ({current.status.value} by "
            f"{_s(current.approver)} at {_when(current.decided_at)}); the first decision "
            f"stands ({ApprovalAlreadyDecided.code})"
        ) from None
    except ApprovalExpired:
        current = await _get_approval(store, approval_id)
        raise CliFailure(
            f"approval {_s(approval_id)!r} expired at {_when(current.expires_at)} and can no "
            f"longer be decided ({ApprovalExpired.code})"
        ) from None
    if args.json:
        _emit_json(approval_json(record, now))
    else:
        print(f"{record.status.value} {_s(approval_id)} by {_s(record.approver)}")
        print(
            f"resume with: callgate operations resume {_s(record.operation_id)} "
            "--registry MODULE:ATTR (and the same --store)"
        )
    return 0


# --- operations ---------------------------------------------------------------------------


async def _get_operation(store: Store, operation_id: str) -> OperationRecord:
    record = await store.get_operation(operation_id)
    if record is None:
        raise CliFailure(f"no operation {_s(operation_id)!r} in this store")
    return record


async def _operations_list(args: argparse.Namespace, store: Store) -> int:
    found = await store.list_operations(args.state, limit=args.limit + 1)
    records = _cut(list(found), args.limit, "operations")
    if args.json:
        _emit_json([operation_json(r) for r in records])
    elif records:
        rows = [
            [_s(r.operation_id), _s(r.state), _s(r.tenant), _s(r.subject), _s(r.owner), updated]
            for r in records
            for updated in [_when(r.updated_at)]
        ]
        print(_table(("OPERATION", "STATE", "TENANT", "SUBJECT", "OWNER", "UPDATED"), rows))
    else:
        print("no operations match")
    return 0


def _operation_text(
    record: OperationRecord, view: dict[str, Any] | None, approvals: Sequence[ApprovalRecord]
) -> str:
    items = [
        ("operation", _s(record.operation_id)),
        ("state", _s(record.state)),
        ("tenant", _s(record.tenant)),
        ("subject", _s(record.subject)),
        ("owner", _s(record.owner)),
        ("version", f"{record.version} (fencing token {record.fencing_token})"),
        ("created", _when(record.created_at)),
        ("updated", _when(record.updated_at)),
    ]
    if view is None:
        items.append(("snapshot", f"not readable ({len(record.snapshot)} bytes)"))
    else:
        items.append(("model", f"{_s(view['provider'])} / {_s(view['model'])}"))
        stop = view["stop"]
        if stop is not None:
            raw = f" (provider: {_s(stop['provider_reason'])})" if stop["provider_reason"] else ""
            items.append(("stop", f"{_s(stop['input'])}: {_s(stop['reason'])}{raw}"))
        if view["text"]:
            items.append(("text", _s(_preview(view["text"]))))
        if view["audit_seq"] is not None:
            items.append(("audit", f"{view['audit_seq']} records, head {_s(view['audit_head'])}"))
    parts = [_pairs(items)]
    now = time.time()
    if approvals:
        parts.append("approvals\n" + _table(_APPROVAL_HEADERS, _approval_rows(approvals, now)))
    if view is not None and view["proposed"] and record.state == OpState.WAITING_APPROVAL:
        rows = [[_s(c["call_id"]), _s(c["name"])] for c in view["proposed"]]
        parts.append("paused turn\n" + _table(("CALL", "TOOL"), rows))
    if view is not None and view["calls"]:
        fields = ("turn", "call_id", "tool", "status", "approval_id", "idempotency_key")
        rows = [[_s(c[k]) for k in fields] for c in view["calls"]]
        headers = ("TURN", "CALL", "TOOL", "STATUS", "APPROVAL", "IDEMPOTENCY KEY")
        parts.append("calls\n" + _table(headers, rows))
    return "\n\n".join(parts)


async def _print_operation(args: argparse.Namespace, store: Store, operation_id: str) -> None:
    record = await _get_operation(store, operation_id)
    approvals = await store.list_approvals(operation_id=operation_id, limit=1000)
    view = snapshot_view(record.snapshot)
    if args.json:
        now = time.time()
        out = operation_json(record)
        out["snapshot"] = view
        out["approvals"] = [approval_json(a, now) for a in approvals]
        _emit_json(out)
    else:
        print(_operation_text(record, view, approvals))


async def _operations_show(args: argparse.Namespace, store: Store) -> int:
    await _print_operation(args, store, args.operation_id)
    return 0


def load_registry(spec: str) -> Registry:
    """The ``Registry`` named by ``MODULE:ATTR`` (ATTR may be dotted, and may name a
    zero-argument function returning the registry). Refusals are ``CliFailure`` (status 2)."""
    module_name, sep, attr = spec.partition(":")
    if not (sep and module_name and attr):
        raise CliFailure(f"--registry must be MODULE:ATTR, got {spec!r}", 2)
    # A console-script entry point does not put the working directory on sys.path the
    # way ``python -m`` does; the host's module usually lives there.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliFailure(f"--registry: cannot import {module_name!r}: {exc}", 2) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliFailure(f"--registry: {module_name!r} has no attribute {attr!r}", 2) from None
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        try:
            inspect.signature(obj).bind()
        except TypeError:
            raise CliFailure(
                f"--registry: {spec!r} is a function that takes arguments; name a Registry "
                "or a zero-argument function returning one",
                2,
            ) from None
        obj = obj()
    if not isinstance(obj, Registry):
        raise CliFailure(f"--registry: {spec!r} is a {type(obj).__name__}, not a Registry", 2)
    return obj


# ``operations resume``'s exit status when another worker's claim held the operation and
# nothing ran: a script must not read "resumed" (1 and 2 are refusals and usage errors).
RESUME_CLAIMED = 3


async def _operations_resume(args: argparse.Namespace, store: Store) -> int:
    # Imported here: only resume needs the run loop (and its HTTP client).
    from .runtime.audit_sink import JsonlAuditSink  # noqa: PLC0415
    from .runtime.loop import Runner  # noqa: PLC0415

    registry = load_registry(args.registry)
    secret = secret_from_env(args.secret_env) if args.secret_env else None
    audit_secret = secret_from_env(args.audit_secret_env) if args.audit_secret_env else None
    record = await _get_operation(store, args.operation_id)
    view = snapshot_view(record.snapshot) or {}
    provider = args.provider or view.get("provider")
    model = args.model or view.get("model")
    if provider not in PROVIDERS:
        raise CliFailure(f"pass --provider (one of {', '.join(PROVIDERS)})", 2)
    if not isinstance(model, str) or not model:
        raise CliFailure("pass --model (the snapshot does not name one)", 2)
    if record.state in {s.value for s in TERMINAL}:
        print(
            f"operation {_s(record.operation_id)} is {_s(record.state)}, not waiting for "
            "approval: nothing to resume",
            file=sys.stderr,
        )
        await _print_operation(args, store, record.operation_id)
        return 0  # (no runner: it would ask for a provider key it has no use for)
    if record.state != OpState.WAITING_APPROVAL:
        # The runner settles an operation no drive holds any more (it ends escalated).
        print(
            f"operation {_s(record.operation_id)} is {_s(record.state)}, not waiting for "
            "approval: it ends escalated if no drive holds it",
            file=sys.stderr,
        )
    if args.audit_file:
        # The sink opens its file at the first record, mid-drive; refuse a path it cannot
        # append to before anything runs (failure_text would blame the store for it).
        try:
            with open(args.audit_file, "ab"):  # noqa: ASYNC230 - one open, before the drive
                pass
        except OSError as exc:
            raise CliFailure(f"--audit-file: cannot open it: {exc.strerror}", 2) from None
    sink = JsonlAuditSink(args.audit_file) if args.audit_file else None
    try:
        runner = Runner(
            provider=provider,
            model=model,
            registry=registry,
            store=store,
            binding_secret=secret,
            audit=None if sink is None else sink.write,
            audit_secret=audit_secret,
            claim_stale_after=args.claim_stale_after,
        )
        # (A snapshot this callgate cannot read is a StoreError: one line, nothing resumed.)
        result = await runner.resume(record.operation_id)
    finally:
        if sink is not None:
            await sink.aclose()
    if result.state not in TERMINAL:
        now_held = await store.get_operation(record.operation_id)
        if now_held is not None and now_held.owner is not None:
            # Not ours to drive: another worker's claim (alive, or dead and not yet stale).
            print(
                f"operation {_s(record.operation_id)} is claimed by worker "
                f"{_s(now_held.owner)} since {_when(now_held.updated_at)}; nothing was "
                "resumed (--claim-stale-after SECONDS takes over a claim of a dead worker)",
                file=sys.stderr,
            )
            await _print_operation(args, store, record.operation_id)
            return RESUME_CLAIMED
        elif result.state is OpState.WAITING_APPROVAL:
            pending = ", ".join(_s(a) for a in result.pending_approvals)
            print(
                f"operation {_s(record.operation_id)} is still waiting for approval"
                + (f": {pending}" if pending else ""),
                file=sys.stderr,
            )
    await _print_operation(args, store, record.operation_id)
    return 0


# --- argument parsing ---------------------------------------------------------------------


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # No %(default)s: the environment's URL may carry a password.
    common.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help=f"sqlite:///path or postgresql://… (default: ${STORE_ENV}, else {DEFAULT_STORE_URL})",
    )
    common.add_argument("--json", action="store_true", help="print one JSON document")
    return common


# A listing's ceiling: a larger --limit (2**63 - 1) overflowed the store's integer.
MAX_LIMIT = 1_000_000


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to {MAX_LIMIT}, got {text}")
    return value


def _leaf(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help_text: str,
    handler: Handler,
    common: argparse.ArgumentParser,
) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text, parents=[common])
    p.set_defaults(func=lambda args: _run_with_store(args, handler), command_name=p.prog)
    return p


def add_admin_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``approvals`` and ``operations`` on the top-level subparsers."""
    common = _common()
    approvals = sub.add_parser("approvals", help="list, show and decide pending approvals")
    asub = approvals.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = _leaf(asub, "list", "list approvals, oldest first", _approvals_list, common)
    p.add_argument("--status", choices=[s.value for s in ApprovalStatus])
    p.add_argument("--operation", metavar="ID", help="only this operation's approvals")
    p.add_argument(
        "--limit", type=_positive, default=100, metavar="N", help="at most N rows (default 100)"
    )
    p = _leaf(asub, "show", "show one approval", _approvals_show, common)
    p.add_argument("approval_id", metavar="ID")
    p = _leaf(
        asub, "approve", "approve a pending call (first decision wins)", _approvals_decide, common
    )
    p.add_argument("approval_id", metavar="ID")
    p.add_argument("--approver", required=True, metavar="NAME")
    p.add_argument("--reason", metavar="TEXT")
    p.set_defaults(approve=True)
    p = _leaf(asub, "deny", "deny a pending call (first decision wins)", _approvals_decide, common)
    p.add_argument("approval_id", metavar="ID")
    p.add_argument("--approver", required=True, metavar="NAME")
    p.add_argument("--reason", required=True, metavar="TEXT")
    p.set_defaults(approve=False)

    operations = sub.add_parser("operations", help="list, show and resume operations")
    osub = operations.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = _leaf(osub, "list", "list operations, oldest first", _operations_list, common)
    p.add_argument("--state", choices=[s.value for s in OpState])
    p.add_argument(
        "--limit", type=_positive, default=100, metavar="N", help="at most N rows (default 100)"
    )
    p = _leaf(osub, "show", "show one operation, its approvals and calls", _operations_show, common)
    p.add_argument("operation_id", metavar="ID")
    p = _leaf(
        osub,
        "resume",
        "continue an operation paused for approval (any worker, any process); exit "
        f"status {RESUME_CLAIMED} when another worker holds it and nothing was resumed",
        _operations_resume,
        common,
    )
    p.add_argument("operation_id", metavar="ID")
    p.add_argument(
        "--registry",
        required=True,
        metavar="MODULE:ATTR",
        help="the host's tool Registry (or a zero-argument function returning it)",
    )
    p.add_argument("--provider", choices=PROVIDERS, help="default: the operation's own")
    p.add_argument("--model", help="default: the operation's own")
    p.add_argument(
        "--claim-stale-after",
        type=_seconds,
        metavar="SECONDS",
        help="take over a claim its worker has not written for this long (it died); set it "
        "above your longest drive (the Runner's claim_stale_after); default: never",
    )
    p.add_argument(
        "--binding-secret-env",
        "--secret-env",
        dest="secret_env",
        metavar="VAR",
        help="env var holding the binding secret (the Runner's binding_secret)",
    )
    p.add_argument(
        "--audit-file",
        metavar="PATH",
        help="append this run's audit records (JSON lines) to the operation's trail file",
    )
    p.add_argument(
        "--audit-secret-env",
        metavar="VAR",
        help="env var holding the audit chain's HMAC secret (the Runner's audit_secret): "
        "pass it when the operation's trail is keyed, or the records this resume appends "
        "will not verify",
    )
