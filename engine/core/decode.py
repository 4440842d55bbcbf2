"""From provider SSE bytes to one classified ``TurnOutcome``, without I/O.

``StreamDecoder`` chains the bounded SSE decoder, a provider adapter's stream and the
turn assembler: bytes go in through ``feed`` (engine events come out, for progress
displays), and ``finish`` returns the outcome once the byte stream has ended.
``decode(provider, chunks)`` does the same over an iterable of byte chunks.

Classification rules (the provider tables live in each adapter):
- a pipeline failure (cap exceeded, protocol violation, undecodable event) → ``failed``;
- a provider error event → ``failed``;
- no terminal signal from the provider → ``truncated``;
- an explicit completion whose calls are not all done → ``truncated``;
- an explicit completion with refusal text → ``refusal``; with complete calls →
  ``tool_proposals``; a tool-use finish without any call → ``failed``;
- any other explicit reason keeps the adapter's kind (truncated, refusal, paused, failed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from .accumulator import CallAccumulator
from .adapter import Adapter, load_adapter
from .errors import LimitExceeded, StreamProtocolError
from .events import (
    ArgumentsDelta,
    ArgumentsRun,
    BatchEvent,
    CallDone,
    CallStarted,
    Completion,
    ContinuationItem,
    EngineEvent,
    ProviderDetail,
    ProviderError,
    RefusalDelta,
    ResponseMeta,
    TextDelta,
    UsageReport,
)
from .footprint import footprint
from .limits import DEFAULT_LIMITS, Limits
from .outcome import OutcomeKind, ProviderErrorInfo, TurnOutcome, Usage
from .pieces import TextPieces
from .sse import SSEDecoder, SSEEvent
from .utf8 import utf8_len

__all__ = ["StreamDecoder", "TurnAssembler", "decode"]

_EXPLICIT_OK = (OutcomeKind.FINAL_TEXT, OutcomeKind.TOOL_PROPOSALS)
_encode = msgspec.json.encode
# A chunk longer than this is fed in slices of _SLICE (see StreamDecoder._pump).
_WHOLE_CHUNK = 1 << 20
_SLICE = 1 << 16
_NO_USAGE = Usage()


class TurnAssembler:
    """Folds engine events into the state of one turn and classifies it at the end."""

    __slots__ = (
        "_calls",
        "_completion",
        "_continuation",
        "_details",
        "_error",
        "_failure",
        "_kept",
        "_limits",
        "_max_text",
        "_model",
        "_refusal",
        "_response_id",
        "_text",
        "_text_size",
        "_usage",
    )

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self._limits = limits
        self._max_text = limits.max_text_bytes
        self._calls = CallAccumulator(limits)
        self._text = TextPieces()
        self._refusal = TextPieces()
        self._text_size = 0
        self._response_id: str | None = None
        self._model: str | None = None
        self._usage = _NO_USAGE
        self._completion: Completion | None = None
        self._error: ProviderErrorInfo | None = None
        self._failure: str | None = None
        self._continuation: list[ContinuationItem] = []
        self._details: list[ProviderDetail] = []
        self._kept = 0  # bytes of the continuation items and details held

    def apply(self, event: EngineEvent | ArgumentsRun) -> None:
        # Dispatch on the event's exact type: cheaper than an isinstance chain per event.
        _HANDLERS[type(event)](self, event)

    def _on_arguments(self, ev: ArgumentsDelta) -> None:
        self._calls.fragment(ev.index, ev.fragment)

    def _on_run(self, ev: ArgumentsRun) -> None:
        self._calls.fragments(ev.indexes, ev.pieces)

    def _add_text(self, target: TextPieces, text: str) -> None:
        if not text:
            return  # an empty piece would hold a list slot that max_text_bytes never counts
        self._text_size += utf8_len(text)  # the cap counts bytes, as text is sent back
        if self._text_size > self._limits.max_text_bytes:
            raise LimitExceeded("max_text_bytes", self._limits.max_text_bytes)
        target.add(text)

    def _on_text(self, ev: TextDelta) -> None:
        self._add_text(self._text, ev.text)

    def _on_refusal(self, ev: RefusalDelta) -> None:
        self._add_text(self._refusal, ev.text)

    def _on_call_started(self, ev: CallStarted) -> None:
        self._calls.start(ev.index, ev.name, ev.call_id, ev.item_id)

    def _on_call_done(self, ev: CallDone) -> None:
        self._calls.done(
            ev.index,
            ev.arguments,
            ev.raw,
            ev.literal,
            error=ev.error,
            refused_bytes=ev.refused_bytes,
        )

    def _on_meta(self, ev: ResponseMeta) -> None:
        # The first non-empty value of each counts: an empty id or model is no value (a
        # later one still counts), so derived call ids never hash an empty response id.
        if ev.response_id and self._response_id is None:
            self._response_id = ev.response_id
        if ev.model and self._model is None:
            self._model = ev.model

    def _on_usage(self, ev: UsageReport) -> None:
        usage = self._usage
        self._usage = ev.usage if usage is _NO_USAGE else usage.merge(ev.usage)

    def _on_completion(self, ev: Completion) -> None:
        # The first terminal signal counts; a repeated one (a duplicated stop event)
        # cannot upgrade the outcome.
        if self._completion is None:
            self._completion = ev

    def _on_error(self, ev: ProviderError) -> None:
        if self._error is None:
            self._error = ev.error

    def _on_continuation(self, ev: ContinuationItem) -> None:
        if len(self._continuation) >= self._limits.max_continuation_items:
            raise LimitExceeded("max_continuation_items", self._limits.max_continuation_items)
        self._keep(ev)
        self._continuation.append(ev)

    def _on_detail(self, ev: ProviderDetail) -> None:
        if len(self._details) < self._limits.max_continuation_items:
            self._keep(ev)
            self._details.append(ev)

    def _keep(self, ev: ContinuationItem | ProviderDetail) -> None:
        """Count a held item against the cap: its bytes as the outcome will encode it,
        and its nodes (see ``footprint``)."""
        try:
            size = len(_encode(ev))
        except Exception:  # (not encodable as it stands: count its text form instead)
            size = len(repr(ev))
        value = ev.item if isinstance(ev, ContinuationItem) else ev.data
        self._kept += footprint(value, size, self._limits.max_continuation_bytes - self._kept)
        if self._kept > self._limits.max_continuation_bytes:
            raise LimitExceeded("max_continuation_bytes", self._limits.max_continuation_bytes)

    def fail(self, reason: str) -> None:
        """Record a pipeline failure (cap, protocol violation); the turn ends ``failed``."""
        if self._failure is None:
            self._failure = reason

    def outcome(self) -> TurnOutcome:
        completion = self._completion
        raw_reason = completion.raw_reason if completion is not None else None
        kind, stop_reason = self._classify(completion)
        calls = self._calls.complete(self._response_id)
        return TurnOutcome(
            kind=kind,
            raw_reason=raw_reason,
            stop_reason=stop_reason,
            response_id=self._response_id,
            model=self._model,
            text=self._text.joined(),
            refusal=self._refusal.joined(),
            calls=calls,
            incomplete_calls=self._calls.incomplete("no done signal before the turn ended"),
            usage=self._usage,
            continuation=tuple(self._continuation),
            error=self._error,
            provider_details=tuple(self._details),
        )

    def _classify(self, completion: Completion | None) -> tuple[OutcomeKind, str]:
        if self._failure is not None:
            return OutcomeKind.FAILED, self._failure
        if self._error is not None:
            return OutcomeKind.FAILED, "the provider reported an error in the stream"
        if completion is None:
            return OutcomeKind.TRUNCATED, "the stream ended before the provider's terminal signal"
        kind = completion.kind
        if kind is OutcomeKind.PAUSED and self._calls.any_done:
            # A paused turn is sent back as it is to continue; a client call in it would
            # go back without its result (or never run): not a turn callgate can carry.
            return OutcomeKind.FAILED, "a paused turn carries complete client tool calls"
        if kind not in _EXPLICIT_OK:
            return kind, f"provider reason {completion.raw_reason!r} maps to {kind.value}"
        open_calls = self._calls.open_count
        if open_calls:
            return (
                OutcomeKind.TRUNCATED,
                f"the turn completed but {open_calls} call(s) never got their done signal",
            )
        if self._refusal:
            return OutcomeKind.REFUSAL, "the model refused (refusal content in the turn)"
        if self._calls.any_done:
            return OutcomeKind.TOOL_PROPOSALS, "explicit completion with complete tool calls"
        if kind is OutcomeKind.TOOL_PROPOSALS:
            return OutcomeKind.FAILED, "a tool-use finish reason arrived without any call"
        return OutcomeKind.FINAL_TEXT, "explicit completion with text only"


_HANDLERS: dict[type, Callable[[TurnAssembler, Any], None]] = {
    ArgumentsDelta: TurnAssembler._on_arguments,
    ArgumentsRun: TurnAssembler._on_run,
    TextDelta: TurnAssembler._on_text,
    CallStarted: TurnAssembler._on_call_started,
    CallDone: TurnAssembler._on_call_done,
    RefusalDelta: TurnAssembler._on_refusal,
    ResponseMeta: TurnAssembler._on_meta,
    UsageReport: TurnAssembler._on_usage,
    Completion: TurnAssembler._on_completion,
    ProviderError: TurnAssembler._on_error,
    ContinuationItem: TurnAssembler._on_continuation,
    ProviderDetail: TurnAssembler._on_detail,
}


class StreamDecoder:
    """Bytes in, engine events out; ``finish()`` gives the turn's outcome. Sans-I/O."""

    __slots__ = ("_adapter_stream", "_batch", "_done", "_max_bytes", "_room", "_sse", "_turn")

    def __init__(self, adapter: Adapter, limits: Limits = DEFAULT_LIMITS) -> None:
        self._sse = SSEDecoder(limits, collect_unframed=adapter.sse_unframed)
        stream = adapter.new_stream(limits)
        self._adapter_stream = stream
        # An adapter stream may translate a whole chunk's events in one call (and batch
        # runs of argument fragments); one that cannot is driven event by event.
        batch: Callable[[list[SSEEvent], list[BatchEvent]], None] | None = getattr(
            stream, "decode_batch", None
        )
        self._batch = batch or self._one_by_one
        self._turn = TurnAssembler(limits)
        self._done = False
        self._max_bytes = limits.max_response_bytes
        self._room = limits.max_response_bytes  # body bytes still allowed

    @property
    def failed(self) -> bool:
        """Whether a pipeline failure (a cap, a protocol violation) has decided the turn:
        the rest of the stream would be ignored, so a reader may stop reading."""
        return self._turn._failure is not None

    def feed(self, data: bytes) -> list[EngineEvent]:
        """Consume bytes; return the engine events they completed. After a failure the
        rest of the stream is ignored (the outcome is already ``failed``). A run of
        argument fragments that one chunk completed may come out as one
        ``ArgumentsDelta`` of their joined text."""
        out: list[EngineEvent] = []
        self._pump(data, out)
        return out

    def _one_by_one(self, events: list[SSEEvent], out: list[BatchEvent]) -> None:
        decode = self._adapter_stream.decode
        for sse in events:
            out += decode(sse)

    def _pump(self, data: bytes, out: list[EngineEvent] | None) -> None:
        """Feed ``data`` through the pipeline; collect the engine events into ``out``
        unless it is None (``decode`` has no use for them)."""
        if self._done:
            return
        if len(data) > _WHOLE_CHUNK:
            # A whole captured body in one chunk: split all at once it held 2.5-4 times
            # its size beside it (every line, event and view alive together); decoded in
            # slices it holds about a tenth. The outcome is the same for any chunking.
            for start in range(0, len(data), _SLICE):
                self._pump(data[start : start + _SLICE], out)
                if self.failed:
                    break  # the rest would be ignored
            return
        if len(data) > self._room:
            # The bytes within the cap count as they would in any chunking (the events
            # they complete are applied, one of them may fail first); then the turn fails.
            allowed = data[: self._room]
            if allowed:
                self._pump(allowed, out)  # (it fits: the room left is then 0)
            if not self._done:
                self._absorb(LimitExceeded("max_response_bytes", self._max_bytes))
            return
        self._room -= len(data)
        try:
            sse_error: Exception | None = None
            try:
                sse_events = self._sse.feed(data)
            except (LimitExceeded, StreamProtocolError) as exc:
                # The events this chunk completed before the error came first in the
                # stream: process them, so that chunk boundaries never change the
                # outcome (one of them may fail first, or carry a provider error).
                sse_events = self._sse.take_salvaged()
                sse_error = exc
            if sse_events:
                self._translate(sse_events, out)
            if sse_error is not None:
                raise sse_error
        except Exception as exc:
            if not self._absorb(exc):
                raise

    def _translate(self, sse_events: list[SSEEvent], out: list[EngineEvent] | None) -> None:
        """Adapter, then assembler, for one chunk's SSE events. The adapter's events up
        to an error it raises are applied first (an earlier failure among them wins)."""
        batch: list[BatchEvent] = []
        adapter_error: Exception | None = None
        try:
            self._batch(sse_events, batch)
        except Exception as exc:
            adapter_error = exc
        turn = self._turn
        calls = turn._calls
        # The events that are nearly every event of a long stream skip the generic
        # dispatch (exact type tests: subclasses go the generic way).
        fragment, fragments = calls.fragment, calls.fragments
        on_text, handlers = turn._on_text, _HANDLERS
        applied = 0
        try:
            for event in batch:
                if type(event) is ArgumentsRun:
                    fragments(event.indexes, event.pieces)
                elif type(event) is ArgumentsDelta:
                    fragment(event.index, event.fragment)
                elif type(event) is TextDelta:
                    on_text(event)
                else:
                    handlers[type(event)](turn, event)  # what ``turn.apply`` does
                applied += 1
        finally:
            if out is not None:  # the events applied (all of them, or up to the failing one)
                for event in batch[:applied]:
                    if type(event) is ArgumentsRun:
                        out += event.deltas()
                    else:
                        out.append(event)  # type: ignore[arg-type]  # runs are handled above
        if adapter_error is not None:
            raise adapter_error

    def _absorb(self, exc: Exception) -> bool:
        """Turn a failure caused by the input into a ``failed`` outcome; re-raise others."""
        if isinstance(exc, LimitExceeded):
            self._turn.fail(f"limit exceeded: {exc.limit}={exc.value}")
        elif isinstance(exc, StreamProtocolError):
            self._turn.fail(f"protocol error: {exc}")
        elif isinstance(exc, msgspec.DecodeError):
            self._turn.fail(f"protocol error: undecodable provider event: {exc}")
        elif isinstance(exc, RecursionError):
            # An adapter that lets msgspec's nesting guard through: still bad input.
            self._turn.fail("protocol error: a provider event nests too deeply to decode")
        else:
            return False
        self._done = True
        return True

    def finish(self) -> TurnOutcome:
        """The byte stream ended (cleanly or not): classify the turn."""
        if not self._done:
            self._done = True
            try:
                tail = self._sse.close()
                if tail:
                    self._translate(tail, None)
                for event in self._adapter_stream.end():
                    self._turn.apply(event)
            except Exception as exc:
                if not self._absorb(exc):
                    raise
        return self._turn.outcome()


def decode(provider: str, chunks: Iterable[bytes], limits: Limits | None = None) -> TurnOutcome:
    """Decode one recorded provider stream (an iterable of byte chunks) into its outcome.

    Bad input never raises: it yields a ``failed`` or ``truncated`` outcome. An unknown
    provider name raises ``ConfigError``.
    """
    decoder = StreamDecoder(load_adapter(provider), limits or DEFAULT_LIMITS)
    pump = decoder._pump
    for chunk in chunks:
        pump(chunk, None)
        if decoder._done:
            break  # failed: the rest would be ignored (and an endless source must end)
    return decoder.finish()
