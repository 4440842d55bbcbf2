"""Anthropic Messages adapter: streamed ``/v1/messages`` events in, engine events out; engine
values in, Messages request shapes out.

Owns the reading of Anthropic's content-block stream (``message_start`` …
``message_stop``) and the writing of the assistant echo, ``tool_result`` blocks and the
streaming request body. Never does HTTP, never parses tool arguments (the assembler does,
on ``CallDone``), never trusts provider text as a status.

Decoding: every content block is keyed by its ``index``. Client ``tool_use`` blocks become
``CallStarted``/``ArgumentsDelta``/``CallDone`` (the ``input: {}`` placeholder is discarded;
``content_block_stop`` is the arguments-done signal). Every other block (text, thinking,
redacted_thinking, server_tool_use, web_search_tool_result, unknown types) is rebuilt here
and emitted whole as a ``ContinuationItem(kind=<block type>)`` at its stop, so that
``assistant_echo`` can replay the assistant content in index order with thinking
signatures unmodified. Text is also streamed as ``TextDelta`` for the assembler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, cast

import msgspec

from callgate.engine.core.adapter import JSON, HttpRequestSpec, ModelResult, ToolDeclaration
from callgate.engine.core.errors import LimitExceeded, StreamProtocolError
from callgate.engine.core.events import (
    ArgumentsDelta,
    BatchEvent,
    CallDone,
    CallStarted,
    Completion,
    ContinuationItem,
    EngineEvent,
    ProviderDetail,
    ProviderError,
    ResponseMeta,
    TextDelta,
    UsageReport,
    append_fragments,
)
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import (
    OutcomeKind,
    ProviderErrorInfo,
    TurnOutcome,
    Usage,
    token_sum,
)
from callgate.engine.core.sse import SSEEvent

from ._utf8 import utf8_len

__all__ = ["ADAPTER", "FINISH_REASONS", "AnthropicAdapter", "AnthropicStream"]

# stop_reason -> outcome kind (ant-py types/stop_reason.py). Unknown reasons are FAILED.
FINISH_REASONS: dict[str, OutcomeKind] = {
    "end_turn": OutcomeKind.FINAL_TEXT,
    "max_tokens": OutcomeKind.TRUNCATED,
    "model_context_window_exceeded": OutcomeKind.TRUNCATED,
    "pause_turn": OutcomeKind.PAUSED,
    "refusal": OutcomeKind.REFUSAL,
    "stop_sequence": OutcomeKind.FINAL_TEXT,
    "tool_use": OutcomeKind.TOOL_PROPOSALS,
}

# In-stream error types worth retrying: the server, not the request, is at fault.
_RETRYABLE_ERRORS: Final = frozenset({"api_error", "overloaded_error", "rate_limit_error"})

_API_VERSION: Final = "2023-06-01"
_DEFAULT_MAX_TOKENS: Final = 4096


# --- wire views: only the fields read here (gc=False: decoded JSON has no cycles) ---------
# One small Struct per event type, chosen by the ``type`` tag, so that msgspec fills only
# the fields that event can carry (a content_block_delta decodes into two fields, not a
# dozen optional ones). A ``type`` outside the union falls back to ``_Kind``.


class _Usage(msgspec.Struct, gc=False):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


# (input, output, cache read, cache write) before any usage arrived.
_NO_COUNTS: Final[tuple[int | None, int | None, int | None, int | None]] = (
    None,
    None,
    None,
    None,
)


class _Message(msgspec.Struct, gc=False):
    id: str | None = None
    model: str | None = None
    usage: _Usage | None = None


class _Error(msgspec.Struct, gc=False):
    type: str | None = None
    message: str | None = None


class _InputJson(msgspec.Struct, tag="input_json_delta", tag_field="type", gc=False):
    partial_json: str | None = None


class _TextPiece(msgspec.Struct, tag="text_delta", tag_field="type", gc=False):
    text: str | None = None


class _ThinkingPiece(msgspec.Struct, tag="thinking_delta", tag_field="type", gc=False):
    thinking: str | None = None


class _SignaturePiece(msgspec.Struct, tag="signature_delta", tag_field="type", gc=False):
    signature: str | None = None


class _CitationPiece(msgspec.Struct, tag="citations_delta", tag_field="type", gc=False):
    citation: dict[str, Any] | None = None


_BlockPiece = _InputJson | _TextPiece | _ThinkingPiece | _SignaturePiece | _CitationPiece


class _MessageStart(msgspec.Struct, tag="message_start", tag_field="type", gc=False):
    message: _Message | None = None


class _BlockStart(msgspec.Struct, tag="content_block_start", tag_field="type", gc=False):
    index: int = -1
    # Kept as a dict: non-tool blocks are echoed whole, unknown keys included.
    content_block: dict[str, Any] | None = None


class _BlockDelta(msgspec.Struct, tag="content_block_delta", tag_field="type", gc=False):
    index: int = -1
    delta: _BlockPiece | None = None


class _BlockStop(msgspec.Struct, tag="content_block_stop", tag_field="type", gc=False):
    index: int = -1


class _StopDelta(msgspec.Struct, gc=False):
    stop_reason: str | None = None
    stop_details: dict[str, Any] | None = None


class _MessageDelta(msgspec.Struct, tag="message_delta", tag_field="type", gc=False):
    delta: _StopDelta | None = None
    usage: _Usage | None = None


class _MessageStop(msgspec.Struct, tag="message_stop", tag_field="type", gc=False):
    pass


class _Ping(msgspec.Struct, tag="ping", tag_field="type", gc=False):
    pass


class _ErrorEvent(msgspec.Struct, tag="error", tag_field="type", gc=False):
    error: _Error | None = None


_AnyEvent = (
    _BlockDelta
    | _Ping
    | _MessageStart
    | _BlockStart
    | _BlockStop
    | _MessageDelta
    | _MessageStop
    | _ErrorEvent
)


class _Kind(msgspec.Struct, gc=False):
    """What an event outside the union (or malformed inside it) says it is."""

    type: str


_DECODER: Final = msgspec.json.Decoder(_AnyEvent)
_KIND_DECODER: Final = msgspec.json.Decoder(_Kind)
_JSON_DECODER: Final = msgspec.json.Decoder()
_KNOWN_TYPES: Final = frozenset(cls.__struct_config__.tag for cls in _AnyEvent.__args__)

# Block kinds.
_TOOL: Final = 0  # client tool_use: streamed to the assembler, not buffered here
_TEXT: Final = 1  # text: streamed as TextDelta and buffered for the echo
_OTHER: Final = 2  # thinking, server tools, unknown: buffered for the echo only


class _Block:
    """One content block being received."""

    __slots__ = ("citations", "data", "json", "kind", "nbytes", "open", "signature", "text")

    def __init__(self, kind: int, data: dict[str, Any] | None) -> None:
        self.kind = kind
        self.data = data
        self.open = True
        self.nbytes = 0
        self.text: list[str] = []  # text_delta / thinking_delta pieces
        self.signature: list[str] = []
        self.json: list[str] = []  # server_tool_use input pieces
        self.citations: list[dict[str, Any]] = []


class AnthropicStream:
    """Decoding state of one Messages response."""

    __slots__ = (
        "_blocks",
        "_done",
        "_limits",
        "_open_tools",
        "_other_blocks",
        "_started",
        "_stop_reason",
        "_text_bytes",
        "_usage",
    )

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._blocks: dict[int, _Block] = {}
        # Indexes of the tool_use blocks started and not stopped (argument fragments).
        self._open_tools: set[int] = set()
        self._other_blocks = 0
        self._text_bytes = 0
        self._started = False
        self._done = False
        self._stop_reason: str | None = None
        # Usage counts merged field by field: a message_delta may repeat only some of them
        # (input_tokens without the cache counts), which must not drop the others.
        self._usage = _NO_COUNTS

    def decode(self, event: SSEEvent) -> list[EngineEvent]:
        out: list[BatchEvent] = []
        self.decode_batch([event], out)
        return cast("list[EngineEvent]", out)  # one event never makes a run

    def decode_batch(self, events: list[SSEEvent], out: list[BatchEvent]) -> None:
        """Translate a chunk's events in order. Argument fragments of one call that
        follow each other become one ``ArgumentsRun``; everything else is handled event
        by event. Events before an error are in ``out`` when it is raised."""
        decode = _DECODER.decode
        open_tools = self._open_tools
        indexes: list[int] = []
        pieces: list[str] = []
        try:
            for event in events:
                try:
                    ev = decode(event.data)
                except msgspec.DecodeError as exc:
                    if pieces:
                        append_fragments(out, indexes, pieces)
                        indexes, pieces = [], []
                    self._other_event(event, exc, out)
                    continue
                # Deltas are nearly every event: a tool call's argument fragment is
                # taken right here (the checks of ``_block_delta`` for that case).
                if type(ev) is _BlockDelta and not self._done:
                    delta = ev.delta
                    if type(delta) is _InputJson and ev.index in open_tools:
                        fragment = delta.partial_json
                        if fragment is not None:
                            if fragment:
                                indexes.append(ev.index)
                                pieces.append(fragment)
                            continue
                if pieces:
                    append_fragments(out, indexes, pieces)
                    indexes, pieces = [], []
                mark = len(out)
                try:
                    self._event(ev, out)
                except Exception:
                    del out[mark:]  # an event is translated whole or not at all
                    raise
        except RecursionError:
            # msgspec's own guard against nesting (even in a field no view reads).
            raise StreamProtocolError("anthropic: an event nests too deeply to decode") from None
        finally:
            append_fragments(out, indexes, pieces)

    def end(self) -> list[EngineEvent]:
        # The Completion was emitted at message_stop; a stream cut before it stays
        # without one, which the assembler reads as truncated.
        return []

    def _event(self, ev: _AnyEvent, out: list[BatchEvent]) -> None:
        kind = type(ev)
        if kind is _Ping:
            return
        if self._done:
            raise StreamProtocolError(f"anthropic: {_tag(ev)!r} event after message_stop")
        if not self._started and kind not in _BEFORE_START:
            raise StreamProtocolError(f"anthropic: {_tag(ev)!r} before message_start")
        _HANDLERS[kind](self, ev, out)

    def _message_stop(self, ev: _MessageStop, out: list[BatchEvent]) -> None:
        if self._stop_reason is None:
            raise StreamProtocolError("anthropic: message_stop without a stop_reason")
        self._done = True
        reason = self._stop_reason
        out.append(Completion(FINISH_REASONS.get(reason, OutcomeKind.FAILED), reason))

    def _error(self, ev: _ErrorEvent, out: list[BatchEvent]) -> None:
        out.append(_provider_error(ev.error))

    def _other_event(
        self, event: SSEEvent, exc: msgspec.DecodeError, out: list[BatchEvent]
    ) -> None:
        """An event the typed union did not take: malformed, or of a type Anthropic added
        after this adapter (documented to happen; such events carry nothing we act on)."""
        try:
            kind = _KIND_DECODER.decode(event.data).type
        except msgspec.DecodeError:
            kind = None
        if kind is None or kind in _KNOWN_TYPES:
            raise StreamProtocolError(
                f"anthropic: undecodable {event.event!r} event: {exc}"
            ) from None
        if self._done:
            raise StreamProtocolError(f"anthropic: {kind!r} event after message_stop")

    # --- message level ---------------------------------------------------------------

    def _message_start(self, ev: _MessageStart, out: list[BatchEvent]) -> None:
        if self._started:
            raise StreamProtocolError("anthropic: second message_start")
        self._started = True
        msg = ev.message
        if msg is None:
            raise StreamProtocolError("anthropic: message_start without a message")
        out.append(ResponseMeta(msg.id, msg.model))
        if msg.usage is not None:
            # message_start's output_tokens is a placeholder the final message_delta
            # replaces; before that, no output count is reported.
            self._report_usage(msg.usage, False, out)

    def _message_delta(self, ev: _MessageDelta, out: list[BatchEvent]) -> None:
        delta = ev.delta
        if delta is not None:
            if delta.stop_reason is not None and self._stop_reason is None:
                # The first stop reason counts: a repeated message_delta cannot turn
                # max_tokens into end_turn.
                self._stop_reason = delta.stop_reason
            if delta.stop_details is not None:
                out.append(ProviderDetail("stop_details", delta.stop_details))
        if ev.usage is not None:
            self._report_usage(ev.usage, True, out)

    def _report_usage(self, usage: _Usage, with_output: bool, out: list[BatchEvent]) -> None:
        """Merge a usage object into the counts so far (a count it repeats wins, the others
        stay) and report the billed total. Anthropic's input_tokens leaves out the prompt
        tokens read from and written to the cache; they are billed (and resent) as well."""
        fresh, output, read, write = self._usage
        if usage.input_tokens is not None:
            fresh = usage.input_tokens
        if with_output and usage.output_tokens is not None:
            output = usage.output_tokens
        if usage.cache_read_input_tokens is not None:
            read = usage.cache_read_input_tokens
        if usage.cache_creation_input_tokens is not None:
            write = usage.cache_creation_input_tokens
        self._usage = (fresh, output, read, write)
        billed = Usage(
            input_tokens=token_sum(fresh, read, write),
            output_tokens=output,
            cached_input_tokens=read,
        )
        out.append(UsageReport(billed))

    # --- content blocks --------------------------------------------------------------

    def _block_start(self, ev: _BlockStart, out: list[BatchEvent]) -> None:
        index = ev.index
        block = ev.content_block
        if index < 0 or block is None:
            raise StreamProtocolError("anthropic: content_block_start without index or block")
        if index in self._blocks:
            raise StreamProtocolError(f"anthropic: content block {index} started twice")
        btype = block.get("type")
        if not isinstance(btype, str):
            raise StreamProtocolError(f"anthropic: content block {index} has no type")
        if btype == "tool_use":
            call_id, name = block.get("id"), block.get("name")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise StreamProtocolError(f"anthropic: tool_use block {index} lacks id or name")
            self._blocks[index] = _Block(_TOOL, None)
            self._open_tools.add(index)
            out.append(CallStarted(index, name, call_id=call_id))
            return
        # Each non-tool block becomes one continuation item at its stop.
        self._other_blocks += 1
        if self._other_blocks > self._limits.max_continuation_items:
            raise LimitExceeded(
                "max_continuation_items", self._limits.max_continuation_items, "anthropic blocks"
            )
        if btype == "text":
            text = block.get("text")
            self._blocks[index] = _Block(_TEXT, block)
            if isinstance(text, str) and text:
                self._count_text(text)
                out.append(TextDelta(text))
            return
        self._blocks[index] = _Block(_OTHER, block)

    def _block_delta(self, ev: _BlockDelta, out: list[BatchEvent]) -> None:
        index = ev.index
        block = self._blocks.get(index)
        if block is None or not block.open:
            state = "closed" if block is not None else "unknown"
            raise StreamProtocolError(f"anthropic: delta for {state} content block {index}")
        delta = ev.delta
        if delta is None:
            raise StreamProtocolError(f"anthropic: content_block_delta {index} without delta")
        if isinstance(delta, _TextPiece) and block.kind == _TEXT and delta.text is not None:
            text = delta.text
            if text:
                self._count_text(text)
                block.text.append(text)
                out.append(TextDelta(text))
            return
        if isinstance(delta, _InputJson) and delta.partial_json is not None:
            fragment = delta.partial_json
            if block.kind == _TOOL:
                if fragment:
                    out.append(ArgumentsDelta(index, fragment))
                return
            if block.kind == _OTHER:
                self._buffer(block, fragment, block.json)
                return
        elif block.kind == _OTHER and block.data is not None:
            btype = block.data.get("type")
            if isinstance(delta, _ThinkingPiece) and btype == "thinking":
                if delta.thinking is not None:
                    self._buffer(block, delta.thinking, block.text)
                    return
            elif isinstance(delta, _SignaturePiece) and delta.signature is not None:
                self._buffer(block, delta.signature, block.signature)
                return
        if isinstance(delta, _CitationPiece) and block.kind != _TOOL and delta.citation is not None:
            if len(block.citations) >= self._limits.max_continuation_items:
                raise LimitExceeded(
                    "max_continuation_items", self._limits.max_continuation_items, "citations"
                )
            block.citations.append(delta.citation)
            return
        raise StreamProtocolError(
            f"anthropic: {_tag(delta)!r} delta not valid for content block {index}"
        )

    def _block_stop(self, ev: _BlockStop, out: list[BatchEvent]) -> None:
        index = ev.index
        block = self._blocks.get(index)
        if block is None or not block.open:
            state = "closed" if block is not None else "unknown"
            raise StreamProtocolError(f"anthropic: content_block_stop for {state} block {index}")
        block.open = False
        if block.kind == _TOOL:
            self._open_tools.discard(index)
            out.append(CallDone(index))
            return
        data = block.data
        assert data is not None  # set for every non-tool block
        item = dict(data)
        btype = str(item["type"])
        if block.text:
            field = "text" if block.kind == _TEXT else "thinking"
            item[field] = str(item.get(field) or "") + "".join(block.text)
        if block.signature:
            item["signature"] = str(item.get("signature") or "") + "".join(block.signature)
        if block.json:
            raw = "".join(block.json)
            try:
                item["input"] = _JSON_DECODER.decode(raw) if raw else {}
            except msgspec.DecodeError:
                raise StreamProtocolError(
                    f"anthropic: {btype} block {index} input is not JSON"
                ) from None
        if block.citations:
            existing = item.get("citations")
            item["citations"] = [
                *(existing if isinstance(existing, list) else ()),
                *block.citations,
            ]
        # Release the buffers; the block index stays known so a reuse is still caught.
        block.data = None
        block.text = block.signature = block.json = []
        block.citations = []
        out.append(ContinuationItem(btype, index, item))

    def _buffer(self, block: _Block, piece: str, into: list[str]) -> None:
        block.nbytes += utf8_len(piece)
        if block.nbytes > self._limits.max_call_argument_bytes:
            raise LimitExceeded(
                "max_call_argument_bytes",
                self._limits.max_call_argument_bytes,
                "anthropic buffered content block",
            )
        into.append(piece)

    def _count_text(self, text: str) -> None:
        self._text_bytes += utf8_len(text)
        if self._text_bytes > self._limits.max_text_bytes:
            raise LimitExceeded("max_text_bytes", self._limits.max_text_bytes, "anthropic text")


# Event type -> handler (after the checks of ``_event``).
_HANDLERS: Final[dict[type, Callable[[AnthropicStream, Any, list[BatchEvent]], None]]] = {
    _BlockDelta: AnthropicStream._block_delta,
    _MessageStart: AnthropicStream._message_start,
    _BlockStart: AnthropicStream._block_start,
    _BlockStop: AnthropicStream._block_stop,
    _MessageDelta: AnthropicStream._message_delta,
    _MessageStop: AnthropicStream._message_stop,
    _ErrorEvent: AnthropicStream._error,
}
# Events that may come before message_start (deltas fail later, on their unknown block).
_BEFORE_START: Final = frozenset({_BlockDelta, _ErrorEvent, _MessageStart})


def _tag(value: msgspec.Struct) -> str:
    return str(value.__struct_config__.tag)


def _provider_error(error: _Error | None) -> ProviderError:
    code = error.type if error is not None else None
    message = error.message if error is not None else None
    return ProviderError(
        ProviderErrorInfo(code=code, message=message, retryable=code in _RETRYABLE_ERRORS)
    )


# --- encode side ---------------------------------------------------------------------------


class AnthropicAdapter:
    """The Anthropic Messages adapter (decode and encode side)."""

    name = "anthropic"
    family = "anthropic_messages"
    revision = "anthropic/1"
    sse_unframed = False
    finish_reasons: Mapping[str, OutcomeKind] = FINISH_REASONS

    def new_stream(self, limits: Limits) -> AnthropicStream:
        return AnthropicStream(limits)

    def initial_messages(self, user_text: str) -> list[JSON]:
        return [{"role": "user", "content": user_text}]

    def assistant_echo(self, outcome: TurnOutcome) -> list[JSON]:
        """The assistant message with every content block in index order: text, thinking
        (signature unmodified) and server-tool blocks from the continuation items, client
        ``tool_use`` blocks from the proposed calls with their parsed input. Works for
        paused turns too (``pause_turn`` is answered by echoing and requesting again)."""
        blocks: list[tuple[int, JSON]] = []
        for item in outcome.continuation:
            # The API rejects empty text blocks; an empty one carries nothing to keep.
            if item.kind == "text" and not item.item.get("text"):
                continue
            blocks.append((item.index, dict(item.item)))
        for call in outcome.calls:
            # A call whose arguments were rejected still gets an error result, which must
            # reference a tool_use block; the API requires an object input.
            args = call.arguments if call.arguments is not None else {}
            blocks.append(
                (
                    call.index,
                    {"type": "tool_use", "id": call.call_id, "name": call.name, "input": args},
                )
            )
        if not blocks:
            return []
        blocks.sort(key=lambda pair: pair[0])
        return [{"role": "assistant", "content": [block for _, block in blocks]}]

    def encode_results(self, outcome: TurnOutcome, results: list[ModelResult]) -> list[JSON]:
        """One user message whose content is only ``tool_result`` blocks, in the given order
        (the API rejects text placed before them)."""
        if not results:
            return []
        content: list[JSON] = []
        for result in results:
            block: JSON = {
                "type": "tool_result",
                "tool_use_id": result.call_id,
                "content": result.content,
            }
            if result.is_error:
                block["is_error"] = True
            content.append(block)
        return [{"role": "user", "content": content}]

    def build_request(
        self,
        *,
        model: str,
        messages: list[JSON],
        tools: list[ToolDeclaration],
        system: str | None = None,
        max_tokens: int | None = None,
        previous: TurnOutcome | None = None,
    ) -> HttpRequestSpec:
        body: JSON = {
            "model": model,
            "messages": messages,
            "stream": True,
            "max_tokens": max_tokens if max_tokens is not None else _DEFAULT_MAX_TOKENS,
        }
        if tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in tools
            ]
        if system is not None:
            body["system"] = system
        return HttpRequestSpec(path="/v1/messages", body=body)

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-api-key": api_key, "anthropic-version": _API_VERSION}


ADAPTER: Final = AnthropicAdapter()
