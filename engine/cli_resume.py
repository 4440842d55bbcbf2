"""``callgate operations resume``: continue an operation paused for approval from the
command line, with a host's tool registry (``--registry MODULE:ATTR``), and say by the exit
status where the operation stands afterwards.

It owns: loading the registry, the resume's refusals before anything runs (provider,
model, audit file, an ended operation's unreadable snapshot), and the exit statuses a
script reads (``RESUME_STATUSES``). It never prints a conversation or a call's arguments
(the operation's view is ``cli_views``'), and never asks for a provider key for an
operation that has already ended (no runner is built for it).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from typing import Any

from .cli_audit import CliFailure, secret_from_env
from .cli_output import ANSWER_LOST, answer_of, warn
from .cli_views import get_operation, print_operation, shown, snapshot_view, when
from .core.adapter import PROVIDERS
from .core.audit import AuditRecord
from .core.registry import Registry
from .core.states import TERMINAL, OpState
from .runtime.operation import OperationResult
from .store.base import OperationRecord, Store

__all__ = [
    "RESUME_CLAIMED",
    "RESUME_ENDED_BADLY",
    "RESUME_STATUSES",
    "RESUME_WAITING",
    "load_registry",
    "operations_resume",
]

# A script reads the status, not the text: 0 must mean the operation is fine — it
# completed, or it moved on (the decided calls ran) and now waits on new approvals.
# An operation that ended anything but completed is a failure to report (1, as a
# refusal is), now or when an earlier resume ended it.
RESUME_ENDED_BADLY = 1
# Another worker's claim held it and nothing ran: not "resumed" (a retry later may run it).
RESUME_CLAIMED = 3
# It still waits on an approval of the same pause (nobody decided yet): nothing ran.
RESUME_WAITING = 5

RESUME_STATUSES = f"""\
exit status:
  0  the operation completed (now, or before this resume), or it moved on: the
     decided calls were acted on and it waits on new approvals
  1  refused (store, record, secret, an unreadable snapshot): nothing was resumed;
     or the operation ended refused, incomplete, failed or escalated (now, or
     before this resume); or --audit-file could not be written mid-resume (calls
     may have run: a later resume answers them from the ledger)
  2  usage error: nothing was resumed
  {RESUME_CLAIMED}  another worker holds its claim: nothing was resumed
  {ANSWER_LOST}  it was resumed, but the answer could not be written to standard output
  {RESUME_WAITING}  it still waits on an approval nobody has decided: nothing ran"""


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


def _audit_failure(exc: OSError) -> CliFailure:
    """The audit file's failure, said as such (``failure_text`` would blame the store)."""
    return CliFailure(
        f"--audit-file: cannot write to it ({exc.strerror or exc}); the resume stopped, "
        "and calls it had acted on may have run (a later resume answers them from the "
        "ledger, never running them again)"
    )


def _ended_status(state: str) -> int:
    return 0 if state == OpState.COMPLETED.value else RESUME_ENDED_BADLY


async def _already_ended(
    args: argparse.Namespace, store: Store, record: OperationRecord, view: dict[str, Any] | None
) -> int:
    """An operation that had ended before this resume: nothing runs (no runner: it would
    ask for a provider key it has no use for); the status says how it ended."""
    op = shown(record.operation_id)
    if view is None:
        # Its end is in the snapshot: one this callgate cannot read says nothing a script
        # could trust, and passing --provider would not make it readable.
        raise CliFailure(
            f"operation {op} is {shown(record.state)}, but its stored snapshot is not "
            f"readable ({len(record.snapshot)} bytes): nothing to resume, and nothing "
            "tells how it ended"
        )
    warn(f"operation {op} is {shown(record.state)}, not waiting for approval: nothing to resume")
    await print_operation(store, record.operation_id, as_json=args.json)
    return _ended_status(record.state)


def _still_waiting(result: OperationResult, paused_on: set[str]) -> bool:
    """Whether the resume left the operation on the pause it found (an approval of it is
    still undecided), rather than running the decided calls into a new pause (whose
    approvals are new ids)."""
    return result.state is OpState.WAITING_APPROVAL and set(result.pending_approvals) <= paused_on


def _verdict(result: OperationResult, paused_on: set[str]) -> tuple[int, str | None]:
    """The exit status and the stderr note for where a resume left the operation."""
    op = shown(result.operation_id)
    pending = ", ".join(shown(a) for a in result.pending_approvals)
    if _still_waiting(result, paused_on):
        return RESUME_WAITING, (
            f"operation {op} is still waiting for approval"
            + (f": {pending}" if pending else "")
            + "; nothing ran"
        )
    if result.state is OpState.WAITING_APPROVAL:
        return 0, f"operation {op} ran its decided calls and waits for approval again: {pending}"
    if result.state is OpState.COMPLETED:
        return 0, None
    why = f": {shown(result.stop.reason)}" if result.stop is not None and result.stop.reason else ""
    return RESUME_ENDED_BADLY, f"operation {op} ended {shown(result.state.value)}{why}"


async def operations_resume(args: argparse.Namespace, store: Store) -> int:
    # Imported here: only resume needs the run loop (and its HTTP client).
    from .runtime.audit_sink import JsonlAuditSink  # noqa: PLC0415
    from .runtime.loop import Runner, sendable_model  # noqa: PLC0415

    registry = load_registry(args.registry)
    secret = secret_from_env(args.secret_env) if args.secret_env else None
    audit_secret = secret_from_env(args.audit_secret_env) if args.audit_secret_env else None
    record = await get_operation(store, args.operation_id)
    view = snapshot_view(record.snapshot)
    if record.state in {s.value for s in TERMINAL}:
        return await _already_ended(args, store, record, view)
    view = view or {}
    provider = args.provider or view.get("provider")
    model = args.model or view.get("model")
    if provider not in PROVIDERS:
        raise CliFailure(f"pass --provider (one of {', '.join(PROVIDERS)})", 2)
    if not sendable_model(model):
        # (The Runner would refuse it too, with an exit status that reads "ended badly".)
        raise CliFailure("pass --model (the snapshot names none a request can carry)", 2)
    if record.state != OpState.WAITING_APPROVAL:
        # The runner settles an operation no drive holds any more (it ends escalated).
        warn(
            f"operation {shown(record.operation_id)} is {shown(record.state)}, not waiting "
            "for approval: it ends escalated if no drive holds it"
        )
    if args.audit_file:
        # The sink opens its file at the first record, mid-drive; refuse a path it cannot
        # append to before anything runs (failure_text would blame the store for it).
        try:
            with open(args.audit_file, "ab"):  # noqa: ASYNC230 - one open, before the drive
                pass
        except OSError as exc:
            raise CliFailure(f"--audit-file: cannot open it: {exc.strerror}", 2) from None
    paused_on = set(view.get("waiting_on", {}).values())
    sink = JsonlAuditSink(args.audit_file) if args.audit_file else None

    async def audit(record: AuditRecord) -> None:
        assert sink is not None
        try:
            await sink.write(record)
        except OSError as exc:
            raise _audit_failure(exc) from None

    try:
        runner = Runner(
            provider=provider,
            model=model,
            registry=registry,
            store=store,
            binding_secret=secret,
            audit=None if sink is None else audit,
            audit_secret=audit_secret,
            claim_stale_after=args.claim_stale_after,
        )
        # (A snapshot this callgate cannot read is a StoreError: one line, nothing resumed.)
        result = await runner.resume(record.operation_id)
    finally:
        if sink is not None:
            try:
                await sink.aclose()
            except OSError as exc:  # (what a failed write left in its buffer)
                raise _audit_failure(exc) from None
    if result.state not in TERMINAL:
        now_held = await store.get_operation(record.operation_id)
        owner = None if now_held is None else now_held.owner
        if result.busy or owner is not None:
            # Not ours to drive: another worker's claim (alive, or dead and not yet stale),
            # or another drive that has just let go of it.
            held = (
                "was being resumed by another worker"
                if now_held is None or owner is None
                else f"is claimed by worker {shown(owner)} since {when(now_held.updated_at)}"
            )
            warn(
                f"operation {shown(record.operation_id)} {held}; nothing was resumed "
                "(--claim-stale-after SECONDS takes over a claim of a dead worker)"
            )
            await print_operation(store, record.operation_id, as_json=args.json)
            return RESUME_CLAIMED
    status, note = _verdict(result, paused_on)
    if note is not None:
        warn(note)
    if status == RESUME_WAITING:  # nothing ran: a lost answer is a read-only one
        await print_operation(store, record.operation_id, as_json=args.json)
        return status
    done = f"the resume of operation {shown(record.operation_id)} (now {result.state.value})"
    with answer_of(done):
        await print_operation(store, record.operation_id, as_json=args.json)
    return status
