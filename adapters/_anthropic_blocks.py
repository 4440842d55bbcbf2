"""Anthropic Messages: the state of one content block while it is received (its kind,
what it buffers for the echo, what it is charged against the caps). Owns no stream state;
``anthropic.py`` drives the blocks.
"""

from __future__ import annotations

from typing import Any, Final

from callgate.engine.core.pieces import TextPieces

__all__ = ["OTHER", "TEXT", "TOOL", "Block"]

# Block kinds.
TOOL: Final = 0  # client tool_use: streamed to the assembler, not buffered here
TEXT: Final = 1  # text: streamed as TextDelta and buffered for the echo
OTHER: Final = 2  # thinking, server tools, unknown: buffered for the echo only


class Block:
    """One content block being received."""

    __slots__ = (
        "citations",
        "data",
        "held",
        "json",
        "kind",
        "nbytes",
        "open",
        "signature",
        "text",
        "whole",
    )

    def __init__(self, kind: int, data: dict[str, Any] | None, whole: bool = False) -> None:
        self.kind = kind
        self.data = data
        self.open = True
        # The block's input came whole in content_block_start: no input delta may follow.
        self.whole = whole
        self.nbytes = 0
        self.held = 0  # bytes charged to the stream's max_continuation_bytes
        self.text = TextPieces()  # text_delta / thinking_delta pieces
        self.signature: str | None = None  # the last signature_delta (it replaces, as in the SDK)
        self.json = TextPieces()  # server_tool_use input pieces
        self.citations: list[bytes] = []  # each citation's JSON bytes
