"""Shared helpers for the Gemini generateContent adapter tests (decode and encode side):
reading the recorded streams, synthetic candidates fed through one adapter stream, and
readers of the events it emits."""

from __future__ import annotations

import json
from typing import Any

from callgate.adapters.gemini import ADAPTER
from callgate.engine.core.events import ArgumentsDelta, CallDone, EngineEvent
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits
from callgate.engine.core.sse import SSEEvent

from .conftest import FIXTURES

FAMILY = FIXTURES / "gemini"


def read(name: str) -> bytes:
    return (FAMILY / name).read_bytes()


def candidate(*parts: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}}
    if finish is not None:
        cand["finishReason"] = finish
    return {"candidates": [cand]}


def run_chunks(
    *chunks: dict[str, Any] | SSEEvent, limits: Limits = DEFAULT_LIMITS
) -> list[EngineEvent]:
    stream = ADAPTER.new_stream(limits)
    out: list[EngineEvent] = []
    for chunk in chunks:
        event = chunk if isinstance(chunk, SSEEvent) else SSEEvent(data=json.dumps(chunk).encode())
        out.extend(stream.decode(event))
    out.extend(stream.end())
    return out


def of(events: list[EngineEvent], kind: type) -> list[Any]:
    return [ev for ev in events if isinstance(ev, kind)]


def joined_arguments(events: list[EngineEvent]) -> dict[int, str]:
    """Each call's argument text: streamed fragments, or the bytes of a whole call."""
    out: dict[int, str] = {}
    for ev in events:
        if isinstance(ev, ArgumentsDelta):
            out[ev.index] = out.get(ev.index, "") + ev.fragment
        elif isinstance(ev, CallDone) and ev.raw is not None:
            out[ev.index] = out.get(ev.index, "") + ev.raw.decode()
    return out


STOP = candidate({"text": ""}, finish="STOP")
