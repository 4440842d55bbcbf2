"""Gemini Interactions wire views: the fields of an SSE event the adapter reads, decoded by
msgspec (gc=False: decoded JSON has no cycles), the reading of the values taken unread
(``msgspec.Raw``): a step's payload and a call's ``arguments``, and the usage and error
objects as engine values.

Owns no state and emits no engine event; ``gemini_interactions.py`` translates what these
views hold. msgspec checks the UTF-8 of what it decodes, not of what it skips or keeps as
``Raw``: ``text`` and ``value`` below check it for what the adapter uses.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from callgate.engine.core.errors import StreamProtocolError
from callgate.engine.core.outcome import ProviderErrorInfo, token_sum
from callgate.engine.core.outcome import Usage as EngineUsage

__all__ = [
    "DECODER",
    "DELTA_NAMES",
    "HOT_DECODER",
    "NO_VALUE",
    "OPS",
    "OP_COMPLETED",
    "OP_CREATED",
    "OP_DELTA",
    "OP_ERROR",
    "OP_START",
    "OP_STATUS",
    "OP_STOP",
    "STEP_DECODER",
    "Delta",
    "Error",
    "Event",
    "HotEvent",
    "Interaction",
    "Step",
    "error_info",
    "given",
    "is_string",
    "output",
    "placeholder",
    "string",
    "text",
    "usage",
    "value",
]

# What an event does, by its name (both formats: steps, then legacy).
OP_DELTA, OP_START, OP_STOP, OP_CREATED, OP_COMPLETED, OP_STATUS, OP_ERROR = range(7)
OPS: Final = {
    "step.delta": OP_DELTA,
    "content.delta": OP_DELTA,
    "step.start": OP_START,
    "content.start": OP_START,
    "step.stop": OP_STOP,
    "content.stop": OP_STOP,
    "interaction.created": OP_CREATED,
    "interaction.start": OP_CREATED,
    "interaction.completed": OP_COMPLETED,
    "interaction.complete": OP_COMPLETED,
    "interaction.status_update": OP_STATUS,
    "interaction.in_progress": OP_STATUS,
    "interaction.requires_action": OP_STATUS,
    "error": OP_ERROR,
}
DELTA_NAMES: Final = frozenset({"step.delta", "content.delta"})

NO_VALUE: Final = msgspec.Raw()
_NULL: Final = msgspec.Raw(b"null")
# An object without members: the `arguments` placeholder of a function_call step.start.
_EMPTY_OBJECT: Final = re.compile(rb"\{[ \t\r\n]*\}")
# In-stream error codes worth retrying: the server, not the request, is at fault.
_RETRYABLE: Final = frozenset(
    {429, 500, 503, "429", "500", "503", "UNAVAILABLE", "RESOURCE_EXHAUSTED"}
)


class Delta(msgspec.Struct, gc=False):
    type: str = ""
    text: str | None = None
    # A partial JSON string (arguments_delta) or, in a legacy function_call, the whole
    # arguments object: taken unread, so that its exact bytes reach the assembler.
    arguments: msgspec.Raw = NO_VALUE
    signature: str | None = None
    # thought_summary: {"type": "text", "text": ...}
    content: Any = None
    id: str | None = None
    name: str | None = None


class Step(msgspec.Struct, gc=False):
    """A step.start ``step`` (legacy content.start ``content``), for the fields acted on.
    Its other fields are skipped: nothing of them is held. (Loosely typed: the adapter
    checks each field's type where it uses it.)"""

    type: Any = None
    id: Any = None
    name: Any = None
    signature: Any = None
    summary: Any = None
    text: Any = None
    # A model_output step's output (ModelOutputStep.content): a list of Content items,
    # {"type": "text", "text": ...} or image, audio, document, video (or a newer type).
    content: Any = None
    arguments: msgspec.Raw = NO_VALUE


class Usage(msgspec.Struct, gc=False):
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    total_thought_tokens: int | None = None
    total_cached_tokens: int | None = None
    # Tokens of the tool-use prompt(s) (tool results fed back to the model): billed as
    # prompt tokens, not included in total_input_tokens.
    total_tool_use_tokens: int | None = None


class Interaction(msgspec.Struct, gc=False):
    id: str | None = None
    status: str | None = None
    model: str | None = None
    usage: Usage | None = None


class Error(msgspec.Struct, gc=False):
    code: int | str | None = None
    message: str | None = None
    status: str | None = None


class Event(msgspec.Struct, gc=False):
    event_type: str = ""
    index: int = -1
    # step.start carries `step`, legacy content.start carries `content`: read through
    # `Step`, or decoded whole for a step this adapter does not act on.
    step: msgspec.Raw = NO_VALUE
    content: msgspec.Raw = NO_VALUE
    delta: Delta | None = None
    interaction: Interaction | None = None
    status: str | None = None
    error: Error | None = None


class HotDelta(msgspec.Struct, gc=False):
    type: str = ""
    arguments: Any = None
    signature: str | None = None


class HotEvent(msgspec.Struct, gc=False):
    """A step delta, read for just what an argument fragment needs."""

    event_type: str = ""
    index: int = -1
    delta: HotDelta | None = None


DECODER: Final = msgspec.json.Decoder(Event)
HOT_DECODER: Final = msgspec.json.Decoder(HotEvent)
STEP_DECODER: Final = msgspec.json.Decoder(Step)
_STRING: Final = msgspec.json.Decoder(str)


def usage(view: Usage) -> EngineUsage:
    """An interaction's usage as engine ``Usage``."""
    return EngineUsage(
        # The tool-use prompt tokens are billed prompt tokens too.
        input_tokens=token_sum(view.total_input_tokens, view.total_tool_use_tokens),
        # total_output_tokens leaves the (billed) thoughts out.
        output_tokens=token_sum(view.total_output_tokens, view.total_thought_tokens),
        reasoning_tokens=view.total_thought_tokens,
        cached_input_tokens=view.total_cached_tokens,
    )


def error_info(error: Error | None) -> ProviderErrorInfo:
    """An ``error`` event's error (or its absence) as ``ProviderErrorInfo``."""
    if error is None:
        return ProviderErrorInfo(code="error")
    code = error.code
    return ProviderErrorInfo(
        code=error.status or (str(code) if code is not None else None),
        message=error.message,
        status=code if isinstance(code, int) else None,
        retryable=code in _RETRYABLE or error.status in _RETRYABLE,
    )


def output(step: Step) -> tuple[list[str], list[Any]]:
    """What a model_output (legacy: text) step start carries of its output: the non-empty
    texts (its ``text``, then the text items of its ``content``) and its other ``content``
    items (image, audio, document, video, a newer type, or a text item without text)."""
    texts: list[str] = [step.text] if isinstance(step.text, str) and step.text else []
    others: list[Any] = []
    content = step.content
    if content is None:
        return texts, others
    for item in content if isinstance(content, list) else [content]:
        if isinstance(item, dict) and item.get("type") == "text":
            text = item.get("text")
            if isinstance(text, str):
                if text:
                    texts.append(text)
                continue
        others.append(item)
    return texts, others


def given(raw: msgspec.Raw) -> bool:
    """Whether a ``Raw`` field holds a value: it is neither absent nor ``null``."""
    return bool(raw) and raw != _NULL


def placeholder(raw: msgspec.Raw) -> bool:
    """Whether a call step's ``arguments`` are no arguments: absent, ``null`` or ``{}``."""
    return not given(raw) or _EMPTY_OBJECT.fullmatch(raw) is not None


def is_string(raw: msgspec.Raw) -> bool:
    """Whether a ``Raw`` value is a JSON string."""
    return bytes(memoryview(raw)[:1]) == b'"'


def string(raw: msgspec.Raw, what: str) -> str | None:
    """A ``Raw`` field that must be a JSON string, decoded (None when absent or null)."""
    if not given(raw):
        return None
    try:
        return _STRING.decode(raw)
    except msgspec.DecodeError as exc:
        raise StreamProtocolError(f"interactions: {what} is not text: {exc}") from None


def text(raw: msgspec.Raw, what: str) -> str:
    """A value's exact JSON text (its wire bytes, which must be UTF-8)."""
    try:
        return str(raw, "utf-8")  # Raw is a buffer, not bytes: no .decode()
    except UnicodeDecodeError:
        raise StreamProtocolError(f"interactions: {what} is not valid UTF-8") from None


def value(raw: msgspec.Raw, what: str) -> Any:
    """A ``Raw`` field decoded (None when absent or null)."""
    if not given(raw):
        return None
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise StreamProtocolError(f"interactions: undecodable {what}: {exc}") from None
