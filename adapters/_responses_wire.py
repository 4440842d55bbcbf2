"""OpenAI Responses wire views: the fields of each streamed event the adapter reads,
decoded by msgspec (gc=False: decoded JSON has no cycles), the usage object as engine
``Usage``, the check that a function call's raw ``arguments`` member is a string, and
an output item rewritten as the next request's input item.

Owns no state and emits no engine event; ``openai_responses.py`` translates what these
views hold.
"""

from __future__ import annotations

from typing import Any

import msgspec

from callgate.engine.core.errors import StreamProtocolError
from callgate.engine.core.outcome import Usage

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
    "REFUSAL_DONE",
    "TEXT_DELTA",
    "TEXT_DONE",
    "TYPE",
    "ResponseView",
    "input_item",
    "string_literal",
    "usage",
]


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


class _LifecycleEvent(msgspec.Struct, frozen=True, gc=False):
    response: ResponseView | None = None


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
    # Read even when output_index is there: the two must name the same call.
    item_id: str | None = None


class _ArgumentsDoneEvent(msgspec.Struct, frozen=True, gc=False):
    # The whole text again: kept as its raw JSON literal, compared without a decoded copy.
    arguments: msgspec.Raw = msgspec.Raw()  # empty when absent
    output_index: int | None = None
    item_id: str | None = None


class _DeltaEvent(msgspec.Struct, frozen=True, gc=False):
    delta: str


class _TextDeltaEvent(msgspec.Struct, frozen=True, gc=False):
    # The part a text delta belongs to: a part that got none takes its done text.
    delta: str
    output_index: int | None = None
    content_index: int | None = None


class _TextDoneEvent(msgspec.Struct, frozen=True, gc=False):
    text: str = ""
    output_index: int | None = None
    content_index: int | None = None


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


LIFECYCLE = msgspec.json.Decoder(_LifecycleEvent)
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
TYPE = msgspec.json.Decoder(_TypeView)
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
