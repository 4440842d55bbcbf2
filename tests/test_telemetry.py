"""execute_tool spans: GenAI semantic-convention attributes, nothing sensitive by default,
and a no-op when opentelemetry-api is absent.

Only ``opentelemetry-api`` is installed (no SDK), so spans are captured by a minimal
TracerProvider written against the API's abstract classes."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from callgate.engine.runtime import telemetry
from callgate.engine.runtime.telemetry import tool_span

SECRET = "sk-live-TELEMETRY-SECRET"


class CapturedSpan(trace.Span):
    def __init__(self, name: str, kind: SpanKind, attributes: Mapping[str, Any] | None) -> None:
        self.name = name
        self.kind = kind
        self.attributes: dict[str, Any] = dict(attributes or {})
        self.status: Status | None = None
        self.ended = False
        self.events: list[str] = []
        self.exceptions: list[BaseException] = []

    def get_span_context(self) -> trace.SpanContext:
        return trace.INVALID_SPAN_CONTEXT

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.attributes.update(attributes)

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        self.events.append(name)

    def update_name(self, name: str) -> None:
        self.name = name

    def is_recording(self) -> bool:
        return not self.ended

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self.status = status if isinstance(status, Status) else Status(status, description)

    def record_exception(self, exception: BaseException, *args: Any, **kwargs: Any) -> None:
        self.exceptions.append(exception)

    def end(self, end_time: int | None = None) -> None:
        self.ended = True


class CapturingTracer(trace.Tracer):
    def __init__(self, spans: list[CapturedSpan]) -> None:
        self.spans = spans

    def start_span(  # noqa: PLR0917 - the API's own signature
        self,
        name: str,
        context: Any = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, Any] | None = None,
        links: Sequence[trace.Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        span = CapturedSpan(name, kind, attributes)
        self.spans.append(span)
        return span

    @contextmanager  # type: ignore[override]
    def start_as_current_span(self, name: str, **kwargs: Any) -> Iterator[trace.Span]:
        span = self.start_span(name, **kwargs)
        with trace.use_span(span, end_on_exit=True) as current:
            yield current


class CapturingProvider(trace.TracerProvider):
    def __init__(self) -> None:
        self.spans: list[CapturedSpan] = []
        self.names: list[str] = []

    def get_tracer(self, instrumenting_module_name: str, *args: Any, **kwargs: Any) -> trace.Tracer:
        self.names.append(instrumenting_module_name)
        return CapturingTracer(self.spans)


ARGS = {"order_id": "A1", "card": {"number": SECRET}, "api_key": SECRET, "note": "a\nb"}


def _everything(span: CapturedSpan) -> str:
    status = span.status
    return repr((span.name, span.attributes, span.events, status and status.description))


def test_execute_tool_span_carries_the_genai_attributes_and_no_arguments() -> None:
    provider = CapturingProvider()
    with tool_span(
        tool="get_order",
        call_id="call_7f3",
        operation_id="op_1",
        provider="openai",
        model="gpt-4o",
        arguments=ARGS,
        tracer_provider=provider,
    ) as handle:
        inside = trace.get_current_span()
        assert handle.recording
        handle.set_outcome("ok")
    (span,) = provider.spans
    assert inside is span and span.ended and provider.names == ["callgate"]
    assert span.name == "execute_tool get_order" and span.kind is SpanKind.INTERNAL
    assert span.attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "get_order",
        "gen_ai.tool.call.id": "call_7f3",
        "gen_ai.tool.type": "function",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "callgate.operation.id": "op_1",
        "callgate.call.outcome": "ok",
    }
    assert span.status is None
    assert trace.get_current_span() is not span


def test_opt_in_records_only_redacted_arguments() -> None:
    provider = CapturingProvider()
    with tool_span(
        tool="pay",
        call_id="c1",
        operation_id="op_1",
        arguments=ARGS,
        record_arguments=True,
        redact_paths=["$.card.number"],
        tracer_provider=provider,
    ):
        pass
    (span,) = provider.spans
    recorded = span.attributes["gen_ai.tool.call.arguments"]
    assert recorded == (
        '{"api_key":"[REDACTED]","card":{"number":"[REDACTED]"},"note":"a\\\\x0ab","order_id":"A1"}'
    )
    assert SECRET not in _everything(span)


def test_a_failing_handler_marks_the_span_by_error_type_only() -> None:
    provider = CapturingProvider()
    with (
        pytest.raises(ValueError),
        tool_span(
            tool="pay", call_id="c1", operation_id="op_1", arguments=ARGS, tracer_provider=provider
        ),
    ):
        raise ValueError(f"card {SECRET} declined")
    (span,) = provider.spans
    assert span.ended and span.exceptions == []
    assert span.attributes["error.type"] == "ValueError"
    assert span.status is not None and span.status.status_code is StatusCode.ERROR
    assert SECRET not in _everything(span)


@pytest.mark.anyio
async def test_a_cancelled_call_names_its_error_type_alike_on_every_backend() -> None:
    # asyncio's CancelledError, trio's Cancelled: error.type said which loop ran it.
    import anyio

    provider = CapturingProvider()
    with anyio.CancelScope() as scope:
        with tool_span(tool="pay", call_id="c1", operation_id="op_1", tracer_provider=provider):
            scope.cancel()
            await anyio.sleep(1)
    assert scope.cancelled_caught
    (span,) = provider.spans
    assert span.attributes["error.type"] == "cancelled"
    assert span.status is not None and span.status.status_code is StatusCode.ERROR


def test_an_error_outcome_sets_error_type_and_status() -> None:
    provider = CapturingProvider()
    with tool_span(
        tool="pay", call_id="c\x1b[2J", operation_id="op_1", tracer_provider=provider
    ) as handle:
        handle.set_outcome("timeout", error=True)
    (span,) = provider.spans
    assert span.attributes["callgate.call.outcome"] == "timeout"
    assert span.attributes["error.type"] == "timeout"
    assert span.status is not None and span.status.status_code is StatusCode.ERROR
    assert span.attributes["gen_ai.tool.call.id"] == "c\\x1b[2J"


def test_without_opentelemetry_the_span_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # makes the import fail
    try:
        hidden = importlib.reload(telemetry)
        assert not hidden.otel_available()
        provider = CapturingProvider()
        with hidden.tool_span(
            tool="t", call_id="c", operation_id="o", tracer_provider=provider
        ) as handle:
            handle.set_outcome("timeout", error=True)
            assert not handle.recording
        assert provider.spans == []
    finally:
        monkeypatch.undo()
        importlib.reload(telemetry)
    assert telemetry.otel_available()
