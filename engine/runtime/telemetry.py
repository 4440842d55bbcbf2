"""OpenTelemetry spans for tool execution, following the GenAI semantic conventions.

One ``execute_tool {tool}`` span (kind INTERNAL) per executed call, with
``gen_ai.operation.name = "execute_tool"``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
``gen_ai.tool.type = "function"``, ``gen_ai.provider.name``, ``gen_ai.request.model`` and
``callgate.operation.id``. Failures set ``error.type`` and an ERROR status.

Active only when ``opentelemetry-api`` is importable; otherwise ``tool_span`` is a no-op.
Spans never carry arguments unless the host opts in with ``record_arguments=True``, and
then only the audit trail's sanitized form (redacted paths and keys, escaped strings) in
``gen_ai.tool.call.arguments``. Exceptions are recorded by type only: exception messages
and tracebacks can quote secrets, so this module never records them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from callgate.engine.core.audit import escape_controls, sanitize
from callgate.engine.core.canonical import canonical_json

from .backends import CANCELLED, is_cancellation

try:
    from opentelemetry import trace as _trace

    _AVAILABLE = True
except ImportError:  # pragma: no cover - the no-op path is tested by hiding the package
    _AVAILABLE = False

__all__ = [
    "ATTR_ARGUMENTS",
    "ATTR_CALL_ID",
    "ATTR_ERROR_TYPE",
    "ATTR_MODEL",
    "ATTR_OPERATION",
    "ATTR_OPERATION_ID",
    "ATTR_OUTCOME",
    "ATTR_PROVIDER",
    "ATTR_TOOL_NAME",
    "ATTR_TOOL_TYPE",
    "ToolSpan",
    "otel_available",
    "tool_span",
]

ATTR_OPERATION = "gen_ai.operation.name"
ATTR_TOOL_NAME = "gen_ai.tool.name"
ATTR_CALL_ID = "gen_ai.tool.call.id"
ATTR_TOOL_TYPE = "gen_ai.tool.type"
ATTR_PROVIDER = "gen_ai.provider.name"
ATTR_MODEL = "gen_ai.request.model"
ATTR_ARGUMENTS = "gen_ai.tool.call.arguments"
ATTR_ERROR_TYPE = "error.type"
ATTR_OPERATION_ID = "callgate.operation.id"
ATTR_OUTCOME = "callgate.call.outcome"

_INSTRUMENTATION = "callgate"


def otel_available() -> bool:
    """Whether spans are emitted at all (``opentelemetry-api`` importable)."""
    return _AVAILABLE


class ToolSpan:
    """The handle ``tool_span`` yields. Without OpenTelemetry every method is a no-op."""

    __slots__ = ("_span",)

    def __init__(self, span: Any = None) -> None:
        self._span = span

    @property
    def recording(self) -> bool:
        return self._span is not None and bool(self._span.is_recording())

    def set_outcome(self, outcome: str, *, error: bool = False) -> None:
        """Record the call-level outcome (``ok``, ``timeout``, ``handler_error``...)."""
        if self._span is None:
            return
        self._span.set_attribute(ATTR_OUTCOME, outcome)
        if error:
            self._span.set_attribute(ATTR_ERROR_TYPE, outcome)
            self._span.set_status(_trace.Status(_trace.StatusCode.ERROR))


@contextmanager
def tool_span(
    *,
    tool: str,
    call_id: str,
    operation_id: str,
    provider: str | None = None,
    model: str | None = None,
    arguments: Mapping[str, Any] | None = None,
    record_arguments: bool = False,
    redact_paths: Sequence[str] = (),
    tracer_provider: Any = None,
) -> Iterator[ToolSpan]:
    """A span around one tool execution (the current span inside the block).

    ``arguments`` are ignored unless ``record_arguments`` is set; then they are recorded
    sanitized with ``redact_paths``. ``tracer_provider`` defaults to the global one.
    """
    if not _AVAILABLE:
        yield ToolSpan()
        return
    attributes: dict[str, str] = {
        ATTR_OPERATION: "execute_tool",
        ATTR_TOOL_NAME: escape_controls(tool),
        ATTR_CALL_ID: escape_controls(call_id),
        ATTR_TOOL_TYPE: "function",
        ATTR_OPERATION_ID: escape_controls(operation_id),
    }
    if provider is not None:
        attributes[ATTR_PROVIDER] = provider
    if model is not None:
        attributes[ATTR_MODEL] = escape_controls(model)
    if record_arguments and arguments is not None:
        safe = sanitize(arguments, redact_paths)
        attributes[ATTR_ARGUMENTS] = canonical_json(safe).decode("utf-8")
    tracer = _trace.get_tracer(_INSTRUMENTATION, tracer_provider=tracer_provider)
    span = tracer.start_span(
        f"execute_tool {attributes[ATTR_TOOL_NAME]}",
        kind=_trace.SpanKind.INTERNAL,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    )
    with _trace.use_span(
        span, end_on_exit=True, record_exception=False, set_status_on_exception=False
    ):
        try:
            yield ToolSpan(span)
        except BaseException as exc:
            # Type only: a message or traceback may quote an argument or a secret. A
            # cancellation is "cancelled" on every backend (backends.py).
            name = CANCELLED if is_cancellation(exc) else type(exc).__qualname__
            span.set_attribute(ATTR_ERROR_TYPE, name)
            span.set_status(_trace.Status(_trace.StatusCode.ERROR))
            raise
