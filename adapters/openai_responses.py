"""OpenAI Responses adapter (``POST /v1/responses``, ``stream:true``, stateless).

Owns the translation between Responses wire shapes and engine values: typed stream
events into engine events (decode side), and input items, ``function_call_output``
results and the streaming request body (encode side). It never does HTTP, never parses
argument JSON (the assembler does, on the done signal) and never decides what a turn
means beyond its terminal-reason table.

Decoding dispatches on the SSE ``event:`` name (always equal to ``data.type``, which is
checked, but for the argument deltas: see ``_responses_wire``), so each event is decoded
once, into a small view of just the fields read; an event type this adapter does not act
on is decoded into a view of its ``type`` alone, so malformed JSON fails the turn
wherever it is. Every ``output_item.done`` item is kept verbatim as a continuation item
(the stateless next request echoes them, in output order, and the reasoning item's
``encrypted_content`` is only final there: the value at
``output_item.added`` may be incomplete), with one exception: a completed
``function_call`` item is kept without its ``arguments``, which repeat the streamed text
the call already holds as its raw bytes; ``assistant_echo`` puts them back from there.
The done events' repeated argument texts stay raw JSON literals (``CallDone.literal``),
compared with the fragments a slice at a time, so a long call is never held twice.

A function call is what its ``output_item.added`` says: an argument event that names it
by both ``output_index`` and ``item_id`` must name the same call by each, and its done
item must keep its ``call_id``, ``name`` and ``id`` (the echo replays that item);
anything else is a protocol error, never a guess at which call was meant. The terminal
event's ``response.output[]`` is read against the stream (``_responses_calls``): a
function_call in it that never streamed fails the turn, and one that differs from the
streamed call is rejected as a disagreeing done event is. An ``output_text`` part whose
text came in no delta takes it once from its done text (``_responses_parts``: per part,
while the stream names parts consistently); when deltas carried a part's text, its done
text is not read. A refusal part is a refusal from its ``content_part.added`` on.

Encode side (stateless, ``store:false``): ``include:["reasoning.encrypted_content"]`` is
sent only when ``is_reasoning_model(model)`` says so (other models reject it with 400
"Encrypted content is not supported with this model"). The echo leaves out a reasoning
item without ``encrypted_content`` (an id-only reference the server cannot resolve when
nothing is stored: "Item with id rs_… not found") and gives a ``function_call`` whose
kept ``arguments`` are absent or null the call's exact raw argument text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TypeVar, cast

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
    ProviderError,
    RefusalDelta,
    ResponseMeta,
    TextDelta,
    UsageReport,
    append_fragments,
)
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import OutcomeKind, ProposedCall, ProviderErrorInfo, TurnOutcome
from callgate.engine.core.sse import SSEData, SSEEvent

from . import _responses_wire as wire
from ._openai_common import ErrorView, error_info
from ._responses_calls import Identity, digest, same_call, terminal_calls
from ._responses_parts import TextParts

__all__ = [
    "ADAPTER",
    "FINISH_REASONS",
    "OpenAIResponsesAdapter",
    "OpenAIResponsesStream",
    "is_reasoning_model",
]

# Raw terminal reason -> outcome kind. The raw reason is the response status
# ("completed"), the incomplete_details.reason of response.incomplete, or the error code
# of response.failed. Tool use has no reason of its own: function_call items decide it.
FINISH_REASONS: dict[str, OutcomeKind] = {
    "completed": OutcomeKind.FINAL_TEXT,
    "incomplete": OutcomeKind.TRUNCATED,
    "max_output_tokens": OutcomeKind.TRUNCATED,
    "content_filter": OutcomeKind.REFUSAL,
    "failed": OutcomeKind.FAILED,
    "cancelled": OutcomeKind.FAILED,
}

_INCLUDE = ["reasoning.encrypted_content"]

# Model names that get ``_INCLUDE``: the o-series (o1, o3-mini, o4-mini, ...), the gpt-5
# family except gpt-5-chat (gpt-5, gpt-5-mini, gpt-5.1, gpt-5-codex, ...), gpt-oss and
# codex models, also inside a longer name (an Azure deployment "prod-o3-mini", a
# fine-tune "ft:o4-mini:org::id"): a word that starts one of those.
_REASONING_MODEL = re.compile(r"(?:^|[^a-z0-9])(?:o\d|gpt-5(?!-chat)|gpt-oss|codex)")


def is_reasoning_model(model: str) -> bool:
    """Whether ``model`` is a reasoning model, i.e. whether the request asks for
    ``reasoning.encrypted_content`` (non-reasoning models such as gpt-4o, gpt-4.1 and
    gpt-5-chat-latest reject it). Case-insensitive; a ``provider/`` prefix
    (``openai/gpt-5``) is ignored. A name the rule does not know counts as non-reasoning:
    such a model then gets no encrypted reasoning to carry between turns."""
    name = model.rsplit("/", 1)[-1].strip().lower()
    return _REASONING_MODEL.search(name) is not None


_V = TypeVar("_V", bound=wire.Typed)


def _read(decoder: msgspec.json.Decoder[_V], data: SSEData, name: str) -> _V:
    """An event's view, whose ``type`` (when given) must be the ``event:`` name: the name
    chose the view, so a different type would be read as an event it is not."""
    view = decoder.decode(data)
    if view.type is not None and view.type != name:
        raise StreamProtocolError(f"openai_responses: {name} event of type {view.type!r}")
    return view


class OpenAIResponsesStream:
    """Decoding state of one Responses stream."""

    __slots__ = (
        "_by_item",
        "_calls",
        "_done",
        "_item_at",
        "_items",
        "_limits",
        "_meta_sent",
        "_parts",
        "_refusal_text",
        "_refused",
        "_started",
        "_terminal",
        "_told",
    )

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        # Function-call item id -> output_index, for deltas that carry only item_id and
        # to check those that carry both.
        self._by_item: dict[str, int] = {}
        # output_index -> (call_id, name, item id) of each call at output_item.added.
        self._calls: dict[int, Identity] = {}
        # output_index -> item id (or None) of each call: the delta fast path's check.
        self._item_at: dict[int, str | None] = {}
        # The calls whose done signal was emitted, and the digest of each one's first
        # done literal: the terminal output repeats them.
        self._done: set[int] = set()
        self._told: dict[int, bytes] = {}
        self._started = 0
        self._items = 0
        self._meta_sent = False
        self._terminal = False
        # A refusal part was seen (even one without deltas or text), and whether its text
        # reached the turn as RefusalDelta: a refusal is never read as final_text.
        self._refused = False
        self._refusal_text = False
        self._parts = TextParts()  # which output_text parts take a done text

    def decode_batch(self, events: list[SSEEvent], out: list[BatchEvent]) -> None:
        """Translate a chunk's events in order; consecutive argument deltas become one
        ``ArgumentsRun``. Events before an error are in ``out`` when it is raised."""
        decode, delta_name = wire.ARGS_DELTA.decode, wire.ARGS_DELTA_NAME
        item_at = self._item_at  # output_index -> item id of its call
        indexes: list[int] = []
        pieces: list[str] = []
        add_index, add_piece = indexes.append, pieces.append
        terminal = self._terminal  # changes only in ``_event``
        try:
            for event in events:
                if event.event == delta_name and not terminal:
                    # Nearly every event: ``_on_arguments_delta`` inlined. After the
                    # terminal event the handler decides.
                    try:
                        ev = decode(event.data)
                    except msgspec.DecodeError as exc:
                        raise StreamProtocolError(
                            f"openai_responses: undecodable {delta_name} event: {exc}"
                        ) from None
                    delta = ev.delta
                    if delta:
                        index = ev.output_index
                        try:
                            if index is None or item_at[index] != ev.item_id:
                                index = self._index(index, ev.item_id)
                        except KeyError:  # no call at that output_index
                            index = self._index(index, ev.item_id)
                        add_index(index)
                        add_piece(delta)
                    continue
                if pieces:
                    append_fragments(out, indexes, pieces)
                    indexes, pieces = [], []
                    add_index, add_piece = indexes.append, pieces.append
                out += self._event(event)
                terminal = self._terminal
        except RecursionError:
            # msgspec's own guard against nesting (even in a field no view reads).
            raise StreamProtocolError(
                "openai_responses: an event nests too deeply to decode"
            ) from None
        finally:
            append_fragments(out, indexes, pieces)

    def decode(self, event: SSEEvent) -> list[EngineEvent]:
        out: list[BatchEvent] = []
        self.decode_batch([event], out)
        return cast("list[EngineEvent]", out)  # one event never makes a run

    def _event(self, event: SSEEvent) -> list[EngineEvent]:
        """Any event but an argument delta before the terminal event."""
        name = event.event
        try:
            handler = _HANDLERS.get(name)
            if handler is None:
                if name != "message":
                    # An event type this adapter does not read: still JSON of that type.
                    _read(wire.TYPED, event.data, name)
                    return []
                # No `event:` line: fall back to the JSON "type" (one extra, small decode).
                try:
                    name = wire.TYPE.decode(event.data).type
                except msgspec.DecodeError as exc:
                    if bytes(event.data).strip() == b"[DONE]":
                        return []  # an end-of-stream marker (LiteLLM); only a terminal event ends
                    raise StreamProtocolError(
                        f"openai_responses: undecodable event: {exc}"
                    ) from None
                handler = _HANDLERS.get(name)
                if handler is None:
                    return []
            if self._terminal and name not in _TERMINAL_EVENTS:
                # Nothing follows the terminal event: a call added after it must not join
                # (or hold open) a turn that already ended. (A second terminal event gets
                # its own error from its handler.)
                raise StreamProtocolError(
                    f"openai_responses: {name} event after the terminal event"
                )
            return handler(self, event.data, name)
        except msgspec.DecodeError as exc:
            raise StreamProtocolError(
                f"openai_responses: undecodable {name} event: {exc}"
            ) from None

    def end(self) -> list[EngineEvent]:
        # Completions are emitted on the terminal event; without one the turn is truncated.
        return []

    # --- handlers: (self, data, event name) -> events ------------------------------------

    def _on_lifecycle(self, data: SSEData, name: str) -> list[EngineEvent]:
        if self._meta_sent:
            _read(wire.TYPED, data, name)  # nothing more to read, but it must decode
            return []
        response = _read(wire.LIFECYCLE, data, name).response
        if response is None or not (response.id or response.model):
            return []  # an empty id or model is no value: a later event may give one
        self._meta_sent = True
        return [ResponseMeta(response.id, response.model)]

    def _on_item_added(self, data: SSEData, name: str) -> list[EngineEvent]:
        ev = _read(wire.ITEM_ADDED, data, name)
        item = ev.item
        if item.type == "message":
            self._parts.message(ev.output_index, item.id)
        if item.type != "function_call":
            return []  # other items matter only at output_item.done (verbatim, final)
        if not item.name:
            raise StreamProtocolError(
                f"openai_responses: function_call at output_index {ev.output_index} has no name"
            )
        self._started += 1
        if self._started > self._limits.max_calls_per_response:
            raise LimitExceeded("max_calls_per_response", self._limits.max_calls_per_response)
        if ev.output_index in self._calls:
            raise StreamProtocolError(
                f"openai_responses: two function_call items at output_index {ev.output_index}"
            )
        if item.id:
            # An id two calls share (a compatible server's constant) names neither: it is
            # kept as ambiguous, and events are attributed by output_index alone.
            self._by_item[item.id] = -1 if item.id in self._by_item else ev.output_index
        self._item_at[ev.output_index] = item.id
        self._calls[ev.output_index] = (item.call_id, item.name, item.id)
        return [CallStarted(ev.output_index, item.name, item.call_id, item.id)]

    def _index(self, output_index: int | None, item_id: str | None) -> int:
        """The call an argument event names. With both output_index and item_id, they
        must name the same call output_item.added announced: a fragment attributed by
        one to another call than the other says is never guessed at."""
        index = self._by_item.get(item_id) if item_id else None
        if index is not None and index >= 0:
            if output_index is not None and output_index != index:
                raise StreamProtocolError(
                    f"openai_responses: argument event names item_id {item_id!r} and "
                    f"output_index {output_index}, which output_item.added did not pair"
                )
            return index
        # An item_id no call was added with (or one two calls share) says nothing: the
        # output_index decides.
        if output_index is not None:
            return output_index
        raise StreamProtocolError(
            "openai_responses: argument event names no known output_index or item_id"
        )

    def _on_arguments_delta(self, data: SSEData, name: str) -> list[EngineEvent]:
        ev = wire.ARGS_DELTA.decode(data)
        if not ev.delta:
            return []
        return [ArgumentsDelta(self._index(ev.output_index, ev.item_id), ev.delta)]

    def _call_done(self, index: int, literal: msgspec.Raw | None = None) -> CallDone:
        self._done.add(index)
        if literal is not None and index not in self._told:
            self._told[index] = digest(literal)
        return CallDone(index, literal=literal)

    def _on_arguments_done(self, data: SSEData, name: str) -> list[EngineEvent]:
        ev = _read(wire.ARGS_DONE, data, name)
        index = self._index(ev.output_index, ev.item_id)
        return [self._call_done(index, wire.string_literal(ev.arguments, index))]

    def _on_item_done(self, data: SSEData, name: str) -> list[EngineEvent]:
        ev = _read(wire.ITEM_DONE, data, name)
        members = ev.item
        order = list(members)
        index = ev.output_index
        arguments = members.pop("arguments", None)
        item = {key: wire.JSON.decode(value) for key, value in members.items()}
        kind = item.get("type")
        if not isinstance(kind, str):
            raise StreamProtocolError("openai_responses: output item without a string type")
        self._items += 1
        if self._items > self._limits.max_continuation_items:
            raise LimitExceeded("max_continuation_items", self._limits.max_continuation_items)
        if kind == "function_call":
            same_call(index, self._calls.get(index), item, "output_item.done")
            status = item.get("status")
            # An "incomplete" call (cut by max_output_tokens) gets no done signal.
            if status is None or status == "completed":
                literal = wire.string_literal(arguments, index)
                if literal is None:
                    if arguments is not None:
                        item["arguments"] = None
                        item = {key: item[key] for key in order}
                    return [self._call_done(index), ContinuationItem(kind, index, item)]
                # The kept item leaves out the arguments: they are the call's own bytes,
                # which the echo puts back (one copy of a long text, not two).
                return [self._call_done(index, literal), ContinuationItem(kind, index, item)]
        if arguments is not None:
            item["arguments"] = wire.JSON.decode(arguments)
            item = {key: item[key] for key in order}  # the members in their wire order
        out: list[EngineEvent] = []
        if kind == "message" and isinstance(item.get("content"), list):
            for position, part in enumerate(item["content"]):
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "refusal":
                    out += self._refusal(part.get("refusal"))
                elif part.get("type") == "output_text":
                    out += self._done_part_text(index, position, part.get("text"))
        out.append(ContinuationItem(kind, index, item))
        return out

    def _on_part_added(self, data: SSEData, name: str) -> list[EngineEvent]:
        part = _read(wire.PART, data, name).part
        if part is not None and part.type == "refusal":
            self._refused = True  # a refusal even if no refusal event follows
        return []

    def _on_part_done(self, data: SSEData, name: str) -> list[EngineEvent]:
        ev = _read(wire.PART, data, name)
        part = ev.part
        if part is None:
            return []
        if part.type == "refusal":
            return self._refusal(part.refusal)
        index, position = ev.output_index, ev.content_index
        if part.type == "output_text" and index is not None and position is not None:
            return self._done_part_text(index, position, part.text)
        return []

    def _on_text_delta(self, data: SSEData, name: str) -> list[EngineEvent]:
        ev = _read(wire.TEXT_DELTA, data, name)
        if not ev.delta:
            return []
        # Raises when a done text already gave this part's text: the delta could double it.
        self._parts.delta(ev.output_index, ev.content_index, ev.item_id, ev.delta)
        return [TextDelta(ev.delta)]

    def _on_text_done(self, data: SSEData, name: str) -> list[EngineEvent]:
        ev = _read(wire.TEXT_DONE, data, name)
        if ev.output_index is None or ev.content_index is None:
            return []  # names no part: the item's done content may still give it
        return self._done_part_text(ev.output_index, ev.content_index, ev.text)

    def _done_part_text(
        self, output_index: int, content_index: int, text: object
    ) -> list[EngineEvent]:
        """The whole text of an output_text part (a done event, or the part in the
        message's done item): it counts once, and only when no delta carried the part's
        text. As for a refusal, a done text that differs from the deltas is not read."""
        if not self._parts.done(output_index, content_index, text):
            return []
        return [TextDelta(cast("str", text))]

    def _on_refusal_delta(self, data: SSEData, name: str) -> list[EngineEvent]:
        delta = _read(wire.DELTA, data, name).delta
        self._refused = True
        if not delta:
            return []
        self._refusal_text = True
        return [RefusalDelta(delta)]

    def _on_refusal_done(self, data: SSEData, name: str) -> list[EngineEvent]:
        # The whole refusal text: it counts only when no delta carried it.
        return self._refusal(_read(wire.REFUSAL_DONE, data, name).refusal)

    def _refusal(self, text: object) -> list[EngineEvent]:
        self._refused = True
        if self._refusal_text or not isinstance(text, str) or not text:
            return []
        self._refusal_text = True
        return [RefusalDelta(text)]

    def _terminal_response(
        self, data: SSEData, name: str
    ) -> tuple[wire.TerminalView, list[EngineEvent]]:
        if self._terminal:
            raise StreamProtocolError("openai_responses: a second terminal event")
        self._terminal = True
        response = _read(wire.TERMINAL, data, name).response or wire.TerminalView()
        out: list[EngineEvent] = []
        if not self._meta_sent and (response.id or response.model):
            self._meta_sent = True
            out.append(ResponseMeta(response.id, response.model))
        if response.usage is not None:
            out.append(UsageReport(wire.usage(response.usage)))
        return response, out

    def _terminal_calls(self, response: wire.TerminalView) -> list[CallDone]:
        return terminal_calls(response.output, self._calls, self._by_item, self._done, self._told)

    def _on_completed(self, data: SSEData, name: str) -> list[EngineEvent]:
        response, out = self._terminal_response(data, name)
        out += self._terminal_calls(response)
        raw = response.status or "completed"
        kind = FINISH_REASONS.get(raw, OutcomeKind.FAILED)
        if self._refused and not self._refusal_text and kind is OutcomeKind.FINAL_TEXT:
            kind = OutcomeKind.REFUSAL  # a refusal part without text: still a refusal
        out.append(Completion(kind, raw))
        return out

    def _on_incomplete(self, data: SSEData, name: str) -> list[EngineEvent]:
        response, out = self._terminal_response(data, name)
        out += self._terminal_calls(response)
        details = response.incomplete_details
        raw = (details.reason if details is not None else None) or "incomplete"
        out.append(Completion(FINISH_REASONS.get(raw, OutcomeKind.TRUNCATED), raw))
        return out

    def _on_failed(self, data: SSEData, name: str) -> list[EngineEvent]:
        # The turn fails whatever its output says: the output is not read against it.
        response, out = self._terminal_response(data, name)
        error = response.error
        info = error_info(error) if error is not None else ProviderErrorInfo()
        out.append(ProviderError(info))
        out.append(Completion(OutcomeKind.FAILED, info.code or "failed"))
        return out

    def _on_error(self, data: SSEData, name: str) -> list[EngineEvent]:
        ev = _read(wire.ERROR, data, name)
        nested = ev.error
        if nested is not None:
            return [ProviderError(error_info(nested))]
        return [ProviderError(error_info(ErrorView(code=ev.code, message=ev.message)))]


_Handler = Callable[[OpenAIResponsesStream, SSEData, str], list[EngineEvent]]

_TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})

_HANDLERS: dict[str, _Handler] = {
    "response.created": OpenAIResponsesStream._on_lifecycle,
    "response.in_progress": OpenAIResponsesStream._on_lifecycle,
    "response.queued": OpenAIResponsesStream._on_lifecycle,
    "response.output_item.added": OpenAIResponsesStream._on_item_added,
    "response.function_call_arguments.delta": OpenAIResponsesStream._on_arguments_delta,
    "response.function_call_arguments.done": OpenAIResponsesStream._on_arguments_done,
    "response.output_item.done": OpenAIResponsesStream._on_item_done,
    "response.content_part.added": OpenAIResponsesStream._on_part_added,
    "response.content_part.done": OpenAIResponsesStream._on_part_done,
    "response.output_text.delta": OpenAIResponsesStream._on_text_delta,
    "response.output_text.done": OpenAIResponsesStream._on_text_done,
    "response.refusal.delta": OpenAIResponsesStream._on_refusal_delta,
    "response.refusal.done": OpenAIResponsesStream._on_refusal_done,
    "response.completed": OpenAIResponsesStream._on_completed,
    "response.incomplete": OpenAIResponsesStream._on_incomplete,
    "response.failed": OpenAIResponsesStream._on_failed,
    "error": OpenAIResponsesStream._on_error,
}


# --- encode side ---------------------------------------------------------------------------


# What OpenAI's function names may be in a conversation the next request carries (the API refuses
# anything else, after the turn's calls would have run).
_ECHO_NAME = re.compile(r"[A-Za-z0-9_-]+")


class OpenAIResponsesAdapter:
    """Responses adapter: decode side (``new_stream``) and stateless encode side."""

    name = "openai_responses"
    family = "openai_responses"
    revision = "openai_responses/1"

    sse_unframed = False
    finish_reasons: Mapping[str, OutcomeKind] = FINISH_REASONS

    def new_stream(self, limits: Limits) -> OpenAIResponsesStream:
        return OpenAIResponsesStream(limits)

    def initial_messages(self, user_text: str) -> list[JSON]:
        return [{"role": "user", "content": user_text}]

    def assistant_echo(self, outcome: TurnOutcome) -> list[JSON]:
        """Every output item, in output order, as received at ``output_item.done`` (minus
        output-only fields), except a reasoning item without ``encrypted_content``: with
        ``store:false`` its id cannot be resolved ("Item with id rs_… not found"), and
        without the encrypted text it carries nothing the next turn can use. A
        ``function_call`` whose ``arguments`` are absent or null gets the call's exact
        raw argument text. Every other item is echoed as is."""
        return wire.echo(outcome)

    def encode_results(self, outcome: TurnOutcome, results: list[ModelResult]) -> list[JSON]:
        # No error flag exists: an error travels as the text in ``output``.
        return [
            {"type": "function_call_output", "call_id": result.call_id, "output": result.content}
            for result in results
        ]

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
        """The stateless streaming request: the whole conversation travels in ``input``,
        ``store:false``, and ``include`` asks for ``reasoning.encrypted_content`` when
        ``is_reasoning_model(model)`` or when the ``previous`` turn produced reasoning
        items (the model is a reasoning one whatever its name)."""
        body: dict[str, object] = {"model": model, "input": messages}
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                    "strict": False,
                }
                for tool in tools
            ]
        body["stream"] = True
        body["store"] = False
        reasoned = previous is not None and any(
            item.kind == "reasoning" for item in previous.continuation
        )
        if reasoned or is_reasoning_model(model):
            body["include"] = list(_INCLUDE)
        if system is not None:
            body["instructions"] = system
        if max_tokens is not None:
            body["max_output_tokens"] = max_tokens
        return HttpRequestSpec(path="/v1/responses", body=body)

    def unsendable(self, call: ProposedCall) -> str | None:
        return unsendable_call(call, _ECHO_NAME)

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"}


ADAPTER = OpenAIResponsesAdapter()
