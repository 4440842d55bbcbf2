"""Seeded synthetic tool-call streams in each provider family's exact wire format.

Owns the generation of benchmark input: argument objects of a requested size, their
fragmentation, and the SSE framing of every family (copied from the recorded fixtures in
``tests/fixtures``: event names, field order, CRLF for Gemini, ``[DONE]`` for Chat
Completions, the repeated full arguments in Responses' done events). It never decodes
anything and never measures time: benchmarks and peers import it.

Stream kinds (``KINDS``): ``openai_chat``, ``openai_responses``, ``anthropic``, ``gemini``
(whole ``functionCall`` parts: Gemini API arguments are never fragmented), ``gemini_vertex``
(Vertex ``partialArgs`` string pieces, decoded by the ``gemini`` provider) and
``gemini_interactions`` (steps format).

Sizes (``SIZES``): S = 1 call, ~60-byte arguments in 4-byte fragments; M = 8 calls with
2 KiB arguments each, in 8-byte fragments, emitted round-robin (interleaved) where the
wire format allows it (Gemini and Vertex calls cannot interleave: they come one after
another); L = 1 call with 1 MiB arguments in 8-byte fragments. Fragments are cut from the
argument JSON text by code points, so a fragment may end inside an escape sequence or
next to a multi-byte character, as model output does.

Everything is deterministic for a given seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = [
    "CHUNK_SIZE",
    "KINDS",
    "PROVIDER",
    "SIZES",
    "ExpectedCall",
    "Shape",
    "SyntheticStream",
    "chunked",
    "make_arguments",
    "make_stream",
    "stream_of_body_size",
]

CHUNK_SIZE = 64 * 1024  # one network read of a busy stream; every decoder gets the same chunks
KINDS = (
    "openai_chat",
    "openai_responses",
    "anthropic",
    "gemini",
    "gemini_vertex",
    "gemini_interactions",
)
PROVIDER = {kind: ("gemini" if kind == "gemini_vertex" else kind) for kind in KINDS}

_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
# Mostly ASCII words; a quote, a newline, a backslash and two non-ASCII words make the
# argument JSON carry escapes and multi-byte UTF-8, as real file contents do. The
# non-ASCII characters are Latin-1 on purpose: one character outside it would make
# CPython store the whole parsed string at 2 bytes per character, and the memory rows
# would measure that instead of callgate's buffers.
_WORDS = (
    "the",
    "config",
    "value",
    "loop",
    "index",
    "return",
    "buffer",
    "stream",
    "parse",
    "token",
    "call",
    "result",
    "error",
    "file",
    "path",
    "line",
    "offset",
    "request",
    "reply",
    "cache",
    "limit",
    "window",
    '"quoted"',
    "\n",
    "\\",
    "café",
    "naïve",
)


@dataclass(frozen=True)
class Shape:
    """``calls`` calls of ``arg_bytes`` argument bytes each, cut into ``fragment``-code-point
    fragments; ``interleave`` emits the fragments of all calls round-robin."""

    calls: int
    arg_bytes: int
    fragment: int
    interleave: bool = False


SIZES: dict[str, Shape] = {
    "S": Shape(calls=1, arg_bytes=60, fragment=4),
    "M": Shape(calls=8, arg_bytes=2048, fragment=8, interleave=True),
    "L": Shape(calls=1, arg_bytes=1024 * 1024, fragment=8),
}


@dataclass(frozen=True)
class ExpectedCall:
    call_id: str | None  # None where the wire carries no id (callgate derives one)
    name: str
    arguments: dict[str, Any]
    text: str  # the argument JSON text as streamed


@dataclass(frozen=True)
class SyntheticStream:
    kind: str
    provider: str
    body: bytes
    chunks: list[bytes]
    events: int  # SSE events in the body
    calls: tuple[ExpectedCall, ...]
    arg_bytes: int  # UTF-8 bytes of all argument texts together
    shape: Shape
    label: str = field(default="")


def chunked(body: bytes, size: int = CHUNK_SIZE) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


def _rand(rng: random.Random, n: int, alphabet: str = _ALNUM) -> str:
    return "".join(rng.choices(alphabet, k=n))


def make_arguments(rng: random.Random, target: int) -> dict[str, Any]:
    """An argument object whose compact JSON text is about ``target`` UTF-8 bytes."""
    if target <= 96:
        args: dict[str, Any] = {
            "city": rng.choice(["Paris", "Lyon", "Berlin", "Osaka", "Lima"]),
            "unit": "celsius",
            "days": rng.randint(1, 9),
        }
        room = target - len(orjson.dumps(args)) - len(',"note":""')
        if room > 0:
            args["note"] = _rand(rng, room)
        return args
    head: dict[str, Any] = {"path": f"src/{_rand(rng, 8).lower()}.txt", "mode": "overwrite"}
    room = target - len(orjson.dumps({**head, "content": ""}))
    words: list[str] = []
    size = 0
    # Whole words until the escaped size reaches the room (escapes count double).
    while size < room:
        batch = rng.choices(_WORDS, k=4096)
        for w in batch:
            words.append(w)
            size += len(orjson.dumps(w)) - 1  # the word, escaped, plus a joining space
            if size >= room:
                break
    content = " ".join(words)
    # Trim to the exact room (never cutting inside an escape: trim whole code points and
    # re-measure).
    text = orjson.dumps(content)
    while len(text) - 2 > room and content:
        content = content[: -max(1, (len(text) - 2 - room) // 2)]
        text = orjson.dumps(content)
    return {**head, "content": content}


def _fragments(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _order(frags: list[list[str]], interleave: bool) -> Iterator[tuple[int, str]]:
    """(call number, fragment) in emission order."""
    if not interleave:
        for k, parts in enumerate(frags):
            for p in parts:
                yield k, p
        return
    longest = max(len(p) for p in frags)
    for i in range(longest):
        for k, parts in enumerate(frags):
            if i < len(parts):
                yield k, parts[i]


def _j(value: Any) -> str:
    return orjson.dumps(value).decode()


# --- per-family framing ----------------------------------------------------------------


def _openai_chat(rng: random.Random, calls: list[ExpectedCall], shape: Shape) -> list[str]:
    cid = "chatcmpl-" + _rand(rng, 29)
    fp = "fp_" + _rand(rng, 10, "0123456789abcdef")
    head = (
        f'{{"id":"{cid}","object":"chat.completion.chunk","created":1727346182,'
        f'"model":"gpt-4o-2024-08-06","system_fingerprint":"{fp}","choices":'
        '[{"index":0,"delta":'
    )
    tail = ',"logprobs":null,"finish_reason":null}]}'
    out = []
    for k, call in enumerate(calls):
        first = {
            "index": k,
            "id": call.call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        delta: dict[str, Any] = {"tool_calls": [first]}
        if k == 0:
            delta = {"role": "assistant", "content": None, **delta, "refusal": None}
        out.append(f"data: {head}{_j(delta)}{tail}\n\n")
        if not shape.interleave:
            out.extend(_chat_fragments(head, tail, [call], shape, base=k))
    if shape.interleave:
        out.extend(_chat_fragments(head, tail, calls, shape, base=0))
    out.append(
        f'data: {head}{{}},"logprobs":null,"finish_reason":"tool_calls"}}]}}\n\n'
        f'data: {{"id":"{cid}","object":"chat.completion.chunk","created":1727346182,'
        f'"model":"gpt-4o-2024-08-06","system_fingerprint":"{fp}","choices":[],'
        '"usage":{"prompt_tokens":44,"completion_tokens":16,"total_tokens":60}}\n\n'
        "data: [DONE]\n\n"
    )
    return out


def _chat_fragments(
    head: str, tail: str, calls: list[ExpectedCall], shape: Shape, base: int
) -> Iterator[str]:
    frags = [_fragments(c.text, shape.fragment) for c in calls]
    for k, piece in _order(frags, shape.interleave):
        yield (
            f'data: {head}{{"tool_calls":[{{"index":{base + k},"function":{{"arguments":'
            f"{_j(piece)}}}}}]}}{tail}\n\n"
        )


def _openai_responses(rng: random.Random, calls: list[ExpectedCall], shape: Shape) -> list[str]:
    rid = "resp_" + _rand(rng, 48, "0123456789abcdef")
    items = ["fc_" + _rand(rng, 48, "0123456789abcdef") for _ in calls]
    seq = 0

    def ev(kind: str, body: str) -> str:
        nonlocal seq
        seq += 1
        return f'event: {kind}\ndata: {{"type":"{kind}",{body},"sequence_number":{seq}}}\n\n'

    def item(k: int, done: bool) -> dict[str, Any]:
        c = calls[k]
        return {
            "id": items[k],
            "type": "function_call",
            "status": "completed" if done else "in_progress",
            "arguments": c.text if done else "",
            "call_id": c.call_id,
            "name": c.name,
        }

    def response(status: str, output: list[dict[str, Any]]) -> str:
        return _j(
            {
                "id": rid,
                "object": "response",
                "created_at": 1743082657,
                "status": status,
                "error": None,
                "incomplete_details": None,
                "model": "gpt-5-2025-08-07",
                "output": output,
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "usage": None
                if status != "completed"
                else {
                    "input_tokens": 81,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": 40,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": 121,
                },
            }
        )

    out = [
        ev("response.created", f'"response":{response("in_progress", [])}'),
        ev("response.in_progress", f'"response":{response("in_progress", [])}'),
    ]

    def added(k: int) -> str:
        return ev("response.output_item.added", f'"output_index":{k},"item":{_j(item(k, False))}')

    def done(k: int) -> list[str]:
        return [
            ev(
                "response.function_call_arguments.done",
                f'"item_id":"{items[k]}","output_index":{k},"arguments":{_j(calls[k].text)}',
            ),
            ev("response.output_item.done", f'"output_index":{k},"item":{_j(item(k, True))}'),
        ]

    def deltas(sel: list[int]) -> Iterator[str]:
        frags = [_fragments(calls[k].text, shape.fragment) for k in sel]
        for j, piece in _order(frags, shape.interleave):
            k = sel[j]
            yield ev(
                "response.function_call_arguments.delta",
                f'"item_id":"{items[k]}","output_index":{k},"delta":{_j(piece)},'
                f'"obfuscation":"{_rand(rng, 4 + (j + len(piece)) % 9)}"',
            )

    if shape.interleave:
        out.extend(added(k) for k in range(len(calls)))
        out.extend(deltas(list(range(len(calls)))))
        for k in range(len(calls)):
            out.extend(done(k))
    else:
        for k in range(len(calls)):
            out.append(added(k))
            out.extend(deltas([k]))
            out.extend(done(k))
    final = response("completed", [item(k, True) for k in range(len(calls))])
    out.append(ev("response.completed", f'"response":{final}'))
    return out


def _anthropic(rng: random.Random, calls: list[ExpectedCall], shape: Shape) -> list[str]:
    mid = "msg_01" + _rand(rng, 22)

    def ev(kind: str, body: str) -> str:
        return f'event: {kind}\ndata: {{"type":"{kind}"{body}}}\n\n'

    out = [
        ev(
            "message_start",
            f',"message":{{"id":"{mid}","type":"message","role":"assistant",'
            '"model":"claude-sonnet-4-20250514","content":[],"stop_reason":null,'
            '"stop_sequence":null,"usage":{"input_tokens":472,"cache_creation_input_tokens":0,'
            '"cache_read_input_tokens":0,"output_tokens":2}}',
        ),
        'event: ping\ndata: {"type": "ping"}\n\n',
    ]

    def start(k: int) -> str:
        c = calls[k]
        block: dict[str, Any] = {"type": "tool_use", "id": c.call_id, "name": c.name, "input": {}}
        return ev("content_block_start", f',"index":{k},"content_block":{_j(block)}')

    def stop(k: int) -> str:
        return ev("content_block_stop", f',"index":{k}')

    def deltas(sel: list[int]) -> Iterator[str]:
        frags = [["", *_fragments(calls[k].text, shape.fragment)] for k in sel]
        for j, piece in _order(frags, shape.interleave):
            yield ev(
                "content_block_delta",
                f',"index":{sel[j]},"delta":{{"type":"input_json_delta",'
                f'"partial_json":{_j(piece)}}}',
            )

    if shape.interleave:
        out.extend(start(k) for k in range(len(calls)))
        out.extend(deltas(list(range(len(calls)))))
        out.extend(stop(k) for k in range(len(calls)))
    else:
        for k in range(len(calls)):
            out.append(start(k))
            out.extend(deltas([k]))
            out.append(stop(k))
    out.append(
        ev(
            "message_delta",
            ',"delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":65}',
        )
    )
    out.append(ev("message_stop", ""))
    return out


def _gemini_chunk(rid: str, parts: list[dict[str, Any]], finish: str | None, usage: str) -> str:
    cand: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
    if finish is not None:
        cand["finishReason"] = finish
    cand["index"] = 0
    return (
        f'data: {{"candidates":[{_j(cand)}],"usageMetadata":{usage},'
        f'"modelVersion":"gemini-3-flash-preview","responseId":"{rid}"}}\r\n\r\n'
    )


_GEMINI_USAGE = '{"promptTokenCount":52,"candidatesTokenCount":5,"totalTokenCount":57}'
_VERTEX_USAGE = '{"trafficType":"ON_DEMAND"}'


def _gemini(rng: random.Random, calls: list[ExpectedCall], shape: Shape) -> list[str]:
    rid = _rand(rng, 23)
    out = []
    for k, c in enumerate(calls):
        part: dict[str, Any] = {"functionCall": {"name": c.name, "args": c.arguments}}
        part["functionCall"]["id"] = c.call_id
        if k == 0:
            part["thoughtSignature"] = _rand(rng, 120)
        out.append(_gemini_chunk(rid, [part], None, _GEMINI_USAGE))
    out.append(_gemini_chunk(rid, [{"text": ""}], "STOP", _GEMINI_USAGE))
    return out


def _gemini_vertex(rng: random.Random, calls: list[ExpectedCall], shape: Shape) -> list[str]:
    rid = _rand(rng, 23)
    out = []
    for c in calls:
        out.append(
            _gemini_chunk(
                rid, [{"functionCall": {"name": c.name, "willContinue": True}}], None, _VERTEX_USAGE
            )
        )
        for key, value in c.arguments.items():
            pieces = _fragments(value, shape.fragment) or [""]
            for i, piece in enumerate(pieces):
                arg: dict[str, Any] = {"jsonPath": f"$.{key}", "stringValue": piece}
                if i < len(pieces) - 1:
                    arg["willContinue"] = True
                fc = {"functionCall": {"partialArgs": [arg], "willContinue": True}}
                out.append(_gemini_chunk(rid, [fc], None, _VERTEX_USAGE))
        out.append(_gemini_chunk(rid, [{"functionCall": {}}], None, _VERTEX_USAGE))
    out.append(_gemini_chunk(rid, [{"text": ""}], "STOP", _GEMINI_USAGE))
    return out


def _gemini_interactions(rng: random.Random, calls: list[ExpectedCall], shape: Shape) -> list[str]:
    iid = "v1_" + _rand(rng, 70)

    def ev(kind: str, body: str) -> str:
        return f'event: {kind}\ndata: {{{body},"event_type":"{kind}"}}\n\n'

    out = [
        ev(
            "interaction.created",
            f'"interaction":{{"id":"{iid}","status":"in_progress","object":"interaction",'
            '"model":"gemini-2.5-flash"}',
        ),
        ev("interaction.status_update", f'"interaction_id":"{iid}","status":"in_progress"'),
    ]

    def start(k: int) -> str:
        c = calls[k]
        step: dict[str, Any] = {
            "id": c.call_id,
            "signature": "",
            "type": "function_call",
            "name": c.name,
            "arguments": {},
        }
        return ev("step.start", f'"index":{k},"step":{_j(step)}')

    def stop(k: int) -> str:
        return ev("step.stop", f'"index":{k}')

    def deltas(sel: list[int]) -> Iterator[str]:
        frags = [_fragments(calls[k].text, shape.fragment) for k in sel]
        for j, piece in _order(frags, shape.interleave):
            yield ev(
                "step.delta",
                f'"index":{sel[j]},"delta":{{"arguments":{_j(piece)},"type":"arguments_delta"}}',
            )

    if shape.interleave:
        out.extend(start(k) for k in range(len(calls)))
        out.extend(deltas(list(range(len(calls)))))
        out.extend(stop(k) for k in range(len(calls)))
    else:
        for k in range(len(calls)):
            out.append(start(k))
            out.extend(deltas([k]))
            out.append(stop(k))
    out.append(
        ev(
            "interaction.completed",
            f'"interaction":{{"id":"{iid}","status":"requires_action","usage":'
            '{"total_tokens":133,"total_input_tokens":53,"total_output_tokens":15},'
            '"object":"interaction","model":"gemini-2.5-flash"}',
        )
    )
    return out


_FRAMERS: dict[str, Callable[[random.Random, list[ExpectedCall], Shape], list[str]]] = {
    "openai_chat": _openai_chat,
    "openai_responses": _openai_responses,
    "anthropic": _anthropic,
    "gemini": _gemini,
    "gemini_vertex": _gemini_vertex,
    "gemini_interactions": _gemini_interactions,
}

_ID_PREFIX = {
    "openai_chat": ("call_", 24),
    "openai_responses": ("call_", 24),
    "anthropic": ("toolu_01", 22),
    "gemini": ("", 8),
    "gemini_interactions": ("", 8),
}


def make_stream(
    kind: str, shape: Shape | str, seed: int = 0, *, chunk_size: int = CHUNK_SIZE
) -> SyntheticStream:
    """A seeded synthetic stream of ``kind`` (see ``KINDS``) with calls of ``shape``."""
    if isinstance(shape, str):
        label, shape = shape, SIZES[shape]
    else:
        label = f"{shape.calls}x{shape.arg_bytes}B/{shape.fragment}"
    rng = random.Random(f"{kind}/{shape}/{seed}")
    calls = []
    for k in range(shape.calls):
        args = make_arguments(rng, shape.arg_bytes)
        if kind == "gemini_vertex":
            # partialArgs stream string values by path; the rebuilt object is what counts.
            args = {key: str(value) for key, value in args.items()}
        prefix = _ID_PREFIX.get(kind)
        call_id = None if prefix is None else prefix[0] + _rand(rng, prefix[1])
        name = "write_file" if shape.arg_bytes > 96 else "get_weather"
        calls.append(
            ExpectedCall(call_id=call_id, name=f"{name}_{k}", arguments=args, text=_j(args))
        )
    events = _FRAMERS[kind](rng, calls, shape)
    body = "".join(events).encode()
    return SyntheticStream(
        kind=kind,
        provider=PROVIDER[kind],
        body=body,
        chunks=chunked(body, chunk_size),
        events=body.count(
            b"\r\n\r\n" if kind.startswith("gemini") and kind != "gemini_interactions" else b"\n\n"
        ),
        calls=tuple(calls),
        arg_bytes=sum(len(c.text.encode()) for c in calls),
        shape=shape,
        label=label,
    )


def stream_of_body_size(kind: str, body_bytes: int, fragment: int = 8) -> SyntheticStream:
    """One call whose stream body is about ``body_bytes`` long (for the scaling question)."""
    probe = make_stream(kind, Shape(calls=1, arg_bytes=64 * 1024, fragment=fragment))
    ratio = len(probe.body) / probe.arg_bytes
    arg_bytes = max(256, int(body_bytes / ratio))
    return make_stream(kind, Shape(calls=1, arg_bytes=arg_bytes, fragment=fragment))
