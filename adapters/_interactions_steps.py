"""Gemini Interactions: the state of one step while it is received (its kind, what it
buffers for the output, what it is charged against the caps). Owns no stream state;
``gemini_interactions.py`` drives the steps.
"""

from __future__ import annotations

from typing import Any, Final

from callgate.engine.core.pieces import TextPieces

__all__ = ["CALL", "KINDS", "OTHER", "OUTPUT", "THOUGHT", "Step"]

CALL: Final = 0
THOUGHT: Final = 1
OUTPUT: Final = 2
OTHER: Final = 3

KINDS: Final = {
    "function_call": CALL,
    "thought": THOUGHT,
    "model_output": OUTPUT,
    "text": OUTPUT,
}


class Step:
    """A step's kind and state and what becomes output (a signature, a capped summary, a
    ``ProviderDetail`` payload until the stop); nothing else of its payload is held."""

    __slots__ = (
        "call_id",
        "call_open",
        "detail",
        "held",
        "kind",
        "nbytes",
        "open",
        "signature",
        "summary",
        "whole",
    )

    def __init__(self, kind: int) -> None:
        self.kind = kind
        self.open = True
        # Steps format: the call opens at step.start. Legacy: at its one content.delta.
        self.call_open = False
        self.call_id: str | None = None  # legacy: the id on the nameless call step
        # The call's arguments came whole (not as deltas): no argument delta may follow.
        self.whole = False
        self.detail: dict[str, Any] | None = None
        self.signature: str | None = None
        self.summary = TextPieces()
        self.nbytes = 0
        self.held = 0  # bytes charged to the stream's max_continuation_bytes
