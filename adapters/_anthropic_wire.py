"""Anthropic Messages wire views: the fields of a streamed event the adapter reads, decoded
by msgspec (gc=False: decoded JSON has no cycles), and the reading of the values taken
unread (``msgspec.Raw``): a content block in ``content_block_start`` and a ``tool_use``
block's ``input``.

One small Struct per event type, chosen by the ``type`` tag, so that msgspec fills only
the fields that event can carry (a content_block_delta decodes into two fields, not a
dozen optional ones). A ``type`` outside the union falls back to ``Kind``.

Owns no state and emits no engine event; ``anthropic.py`` translates what these views
hold. msgspec checks the UTF-8 of what it decodes, not of what it skips or keeps as
``Raw``: ``text`` below checks it for the ``input`` bytes the adapter uses.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from callgate.engine.core.errors import StreamProtocolError

__all__ = [
    "DECODER",
    "HEAD_DECODER",
    "JSON_DECODER",
    "KIND_DECODER",
    "KNOWN_TYPES",
    "NO_COUNTS",
    "AnyEvent",
    "BlockDelta",
    "BlockHead",
    "BlockStart",
    "BlockStop",
    "CitationPiece",
    "Error",
    "ErrorEvent",
    "InputJson",
    "Kind",
    "MessageDelta",
    "MessageStart",
    "MessageStop",
    "Ping",
    "SignaturePiece",
    "TextPiece",
    "ThinkingPiece",
    "Usage",
    "given",
    "placeholder",
    "text",
]

_NO_VALUE: Final = msgspec.Raw()
_NULL: Final = msgspec.Raw(b"null")
_EMPTY: Final = msgspec.Raw(b"{}")
# An object without members: the `input` placeholder of a tool_use content_block_start.
_EMPTY_OBJECT: Final = re.compile(rb"\{[ \t\r\n]*\}")


class Usage(msgspec.Struct, gc=False):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


# (input, output, cache read, cache write) before any usage arrived.
NO_COUNTS: Final[tuple[int | None, int | None, int | None, int | None]] = (
    None,
    None,
    None,
    None,
)


class Message(msgspec.Struct, gc=False):
    id: str | None = None
    model: str | None = None
    usage: Usage | None = None


class Error(msgspec.Struct, gc=False):
    type: str | None = None
    message: str | None = None


class InputJson(msgspec.Struct, tag="input_json_delta", tag_field="type", gc=False):
    partial_json: str | None = None


class TextPiece(msgspec.Struct, tag="text_delta", tag_field="type", gc=False):
    text: str | None = None


class ThinkingPiece(msgspec.Struct, tag="thinking_delta", tag_field="type", gc=False):
    thinking: str | None = None


class SignaturePiece(msgspec.Struct, tag="signature_delta", tag_field="type", gc=False):
    signature: str | None = None


class CitationPiece(msgspec.Struct, tag="citations_delta", tag_field="type", gc=False):
    # Kept as its bytes until the block ends: charged by size like any buffered content.
    citation: msgspec.Raw = msgspec.Raw()


BlockPiece = InputJson | TextPiece | ThinkingPiece | SignaturePiece | CitationPiece


class MessageStart(msgspec.Struct, tag="message_start", tag_field="type", gc=False):
    message: Message | None = None


class BlockStart(msgspec.Struct, tag="content_block_start", tag_field="type", gc=False):
    index: int = -1
    # Taken unread: read through ``BlockHead`` (a tool_use block's input must reach the
    # assembler as its exact bytes), then decoded whole for a block echoed whole.
    content_block: msgspec.Raw = _NO_VALUE


class BlockHead(msgspec.Struct, gc=False):
    """A content block, for the fields a ``tool_use`` block is acted on by. (Loosely
    typed: the adapter checks each field's type where it uses it.)"""

    type: Any = None
    id: Any = None
    name: Any = None
    input: msgspec.Raw = _NO_VALUE


class BlockDelta(msgspec.Struct, tag="content_block_delta", tag_field="type", gc=False):
    index: int = -1
    delta: BlockPiece | None = None


class BlockStop(msgspec.Struct, tag="content_block_stop", tag_field="type", gc=False):
    index: int = -1


class StopDelta(msgspec.Struct, gc=False):
    stop_reason: str | None = None
    stop_details: dict[str, Any] | None = None


class MessageDelta(msgspec.Struct, tag="message_delta", tag_field="type", gc=False):
    delta: StopDelta | None = None
    usage: Usage | None = None


class MessageStop(msgspec.Struct, tag="message_stop", tag_field="type", gc=False):
    pass


class Ping(msgspec.Struct, tag="ping", tag_field="type", gc=False):
    pass


class ErrorEvent(msgspec.Struct, tag="error", tag_field="type", gc=False):
    error: Error | None = None


AnyEvent = (
    BlockDelta
    | Ping
    | MessageStart
    | BlockStart
    | BlockStop
    | MessageDelta
    | MessageStop
    | ErrorEvent
)


class Kind(msgspec.Struct, gc=False):
    """What an event outside the union (or malformed inside it) says it is."""

    type: str


DECODER: Final = msgspec.json.Decoder(AnyEvent)
HEAD_DECODER: Final = msgspec.json.Decoder(BlockHead)
KIND_DECODER: Final = msgspec.json.Decoder(Kind)
JSON_DECODER: Final = msgspec.json.Decoder()
KNOWN_TYPES: Final = frozenset(cls.__struct_config__.tag for cls in AnyEvent.__args__)


def given(raw: msgspec.Raw) -> bool:
    """Whether a ``Raw`` field holds a value: it is neither absent nor ``null``."""
    return bool(raw) and raw != _NULL


def placeholder(raw: msgspec.Raw) -> bool:
    """Whether a tool_use block's ``input`` is no input: absent, ``null`` or ``{}``."""
    return not raw or raw in (_EMPTY, _NULL) or _EMPTY_OBJECT.fullmatch(raw) is not None


def text(raw: msgspec.Raw, what: str) -> str:
    """A value's exact JSON text (its wire bytes, which must be UTF-8)."""
    try:
        return str(raw, "utf-8")  # Raw is a buffer, not bytes: no .decode()
    except UnicodeDecodeError:
        raise StreamProtocolError(f"anthropic: {what} is not valid UTF-8") from None
