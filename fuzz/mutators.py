"""Structure-aware mutations of provider SSE streams, seeded from the recorded fixtures.

Two families, both plain functions ``(body, rng, provider) -> bytes`` usable from
Hypothesis tests and wrapped for atheris by ``atheris_mutator``:

- ``BREAKING``: what a hostile network or a buggy provider does to a stream: cut it at
  any byte, drop / duplicate / reorder events, split and join lines, swap LF/CRLF/CR,
  corrupt UTF-8, inject the provider's error event mid-stream, repeat done events,
  reuse an index or a call id, tweak one JSON value, splice events of another fixture.
- ``VALID``: rewrites that keep a valid stream valid and its meaning unchanged (JSON
  whitespace, argument fragments split at other points, consistent line-end style, SSE
  comments, ``data:`` with or without the space). A decoder must give the same calls
  before and after; the differential target compares callgate with the SDKs on them.

Events are the stream's blocks up to and including their blank line; joining the blocks
gives back the exact bytes, so a mutation touches only what it means to touch.
This module never imports callgate: it must stay usable as an independent oracle.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

__all__ = [
    "BREAKING",
    "ERROR_EVENTS",
    "FIXTURES",
    "PROVIDERS",
    "VALID",
    "Mutation",
    "atheris_mutator",
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
    "corrupt_utf8",
]

Mutation = Callable[[bytes, random.Random, str | None], bytes]

PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini", "gemini_interactions")
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"

# A blank line: two line ends in a row. A bare CR must not be the first half of a CRLF.
_BLOCK_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")
_ENDS_BLANK = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)\Z")
_LINE_END = re.compile(rb"\r\n|\r|\n")
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


# --- stream structure -------------------------------------------------------------------


def split_events(body: bytes) -> list[bytes]:
    """The blocks of ``body``, each with its terminating blank line (the last one may be
    unterminated). ``b"".join(split_events(b)) == b`` always."""
    out: list[bytes] = []
    pos = 0
    for match in _BLOCK_END.finditer(body):
        out.append(body[pos : match.end()])
        pos = match.end()
    if pos < len(body):
        out.append(body[pos:])
    return out


def _eol(body: bytes) -> bytes:
    """The stream's dominant line end."""
    crlf = body.count(b"\r\n")
    lf = body.count(b"\n") - crlf
    cr = body.count(b"\r") - crlf
    best = max((lf, b"\n"), (crlf, b"\r\n"), (cr, b"\r"))
    return best[1] if best[0] else b"\n"


def _restyle(event: bytes, eol: bytes) -> bytes:
    return _LINE_END.sub(eol, event)


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
    events.insert(at, _terminated(events[i], body))
    return b"".join(events)


def reorder_events(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """Two events swapped, or one moved elsewhere."""
    events = split_events(body)
    if len(events) < 2:
        return body
    events = [_terminated(e, body) for e in events]
    i, j = rng.sample(range(len(events)), 2)
    if rng.random() < 0.5:
        events[i], events[j] = events[j], events[i]
    else:
        events.insert(j, events.pop(i))
    return b"".join(events)


def _terminated(event: bytes, body: bytes) -> bytes:
    """``event`` ending in a blank line (the unterminated last block gets one)."""
    if _ENDS_BLANK.search(event):
        return event
    eol = _eol(body)
    return event + eol + eol if not event.endswith((b"\n", b"\r")) else event + eol


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
    end_match = _LINE_END.search(body, start)
    end = end_match.start() if end_match else len(body)
    value_at = start + (6 if body[start + 5 : start + 6] == b" " else 5)
    if end <= value_at:
        return body
    i = rng.randint(value_at, end)
    return body[:i] + _eol(body) + b"data: " + body[i:]


def join_lines(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """One line end removed: two lines (or two events, at a blank line) become one."""
    ends = list(_LINE_END.finditer(body))
    if not ends:
        return body
    m = rng.choice(ends)
    return body[: m.start()] + body[m.end() :]


def join_events(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """The blank line between two events removed: their fields merge into one event."""
    blanks = list(_BLOCK_END.finditer(body))
    if not blanks:
        return body
    m = rng.choice(blanks)
    first = _LINE_END.match(body, m.start())
    assert first is not None
    return body[: first.end()] + body[m.end() :]


def swap_line_endings(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """Every line end rewritten: one style for all, or a random style per line end."""
    styles = (b"\n", b"\r\n", b"\r")
    if rng.random() < 0.5:
        return _LINE_END.sub(rng.choice(styles), body)
    return _LINE_END.sub(lambda _m: rng.choice(styles), body)


def corrupt_utf8(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """An invalid UTF-8 sequence written over, or inserted at, a random byte (half the
    time inside a JSON string, where decoders meet it)."""
    bad = rng.choice(_BAD_UTF8)
    quotes = [m.start() + 1 for m in re.finditer(rb'"', body)]
    if quotes and rng.random() < 0.5:
        i = rng.choice(quotes)
    else:
        i = rng.randint(0, len(body))
    if rng.random() < 0.5:
        return body[:i] + bad + body[i:]
    return body[:i] + bad + body[i + len(bad) :]


def inject_error(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """The provider's error event inserted at an event boundary."""
    name = provider or guess_provider(body) or rng.choice(PROVIDERS)
    template = _restyle(rng.choice(ERROR_EVENTS[name]), _eol(body))
    events = split_events(body)
    events.insert(rng.randint(0, len(events)), template)
    return b"".join(_terminated(e, body) for e in events[:-1]) + events[-1]


def repeat_done(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """A done/stop/finish event repeated (in place, or later in the stream)."""
    events = split_events(body)
    done = [i for i, e in enumerate(events) if any(m in e for m in _DONE_MARKERS)]
    if not done:
        return duplicate_event(body, rng)
    i = rng.choice(done)
    at = i + 1 if rng.random() < 0.5 else rng.randint(i + 1, len(events))
    events.insert(at, _terminated(events[i], body))
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
    piece = [_terminated(_restyle(e, _eol(body)), body) for e in donor[a : a + rng.randint(1, 4)]]
    events = split_events(body)
    at = rng.randint(0, len(events))
    head = [_terminated(e, body) for e in events[:at]]
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


def _data_spans(event: bytes) -> list[tuple[int, int]]:
    """(start, end) of each ``data:`` value in ``event``."""
    spans = []
    for m in re.finditer(rb"(?<![^\r\n])data:( ?)([^\r\n]*)", event):
        spans.append((m.start(2), m.end(2)))
    return spans


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
    candidates = [(i, s) for i, e in enumerate(events) for s in _data_spans(e)]
    if not candidates:
        return corrupt_utf8(body, rng)
    i, (start, end) = rng.choice(candidates)
    event = events[i]
    try:
        value = json.loads(event[start:end])
    except ValueError:
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


# --- valid-preserving mutations -------------------------------------------------------


def _ws(rng: random.Random) -> str:
    return rng.choice(("", "", " ", "  ", "\t", " \t "))


def _dump_spaced(value: Any, rng: random.Random) -> str:
    """JSON text of ``value`` with random whitespace between tokens and random (but
    equivalent) string escaping."""
    if isinstance(value, dict):
        items = [
            _ws(rng) + _dump_string(k, rng) + _ws(rng) + ":" + _ws(rng) + _dump_spaced(v, rng)
            for k, v in value.items()
        ]
        return "{" + ",".join(items) + _ws(rng) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_ws(rng) + _dump_spaced(v, rng) for v in value) + _ws(rng) + "]"
    if isinstance(value, str):
        return _dump_string(value, rng)
    return json.dumps(value)


def _dump_string(text: str, rng: random.Random) -> str:
    # A lone surrogate can only be written escaped.
    ascii_only = rng.random() < 0.3 or not text.isascii() and _has_surrogate(text)
    return json.dumps(text, ensure_ascii=ascii_only)


def _has_surrogate(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def _finite(value: Any) -> bool:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, float) and (node != node or node in (float("inf"), float("-inf"))):
            return False
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return True


def json_whitespace(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """Rewrite the JSON of some events with other whitespace and escaping; sometimes
    spread one event's JSON over several ``data:`` lines (joined with LF, which JSON
    reads as whitespace). Only valid, duplicate-free JSON objects are touched."""
    events = split_events(body)
    eol = _eol(body)
    for i, event in enumerate(events):
        spans = _data_spans(event)
        if len(spans) != 1 or rng.random() < 0.5:
            continue
        start, end = spans[0]
        try:
            value = json.loads(event[start:end])
        except ValueError:
            continue
        if not isinstance(value, dict) or not _finite(value):
            continue
        text = _dump_spaced(value, rng).encode()
        if rng.random() < 0.3:
            # Break at a comma between members: always outside strings in this output.
            pieces = _split_outside_strings(text, rng)
            text = (eol + b"data: ").join(pieces)
        events[i] = event[:start] + text + event[end:]
    return b"".join(events)


def _split_outside_strings(text: bytes, rng: random.Random) -> list[bytes]:
    cuts = []
    in_string = escaped = False
    for i, byte in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte == 0x2C and rng.random() < 0.3:
            cuts.append(i + 1)
    pieces, last = [], 0
    for c in cuts:
        pieces.append(text[last:c])
        last = c
    pieces.append(text[last:])
    return pieces


# How to find argument fragments per provider: (marker in the event, path to the
# fragment text, path to the call key). Paths index into the decoded JSON.
_FRAGMENTS: dict[str, tuple[bytes, tuple[Any, ...], tuple[Any, ...]]] = {
    "openai_chat": (
        b'"arguments"',
        ("choices", 0, "delta", "tool_calls", 0, "function", "arguments"),
        ("choices", 0, "delta", "tool_calls", 0, "index"),
    ),
    "anthropic": (b"input_json_delta", ("delta", "partial_json"), ("index",)),
    "openai_responses": (b"function_call_arguments.delta", ("delta",), ("output_index",)),
    "gemini_interactions": (b"arguments_delta", ("delta", "arguments"), ("index",)),
}


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        if isinstance(step, int):
            if not isinstance(value, list) or step >= len(value):
                return None
        elif not isinstance(value, dict):
            return None
        value = value[step] if isinstance(step, int) else value.get(step)
    return value


def _set(value: Any, path: tuple[Any, ...], new: Any) -> None:
    for step in path[:-1]:
        value = value[step]
    value[path[-1]] = new


def _is_pure_fragment(provider: str, value: dict[str, Any]) -> bool:
    """An event that carries nothing but one argument fragment (so it can be cloned)."""
    if provider != "openai_chat":
        return True
    choices = value.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or value.get("usage"):
        return False
    choice = choices[0]
    delta = choice.get("delta") or {}
    calls = delta.get("tool_calls")
    if choice.get("finish_reason") or delta.get("content") or delta.get("refusal"):
        return False
    if not isinstance(calls, list) or len(calls) != 1:
        return False
    call = calls[0]
    function = call.get("function") or {}
    return not call.get("id") and not function.get("name") and set(function) == {"arguments"}


def _event_json(event: bytes) -> Any:
    """The decoded JSON of an event's data lines (joined with LF), or None."""
    spans = _data_spans(event)
    if not spans:
        return None
    try:
        return json.loads(b"\n".join(event[a:b] for a, b in spans))
    except ValueError:
        return None


def _with_data(event: bytes, data: bytes, eol: bytes) -> bytes:
    """``event`` with its data lines replaced by one ``data:`` line carrying ``data``."""
    lines = [line for line in _LINE_END.split(event) if line]
    kept = [line for line in lines if not line.startswith(b"data:")]
    return eol.join([*kept, b"data: " + data]) + eol + eol


def resplit_arguments(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """The argument fragments of one call joined and split again at other points (the
    joined text is unchanged). Only a run of events that carry nothing but a fragment
    moves (no other fragment of that call in between); the new fragments take the place
    of the run's last event."""
    name = provider or guess_provider(body)
    if name not in _FRAGMENTS:
        return body
    marker, text_path, key_path = _FRAGMENTS[name]
    events = split_events(body)
    by_call: dict[Any, list[tuple[int, dict[str, Any], bool]]] = {}
    for i, event in enumerate(events):
        if marker not in event:
            continue
        value = _event_json(event)
        if not isinstance(value, dict) or not isinstance(_get(value, text_path), str):
            continue
        key = _get(value, key_path)
        by_call.setdefault(key, []).append((i, value, _is_pure_fragment(name, value)))
    runs = []
    for found in by_call.values():
        pure = [(i, v) for i, v, ok in found if ok]
        if not pure:
            continue
        first, last = pure[0][0], pure[-1][0]
        if all(ok or not first < i < last for i, _, ok in found):
            runs.append(pure)
    if not runs:
        return body
    fragments = rng.choice(runs)
    joined = "".join(_get(v, text_path) for _, v in fragments)
    count = min(rng.randint(0, 6), max(len(joined) - 1, 0))
    cuts = sorted(rng.sample(range(1, len(joined)), count))
    pieces = [joined[a:b] for a, b in zip([0, *cuts], [*cuts, len(joined)], strict=True)]
    template_index, template = fragments[-1]
    eol = _eol(body)
    rebuilt = []
    for piece in pieces:
        clone = json.loads(json.dumps(template))
        _set(clone, text_path, piece)
        text = json.dumps(clone, separators=(",", ":")).encode()
        rebuilt.append(_with_data(events[template_index], text, eol))
    drop = {i for i, _ in fragments}
    out: list[bytes] = []
    for i, event in enumerate(events):
        if i == template_index:
            out.extend(rebuilt)
        elif i not in drop:
            out.append(event)
    return b"".join(out)


def same_line_endings(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """Every line end rewritten in one style (LF, CRLF or CR): the same stream."""
    return _LINE_END.sub(rng.choice((b"\n", b"\r\n", b"\r")), body)


def insert_comment(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """An SSE comment line (``: keep-alive``) inserted at the start of some event."""
    events = split_events(body)
    if not events:
        return body
    i = rng.randrange(len(events))
    events[i] = b": keep-alive" + _eol(body) + events[i]
    return b"".join(events)


def toggle_colon_space(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """``data: x`` <-> ``data:x`` on every line (the one space after the colon is
    optional in SSE)."""
    if rng.random() < 0.5:
        return re.sub(rb"(?<![^\r\n])(data|event):(?! )", rb"\1: ", body)
    return re.sub(rb"(?<![^\r\n])(data|event): (?! )", rb"\1:", body)


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
VALID: tuple[Mutation, ...] = (
    json_whitespace,
    resplit_arguments,
    same_line_endings,
    insert_comment,
    toggle_colon_space,
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
