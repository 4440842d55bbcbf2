"""Shared helpers for the OpenAI Responses adapter tests (decode and encode side): the recorded
streams read independently of the adapter, and synthetic events fed through one stream."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from callgate.adapters.openai_responses import ADAPTER
from callgate.engine.core.events import CallDone, EngineEvent
from callgate.engine.core.limits import DEFAULT_LIMITS
from callgate.engine.core.sse import SSEEvent

from .conftest import FIXTURES

FAMILY = FIXTURES / "openai_responses"


def wire_events(name: str) -> list[dict[str, Any]]:
    """The recorded data objects, parsed independently of the adapter."""
    text = (FAMILY / name).read_text(encoding="utf-8")
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def send(*payloads: dict[str, Any], named: bool = True) -> list[EngineEvent]:
    """Feed payloads as events named by their type (or unnamed), then end the stream."""
    stream = ADAPTER.new_stream(DEFAULT_LIMITS)
    out: list[EngineEvent] = []
    for payload in payloads:
        name = payload.get("type", "message") if named else "message"
        out.extend(stream.decode(SSEEvent(event=name, data=json.dumps(payload).encode())))
    out.extend(stream.end())
    return out


def of(events: list[EngineEvent], kind: type) -> list[Any]:
    return [ev for ev in events if isinstance(ev, kind)]


FC = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_1",
    "name": "f",
    "arguments": "",
    "status": "in_progress",
}


def added(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": index, "item": item}


def item_done(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.done", "output_index": index, "item": item}


def dones(events: list[EngineEvent]) -> list[tuple[int, str | None]]:
    """Each CallDone's index and the text it repeats (its JSON literal, decoded)."""
    out: list[tuple[int, str | None]] = []
    for ev in of(events, CallDone):
        text = ev.arguments if ev.literal is None else msgspec.json.decode(ev.literal)
        out.append((ev.index, text))
    return out
