"""Structure-aware mutations of provider SSE streams, seeded from the recorded fixtures.

Two families, both plain functions ``(body, rng, provider) -> bytes`` usable from
Hypothesis tests and wrapped for atheris by ``atheris_mutator``:

- ``BREAKING``: what a hostile network or a buggy provider does to a stream: cut it at
  any byte, drop / duplicate / reorder events, split and join lines, swap LF/CRLF/CR,
  corrupt UTF-8, inject the provider's error event mid-stream, repeat done events,
  reuse an index or a call id, tweak one JSON value, splice events of another fixture.
- ``VALID`` (from ``fuzz.valid_mutations``, re-exported here): rewrites that keep a valid
  stream valid and its meaning unchanged. A decoder must give the same calls before and
  after; the differential target compares callgate with the SDKs on them.

The stream structure (events, line ends, ``data:`` values) is ``fuzz.sse_events``.
This module never imports callgate: it must stay usable as an independent oracle.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from typing import Any

from fuzz.sse_events import (
    BLOCK_END,
    FIXTURES,
    LINE_END,
    PROVIDERS,
    data_spans,
    fixture_bodies,
    guess_provider,
    line_end,
    restyle,
    split_events,
    terminated,
)
from fuzz.valid_mutations import (
    VALID,
    insert_comment,
    json_whitespace,
    resplit_arguments,
    same_line_endings,
    toggle_colon_space,
)

__all__ = [
    "BREAKING",
    "ERROR_EVENTS",
    "FIXTURES",
    "PROVIDERS",
    "VALID",
    "Mutation",
    "atheris_mutator",
    "corrupt_utf8",
    "cut",
    "drop_event",
    "duplicate_event",
    "fixture_bodies",
    "guess_provider",
    "inject_error",
    "insert_comment",
    "join_events",
    "join_lines",
    "json_whitespace",
    "mutate",
    "mutate_valid",
    "reorder_events",
    "repeat_done",
    "resplit_arguments",
    "reuse_call_id",
    "reuse_index",
    "same_line_endings",
    "splice",
    "split_data_line",
    "split_events",
    "split_line",
    "swap_line_endings",
    "toggle_colon_space",
    "tweak_json",
]

Mutation = Callable[[bytes, random.Random, str | None], bytes]

_INDEX = re.compile(rb'"(?:output_index|index)"\s*:\s*(-?\d+)')
_ID = re.compile(rb'"(?:id|call_id|item_id)"\s*:\s*"([^"\\]{1,200})"')
_DONE_MARKERS = (
    b"[DONE]",
    b'"finish_reason":"',
    b"content_block_stop",
    b"message_stop",
    b"message_delta",
    b"function_call_arguments.done",
    b"output_item.done",
    b"response.completed",
    b"response.incomplete",
    b"finishReason",
    b"step.stop",
    b"content.stop",
    b"interaction.complete",
)
_BAD_UTF8 = (b"\xff", b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf4\x90\x80\x80")

# Each provider's in-stream error shapes (LF-terminated; adapted to the stream's line ends).
ERROR_EVENTS: dict[str, tuple[bytes, ...]] = {
    "openai_chat": (
        b'data: {"error":{"type":"server_error","code":"server_error","message":"fuzz"}}\n\n',
        b'data: {"error":"fuzz"}\n\n',
    ),
    "openai_responses": (
        b'event: error\ndata: {"type":"error","code":"server_error","message":"fuzz"}\n\n',
        b'event: response.failed\ndata: {"type":"response.failed","response":{"status":'
        b'"failed","error":{"code":"server_error","message":"fuzz"}}}\n\n',
    ),
    "anthropic": (
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
        b'"message":"Overloaded"}}\n\n',
    ),
    "gemini": (
        b'data: {"error":{"code":503,"message":"fuzz","status":"UNAVAILABLE"}}\n\n',
        b'{"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}}\n',
    ),
    "gemini_interactions": (
        b'event: error\ndata: {"event_type":"error","error":{"code":503,"message":"fuzz",'
        b'"status":"UNAVAILABLE"}}\n\n',
    ),
}


# --- breaking mutations ---------------------------------------------------------------


def cut(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """The stream cut at any byte."""
    return body[: rng.randint(0, len(body))]


def drop_event(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    events = split_events(body)
    if not events:
        return body
    del events[rng.randrange(len(events))]
    return b"".join(events)


def duplicate_event(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """One event repeated, right after itself or anywhere later."""
    events = split_events(body)
    if not events:
        return body
    i = rng.randrange(len(events))
    at = i + 1 if rng.random() < 0.5 else rng.randint(i + 1, len(events))
    events.insert(at, terminated(events[i], body))
    return b"".join(events)


def reorder_events(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """Two events swapped, or one moved elsewhere."""
    events = split_events(body)
    if len(events) < 2:
        return body
    events = [terminated(e, body) for e in events]
    i, j = rng.sample(range(len(events)), 2)
    if rng.random() < 0.5:
        events[i], events[j] = events[j], events[i]
    else:
        events.insert(j, events.pop(i))
    return b"".join(events)


def split_line(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """A line end inserted at any byte (the rest of the line becomes a line of its own)."""
    if not body:
        return body
    i = rng.randrange(len(body))
    return body[:i] + rng.choice((b"\n", b"\r\n", b"\r")) + body[i:]


def split_data_line(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """One ``data:`` line split into two ``data:`` lines (SSE joins them with LF)."""
    starts = [m.start() for m in re.finditer(rb"(?<![^\r\n])data: ?", body)]
    if not starts:
        return split_line(body, rng)
    start = rng.choice(starts)
    end_match = LINE_END.search(body, start)
    end = end_match.start() if end_match else len(body)
    value_at = start + (6 if body[start + 5 : start + 6] == b" " else 5)
    if end <= value_at:
        return body
    i = rng.randint(value_at, end)
    return body[:i] + line_end(body) + b"data: " + body[i:]


def join_lines(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """One line end removed: two lines (or two events, at a blank line) become one."""
    ends = list(LINE_END.finditer(body))
    if not ends:
        return body
    m = rng.choice(ends)
    return body[: m.start()] + body[m.end() :]


def join_events(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """The blank line between two events removed: their fields merge into one event."""
    blanks = list(BLOCK_END.finditer(body))
    if not blanks:
        return body
    m = rng.choice(blanks)
    first = LINE_END.match(body, m.start())
    assert first is not None
    return body[: first.end()] + body[m.end() :]


def swap_line_endings(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """Every line end rewritten: one style for all, or a random style per line end."""
    styles = (b"\n", b"\r\n", b"\r")
    if rng.random() < 0.5:
        return LINE_END.sub(rng.choice(styles), body)
    return LINE_END.sub(lambda _m: rng.choice(styles), body)


def corrupt_utf8(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """An invalid UTF-8 sequence written over, or inserted at, a random byte (half the
    time inside a JSON string, where decoders meet it)."""
    bad = rng.choice(_BAD_UTF8)
    quotes = [m.start() + 1 for m in re.finditer(rb'"', body)]
    i = rng.choice(quotes) if quotes and rng.random() < 0.5 else rng.randint(0, len(body))
    if rng.random() < 0.5:
        return body[:i] + bad + body[i:]
    return body[:i] + bad + body[i + len(bad) :]


def inject_error(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """The provider's error event inserted at an event boundary."""
    name = provider or guess_provider(body) or rng.choice(PROVIDERS)
    template = restyle(rng.choice(ERROR_EVENTS[name]), line_end(body))
    events = split_events(body)
    events.insert(rng.randint(0, len(events)), template)
    return b"".join(terminated(e, body) for e in events[:-1]) + events[-1]


def repeat_done(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """A done/stop/finish event repeated (in place, or later in the stream)."""
    events = split_events(body)
    done = [i for i, e in enumerate(events) if any(m in e for m in _DONE_MARKERS)]
    if not done:
        return duplicate_event(body, rng)
    i = rng.choice(done)
    at = i + 1 if rng.random() < 0.5 else rng.randint(i + 1, len(events))
    events.insert(at, terminated(events[i], body))
    return b"".join(events)


def reuse_index(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """One ``index``/``output_index`` replaced by another index of the stream (or a
    neighbour, or a negative one)."""
    found = list(_INDEX.finditer(body))
    if not found:
        return body
    target = rng.choice(found)
    values = sorted({int(m.group(1)) for m in found})
    old = int(target.group(1))
    new = rng.choice([*values, old - 1, old + 1, -1, 2**31, 2**63])
    return body[: target.start(1)] + str(new).encode() + body[target.end(1) :]


def reuse_call_id(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """One ``id``/``call_id``/``item_id`` value replaced by another id of the stream
    (or emptied)."""
    found = list(_ID.finditer(body))
    if not found:
        return body
    target = rng.choice(found)
    ids = [m.group(1) for m in found if m.group(1) != target.group(1)]
    new = rng.choice(ids) if ids and rng.random() < 0.8 else b""
    return body[: target.start(1)] + new + body[target.end(1) :]


def splice(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """Events of another recorded stream of the same provider spliced in."""
    name = provider or guess_provider(body)
    donors = fixture_bodies(name) if name else ()
    if not donors:
        return duplicate_event(body, rng)
    donor = split_events(rng.choice(donors))
    if not donor:
        return body
    a = rng.randrange(len(donor))
    piece = [terminated(restyle(e, line_end(body)), body) for e in donor[a : a + rng.randint(1, 4)]]
    events = split_events(body)
    at = rng.randint(0, len(events))
    head = [terminated(e, body) for e in events[:at]]
    return b"".join([*head, *piece, *events[at:]])


# --- JSON-level mutation --------------------------------------------------------------

_ODD_VALUES: tuple[Any, ...] = (
    None,
    True,
    False,
    0,
    -1,
    1,
    2**64,
    -(2**63) - 1,
    1e308,
    0.5,
    "",
    "x",
    "\u00e9\u6f22",
    [],
    {},
    {"a": 1},
    "{",
    '{"a":1}',
    '{"a":1,"a":2}',
    "[1]",
)
_ARG_TOKENS = ("{", "}", "[", "]", '"', ":", ",", "1", "null", '"k"', "\\u003a", "\\ud800", " ")


def _nodes(value: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) slot in a decoded JSON value."""
    out: list[tuple[Any, Any]] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                out.append((node, k))
                stack.append(v)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                out.append((node, i))
                stack.append(v)
    return out


def _mutate_text(text: str, rng: random.Random) -> str:
    """Argument-like text: cut, token inserted, or a piece duplicated."""
    choice = rng.randrange(4)
    if choice == 0:
        return text[: rng.randint(0, len(text))]
    i = rng.randint(0, len(text))
    if choice == 1:
        return text[:i] + rng.choice(_ARG_TOKENS) + text[i:]
    if choice == 2 and text:
        j = rng.randint(i, len(text))
        return text[:j] + text[i:j] + text[j:]
    return rng.choice(("", "{}", '{"a":1}', '{"a":1,"a":1}', text + text))


def tweak_json(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """One value inside one event's JSON changed: deleted, retyped, or (for strings that
    carry argument text) cut or given a stray token."""
    events = split_events(body)
    candidates = [(i, s) for i, e in enumerate(events) for s in data_spans(e)]
    if not candidates:
        return corrupt_utf8(body, rng)
    i, (start, end) = rng.choice(candidates)
    event = events[i]
    try:
        value = json.loads(event[start:end])
    except (ValueError, RecursionError):  # not JSON, or nested past the parser
        return body
    slots = _nodes(value)
    if not slots:
        return body
    container, key = rng.choice(slots)
    old = container[key]
    roll = rng.random()
    if roll < 0.2 and isinstance(container, dict):
        del container[key]
    elif roll < 0.6 and isinstance(old, str):
        container[key] = _mutate_text(old, rng)
    elif isinstance(old, int) and not isinstance(old, bool) and roll < 0.8:
        container[key] = old + rng.choice((-1, 1, 2**32))
    else:
        container[key] = rng.choice(_ODD_VALUES)
    new = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )
    events[i] = event[:start] + new + event[end:]
    return b"".join(events)


# How to find argument fragments per provider: (marker in the event, path to the
# fragment text, path to the call key). Paths index into the decoded JSON.


BREAKING: tuple[Mutation, ...] = (
    cut,
    drop_event,
    duplicate_event,
    reorder_events,
    split_line,
    split_data_line,
    join_lines,
    join_events,
    swap_line_endings,
    corrupt_utf8,
    inject_error,
    repeat_done,
    reuse_index,
    reuse_call_id,
    splice,
    tweak_json,
)


def mutate(body: bytes, rng: random.Random, provider: str | None = None, rounds: int = 0) -> bytes:
    """Apply 1-3 (or ``rounds``) random breaking or valid mutations."""
    for _ in range(rounds or rng.randint(1, 3)):
        op = rng.choice(BREAKING) if rng.random() < 0.85 else rng.choice(VALID)
        body = op(body, rng, provider)
    return body


def mutate_valid(
    body: bytes, rng: random.Random, provider: str | None = None, rounds: int = 0
) -> bytes:
    """Apply 1-3 (or ``rounds``) meaning-preserving mutations."""
    for _ in range(rounds or rng.randint(1, 3)):
        body = rng.choice(VALID)(body, rng, provider)
    return body


def atheris_mutator(
    provider: str | None, *, valid_only: bool = False
) -> Callable[[bytes, int, int], bytes]:
    """A libFuzzer custom mutator: structured mutations most of the time, libFuzzer's own
    byte-level ones (``atheris.Mutate``) for the rest. With ``valid_only`` only the
    ``VALID`` family runs, so a valid seed corpus stays valid."""

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        if valid_only:
            out = mutate_valid(data, rng, provider)
            return out if len(out) <= max_size else data[:max_size]
        if rng.random() < 0.2:
            import atheris  # type: ignore[import-untyped]

            result: bytes = atheris.Mutate(data, max_size)
            return result
        if not data or rng.random() < 0.02:
            name = provider or rng.choice(PROVIDERS)
            seeds = fixture_bodies(name)
            data = rng.choice(seeds) if seeds else data
        return mutate(data, rng, provider)[:max_size]

    return custom_mutator
