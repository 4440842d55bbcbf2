"""OpenAI Responses wire views: the fields of each streamed event the adapter reads,
decoded by msgspec (gc=False: decoded JSON has no cycles), the usage object as engine
``Usage``, the check that a function call's raw ``arguments`` member is a string, and
the encode side's rewriting of a turn's output items as the next request's input items.

Every event view but the argument delta's reads the event's own ``type`` (``Typed``), so
that the adapter can hold it to the SSE ``event:`` name; ``TYPED`` reads nothing else (an
event the adapter does not act on is still decoded, so malformed JSON never passes
unseen).

Owns no state and emits no engine event; ``openai_responses.py`` translates what these
views hold.
"""

from __future__ import annotations

from typing import Any

import msgspec

from callgate.engine.core.adapter import echo_arguments
from callgate.engine.core.errors import StreamProtocolError
from callgate.engine.core.outcome import TurnOutcome, Usage

from ._openai_common import ErrorView

__all__ = [
    "ARGS_DELTA",
    "ARGS_DELTA_NAME",
    "ARGS_DONE",
    "DELTA",
    "ERROR",
    "ITEM_ADDED",
    "ITEM_DONE",
    "JSON",
    "LIFECYCLE",
    "PART",
    "REFUSAL_DONE",
    "TERMINAL",
    "TEXT_DELTA",
    "TEXT_DONE",
    "TYPE",
    "TYPED",
    "ResponseView",
    "TerminalView",
    "Typed",
    "echo",
    "input_item",
    "string_literal",
    "usage",
]


class Typed(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """The event's own ``type`` (absent in some hand-built streams: then not checked)."""

    type: str | None = None


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


class ResponseView(msgspec.Struct, frozen=True, gc=False):
    id: str | None = None
    model: str | None = None
    status: str | None = None
    usage: _UsageView | None = None
    error: ErrorView | None = None
    incomplete_details: _IncompleteView | None = None


class TerminalView(ResponseView, frozen=True, gc=False):
    # The full output of a terminal event, member by member: its function_call items are
    # checked against the streamed calls (their ``arguments`` stay raw literals).
    output: list[dict[str, msgspec.Raw]] | None = None


class _LifecycleEvent(Typed, frozen=True, gc=False):
    response: ResponseView | None = None


class _TerminalEvent(Typed, frozen=True, gc=False):
    response: TerminalView | None = None


class _AddedItemView(msgspec.Struct, frozen=True, gc=False):
    type: str
    id: str | None = None
    call_id: str | None = None
    name: str | None = None


class _ItemAddedEvent(Typed, frozen=True, gc=False):
    output_index: int
    item: _AddedItemView


class _ItemDoneEvent(Typed, frozen=True, gc=False):
    output_index: int
    # Kept for the stateless echo, so decoded member by member (a function call's
    # ``arguments`` stays a raw literal: it repeats the streamed text).
    item: dict[str, msgspec.Raw]


class _ArgumentsDeltaEvent(msgspec.Struct, frozen=True, gc=False):
    # Nearly every event, so its ``type`` is not read (a cost on every fragment, 5-7% of
    # a long call's decode). A fragment from an event of another type cannot pass
    # unseen: the done events repeat the call's whole text, which must equal the
    # fragments.
    delta: str
    output_index: int | None = None
    # Read even when output_index is there: the two must name the same call.
    item_id: str | None = None


class _ArgumentsDoneEvent(Typed, frozen=True, gc=False):
    # The whole text again: kept as its raw JSON literal, compared without a decoded copy.
    arguments: msgspec.Raw = msgspec.Raw()  # empty when absent
    output_index: int | None = None
    item_id: str | None = None


class _DeltaEvent(Typed, frozen=True, gc=False):
    delta: str


class _TextDeltaEvent(Typed, frozen=True, gc=False):
    # The part a text delta belongs to (and its item): a part that got none takes its
    # done text.
    delta: str
    output_index: int | None = None
    content_index: int | None = None
    item_id: str | None = None


class _TextDoneEvent(Typed, frozen=True, gc=False):
    text: str = ""
    output_index: int | None = None
    content_index: int | None = None


class _RefusalDoneEvent(Typed, frozen=True, gc=False):
    refusal: str = ""


class _ErrorEvent(Typed, frozen=True, gc=False):
    # Flat shape (SDK types) carries code/message at the top; the recorded shape nests
    # them under "error". The top-level "type" is the event type (``Typed``).
    code: str | int | None = None
    message: str | None = None
    error: ErrorView | str | None = None


class _PartView(msgspec.Struct, frozen=True, gc=False):
    # Loosely typed: the adapter checks each field's type where it uses it.
    type: Any = None
    text: Any = None
    refusal: Any = None


class _PartEvent(Typed, frozen=True, gc=False):
    # response.content_part.added / .done: a refusal part is a refusal even when no
    # refusal event follows, and a done part's text is one of its done texts.
    output_index: int | None = None
    content_index: int | None = None
    part: _PartView | None = None


class _TypeView(msgspec.Struct, frozen=True, gc=False):
    type: str


LIFECYCLE = msgspec.json.Decoder(_LifecycleEvent)
TERMINAL = msgspec.json.Decoder(_TerminalEvent)
ITEM_ADDED = msgspec.json.Decoder(_ItemAddedEvent)
ITEM_DONE = msgspec.json.Decoder(_ItemDoneEvent)
ARGS_DELTA = msgspec.json.Decoder(_ArgumentsDeltaEvent)
ARGS_DELTA_NAME = "response.function_call_arguments.delta"
ARGS_DONE = msgspec.json.Decoder(_ArgumentsDoneEvent)
DELTA = msgspec.json.Decoder(_DeltaEvent)
TEXT_DELTA = msgspec.json.Decoder(_TextDeltaEvent)
TEXT_DONE = msgspec.json.Decoder(_TextDoneEvent)
REFUSAL_DONE = msgspec.json.Decoder(_RefusalDoneEvent)
ERROR = msgspec.json.Decoder(_ErrorEvent)
PART = msgspec.json.Decoder(_PartEvent)
TYPE = msgspec.json.Decoder(_TypeView)
TYPED = msgspec.json.Decoder(Typed)
JSON = msgspec.json.Decoder()
_QUOTE, _NULL = ord('"'), b"null"


def usage(view: _UsageView) -> Usage:
    inp = view.input_tokens_details
    out = view.output_tokens_details
    return Usage(
        input_tokens=view.input_tokens,
        output_tokens=view.output_tokens,
        reasoning_tokens=None if out is None else out.reasoning_tokens,
        cached_input_tokens=None if inp is None else inp.cached_tokens,
    )


def string_literal(value: msgspec.Raw | None, index: int) -> msgspec.Raw | None:
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


# --- encode side -------------------------------------------------------------------------

# Output-only fields the API rejects when an item is sent back as input ("Unknown
# parameter: 'input[N].status'" on reasoning items). A message keeps its status: the
# input schema requires it there.
_OUTPUT_ONLY = {"reasoning": ("status",), "function_call": ("status",)}


# What an item produced with a reasoning item that cannot go back loses (see ``echo``):
# the API holds an item that names its own id to that reasoning item. A message without
# an id is plain assistant input, which takes no status either. (Built-in tool calls
# need their id; callgate declares none.)
_WITHOUT_REASONING = {
    "custom_tool_call": ("id",),
    "function_call": ("id",),
    "message": ("id", "status"),
}


def input_item(kind: str, item: dict[str, Any]) -> dict[str, Any]:
    """An output item as the next request's input item (a copy; the outcome is frozen)."""
    echoed = dict(item)
    for field in _OUTPUT_ONLY.get(kind, ()):
        echoed.pop(field, None)
    if kind == "reasoning":
        if echoed.get("summary") is None:
            echoed["summary"] = []  # required on input
        if "content" in echoed and not echoed["content"]:
            del echoed["content"]  # an empty (or null) reasoning_text list carries nothing
    return echoed


def echo(outcome: TurnOutcome) -> list[dict[str, Any]]:
    """The assistant echo of a turn (``OpenAIResponsesAdapter.assistant_echo`` says what
    it holds): its kept output items as input items, in output order."""
    calls = {call.index: call for call in outcome.calls}
    ordered: list[tuple[int, int, dict[str, Any]]] = []
    has_message = False
    echoed_ids: set[object] = set()  # a repeated call id gets no result: not echoed
    # A reasoning item without its encrypted content cannot go back; the API then
    # refuses an item produced with it that names its own id ("Item 'fc_…' / 'msg_…'
    # was provided without its required 'reasoning' item"): such items go back without
    # it (calls by call_id alone, messages as plain assistant input).
    reasoning = [
        (cont.index, not cont.item.get("encrypted_content"))
        for cont in outcome.continuation
        if cont.kind == "reasoning"
    ]

    def after_dropped(index: int) -> bool:  # the last reasoning item before it went
        before = [dropped for at, dropped in reasoning if at < index]
        return bool(before) and before[-1]

    for cont in outcome.continuation:
        if cont.kind == "reasoning" and not cont.item.get("encrypted_content"):
            continue
        echoed = input_item(cont.kind, cont.item)
        if after_dropped(cont.index):
            for field in _WITHOUT_REASONING.get(cont.kind, ()):
                echoed.pop(field, None)
        if cont.kind == "function_call":
            call = calls.pop(cont.index, None)
            if call is not None and not echoed.get("call_id"):
                # The result references the (derived) call id; the echo must too.
                echoed["call_id"] = call.call_id
            if call is not None and call.arguments is None:
                echoed["arguments"] = "{}"  # rejected: never echoed (see echo_arguments)
            elif echoed.get("arguments") is None:
                # Left out of the kept item (or null there, as some compatible
                # endpoints send it): the call's own bytes are the same text.
                echoed["arguments"] = echo_arguments(call) if call is not None else "{}"
            if echoed.get("call_id") in echoed_ids:
                continue
            echoed_ids.add(echoed.get("call_id"))
        elif cont.kind == "message":
            has_message = True
        ordered.append((cont.index, 0, echoed))
    if outcome.text and not has_message:
        # No message item was kept: carry the text as a plain assistant message.
        ordered.append((-1, 0, {"role": "assistant", "content": outcome.text}))
    for call in calls.values():
        # A call whose output_item.done never came: rebuild it from what was streamed.
        if call.call_id in echoed_ids:
            continue
        echoed_ids.add(call.call_id)
        rebuilt: dict[str, Any] = {"type": "function_call"}
        if call.item_id is not None and not after_dropped(call.index):
            rebuilt["id"] = call.item_id
        rebuilt["call_id"] = call.call_id
        rebuilt["name"] = call.name
        rebuilt["arguments"] = echo_arguments(call)
        ordered.append((call.index, 1, rebuilt))
    ordered.sort(key=lambda entry: (entry[0], entry[1]))
    return [entry[2] for entry in ordered]
