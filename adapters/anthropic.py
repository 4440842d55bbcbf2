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

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from callgate.engine.core.adapter import JSON, HttpRequestSpec, ModelResult, ToolDeclaration
from callgate.engine.core.errors import LimitExceeded, StreamProtocolError
from callgate.engine.core.events import (
    ArgumentsDelta,
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
)
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import OutcomeKind, ProviderErrorInfo, TurnOutcome, Usage
from callgate.engine.core.sse import SSEEvent

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


class _Usage(msgspec.Struct, gc=False):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class _Message(msgspec.Struct, gc=False):
    id: str | None = None
    model: str | None = None
    usage: _Usage | None = None


class _Delta(msgspec.Struct, gc=False):
    # content_block_delta fields
    type: str = ""
    text: str | None = None
    partial_json: str | None = None
    thinking: str | None = None
    signature: str | None = None
    citation: dict[str, Any] | None = None
    # message_delta fields
    stop_reason: str | None = None
    stop_details: dict[str, Any] | None = None


class _Error(msgspec.Struct, gc=False):
    type: str | None = None
    message: str | None = None


class _Event(msgspec.Struct, gc=False):
    type: str
    index: int = -1
    message: _Message | None = None
    # Kept as a dict: non-tool blocks are echoed whole, unknown keys included.
    content_block: dict[str, Any] | None = None
    delta: _Delta | None = None
    usage: _Usage | None = None
    error: _Error | None = None


_DECODER: Final = msgspec.json.Decoder(_Event)
_JSON_DECODER: Final = msgspec.json.Decoder()

# Block kinds.
_TOOL: Final = 0  # client tool_use: streamed to the assembler, not buffered here
_TEXT: Final = 1  # text: streamed as TextDelta and buffered for the echo
_OTHER: Final = 2  # thinking, server tools, unknown: buffered for the echo only


def _utf8_len(text: str) -> int:
    # isascii() is O(1) on CPython; only non-ASCII text pays for an encode.
    return len(text) if text.isascii() else len(text.encode())


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

    def decode(self, event: SSEEvent) -> list[EngineEvent]:
        try:
            ev = _DECODER.decode(event.data)
        except msgspec.DecodeError as exc:
            raise StreamProtocolError(
                f"anthropic: undecodable {event.event!r} event: {exc}"
            ) from None
        kind = ev.type
        # Deltas are nearly every event: test for them first, and take a tool call's
        # argument fragment right here (the checks of ``_block_delta`` for that case).
        if kind == "content_block_delta" and not self._done:
            delta = ev.delta
            if ev.index in self._open_tools and delta is not None:
                fragment = delta.partial_json
                if delta.type == "input_json_delta" and fragment is not None:
                    return [ArgumentsDelta(ev.index, fragment)] if fragment else []
            return self._block_delta(ev)
        if kind == "ping":
            return []
        if self._done:
            raise StreamProtocolError(f"anthropic: {kind!r} event after message_stop")
        if kind == "error":
            return [_provider_error(ev.error)]
        if kind == "message_start":
            return self._message_start(ev)
        if not self._started and kind in _NEEDS_START:
            raise StreamProtocolError(f"anthropic: {kind!r} before message_start")
        if kind == "content_block_start":
            return self._block_start(ev)
        if kind == "content_block_stop":
            return self._block_stop(ev.index)
        if kind == "message_delta":
            return self._message_delta(ev)
        if kind == "message_stop":
            if self._stop_reason is None:
                raise StreamProtocolError("anthropic: message_stop without a stop_reason")
            self._done = True
            reason = self._stop_reason
            return [Completion(FINISH_REASONS.get(reason, OutcomeKind.FAILED), reason)]
        # Anthropic documents that new event types may appear; they carry nothing we act on.
        return []

    def end(self) -> list[EngineEvent]:
        # The Completion was emitted at message_stop; a stream cut before it stays
        # without one, which the assembler reads as truncated.
        return []

    # --- message level ---------------------------------------------------------------

    def _message_start(self, ev: _Event) -> list[EngineEvent]:
        if self._started:
            raise StreamProtocolError("anthropic: second message_start")
        self._started = True
        msg = ev.message
        if msg is None:
            raise StreamProtocolError("anthropic: message_start without a message")
        out: list[EngineEvent] = [ResponseMeta(msg.id, msg.model)]
        usage = msg.usage
        if usage is not None:
            out.append(
                UsageReport(
                    Usage(
                        input_tokens=usage.input_tokens,
                        cached_input_tokens=usage.cache_read_input_tokens,
                    )
                )
            )
        return out

    def _message_delta(self, ev: _Event) -> list[EngineEvent]:
        out: list[EngineEvent] = []
        delta = ev.delta
        if delta is not None:
            if delta.stop_reason is not None:
                self._stop_reason = delta.stop_reason
            if delta.stop_details is not None:
                out.append(ProviderDetail("stop_details", delta.stop_details))
        usage = ev.usage
        if usage is not None:
            out.append(
                UsageReport(
                    Usage(
                        input_tokens=usage.input_tokens,
                        output_tokens=usage.output_tokens,
                        cached_input_tokens=usage.cache_read_input_tokens,
                    )
                )
            )
        return out

    # --- content blocks --------------------------------------------------------------

    def _block_start(self, ev: _Event) -> list[EngineEvent]:
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
            return [CallStarted(index, name, call_id=call_id)]
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
                return [TextDelta(text)]
            return []
        self._blocks[index] = _Block(_OTHER, block)
        return []

    def _block_delta(self, ev: _Event) -> list[EngineEvent]:
        index = ev.index
        block = self._blocks.get(index)
        if block is None or not block.open:
            state = "closed" if block is not None else "unknown"
            raise StreamProtocolError(f"anthropic: delta for {state} content block {index}")
        delta = ev.delta
        if delta is None:
            raise StreamProtocolError(f"anthropic: content_block_delta {index} without delta")
        dtype = delta.type
        if dtype == "text_delta" and block.kind == _TEXT and delta.text is not None:
            text = delta.text
            if not text:
                return []
            self._count_text(text)
            block.text.append(text)
            return [TextDelta(text)]
        if dtype == "input_json_delta" and delta.partial_json is not None:
            fragment = delta.partial_json
            if block.kind == _TOOL:
                return [ArgumentsDelta(index, fragment)] if fragment else []
            if block.kind == _OTHER:
                self._buffer(block, fragment, block.json)
                return []
        elif block.kind == _OTHER and block.data is not None:
            btype = block.data.get("type")
            if dtype == "thinking_delta" and btype == "thinking" and delta.thinking is not None:
                self._buffer(block, delta.thinking, block.text)
                return []
            if dtype == "signature_delta" and delta.signature is not None:
                self._buffer(block, delta.signature, block.signature)
                return []
        if dtype == "citations_delta" and block.kind != _TOOL and delta.citation is not None:
            if len(block.citations) >= self._limits.max_continuation_items:
                raise LimitExceeded(
                    "max_continuation_items", self._limits.max_continuation_items, "citations"
                )
            block.citations.append(delta.citation)
            return []
        raise StreamProtocolError(f"anthropic: {dtype!r} delta not valid for content block {index}")

    def _block_stop(self, index: int) -> list[EngineEvent]:
        block = self._blocks.get(index)
        if block is None or not block.open:
            state = "closed" if block is not None else "unknown"
            raise StreamProtocolError(f"anthropic: content_block_stop for {state} block {index}")
        block.open = False
        if block.kind == _TOOL:
            self._open_tools.discard(index)
            return [CallDone(index)]
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
        return [ContinuationItem(btype, index, item)]

    def _buffer(self, block: _Block, piece: str, into: list[str]) -> None:
        block.nbytes += _utf8_len(piece)
        if block.nbytes > self._limits.max_call_argument_bytes:
            raise LimitExceeded(
                "max_call_argument_bytes",
                self._limits.max_call_argument_bytes,
                "anthropic buffered content block",
            )
        into.append(piece)

    def _count_text(self, text: str) -> None:
        self._text_bytes += _utf8_len(text)
        if self._text_bytes > self._limits.max_text_bytes:
            raise LimitExceeded("max_text_bytes", self._limits.max_text_bytes, "anthropic text")


# Events that only make sense inside a started message.
_NEEDS_START: Final = frozenset(
    {"content_block_start", "content_block_stop", "message_delta", "message_stop"}
)


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
