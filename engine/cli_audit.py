"""``callgate audit verify``: check a JSON-lines audit trail's hash chain and name the first
record that does not fit, with its line number in the file.

A trail is what ``runtime.audit_sink.JsonlAuditSink`` writes: one record per line, blank
lines ignored. The run loop chains each operation's records separately, so a file shared by
several operations holds several chains: ``--operation ID`` verifies one of them,
``--by-operation`` all of them; by default the whole file must be one chain.

It owns: reading the file line by line (memory stays flat for one chain), mapping record
positions back to line numbers, the host secret from an environment variable, and the
result lines and exit statuses (0 intact, 1 broken or without a single record, 2 unusable
input).

It must never print a record's content or the secret: only positions, line numbers, digests
and ``verify_trail``'s reasons (which never quote data).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterable, Iterator
from typing import IO, Any

import msgspec

from .cli_output import say_json, say_line, say_lines, warn
from .core.audit import VerifyReport, escape_controls, verify_trail

__all__ = [
    "ChainReport",
    "CliFailure",
    "add_audit_commands",
    "is_utf8_text",
    "secret_from_env",
    "verify_file",
]


def is_utf8_text(text: str) -> bool:
    """Whether a command-line ``text`` is UTF-8: bytes that are not are kept by Python as
    lone surrogates, which no store, JSON encoder or terminal accepts."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class CliFailure(Exception):
    """A refusal the CLI prints as one line (``callgate <command>: <message>``), exiting
    with ``status`` (1: refused or not found, 2: unusable input)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def secret_from_env(var: str) -> bytes:
    """The bytes of environment variable ``var`` exactly as the process got them (never
    printed; any bytes, not only UTF-8: a host may export a raw random key); unset or empty
    is a ``CliFailure`` (status 2) naming the variable."""
    if os.supports_bytes_environ:
        value = os.environb.get(os.fsencode(var), b"")
    else:  # pragma: no cover - Windows: the environment is text
        value = os.environ.get(var, "").encode("utf-8", "surrogatepass")
    if not value:
        raise CliFailure(f"environment variable {var} is not set or empty", 2)
    return value


class ChainReport(msgspec.Struct, frozen=True, kw_only=True):
    """One chain's verdict. ``first_broken`` is the position of the first bad record within
    the chain and ``line`` its 1-based line in the file (None when the chain ended before
    ``--expected-head``: nothing there to point at). ``last_line`` is the last line read."""

    operation_id: str | None
    ok: bool
    records: int
    head: str | None
    first_broken: int | None = None
    line: int | None = None
    last_line: int = 0
    reason: str = ""

    def describe(self) -> str:
        if self.ok:
            return f"ok: {self.records} records, head {self.head}"
        if self.first_broken is None:
            return self.reason if self.line is None else f"line {self.line}: {self.reason}"
        where = f"line {self.line}" if self.line is not None else f"after line {self.last_line}"
        reason = self.reason.removeprefix(f"record {self.first_broken} ")
        return f"record {self.first_broken} ({where}): {reason}"


class _OperationOf(msgspec.Struct):
    """Only the field a record is grouped by (other fields are not decoded here)."""

    operation_id: str


_OPERATION_OF = msgspec.json.Decoder(_OperationOf)
_UNATTRIBUTABLE = "is not an audit record (cannot tell which operation it belongs to)"


def _operation_of(raw: bytes) -> str | None:
    try:
        return _OPERATION_OF.decode(raw).operation_id
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


# Far above any record callgate writes; a longer "line" (a corrupt or hostile trail,
# /dev/zero, a FIFO) is refused instead of read into memory whole.
MAX_LINE_BYTES = 64 * 1024 * 1024


def _numbered(handle: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    number = 0
    while raw := handle.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(raw) > MAX_LINE_BYTES:
            raise CliFailure(f"line {number} is longer than {MAX_LINE_BYTES} bytes", 2)
        if raw.strip():
            yield number, raw


class _Unattributable(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


def _verify_chain(
    lines: Iterable[tuple[int, bytes]],
    *,
    operation_id: str | None,
    secret: bytes | None,
    expected_head: str | None,
) -> ChainReport:
    seen = 0
    last_line = 0

    def records() -> Iterator[bytes]:
        nonlocal seen, last_line
        for number, raw in lines:
            seen += 1
            last_line = number
            yield raw

    report: VerifyReport = verify_trail(records(), secret=secret, expected_head=expected_head)
    broken = report.first_broken
    return ChainReport(
        operation_id=operation_id,
        ok=report.ok,
        records=report.count,
        head=report.head,
        first_broken=broken,
        # verify_trail stops right after reading the bad record, so it was the last line
        # read; when nothing past the last record was read, the break is the missing tail.
        line=last_line if broken is not None and seen > broken else None,
        last_line=last_line,
        reason=report.reason,
    )


class _Only:
    """The lines of one operation. Records store ``escape_controls(operation_id)`` (ids
    are escaped like every string in a record), so that is what is compared."""

    def __init__(self, lines: Iterable[tuple[int, bytes]], operation_id: str) -> None:
        self._lines = lines
        self._wanted = escape_controls(operation_id)
        self.matched = 0

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        for number, raw in self._lines:
            found = _operation_of(raw)
            if found is None:
                raise _Unattributable(number)
            if found == self._wanted:
                self.matched += 1
                yield number, raw


def verify_file(
    handle: IO[bytes],
    *,
    secret: bytes | None = None,
    expected_head: str | None = None,
    operation_id: str | None = None,
    by_operation: bool = False,
) -> list[ChainReport]:
    """Verify the trail in ``handle``: one report for the whole file (or for
    ``operation_id``'s records), or with ``by_operation`` one per operation in order of
    first appearance (a line that names no operation is a failed report of its own). A
    file without records fails (one report), unless ``expected_head`` is ``GENESIS``."""
    lines = _numbered(handle)
    if not by_operation:
        only = None if operation_id is None else _Only(lines, operation_id)
        try:
            report = _verify_chain(
                lines if only is None else only,
                operation_id=operation_id,
                secret=secret,
                expected_head=expected_head,
            )
        except _Unattributable as exc:
            return [_unattributable(exc.line)]
        if only is not None and only.matched == 0:
            # "ok: 0 records" would pass a trail that lost every record of the operation
            # (or a mistyped id): nothing verified is a failure.
            return [
                ChainReport(
                    operation_id=operation_id,
                    ok=False,
                    records=0,
                    head=None,
                    last_line=report.last_line,
                    reason=f"no record in the file belongs to operation {operation_id!r}",
                )
            ]
        if report.ok and report.records == 0 and expected_head is None:
            return [_no_records()]
        return [report]
    groups: dict[str, list[tuple[int, bytes]]] = {}
    for number, raw in lines:
        found = _operation_of(raw)
        if found is None:
            return [_unattributable(number)]
        groups.setdefault(found, []).append((number, raw))
    if not groups:
        return [_no_records()]
    return [
        _verify_chain(group, operation_id=op, secret=secret, expected_head=None)
        for op, group in groups.items()
    ]


def _no_records() -> ChainReport:
    """A trail without a single record (an empty file, or blank lines only): "ok: 0
    records" would pass a trail that lost everything, or the wrong file. Only a head kept
    elsewhere can say a trail is meant to be empty (``--expected-head`` of the start of a
    chain, ``GENESIS``: ``verify_trail`` checks that)."""
    return ChainReport(
        operation_id=None,
        ok=False,
        records=0,
        head=None,
        reason="no records: the file is empty or holds only blank lines, and a trail "
        "without records proves nothing",
    )


def _unattributable(line: int) -> ChainReport:
    return ChainReport(
        operation_id=None,
        ok=False,
        records=0,
        head=None,
        line=line,
        last_line=line,
        reason=_UNATTRIBUTABLE,
    )


def _shown(stored: str) -> str:
    """An operation id as a record stores it (``escape_controls`` of the real id), for the
    terminal: the real id when it had no control characters (what ``--operation`` takes),
    else the stored form as it is. A line that does not verify may hold anything: what
    no honest record could store is escaped again (it could otherwise forge a line)."""
    if escape_controls(stored) != stored.replace("\\", "\\\\"):
        return escape_controls(stored)  # raw control characters: not an honest record's
    real = stored.replace("\\\\", "\\")
    return real if escape_controls(real) == stored else stored


def _several_operations(path: str, report: ChainReport) -> bool:
    """Whether a single-chain failure is really a file holding several operations' chains
    (the first record and the broken one belong to different operations)."""
    if report.line is None:
        return False
    first: str | None = None
    broken: str | None = None
    with open(path, "rb") as handle:
        for number, raw in _numbered(handle):
            if first is None:
                first = _operation_of(raw)
            if number == report.line:
                broken = _operation_of(raw)
                break
    return first is not None and broken is not None and first != broken


def _report_json(r: ChainReport) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(r)
    out.pop("last_line")
    return out


_HEAD = re.compile("[0-9a-f]{64}")


def _cmd_verify(args: argparse.Namespace) -> int:
    prog = "callgate audit verify"
    try:
        if args.by_operation and args.expected_head is not None:
            raise CliFailure("--expected-head needs one chain: use --operation ID", 2)
        if args.expected_head is not None and not _HEAD.fullmatch(args.expected_head):
            # A shortened or upper-case head would fail an intact trail as "cut".
            raise CliFailure("--expected-head must be the full digest: 64 lowercase hex", 2)
        if args.operation is not None and not is_utf8_text(args.operation):
            raise CliFailure("argument --operation is not valid UTF-8 text", 2)
        secret = secret_from_env(args.secret_env) if args.secret_env else None
        try:
            with open(args.file, "rb") as handle:
                reports = verify_file(
                    handle,
                    secret=secret,
                    expected_head=args.expected_head,
                    operation_id=args.operation,
                    by_operation=args.by_operation,
                )
        except OSError as exc:
            raise CliFailure(f"cannot read {args.file}: {exc.strerror}", 2) from None
    except CliFailure as exc:
        warn(f"{prog}: {exc}")
        return exc.status
    ok = all(r.ok for r in reports)
    if args.json:
        out: dict[str, Any] = {"ok": ok, "records": sum(r.records for r in reports)}
        if args.by_operation:
            out["operations"] = [_report_json(r) for r in reports]
        else:
            out.update(_report_json(reports[0]))
        say_json(out)
        return 0 if ok else 1
    if not args.by_operation:
        (report,) = reports
        say_line(report.describe())
        if not report.ok and args.operation is None and _several_operations(args.file, report):
            warn(
                f"{prog}: this file holds several operations' trails (each is its own "
                "chain): verify one with --operation ID, or all with --by-operation"
            )
        return 0 if report.ok else 1
    total = sum(r.records for r in reports)
    lines = [f"ok: {total} records in {len(reports)} operations"] if ok else []
    # (One line per operation: an id is outside text, so each is escaped whole.)
    lines += [
        f"{_shown(r.operation_id) if r.operation_id else '-'}: {r.describe()}" for r in reports
    ]
    say_lines(lines)
    return 0 if ok else 1


_VERIFY_TEXT = """\
Check a JSON-lines audit trail (what Runner(audit=...) writes) and name the first
record that does not fit its hash chain, with its line number. A file shared by
several operations holds one chain each: --operation ID checks one, --by-operation
all. A file without a single record fails: it proves nothing (an --expected-head of
64 zeros, the start of a chain, says it is meant to be empty)."""

_VERIFY_STATUSES = """\
exit status:
  0  intact
  1  broken, or no records
  2  unusable input (an unreadable file, a line over 64 MiB, a bad option), or the
     answer could not be written to standard output"""


def add_audit_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``audit verify`` on the top-level subparsers."""
    audit = sub.add_parser(
        "audit",
        help="verify a tamper-evident audit trail",
        description="Verify a tamper-evident audit trail (JSON lines, hash-chained).",
    )
    asub = audit.add_subparsers(dest="action", required=True, metavar="ACTION")
    # Raw: laid out as written (the default formatter re-wraps it into one paragraph).
    p = asub.add_parser(
        "verify",
        help="check a JSON-lines trail's hash chain",
        description=_VERIFY_TEXT,
        epilog=_VERIFY_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--secret-env", metavar="VAR", help="env var holding the chain's HMAC secret (its bytes)"
    )
    p.add_argument(
        "--expected-head",
        metavar="DIGEST",
        help="the head digest kept elsewhere: detects records removed from the end",
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--operation", metavar="ID", help="verify only this operation's chain")
    scope.add_argument("--by-operation", action="store_true", help="verify every operation's chain")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_verify, command_name="callgate audit verify")
