"""``callgate approvals …`` and ``callgate operations …``: the operator's view of the durable
store — list, show and decide approvals; list, show and resume operations.

It owns: the store URL option (``--store``, else env ``CALLGATE_STORE``, else
``sqlite:///./callgate.db``), the aligned-text and ``--json`` views of store records, the
defensive reading of an operation's snapshot (the views are ``cli_views``'; ``operations
resume`` is ``cli_resume``'s), and turning every refusal into one line on stderr with exit
status 1 (usage problems: 2) — never a traceback (the mapping is in ``cli_errors``). What a
command prints goes through ``cli_output`` (terminal-safe lines; a failed write of an
answer is never blamed on the store).

It must never: show a store URL except through ``redact_url`` (nor a password quoted inside
a driver's error text), print a conversation or a call's arguments (they may hold personal
data; the redacted audit trail is the place for those), create a SQLite database on a
listing or a decision (a mistyped path would quietly show an empty store), migrate a
database (every command opens the store with ``migrate=False``: the engine migrates), or
import ``callgate.adapters`` (the run loop resolves providers by name).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import anyio

from .cli_audit import CliFailure
from .cli_errors import failure_text, innermost, refuse_undecodable, scrub
from .cli_output import ANSWER_LOST, CliParser, answer_of, say, say_json, warn
from .cli_resume import RESUME_STATUSES, load_registry, operations_resume
from .cli_views import (
    APPROVAL_HEADERS,
    approval_json,
    approval_rows,
    approval_text,
    operation_json,
    print_operation,
    shown,
    snapshot_view,
    table,
    when,
)
from .core.adapter import PROVIDERS
from .core.states import OpState
from .store.base import ApprovalRecord, ApprovalStatus, Store
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
        warn(f"{command}: {scrub(text, url)}")
        return status


# --- approvals ----------------------------------------------------------------------------


def _cut(records: list[_R], limit: int, what: str) -> list[_R]:
    """The first ``limit`` of ``records`` (asked for one more than that); a note on stderr
    when more match, so a long list never looks complete (oldest first: the newest
    entries are the ones left out)."""
    if len(records) <= limit:
        return records
    warn(f"more than {limit} {what} match: the oldest {limit} are shown (pass --limit N)")
    return records[:limit]


async def _approvals_list(args: argparse.Namespace, store: Store) -> int:
    status = None if args.status is None else ApprovalStatus(args.status)
    found = await store.list_approvals(status, operation_id=args.operation, limit=args.limit + 1)
    records = _cut(list(found), args.limit, "approvals")
    now = time.time()
    if args.json:
        say_json([approval_json(r, now) for r in records])
    elif records:
        say(table(APPROVAL_HEADERS, approval_rows(records, now)))
    else:
        say("no approvals match")
    return 0


async def _get_approval(store: Store, approval_id: str) -> ApprovalRecord:
    record = await store.get_approval(approval_id)
    if record is None:
        raise CliFailure(f"no approval '{shown(approval_id)}' in this store")
    return record


async def _approvals_show(args: argparse.Namespace, store: Store) -> int:
    record = await _get_approval(store, args.approval_id)
    now = time.time()
    if args.json:
        say_json(approval_json(record, now))
    else:
        say(approval_text(record, now))
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
            f"approval '{shown(approval_id)}' was already decided ({current.status.value} by "
            f"{shown(current.approver)} at {when(current.decided_at)}); the first decision "
            f"stands ({ApprovalAlreadyDecided.code})"
        ) from None
    except ApprovalExpired:
        current = await _get_approval(store, approval_id)
        raise CliFailure(
            f"approval '{shown(approval_id)}' expired at {when(current.expires_at)} and can no "
            f"longer be decided ({ApprovalExpired.code})"
        ) from None
    decision = f"{record.status.value} {shown(approval_id)} by {shown(record.approver)}"
    # From here the decision is durable: an answer that cannot be written must say so,
    # never "store …" (exit ANSWER_LOST, see cli_output).
    with answer_of(f"the decision ({decision})"):
        if args.json:
            say_json(approval_json(record, now))
        else:
            say(
                f"{decision}\n"
                f"resume with: callgate operations resume {shown(record.operation_id)} "
                "--registry MODULE:ATTR (and the same --store)"
            )
    return 0


# --- operations ---------------------------------------------------------------------------


async def _operations_list(args: argparse.Namespace, store: Store) -> int:
    found = await store.list_operations(args.state, limit=args.limit + 1)
    records = _cut(list(found), args.limit, "operations")
    if args.json:
        say_json([operation_json(r) for r in records])
    elif records:
        rows = [
            [*map(shown, (r.operation_id, r.state, r.tenant, r.subject, r.owner)), updated]
            for r in records
            for updated in [when(r.updated_at)]
        ]
        say(table(("OPERATION", "STATE", "TENANT", "SUBJECT", "OWNER", "UPDATED"), rows))
    else:
        say("no operations match")
    return 0


async def _operations_show(args: argparse.Namespace, store: Store) -> int:
    await print_operation(store, args.operation_id, as_json=args.json)
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
    common = CliParser(add_help=False)
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


# What a listing or a show exits with, and what a decision adds (--help's epilog).
_READ_STATUSES = """\
exit status:
  0  done
  1  refused (store, record)
  2  usage error, or the answer could not be written (nothing was changed)"""
_DECIDE_STATUSES = f"""\
exit status:
  0  decided
  1  refused (store, record; already decided; expired): nothing was decided
  2  usage error: nothing was decided
  {ANSWER_LOST}  the decision was recorded, but its answer could not be written to
     standard output (do not decide again: approvals show ID reads it back)"""


def _leaf(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help_text: str,
    handler: Handler,
    common: argparse.ArgumentParser,
    *,
    description: str | None = None,
    statuses: str = _READ_STATUSES,
) -> argparse.ArgumentParser:
    # Raw: the description and the exit statuses are laid out as written (argparse's
    # default formatter re-wraps them into one paragraph).
    p = sub.add_parser(
        name,
        help=help_text,
        description=description or help_text,
        epilog=statuses,
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=lambda args: _run_with_store(args, handler), command_name=p.prog)
    return p


def _group(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help_text: str, text: str
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    group = sub.add_parser(
        name,
        help=help_text,
        description=text,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return group.add_subparsers(dest="action", required=True, metavar="ACTION")


_APPROVALS_TEXT = """\
List, show and decide the approvals of calls paused for a human. A decision is
final (the first one wins); resume the operation afterwards (operations resume).
Every action reads --store URL (default $CALLGATE_STORE, else
sqlite:///./callgate.db) and never creates or migrates a database."""

_OPERATIONS_TEXT = """\
List and show the operations in the store, and resume one paused for approval
(from any worker, in any process). Every action reads --store URL (default
$CALLGATE_STORE, else sqlite:///./callgate.db) and never creates or migrates a
database."""

_RESUME_TEXT = """\
Continue an operation paused for approval (any worker, any process): it acts on
the decisions of its approvals and asks the model again. The operation's view is
printed afterwards; the exit status says where the operation was left."""


def add_admin_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``approvals`` and ``operations`` on the top-level subparsers."""
    common = _common()
    asub = _group(sub, "approvals", "list, show and decide pending approvals", _APPROVALS_TEXT)
    p = _leaf(asub, "list", "list approvals, oldest first", _approvals_list, common)
    p.add_argument("--status", choices=[s.value for s in ApprovalStatus])
    p.add_argument("--operation", metavar="ID", help="only this operation's approvals")
    p.add_argument(
        "--limit", type=_positive, default=100, metavar="N", help="at most N rows (default 100)"
    )
    p = _leaf(asub, "show", "show one approval", _approvals_show, common)
    p.add_argument("approval_id", metavar="ID")
    p = _leaf(
        asub,
        "approve",
        "approve a pending call (first decision wins)",
        _approvals_decide,
        common,
        statuses=_DECIDE_STATUSES,
    )
    p.add_argument("approval_id", metavar="ID")
    p.add_argument("--approver", required=True, metavar="NAME")
    p.add_argument("--reason", metavar="TEXT")
    p.set_defaults(approve=True)
    p = _leaf(
        asub,
        "deny",
        "deny a pending call (first decision wins; --reason says why)",
        _approvals_decide,
        common,
        statuses=_DECIDE_STATUSES,
    )
    p.add_argument("approval_id", metavar="ID")
    p.add_argument("--approver", required=True, metavar="NAME")
    p.add_argument("--reason", required=True, metavar="TEXT")
    p.set_defaults(approve=False)

    osub = _group(sub, "operations", "list, show and resume operations", _OPERATIONS_TEXT)
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
        "continue an operation paused for approval (see its -h for the exit statuses)",
        operations_resume,
        common,
        description=_RESUME_TEXT,
        statuses=RESUME_STATUSES,
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
