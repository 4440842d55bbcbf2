"""Meaning-preserving rewrites of a valid SSE stream: a correct decoder reads the same
calls, arguments and text before and after.

JSON whitespace and escaping (with the JSON spread over several ``data:`` lines),
argument fragments split at other points, one line-end style for the whole stream, SSE
comment lines, ``data:`` with or without its space. Each is a plain function
``(body, rng, provider) -> bytes``; ``VALID`` lists them. The differential target mutates
with these alone, so its inputs stay valid. Never imports callgate.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable
from typing import Any

from fuzz.sse_events import (
    LINE_END,
    data_spans,
    event_json,
    guess_provider,
    line_end,
    split_events,
    with_data,
)

__all__ = [
    "VALID",
    "insert_comment",
    "json_whitespace",
    "resplit_arguments",
    "same_line_endings",
    "toggle_colon_space",
]

Mutation = Callable[[bytes, random.Random, str | None], bytes]


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
    ascii_only = rng.random() < 0.3 or (not text.isascii() and _has_surrogate(text))
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
        if isinstance(node, float) and not math.isfinite(node):
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
    eol = line_end(body)
    for i, event in enumerate(events):
        spans = data_spans(event)
        if len(spans) != 1 or rng.random() < 0.5:
            continue
        start, end = spans[0]
        try:
            value = json.loads(event[start:end])
        except (ValueError, RecursionError):  # not JSON, or nested past the parser
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
    by_call: dict[str, list[tuple[int, dict[str, Any], bool]]] = {}
    for i, event in enumerate(events):
        if marker not in event:
            continue
        value = event_json(event)
        if not isinstance(value, dict) or not isinstance(_get(value, text_path), str):
            continue
        key = json.dumps(_get(value, key_path), sort_keys=True)  # may be any JSON value
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
    eol = line_end(body)
    rebuilt = []
    for piece in pieces:
        clone = json.loads(json.dumps(template))
        _set(clone, text_path, piece)
        text = json.dumps(clone, separators=(",", ":")).encode()
        rebuilt.append(with_data(events[template_index], text, eol))
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
    return LINE_END.sub(rng.choice((b"\n", b"\r\n", b"\r")), body)


def insert_comment(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """An SSE comment line (``: keep-alive``) inserted at the start of some event."""
    events = split_events(body)
    if not events:
        return body
    i = rng.randrange(len(events))
    events[i] = b": keep-alive" + line_end(body) + events[i]
    return b"".join(events)


def toggle_colon_space(body: bytes, rng: random.Random, provider: str | None = None) -> bytes:
    """``data: x`` <-> ``data:x`` on every line (the one space after the colon is
    optional in SSE)."""
    if rng.random() < 0.5:
        return re.sub(rb"(?<![^\r\n])(data|event):(?! )", rb"\1: ", body)
    return re.sub(rb"(?<![^\r\n])(data|event): (?! )", rb"\1:", body)


VALID: tuple[Mutation, ...] = (
    json_whitespace,
    resplit_arguments,
    same_line_endings,
    insert_comment,
    toggle_colon_space,
)
