"""Shared helpers for the OpenAI Chat Completions adapter tests (decode and encode side):
the recorded streams' directory, a synthetic chunk builder, and readers of the events an
adapter stream emits."""

from __future__ import annotations

from callgate.engine.core.events import ArgumentsDelta, EngineEvent

from .conftest import FIXTURES

FAMILY = FIXTURES / "openai_chat"


def chunk(delta: dict[str, object] | None = None, finish: str | None = None, **extra: object):
    body: dict[str, object] = {
        "id": "chatcmpl-x",
        "model": "m",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }
    body.update(extra)
    return body


def joined_arguments(events: list[EngineEvent]) -> dict[int, str]:
    out: dict[int, str] = {}
    for ev in events:
        if isinstance(ev, ArgumentsDelta):
            out[ev.index] = out.get(ev.index, "") + ev.fragment
    return out


def of(events: list[EngineEvent], kind: type) -> list:
    return [ev for ev in events if isinstance(ev, kind)]
