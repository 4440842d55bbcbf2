"""Bounded, incremental Server-Sent Events decoder (placeholder; see sse issue work)."""
from __future__ import annotations

import msgspec

__all__ = ["SSEDecoder", "SSEEvent"]


class SSEEvent(msgspec.Struct, frozen=True):
    """One dispatched event. ``data`` is the UTF-8 bytes of the joined data lines
    (adapters decode JSON straight from bytes). ``unframed`` marks text that arrived
    outside any SSE field (only collected when the decoder is asked to)."""

    event: str = "message"
    data: bytes = b""
    id: str | None = None
    retry: int | None = None
    unframed: bool = False
