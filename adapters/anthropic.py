"""Anthropic Messages adapter: streamed ``/v1/messages`` events in, engine events out; engine
values in, Messages request shapes out.

Owns the reading of Anthropic's content-block stream (``message_start`` …
``message_stop``) and the writing of the assistant echo, ``tool_result`` blocks and the
streaming request body. Never does HTTP, never parses tool arguments (the assembler does,
on ``CallDone``), never trusts provider text as a status.

Decoding: every content block is keyed by its ``index``. Client ``tool_use`` blocks become
``CallStarted``/``ArgumentsDelta``/``CallDone`` (the ``input: {}`` placeholder is discarded;
``content_block_stop`` is the arguments-done signal). A non-empty ``input`` in
``content_block_start`` (as proxies send it) is the call's argument text, its exact wire
bytes, and no input delta may follow it. Every other block (text, thinking,
redacted_thinking, server_tool_use, web_search_tool_result, unknown types) is rebuilt here
and emitted whole as a ``ContinuationItem(kind=<block type>)`` at its stop, so that
``assistant_echo`` can replay the assistant content in index order with thinking
signatures unmodified (the last ``signature_delta`` is the signature, as the SDK assigns
it). Text is also streamed as ``TextDelta`` for the assembler.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

import msgspec

from callgate.engine.core.adapter import (
    JSON,
    HttpRequestSpec,
    ModelResult,
    ToolDeclaration,
    unsendable_call,
)
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
from callgate.engine.core.footprint import footprint
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import (
    OutcomeKind,
    ProposedCall,
    ProviderErrorInfo,
    TurnOutcome,
    Usage,
    token_sum,
)
from callgate.engine.core.pieces import TextPieces
from callgate.engine.core.sse import SSEEvent

from . import _anthropic_wire as wire
from ._anthropic_blocks import OTHER, TEXT, TOOL, Block
from ._anthropic_wire import (
    DECODER,
    HEAD_DECODER,
    JSON_DECODER,
    KIND_DECODER,
    KNOWN_TYPES,
    NO_COUNTS,
    AnyEvent,
    BlockDelta,
    BlockStart,
    BlockStop,
    CitationPiece,
    ErrorEvent,
    InputJson,
    MessageDelta,
    MessageStart,
    MessageStop,
    Ping,
    SignaturePiece,
    TextPiece,
    ThinkingPiece,
    placeholder,
)
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


class AnthropicStream:
    """Decoding state of one Messages response."""

    __slots__ = (
        "_blocks",
        "_done",
        "_held",
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
        self._blocks: dict[int, Block] = {}
        # Indexes of the tool_use blocks started and not stopped (argument fragments).
        self._open_tools: set[int] = set()
        self._other_blocks = 0
        # Bytes of the open non-tool blocks (their start and buffered deltas): held here
        # until their stop hands them on as items, so bounded with them (the assembler
        # counts an item once it has it).
        self._held = 0
        self._text_bytes = 0
        self._started = False
        self._done = False
        self._stop_reason: str | None = None
        # Usage counts merged field by field: a message_delta may repeat only some of them
        # (input_tokens without the cache counts), which must not drop the others.
        self._usage = NO_COUNTS

    def decode(self, event: SSEEvent) -> list[EngineEvent]:
        out: list[BatchEvent] = []
        self.decode_batch([event], out)
        return cast("list[EngineEvent]", out)  # one event never makes a run

    def decode_batch(self, events: list[SSEEvent], out: list[BatchEvent]) -> None:
        """Translate a chunk's events in order. Argument fragments of one call that
        follow each other become one ``ArgumentsRun``; everything else is handled event
        by event. Events before an error are in ``out`` when it is raised."""
        decode = DECODER.decode
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
                if type(ev) is BlockDelta and not self._done:
                    delta = ev.delta
                    if type(delta) is InputJson and ev.index in open_tools:
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

    def _event(self, ev: AnyEvent, out: list[BatchEvent]) -> None:
        kind = type(ev)
        if kind is Ping:
            return
        if self._done:
            raise StreamProtocolError(f"anthropic: {_tag(ev)!r} event after message_stop")
        if not self._started and kind not in _BEFORE_START:
            raise StreamProtocolError(f"anthropic: {_tag(ev)!r} before message_start")
        _HANDLERS[kind](self, ev, out)

    def _message_stop(self, ev: MessageStop, out: list[BatchEvent]) -> None:
        if self._stop_reason is None:
            raise StreamProtocolError("anthropic: message_stop without a stop_reason")
        self._done = True
        reason = self._stop_reason
        kind = FINISH_REASONS.get(reason, OutcomeKind.FAILED)
        if kind in (OutcomeKind.FINAL_TEXT, OutcomeKind.TOOL_PROPOSALS, OutcomeKind.PAUSED):
            # A turn that goes on (run, echoed, resumed) needs its blocks whole: a block
            # becomes an item only at its stop, so one still open would be missing from
            # the echo (with its signature). A cut turn (max_tokens) may leave one open.
            unstopped = [i for i, b in self._blocks.items() if b.open and b.kind != TOOL]
            if unstopped:
                raise StreamProtocolError(
                    f"anthropic: content block {unstopped[0]} got no content_block_stop "
                    "before message_stop"
                )
        out.append(Completion(kind, reason))

    def _error(self, ev: ErrorEvent, out: list[BatchEvent]) -> None:
        out.append(_provider_error(ev.error))

    def _other_event(
        self, event: SSEEvent, exc: msgspec.DecodeError, out: list[BatchEvent]
    ) -> None:
        """An event the typed union did not take: malformed, or of a type Anthropic added
        after this adapter (documented to happen; such events carry nothing we act on)."""
        try:
            kind = KIND_DECODER.decode(event.data).type
        except msgspec.DecodeError:
            kind = None
        if kind is None or kind in KNOWN_TYPES:
            raise StreamProtocolError(
                f"anthropic: undecodable {event.event!r} event: {exc}"
            ) from None
        if self._done:
            raise StreamProtocolError(f"anthropic: {kind!r} event after message_stop")

    # --- message level ---------------------------------------------------------------

    def _message_start(self, ev: MessageStart, out: list[BatchEvent]) -> None:
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

    def _message_delta(self, ev: MessageDelta, out: list[BatchEvent]) -> None:
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

    def _report_usage(self, usage: wire.Usage, with_output: bool, out: list[BatchEvent]) -> None:
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

    def _block_start(self, ev: BlockStart, out: list[BatchEvent]) -> None:
        index = ev.index
        raw = ev.content_block
        if index < 0 or not wire.given(raw):
            raise StreamProtocolError("anthropic: content_block_start without index or block")
        if index in self._blocks:
            raise StreamProtocolError(f"anthropic: content block {index} started twice")
        try:
            head = HEAD_DECODER.decode(raw)
        except msgspec.DecodeError as exc:
            raise StreamProtocolError(
                f"anthropic: undecodable content block {index}: {exc}"
            ) from None
        btype = head.type
        if not isinstance(btype, str):
            raise StreamProtocolError(f"anthropic: content block {index} has no type")
        if btype == "tool_use":
            call_id, name, args = head.id, head.name, head.input
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise StreamProtocolError(f"anthropic: tool_use block {index} lacks id or name")
            if placeholder(args):
                # `input: {}` (documented): the input_json_delta fragments carry the input.
                self._blocks[index] = Block(TOOL, None)
                self._open_tools.add(index)
                out.append(CallStarted(index, name, call_id=call_id))
                return
            # A real input in content_block_start (proxies send it whole) is never dropped:
            # alone it is the call's arguments, as its exact wire bytes (parsed strictly and
            # capped by the assembler). An input delta after it would be a second source;
            # joining or picking one would be a guess, so it fails the stream (the block is
            # kept out of `_open_tools`, so its deltas take `_block_delta`'s path).
            text = wire.text(args, f"tool_use block {index} input")
            self._blocks[index] = Block(TOOL, None, whole=True)
            out.append(CallStarted(index, name, call_id=call_id))
            out.append(ArgumentsDelta(index, text))
            return
        try:
            block = JSON_DECODER.decode(raw)  # an object (it decoded as `BlockHead`) ...
        except msgspec.DecodeError as exc:  # ... whose unread members may be bad UTF-8
            raise StreamProtocolError(
                f"anthropic: undecodable content block {index}: {exc}"
            ) from None
        # Each non-tool block becomes one continuation item at its stop.
        self._other_blocks += 1
        if self._other_blocks > self._limits.max_continuation_items:
            raise LimitExceeded(
                "max_continuation_items", self._limits.max_continuation_items, "anthropic blocks"
            )
        if btype == "text":
            text = block.get("text")
            self._blocks[index] = new = Block(TEXT, block)
            self._hold_value(new, block, len(raw))
            if isinstance(text, str) and text:
                self._count_text(text)
                out.append(TextDelta(text))
            return
        # A server tool's non-empty input here is its input (echoed): no input delta may follow.
        self._blocks[index] = new = Block(OTHER, block, whole=not placeholder(head.input))
        self._hold_value(new, block, len(raw))

    def _block_delta(self, ev: BlockDelta, out: list[BatchEvent]) -> None:
        index = ev.index
        block = self._blocks.get(index)
        if block is None or not block.open:
            state = "closed" if block is not None else "unknown"
            raise StreamProtocolError(f"anthropic: delta for {state} content block {index}")
        delta = ev.delta
        if delta is None:
            raise StreamProtocolError(f"anthropic: content_block_delta {index} without delta")
        if isinstance(delta, TextPiece) and block.kind == TEXT and delta.text is not None:
            text = delta.text
            if text:
                self._count_text(text)
                block.text.add(text)
                out.append(TextDelta(text))
            return
        if isinstance(delta, InputJson) and delta.partial_json is not None:
            fragment = delta.partial_json
            if block.kind != TEXT:
                if fragment and block.whole:
                    raise StreamProtocolError(
                        f"anthropic: input_json_delta for content block {index}: "
                        "its input came whole in content_block_start"
                    )
                if block.kind == OTHER:
                    self._buffer(block, fragment, block.json)
                elif fragment:
                    out.append(ArgumentsDelta(index, fragment))
                return
        elif block.kind == OTHER and block.data is not None:
            btype = block.data.get("type")
            if isinstance(delta, ThinkingPiece) and btype == "thinking":
                if delta.thinking is not None:
                    self._buffer(block, delta.thinking, block.text)
                    return
            elif isinstance(delta, SignaturePiece) and delta.signature is not None:
                # The last signature given wins (the SDK's accumulator assigns it): the one
                # it replaces no longer counts against the buffer cap.
                if block.signature:
                    block.nbytes -= utf8_len(block.signature)
                self._charge(block, delta.signature)
                block.signature = delta.signature
                return
        if isinstance(delta, CitationPiece) and block.kind != TOOL:
            if len(block.citations) >= self._limits.max_continuation_items:
                raise LimitExceeded(
                    "max_continuation_items", self._limits.max_continuation_items, "citations"
                )
            citation = bytes(delta.citation)  # a copy, not a view pinning the event's buffer
            if citation[:1] != b"{":
                raise StreamProtocolError("anthropic: citations_delta citation is not an object")
            self._hold(block, len(citation))
            block.citations.append(citation)
            return
        raise StreamProtocolError(
            f"anthropic: {_tag(delta)!r} delta not valid for content block {index}"
        )

    def _block_stop(self, ev: BlockStop, out: list[BatchEvent]) -> None:
        index = ev.index
        block = self._blocks.get(index)
        if block is None or not block.open:
            state = "closed" if block is not None else "unknown"
            raise StreamProtocolError(f"anthropic: content_block_stop for {state} block {index}")
        block.open = False
        if block.kind == TOOL:
            self._open_tools.discard(index)
            out.append(CallDone(index))
            return
        data = block.data
        assert data is not None  # set for every non-tool block
        item = dict(data)
        btype = str(item["type"])
        if block.text:
            field = "text" if block.kind == TEXT else "thinking"
            item[field] = str(item.get(field) or "") + block.text.joined()
        if block.signature is not None:
            item["signature"] = block.signature
        if block.json:
            raw = block.json.joined()
            try:
                if raw:
                    item["input"] = JSON_DECODER.decode(raw)
                elif item.get("input") is None:
                    item["input"] = {}
                # else empty deltas change nothing: the start's input stands, as in the SDK
            except msgspec.DecodeError:
                raise StreamProtocolError(
                    f"anthropic: {btype} block {index} input is not JSON"
                ) from None
        if block.citations:
            existing = item.get("citations")
            item["citations"] = [
                *(existing if isinstance(existing, list) else ()),
                *(JSON_DECODER.decode(c) for c in block.citations),
            ]
        # Release the buffers; the block index stays known so a reuse is still caught.
        self._held -= block.held
        block.held = 0
        block.data = block.signature = None
        block.text, block.json = TextPieces(), TextPieces()
        block.citations = []
        out.append(ContinuationItem(btype, index, item))

    def _buffer(self, block: Block, piece: str, into: TextPieces) -> None:
        self._charge(block, piece)
        into.add(piece)

    def _charge(self, block: Block, piece: str) -> None:
        size = utf8_len(piece)
        block.nbytes += size
        if block.nbytes > self._limits.max_call_argument_bytes:
            raise LimitExceeded(
                "max_call_argument_bytes",
                self._limits.max_call_argument_bytes,
                "anthropic buffered content block",
            )
        self._hold(block, size)

    def _hold_value(self, block: Block, value: object, size: int) -> None:
        """Hold a decoded block head: charged as kept values are (see core.footprint)."""
        budget = self._limits.max_continuation_bytes - self._held
        self._hold(block, footprint(value, size, budget))

    def _hold(self, block: Block, size: int) -> None:
        block.held += size
        self._held += size
        if self._held > self._limits.max_continuation_bytes:
            raise LimitExceeded(
                "max_continuation_bytes",
                self._limits.max_continuation_bytes,
                "anthropic open content blocks",
            )

    def _count_text(self, text: str) -> None:
        self._text_bytes += utf8_len(text)
        if self._text_bytes > self._limits.max_text_bytes:
            raise LimitExceeded("max_text_bytes", self._limits.max_text_bytes, "anthropic text")


# Event type -> handler (after the checks of ``_event``).
_HANDLERS: Final[dict[type, Callable[[AnthropicStream, Any, list[BatchEvent]], None]]] = {
    BlockDelta: AnthropicStream._block_delta,
    MessageStart: AnthropicStream._message_start,
    BlockStart: AnthropicStream._block_start,
    BlockStop: AnthropicStream._block_stop,
    MessageDelta: AnthropicStream._message_delta,
    MessageStop: AnthropicStream._message_stop,
    ErrorEvent: AnthropicStream._error,
}
# Events that may come before message_start (deltas fail later, on their unknown block).
_BEFORE_START: Final = frozenset({BlockDelta, ErrorEvent, MessageStart})


def _tag(value: msgspec.Struct) -> str:
    return str(value.__struct_config__.tag)


def _provider_error(error: wire.Error | None) -> ProviderError:
    code = error.type if error is not None else None
    message = error.message if error is not None else None
    return ProviderError(
        ProviderErrorInfo(code=code, message=message, retryable=code in _RETRYABLE_ERRORS)
    )


# --- encode side ---------------------------------------------------------------------------


def _has_text(text: object) -> bool:
    return isinstance(text, str) and not text.isspace() and text != ""


# What Anthropic's tool_use names may be in a conversation the next request
# carries (the API refuses anything else, after the turn's calls would have run).
_ECHO_NAME = re.compile(r"[A-Za-z0-9_-]{1,200}")


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
            # The API rejects empty and whitespace-only text blocks ("text content blocks
            # must contain non-whitespace text"); such a block carries nothing to keep.
            if item.kind == "text" and not _has_text(item.item.get("text")):
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

    def unsendable(self, call: ProposedCall) -> str | None:
        # (No id pattern: api.anthropic.com takes back only [A-Za-z0-9_-]+, but
        # compatible servers serving Kimi K2 issue and take back "functions.x:0".)
        return unsendable_call(call, _ECHO_NAME)

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-api-key": api_key, "anthropic-version": _API_VERSION}


ADAPTER: Final = AnthropicAdapter()
