"""OpenAI Responses adapter (``POST /v1/responses``, ``stream:true``, stateless).

Owns the translation between Responses wire shapes and engine values: typed stream
events into engine events (decode side), and input items, ``function_call_output``
results and the streaming request body (encode side). It never does HTTP, never parses
argument JSON (the assembler does, on the done signal) and never decides what a turn
means beyond its terminal-reason table.

Decoding dispatches on the SSE ``event:`` name (always equal to ``data.type``), so each
event is decoded once, into a small view of just the fields read; unknown event types
are skipped without decoding. Every ``output_item.done`` item is kept verbatim as a
continuation item (the stateless next request echoes them, in output order, and
the reasoning item's ``encrypted_content`` is only final there: the value at
``output_item.added`` may be incomplete), with one exception: a completed
``function_call`` item is kept without its ``arguments``, which repeat the streamed text
the call already holds as its raw bytes; ``assistant_echo`` puts them back from there.
The done events' repeated argument texts stay raw JSON literals (``CallDone.literal``),
compared with the fragments a slice at a time, so a long call is never held twice.

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
from typing import Any, cast

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
    ProviderError,
    RefusalDelta,
    ResponseMeta,
    TextDelta,
    UsageReport,
    append_fragments,
)
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import OutcomeKind, ProviderErrorInfo, TurnOutcome, Usage
from callgate.engine.core.sse import SSEData, SSEEvent

from ._openai_common import ErrorView, error_info

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


# --- decode views: only the fields this adapter reads --------------------------------------


class _InputDetailsView(msgspec.Struct, frozen=True, gc=False):
    cached_tokens: int | None = None


class _OutputDetailsView(msgspec.Struct, frozen=True, gc=False):
    reasoning_tokens: int | None = None


class _UsageView(msgspec.Struct, frozen=True, gc=False):
    input_tokens: int | None = None
    output_tokens: int | None = None
    input_tokens_details: _InputDetailsView | None = None
    output_tokens_details: _OutputDetailsView | None = None


class _IncompleteView(msgspec.Struct, frozen=True, gc=False):
    reason: str | None = None


class _ResponseView(msgspec.Struct, frozen=True, gc=False):
    id: str | None = None
    model: str | None = None
    status: str | None = None
    usage: _UsageView | None = None
    error: ErrorView | None = None
    incomplete_details: _IncompleteView | None = None


class _LifecycleEvent(msgspec.Struct, frozen=True, gc=False):
    response: _ResponseView | None = None


class _AddedItemView(msgspec.Struct, frozen=True, gc=False):
    type: str
    id: str | None = None
    call_id: str | None = None
    name: str | None = None


class _ItemAddedEvent(msgspec.Struct, frozen=True, gc=False):
    output_index: int
    item: _AddedItemView


class _ItemDoneEvent(msgspec.Struct, frozen=True, gc=False):
    output_index: int
    # Kept for the stateless echo, so decoded member by member (a function call's
    # ``arguments`` stays a raw literal: it repeats the streamed text).
    item: dict[str, msgspec.Raw]


class _ArgumentsDeltaEvent(msgspec.Struct, frozen=True, gc=False):
    delta: str
    output_index: int | None = None
    item_id: str | None = None


class _IndexedDeltaEvent(msgspec.Struct, frozen=True, gc=False):
    """The same event when it names its output_index (OpenAI's own always do): the
    item id is not decoded, one string less per fragment."""

    delta: str
    output_index: int | None = None


class _ArgumentsDoneEvent(msgspec.Struct, frozen=True, gc=False):
    # The whole text again: kept as its raw JSON literal, compared without a decoded copy.
    arguments: msgspec.Raw = msgspec.Raw()  # empty when absent
    output_index: int | None = None
    item_id: str | None = None


class _DeltaEvent(msgspec.Struct, frozen=True, gc=False):
    delta: str


class _RefusalDoneEvent(msgspec.Struct, frozen=True, gc=False):
    refusal: str = ""


class _ErrorEvent(msgspec.Struct, frozen=True, gc=False):
    # Flat shape (SDK types) carries code/message at the top; the recorded shape nests
    # them under "error". The top-level "type" is the event type, so it is not read.
    code: str | int | None = None
    message: str | None = None
    error: ErrorView | str | None = None


class _TypeView(msgspec.Struct, frozen=True, gc=False):
    type: str


_LIFECYCLE = msgspec.json.Decoder(_LifecycleEvent)
_ITEM_ADDED = msgspec.json.Decoder(_ItemAddedEvent)
_ITEM_DONE = msgspec.json.Decoder(_ItemDoneEvent)
_ARGS_DELTA = msgspec.json.Decoder(_ArgumentsDeltaEvent)
_INDEXED_DELTA = msgspec.json.Decoder(_IndexedDeltaEvent)
_ARGS_DELTA_NAME = "response.function_call_arguments.delta"
_ARGS_DONE = msgspec.json.Decoder(_ArgumentsDoneEvent)
_DELTA = msgspec.json.Decoder(_DeltaEvent)
_REFUSAL_DONE = msgspec.json.Decoder(_RefusalDoneEvent)
_ERROR = msgspec.json.Decoder(_ErrorEvent)
_TYPE = msgspec.json.Decoder(_TypeView)
_JSON = msgspec.json.Decoder()
_QUOTE, _NULL = ord('"'), b"null"


def _usage(view: _UsageView) -> Usage:
    inp = view.input_tokens_details
    out = view.output_tokens_details
    return Usage(
        input_tokens=view.input_tokens,
        output_tokens=view.output_tokens,
        reasoning_tokens=None if out is None else out.reasoning_tokens,
        cached_input_tokens=None if inp is None else inp.cached_tokens,
    )


class OpenAIResponsesStream:
    """Decoding state of one Responses stream."""

    __slots__ = (
        "_by_item",
        "_items",
        "_limits",
        "_meta_sent",
        "_refusal_text",
        "_refused",
        "_started",
        "_terminal",
    )

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        # Function-call item id -> output_index, for deltas that carry only item_id.
        self._by_item: dict[str, int] = {}
        self._started = 0
        self._items = 0
        self._meta_sent = False
        self._terminal = False
        # A refusal part was seen (even one without deltas or text), and whether its text
        # reached the turn as RefusalDelta: a refusal is never read as final_text.
        self._refused = False
        self._refusal_text = False

    def decode_batch(self, events: list[SSEEvent], out: list[BatchEvent]) -> None:
        """Translate a chunk's events in order; consecutive argument deltas become one
        ``ArgumentsRun``. Events before an error are in ``out`` when it is raised."""
        decode = _INDEXED_DELTA.decode
        indexes: list[int] = []
        pieces: list[str] = []
        try:
            for event in events:
                if event.event == _ARGS_DELTA_NAME and not self._terminal:
                    # Nearly every event: ``_on_arguments_delta`` inlined. After the
                    # terminal event the handler decides.
                    try:
                        ev = decode(event.data)
                        if not ev.delta:
                            continue
                        index = ev.output_index
                        if index is None:
                            # The lean view skipped item_id unread (and unvalidated):
                            # this second decode may reject what the first let pass.
                            index = self._index(None, _ARGS_DELTA.decode(event.data).item_id)
                    except msgspec.DecodeError as exc:
                        raise StreamProtocolError(
                            f"openai_responses: undecodable {_ARGS_DELTA_NAME} event: {exc}"
                        ) from None
                    indexes.append(index)
                    pieces.append(ev.delta)
                    continue
                if pieces:
                    append_fragments(out, indexes, pieces)
                    indexes, pieces = [], []
                out += self._event(event)
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
        handler = _HANDLERS.get(name)
        if handler is None:
            if name != "message":
                return []  # an event type this adapter does not read
            # No `event:` line: fall back to the JSON "type" (one extra, small decode).
            try:
                name = _TYPE.decode(event.data).type
            except msgspec.DecodeError as exc:
                raise StreamProtocolError(f"openai_responses: undecodable event: {exc}") from None
            handler = _HANDLERS.get(name)
            if handler is None:
                return []
        if self._terminal and name not in _TERMINAL_EVENTS:
            # Nothing follows the terminal event: a call added after it must not join
            # (or hold open) a turn that already ended. (A second terminal event gets
            # its own error from its handler.)
            raise StreamProtocolError(f"openai_responses: {name} event after the terminal event")
        try:
            return handler(self, event.data)
        except msgspec.DecodeError as exc:
            raise StreamProtocolError(
                f"openai_responses: undecodable {name} event: {exc}"
            ) from None

    def end(self) -> list[EngineEvent]:
        # Completions are emitted on the terminal event; without one the turn is truncated.
        return []

    # --- handlers: (self, data) -> events --------------------------------------------------

    def _on_lifecycle(self, data: SSEData) -> list[EngineEvent]:
        if self._meta_sent:
            return []
        response = _LIFECYCLE.decode(data).response
        if response is None:
            return []
        self._meta_sent = True
        return [ResponseMeta(response.id, response.model)]

    def _on_item_added(self, data: SSEData) -> list[EngineEvent]:
        ev = _ITEM_ADDED.decode(data)
        item = ev.item
        if item.type != "function_call":
            return []  # other items matter only at output_item.done (verbatim, final)
        if not item.name:
            raise StreamProtocolError(
                f"openai_responses: function_call at output_index {ev.output_index} has no name"
            )
        self._started += 1
        if self._started > self._limits.max_calls_per_response:
            raise LimitExceeded("max_calls_per_response", self._limits.max_calls_per_response)
        if item.id is not None:
            self._by_item[item.id] = ev.output_index
        return [CallStarted(ev.output_index, item.name, item.call_id, item.id)]

    def _index(self, output_index: int | None, item_id: str | None) -> int:
        if output_index is not None:
            return output_index
        if item_id is not None:
            index = self._by_item.get(item_id)
            if index is not None:
                return index
        raise StreamProtocolError(
            "openai_responses: argument event names no known output_index or item_id"
        )

    def _on_arguments_delta(self, data: SSEData) -> list[EngineEvent]:
        ev = _ARGS_DELTA.decode(data)
        if not ev.delta:
            return []
        return [ArgumentsDelta(self._index(ev.output_index, ev.item_id), ev.delta)]

    def _on_arguments_done(self, data: SSEData) -> list[EngineEvent]:
        ev = _ARGS_DONE.decode(data)
        index = self._index(ev.output_index, ev.item_id)
        return [CallDone(index, literal=_string_literal(ev.arguments, index))]

    def _on_item_done(self, data: SSEData) -> list[EngineEvent]:
        ev = _ITEM_DONE.decode(data)
        members = ev.item
        order = list(members)
        index = ev.output_index
        arguments = members.pop("arguments", None)
        item = {key: _JSON.decode(value) for key, value in members.items()}
        kind = item.get("type")
        if not isinstance(kind, str):
            raise StreamProtocolError("openai_responses: output item without a string type")
        self._items += 1
        if self._items > self._limits.max_continuation_items:
            raise LimitExceeded("max_continuation_items", self._limits.max_continuation_items)
        if kind == "function_call":
            status = item.get("status")
            # An "incomplete" call (cut by max_output_tokens) gets no done signal.
            if status is None or status == "completed":
                literal = _string_literal(arguments, index)
                if literal is None:
                    if arguments is not None:
                        item["arguments"] = None
                        item = {key: item[key] for key in order}
                    return [CallDone(index), ContinuationItem(kind, index, item)]
                # The kept item leaves out the arguments: they are the call's own bytes,
                # which the echo puts back (one copy of a long text, not two).
                return [CallDone(index, literal=literal), ContinuationItem(kind, index, item)]
        if arguments is not None:
            item["arguments"] = _JSON.decode(arguments)
            item = {key: item[key] for key in order}  # the members in their wire order
        out: list[EngineEvent] = []
        if kind == "message" and isinstance(item.get("content"), list):
            for part in item["content"]:
                if isinstance(part, dict) and part.get("type") == "refusal":
                    out += self._refusal(part.get("refusal"))
        out.append(ContinuationItem(kind, index, item))
        return out

    def _on_text_delta(self, data: SSEData) -> list[EngineEvent]:
        delta = _DELTA.decode(data).delta
        return [TextDelta(delta)] if delta else []

    def _on_refusal_delta(self, data: SSEData) -> list[EngineEvent]:
        delta = _DELTA.decode(data).delta
        self._refused = True
        if not delta:
            return []
        self._refusal_text = True
        return [RefusalDelta(delta)]

    def _on_refusal_done(self, data: SSEData) -> list[EngineEvent]:
        # The whole refusal text: it counts only when no delta carried it.
        return self._refusal(_REFUSAL_DONE.decode(data).refusal)

    def _refusal(self, text: object) -> list[EngineEvent]:
        self._refused = True
        if self._refusal_text or not isinstance(text, str) or not text:
            return []
        self._refusal_text = True
        return [RefusalDelta(text)]

    def _terminal_response(self, data: SSEData) -> tuple[_ResponseView, list[EngineEvent]]:
        if self._terminal:
            raise StreamProtocolError("openai_responses: a second terminal event")
        self._terminal = True
        response = _LIFECYCLE.decode(data).response or _ResponseView()
        out: list[EngineEvent] = []
        if not self._meta_sent and (response.id is not None or response.model is not None):
            self._meta_sent = True
            out.append(ResponseMeta(response.id, response.model))
        if response.usage is not None:
            out.append(UsageReport(_usage(response.usage)))
        return response, out

    def _on_completed(self, data: SSEData) -> list[EngineEvent]:
        response, out = self._terminal_response(data)
        raw = response.status or "completed"
        kind = FINISH_REASONS.get(raw, OutcomeKind.FAILED)
        if self._refused and not self._refusal_text and kind is OutcomeKind.FINAL_TEXT:
            kind = OutcomeKind.REFUSAL  # a refusal part without text: still a refusal
        out.append(Completion(kind, raw))
        return out

    def _on_incomplete(self, data: SSEData) -> list[EngineEvent]:
        response, out = self._terminal_response(data)
        details = response.incomplete_details
        raw = (details.reason if details is not None else None) or "incomplete"
        out.append(Completion(FINISH_REASONS.get(raw, OutcomeKind.TRUNCATED), raw))
        return out

    def _on_failed(self, data: SSEData) -> list[EngineEvent]:
        response, out = self._terminal_response(data)
        error = response.error
        info = error_info(error) if error is not None else ProviderErrorInfo()
        out.append(ProviderError(info))
        out.append(Completion(OutcomeKind.FAILED, info.code or "failed"))
        return out

    def _on_error(self, data: SSEData) -> list[EngineEvent]:
        ev = _ERROR.decode(data)
        nested = ev.error
        if nested is not None:
            return [ProviderError(error_info(nested))]
        return [ProviderError(error_info(ErrorView(code=ev.code, message=ev.message)))]


def _string_literal(value: msgspec.Raw | None, index: int) -> msgspec.Raw | None:
    """A function call's raw ``arguments`` member: the literal when it is a string, None
    when it is absent or null; anything else is a protocol error."""
    if value is None or not value:
        return None
    view = memoryview(value)
    if view[0] == _QUOTE:
        return value
    if view == _NULL:
        return None
    raise StreamProtocolError(
        f"openai_responses: function_call at output_index {index} has non-string arguments"
    )


_Handler = Callable[[OpenAIResponsesStream, SSEData], list[EngineEvent]]

_TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})

_HANDLERS: dict[str, _Handler] = {
    "response.created": OpenAIResponsesStream._on_lifecycle,
    "response.in_progress": OpenAIResponsesStream._on_lifecycle,
    "response.queued": OpenAIResponsesStream._on_lifecycle,
    "response.output_item.added": OpenAIResponsesStream._on_item_added,
    "response.function_call_arguments.delta": OpenAIResponsesStream._on_arguments_delta,
    "response.function_call_arguments.done": OpenAIResponsesStream._on_arguments_done,
    "response.output_item.done": OpenAIResponsesStream._on_item_done,
    "response.output_text.delta": OpenAIResponsesStream._on_text_delta,
    "response.refusal.delta": OpenAIResponsesStream._on_refusal_delta,
    "response.refusal.done": OpenAIResponsesStream._on_refusal_done,
    "response.completed": OpenAIResponsesStream._on_completed,
    "response.incomplete": OpenAIResponsesStream._on_incomplete,
    "response.failed": OpenAIResponsesStream._on_failed,
    "error": OpenAIResponsesStream._on_error,
}


# --- encode side ---------------------------------------------------------------------------

# Output-only fields the API rejects when an item is sent back as input ("Unknown
# parameter: 'input[N].status'" on reasoning items). A message keeps its status: the
# input schema requires it there.
_OUTPUT_ONLY = {"reasoning": ("status",), "function_call": ("status",)}


def _input_item(kind: str, item: dict[str, Any]) -> JSON:
    """An output item as the next request's input item (a copy; the outcome is frozen)."""
    echoed: JSON = dict(item)
    for field in _OUTPUT_ONLY.get(kind, ()):
        echoed.pop(field, None)
    if kind == "reasoning":
        if echoed.get("summary") is None:
            echoed["summary"] = []  # required on input
        if "content" in echoed and not echoed["content"]:
            del echoed["content"]  # an empty (or null) reasoning_text list carries nothing
    return echoed


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
        calls = {call.index: call for call in outcome.calls}
        ordered: list[tuple[int, int, JSON]] = []
        has_message = False
        for cont in outcome.continuation:
            if cont.kind == "reasoning" and not cont.item.get("encrypted_content"):
                continue
            echoed = _input_item(cont.kind, cont.item)
            if cont.kind == "function_call":
                call = calls.pop(cont.index, None)
                if call is not None and not echoed.get("call_id"):
                    # The result references the (derived) call id; the echo must too.
                    echoed["call_id"] = call.call_id
                if echoed.get("arguments") is None:
                    # Left out of the kept item (or null there, as some compatible
                    # endpoints send it): the call's own bytes are the same text.
                    raw = call.raw_arguments if call is not None else b""
                    echoed["arguments"] = raw.decode("utf-8", "replace")
            elif cont.kind == "message":
                has_message = True
            ordered.append((cont.index, 0, echoed))
        if outcome.text and not has_message:
            # No message item was kept: carry the text as a plain assistant message.
            ordered.append((-1, 0, {"role": "assistant", "content": outcome.text}))
        for call in calls.values():
            # A call whose output_item.done never came: rebuild it from what was streamed.
            rebuilt: JSON = {"type": "function_call"}
            if call.item_id is not None:
                rebuilt["id"] = call.item_id
            rebuilt["call_id"] = call.call_id
            rebuilt["name"] = call.name
            rebuilt["arguments"] = call.raw_arguments.decode("utf-8", "replace")
            ordered.append((call.index, 1, rebuilt))
        ordered.sort(key=lambda entry: (entry[0], entry[1]))
        return [entry[2] for entry in ordered]

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

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"}


ADAPTER = OpenAIResponsesAdapter()
