"""The demo's plain-text output: a live progress display and the end-of-run summary.

``ProgressDisplay`` is handed to the runner twice: as its progress sink (state changes,
"preparing to call X" while arguments stream, rejections, approval requests, the end)
and as its audit writer, where it persists each record to the JSONL trail first and then
shows the tool results from the ``executed`` records. ``summary_lines`` renders the
final explanation, the terminal state against the expected one, the id table, the checks
and the audit verification.

Everything here formats; nothing decides. Text that came from the model or a tool is
shown through ``escape_controls`` so no terminal control sequence gets through.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec

from callgate.engine.core.audit import AuditRecord, VerifyReport, escape_controls
from callgate.engine.core.states import OpState

from .audit_sink import AuditSink
from .loop import CallSummary, OperationResult
from .progress import (
    ApprovalRequested,
    CallPreparing,
    CallRejected,
    OperationEnded,
    ProgressEvent,
    StateChanged,
    TextChunk,
    TurnRetried,
)

__all__ = ["WIDTH", "ProgressDisplay", "header", "summary_lines"]

WIDTH = 96
_LABEL = 11
_INDENT = " " * (2 + _LABEL + 1)
_MAX_RESULT_LINES = 3


def header(title: str) -> str:
    """A section rule: ``── title ─────``."""
    return f"── {title} " + "─" * max(3, WIDTH - len(title) - 4)


def _clean(text: str) -> str:
    return escape_controls(text)


def _result_text(result: Any) -> str:
    """A tool result as the model sees it, minus the ``{"result": …}`` wrapper."""
    if isinstance(result, dict) and set(result) == {"result"}:
        result = result["result"]
    elif isinstance(result, dict) and isinstance(result.get("error"), dict):
        err = result["error"]
        return f"error {err.get('code')}: {err.get('message', '')}"
    return msgspec.json.encode(result).decode()


class ProgressDisplay:
    """Prints one aligned line per thing that happens. ``emit`` is where lines go (print
    by default; the demo's child processes print to the pipe their parent relays)."""

    def __init__(
        self, sink: AuditSink | None = None, *, emit: Callable[[str], None] | None = None
    ) -> None:
        self._sink = sink
        self._emit = emit or (lambda line: print(line, flush=True))
        self._text: list[str] = []

    def line(self, label: str, text: str) -> None:
        wrapped = textwrap.wrap(
            text,
            width=WIDTH,
            initial_indent=f"  {label:<{_LABEL}} ",
            subsequent_indent=_INDENT,
            break_on_hyphens=False,
        )
        for piece in wrapped or [f"  {label}"]:
            self._emit(piece)

    def _flush_text(self) -> None:
        if self._text:
            text = "".join(self._text).strip()
            self._text.clear()
            if text:
                self.line("model", f"“{_clean(text)}”")

    async def progress(self, event: ProgressEvent) -> None:
        if isinstance(event, TextChunk):
            self._text.append(event.text)
            return
        if isinstance(event, TurnRetried):
            self._text.clear()  # the failed attempt's text is not the model's answer
            self.line("retry", f"attempt {event.attempt} failed ({_clean(event.reason)}); again")
            return
        self._flush_text()
        if isinstance(event, StateChanged):
            self.line("state", f"{event.old} → {event.new}   ({event.input})")
        elif isinstance(event, CallPreparing):
            self.line(
                "model",
                f"preparing to call {_clean(event.name)} … (arguments streaming; nothing "
                "runs before they are complete)",
            )
        elif isinstance(event, CallRejected):
            self.line("rejected", f"{_clean(event.name)} → {event.code} envelope (not executed)")
        elif isinstance(event, ApprovalRequested):
            self.line("approval", f"{event.name} needs a person: {event.approval_id}")
        elif isinstance(event, OperationEnded):
            raw = f", provider said {_clean(event.raw_reason)!r}" if event.raw_reason else ""
            self.line("ended", f"{event.state.upper()} ({_clean(event.stop_reason)}{raw})")

    async def audit(self, record: AuditRecord) -> None:
        # Persist first: the trail must hold every record even if showing one fails.
        if self._sink is not None:
            await self._sink.write(record)
        if record.kind != "executed":
            return
        self._flush_text()
        data = record.data
        status = str(data.get("status", "?"))
        ms = data.get("duration_ms")
        timing = f"{ms:.1f} ms" if isinstance(ms, int | float) else ""
        how = "ran" if data.get("ran") else "not re-run"
        detail = data.get("detail") or ""
        note = f" — {detail}" if detail else ""
        tool = _clean(record.tool or "?")
        self.line("result", f"{tool} {status} ({how}, {timing}){note}")
        result = data.get("result")
        if result is not None:
            lines = textwrap.wrap(
                _clean(_result_text(result)),
                width=WIDTH,
                initial_indent=_INDENT,
                subsequent_indent=_INDENT,
                max_lines=_MAX_RESULT_LINES,
                placeholder=" …",
            )
            for piece in lines:
                self._emit(piece)


# --- the summary -------------------------------------------------------------------------------


def _abbrev(value: str | None, keep: int = 14) -> str:
    if not value:
        return "-"
    return value if len(value) <= keep + 1 else value[:keep] + "…"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "    " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]


def _id_table(operation_id: str, calls: Sequence[CallSummary]) -> list[str]:
    out = [f"  operation id      {operation_id}   (the whole business task)"]
    if not calls:
        return [*out, "    (no call was answered)"]
    rows = [["turn", "call id", "tool", "status", "approval id", "idempotency key"]]
    rows.extend(
        [
            str(c.turn),
            _abbrev(c.call_id, 18),
            _clean(c.tool),
            c.status,
            _abbrev(c.approval_id),
            _abbrev(c.idempotency_key, 12),
        ]
        for c in calls
    )
    out.extend(_table(rows))
    keys = [c.idempotency_key for c in calls if c.idempotency_key]
    shared = {k for k in keys if keys.count(k) > 1}
    for key in sorted(shared):
        ids = ", ".join(_abbrev(c.call_id, 18) for c in calls if c.idempotency_key == key)
        out.append(f"    one idempotency key, several call ids ({ids}): the same intent")
    return out


# The recovery each terminal state leads to: a named next step, never just "an error".
_NEXT: dict[OpState, str] = {
    OpState.COMPLETED: "done; the explanation above is the answer",
    OpState.INCOMPLETE: (
        "nothing from the cut turn ran; ask again (e.g. with a larger output budget)"
    ),
    OpState.ESCALATED: "stopped safely for a person; partial results stay in the audit trail",
    OpState.REFUSED: "the model declined and nothing ran; a person reads the refusal",
    OpState.FAILED: "nothing further runs; the audit trail says why",
    OpState.WAITING_APPROVAL: "paused in the store until a person decides",
}


def summary_lines(
    *,
    result: OperationResult,
    expected: OpState,
    expected_note: str,
    checks: Iterable[tuple[bool, str]],
    audit_path: str,
    report: VerifyReport,
    head_matches: bool | None,
    result_path: str,
) -> list[str]:
    """The end-of-run report (see the module docstring)."""
    out = [header("outcome")]
    text = _clean(result.text.strip()) or "(the model said nothing)"
    label = "final explanation" if result.state is OpState.COMPLETED else "the model's last words"
    out.append(f"  {label}")
    out.extend(textwrap.wrap(text, WIDTH, initial_indent="    ", subsequent_indent="    "))
    match = result.state is expected
    out.append(f"  terminal state    {result.state.name}")
    verdict = "✓ as expected" if match else f"✗ expected {expected.name}"
    out.append(f"  expected          {expected.name} — {expected_note}   {verdict}")
    if result.stop is not None:
        raw = result.stop.provider_reason
        why = _clean(result.stop.reason) + (f" (provider: {_clean(raw)})" if raw else "")
        out.append(f"  stop reason       {why}")
    next_step = _NEXT.get(result.state)
    if next_step:
        out.append(f"  what now          {next_step}")
    out.append("")
    out.append(header("ids"))
    out.extend(_id_table(result.operation_id, result.calls))
    out.append(f"    full ids: {result_path}")
    checks = list(checks)
    if checks:
        out.append("")
        out.append(header("checks"))
        out.extend(f"  {'✓' if ok else '✗'} {text}" for ok, text in checks)
    out.append("")
    out.append(header("audit trail"))
    if report.ok:
        head = report.head or ""
        out.append(f"  {audit_path}")
        out.append(
            f"  {report.count} record{'s' if report.count != 1 else ''}, hash chain verified ok "
            f"(head {head[:12]}…)"
        )
        if head_matches is True:
            out.append("  the chain ends at the head recorded with the operation: nothing cut off")
        elif head_matches is False:
            out.append("  ✗ the chain does not end at the head recorded with the operation")
    else:
        out.append(
            f"  ✗ verification FAILED at record {report.first_broken}: {_clean(report.reason)}"
        )
    return out
