"""The structure of a provider SSE stream as the fuzz mutators see it: events (blocks up to
and including their blank line), line ends, ``data:`` values, and the recorded fixtures.

``b"".join(split_events(body)) == body`` for every body, so a mutation touches only what
it means to touch. This module never imports callgate (the mutators must stay usable as
an independent oracle) and never writes anything.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

__all__ = [
    "BLOCK_END",
    "FIXTURES",
    "LINE_END",
    "PROVIDERS",
    "data_spans",
    "event_json",
    "fixture_bodies",
    "guess_provider",
    "line_end",
    "restyle",
    "split_events",
    "terminated",
    "with_data",
]

PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini", "gemini_interactions")
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"

# A blank line: two line ends in a row. A bare CR must not be the first half of a CRLF.
BLOCK_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")
_ENDS_BLANK = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)\Z")
LINE_END = re.compile(rb"\r\n|\r|\n")


def split_events(body: bytes) -> list[bytes]:
    """The blocks of ``body``, each with its terminating blank line (the last one may be
    unterminated). ``b"".join(split_events(b)) == b`` always."""
    out: list[bytes] = []
    pos = 0
    for match in BLOCK_END.finditer(body):
        out.append(body[pos : match.end()])
        pos = match.end()
    if pos < len(body):
        out.append(body[pos:])
    return out


def line_end(body: bytes) -> bytes:
    """The stream's dominant line end."""
    crlf = body.count(b"\r\n")
    lf = body.count(b"\n") - crlf
    cr = body.count(b"\r") - crlf
    best = max((lf, b"\n"), (crlf, b"\r\n"), (cr, b"\r"))
    return best[1] if best[0] else b"\n"


def restyle(event: bytes, eol: bytes) -> bytes:
    return LINE_END.sub(eol, event)


@cache
def fixture_bodies(provider: str) -> tuple[bytes, ...]:
    """The recorded streams of ``provider`` (empty when the fixtures are not present)."""
    folder = FIXTURES / provider
    if not folder.is_dir():
        return ()
    return tuple(p.read_bytes() for p in sorted(folder.glob("*.sse")))


def guess_provider(body: bytes) -> str | None:
    """The provider whose wire format ``body`` looks like, from marker strings."""
    if b"event_type" in body:
        return "gemini_interactions"
    if b"content_block" in body or b"message_start" in body:
        return "anthropic"
    if b'"response.' in body or b"event: response." in body:
        return "openai_responses"
    if b"chat.completion" in body or b'"choices"' in body:
        return "openai_chat"
    if b"candidates" in body or b"usageMetadata" in body:
        return "gemini"
    return None


def terminated(event: bytes, body: bytes) -> bytes:
    """``event`` ending in a blank line (the unterminated last block gets one)."""
    if _ENDS_BLANK.search(event):
        return event
    eol = line_end(body)
    return event + eol + eol if not event.endswith((b"\n", b"\r")) else event + eol


def data_spans(event: bytes) -> list[tuple[int, int]]:
    """(start, end) of each ``data:`` value in ``event``."""
    spans = []
    for m in re.finditer(rb"(?<![^\r\n])data:( ?)([^\r\n]*)", event):
        spans.append((m.start(2), m.end(2)))
    return spans


def event_json(event: bytes) -> Any:
    """The decoded JSON of an event's data lines (joined with LF), or None."""
    spans = data_spans(event)
    if not spans:
        return None
    try:
        return json.loads(b"\n".join(event[a:b] for a, b in spans))
    except (ValueError, RecursionError):  # not JSON, or nested past the parser
        return None


def with_data(event: bytes, data: bytes, eol: bytes) -> bytes:
    """``event`` with its data lines replaced by one ``data:`` line carrying ``data``."""
    lines = [line for line in LINE_END.split(event) if line]
    kept = [line for line in lines if not line.startswith(b"data:")]
    return eol.join([*kept, b"data: " + data]) + eol + eol
