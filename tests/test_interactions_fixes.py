"""Fixes in the Gemini Interactions adapter, each shown on whole streams fed whole, one byte
at a time and at seeded random chunk boundaries (identical outcomes required):

- a legacy ``function_call``'s ``arguments`` object reaches the assembler as the exact wire
  bytes (strictly parsed: duplicate keys are an error, ``1E2`` stays ``1E2``; invalid
  UTF-8 fails the turn) instead of a decoded-and-re-encoded copy;
- non-empty ``arguments`` in a ``function_call`` ``step.start`` are never dropped: without
  argument deltas they are the call's arguments (exact bytes, strict parse, the argument
  caps), with argument deltas, or on a call step without a name, they fail the turn;
- a step's payload is not held for the whole stream: only what becomes output is kept.
"""

from __future__ import annotations

import json
import random
import tracemalloc
from typing import Any

import pytest

from callgate.engine.core.adapter import load_adapter
from callgate.engine.core.decode import StreamDecoder, decode
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits
from callgate.engine.core.outcome import OutcomeKind, TurnOutcome

from .conftest import FIXTURES, chunkings

LEGACY_CALL = (
    FIXTURES
    / "gemini_interactions"
    / "legacy_content_api_function_call_requires_action.converted.sse"
)
LEGACY_ARGS = b'"arguments":{"location":"San Francisco"}'


def frame(event_type: str, payload: bytes) -> bytes:
    return b"event: " + event_type.encode() + b"\ndata: " + payload + b"\n\n"


def iev(event_type: str, **data: Any) -> bytes:
    return frame(event_type, json.dumps({"event_type": event_type, **data}).encode())


CREATED = iev("interaction.created", interaction={"id": "v1_x", "status": "in_progress"})


def completed(status: str = "requires_action") -> bytes:
    return iev("interaction.completed", interaction={"id": "v1_x", "status": status})


def call_start(index: int, arguments: bytes, *, name: str | None = "delete_files") -> bytes:
    """A function_call step.start whose ``arguments`` are exactly ``arguments``."""
    named = b'"name":"%s",' % name.encode() if name is not None else b""
    return frame(
        "step.start",
        b'{"event_type":"step.start","index":%d,"step":{"type":"function_call","id":"c%d",%s'
        b'"arguments":%s,"signature":""}}' % (index, index, named, arguments),
    )


def args_delta(index: int, text: str, **extra: Any) -> bytes:
    return iev(
        "step.delta", index=index, delta={"type": "arguments_delta", "arguments": text, **extra}
    )


def stop(index: int) -> bytes:
    return iev("step.stop", index=index)


def outcome(body: bytes, limits: Limits = DEFAULT_LIMITS) -> TurnOutcome:
    """The outcome of ``body``, the same in all three feeding modes."""
    results = [decode("gemini_interactions", chunks, limits) for _, chunks in chunkings(body)]
    assert results[0] == results[1] == results[2]
    return results[0]


def legacy(arguments: bytes) -> bytes:
    body = LEGACY_CALL.read_bytes()
    assert body.count(LEGACY_ARGS) == 1
    return body.replace(LEGACY_ARGS, b'"arguments":' + arguments)


# --- f2: legacy function_call arguments ----------------------------------------------------


@pytest.mark.parametrize(
    "wire",
    [
        pytest.param(b'{ "n" : 1E2 }', id="exponent-and-spaces"),
        pytest.param(b'{"city":"Z\\u00fcrich","n":1.50}', id="escape-and-trailing-zero"),
        pytest.param('{"city": "Zürich"}'.encode(), id="utf8"),
    ],
)
def test_legacy_call_arguments_are_the_wire_bytes(wire: bytes) -> None:
    out = outcome(legacy(wire))
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    [call] = out.calls
    assert call.error is None
    assert call.raw_arguments == wire
    assert call.arguments == json.loads(wire)


def test_legacy_call_arguments_are_parsed_strictly() -> None:
    wire = b'{"location":"San Francisco", "location":"Paris"}'
    [call] = outcome(legacy(wire)).calls
    assert call.arguments is None
    assert call.error == "arguments contain a duplicate key"
    assert call.raw_arguments == wire
    # The bytes are taken unread from the event, so their UTF-8 is checked by the adapter:
    # an invalid byte fails the turn, as anywhere else in an event.
    out = outcome(legacy(b'{"location":"Z\xfcrich"}'))
    assert out.kind is OutcomeKind.FAILED and out.calls == ()
    assert "UTF-8" in out.stop_reason


# --- f9: arguments in a function_call step.start -------------------------------------------


def test_step_start_arguments_without_deltas_are_the_call_arguments() -> None:
    wire = b'{"path": "/srv/data", "recursive" : true}'
    out = outcome(
        CREATED
        + call_start(0, wire)
        # A delta that carries only a signature brings no argument text.
        + args_delta(0, "", signature="FS")
        + stop(0)
        + completed()
    )
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    [call] = out.calls
    assert (call.call_id, call.name, call.error) == ("c0", "delete_files", None)
    assert call.arguments == {"path": "/srv/data", "recursive": True}
    assert call.raw_arguments == wire
    assert [item.kind for item in out.continuation] == ["function_call_signature"]
    # The bytes are taken unread from the event: the adapter checks their UTF-8.
    out = outcome(CREATED + call_start(0, b'{"path":"/srv/d\xe4ta"}') + stop(0) + completed())
    assert out.kind is OutcomeKind.FAILED and out.calls == ()
    assert "UTF-8" in out.stop_reason


@pytest.mark.parametrize(
    ("wire", "error"),
    [
        pytest.param(
            b'{"path":"/tmp","path":"/srv/data"}',
            "arguments contain a duplicate key",
            id="duplicate-key",
        ),
        pytest.param(b'["/srv/data"]', "must be a JSON object", id="not-an-object"),
    ],
)
def test_step_start_arguments_are_parsed_strictly(wire: bytes, error: str) -> None:
    out = outcome(CREATED + call_start(0, wire) + stop(0) + completed())
    [call] = out.calls
    assert call.arguments is None and call.error is not None and error in call.error
    assert call.raw_arguments == wire


def test_step_start_arguments_as_a_json_string_are_argument_text() -> None:
    # As the legacy content.delta's string arguments: the string is the argument text.
    out = outcome(
        CREATED + call_start(0, b'"{\\"path\\":\\"/srv/data\\"}"') + stop(0) + completed()
    )
    [call] = out.calls
    assert call.arguments == {"path": "/srv/data"}
    assert call.raw_arguments == b'{"path":"/srv/data"}'
    # An empty string is the placeholder: the deltas carry the arguments.
    body = CREATED + call_start(0, b'""') + args_delta(0, '{"a":1}') + stop(0) + completed()
    [call] = outcome(body).calls
    assert call.arguments == {"a": 1}
    # A non-empty one with deltas after it: two sources, the turn fails.
    body = CREATED + call_start(0, b'"{}"') + args_delta(0, '{"a":1}') + stop(0) + completed()
    assert outcome(body).kind is OutcomeKind.FAILED


@pytest.mark.parametrize(
    "deltas",
    [
        pytest.param([args_delta(0, '{"path":"/"}')], id="whole-text"),
        pytest.param([args_delta(0, ""), args_delta(0, " ")], id="after-an-empty-one"),
        pytest.param([args_delta(0, "}", signature="FS")], id="with-a-signature"),
    ],
)
def test_step_start_arguments_followed_by_argument_deltas_fail_the_turn(
    deltas: list[bytes],
) -> None:
    body = b"".join([CREATED, call_start(0, b'{"path":"/srv/data"}'), *deltas, stop(0)])
    out = outcome(body + completed())
    assert out.kind is OutcomeKind.FAILED and out.calls == ()
    assert "arguments came whole" in out.stop_reason
    # The contrast (and the recorded format): absent, null or an empty object is the
    # placeholder, not arguments; the deltas carry them.
    for placeholder in (b"{}", b"{ \t }", b"null"):
        body = CREATED + call_start(0, placeholder) + args_delta(0, '{"path":"/"}') + stop(0)
        [call] = outcome(body + completed()).calls
        assert (call.arguments, call.raw_arguments) == ({"path": "/"}, b'{"path":"/"}')


def test_step_start_arguments_of_a_nameless_call_step_fail_the_turn() -> None:
    # A nameless call step is the legacy form, whose call (with its own arguments) comes
    # in the delta: two sources of arguments, neither picked.
    legacy_call = iev(
        "content.delta",
        index=0,
        delta={"type": "function_call", "id": "c0", "name": "f", "arguments": {"b": 2}},
    )
    start = call_start(0, b'{"a":1}', name=None).replace(b"step.start", b"content.start")
    out = outcome(CREATED + start + legacy_call + stop(0) + completed())
    assert out.kind is OutcomeKind.FAILED and out.calls == ()


def test_step_start_arguments_count_against_the_argument_caps() -> None:
    # Over the per-call cap: that call is spoiled (arguments None, an error).
    wire = b'{"path":"/srv/data"}'
    out = outcome(
        CREATED + call_start(0, wire) + stop(0) + completed(),
        Limits(max_call_argument_bytes=len(wire) - 1),
    )
    [call] = out.calls
    assert call.arguments is None
    assert call.error is not None and "max_call_argument_bytes" in call.error
    # The reviewer's stream, scaled down: 40 call steps, each with arguments far over the
    # response's cap together. The turn fails on the cap instead of proposing 40 calls
    # (the failed outcome still lists the 4 calls that fitted under it).
    blob = json.dumps({f"k{i}": "x" * 100 for i in range(30)}).encode()
    steps = b"".join(call_start(i, blob) + stop(i) for i in range(40))
    out = outcome(CREATED + steps + completed(), Limits(max_response_argument_bytes=4 * len(blob)))
    assert out.kind is OutcomeKind.FAILED and len(out.calls) == 4
    assert "max_response_argument_bytes" in out.stop_reason


# --- f8: what the adapter keeps of a step --------------------------------------------------


def _steps_with_payload(payload: str, count: int) -> bytes:
    """``count`` steps (calls, thoughts, text outputs in turn), each step.start carrying
    ``payload`` in a field the adapter does not act on."""
    body = [CREATED]
    for i in range(count):
        kind = ("function_call", "thought", "model_output")[i % 3]
        step: dict[str, Any] = {"type": kind, "x_payload": payload}
        if kind == "function_call":
            step.update(id=f"c{i}", name="f", arguments={})
        body.append(iev("step.start", index=i, step=step))
        if kind == "function_call":
            body.append(args_delta(i, f'{{"i":{i}}}'))
        body.append(stop(i))
    return b"".join(body)


def _held(chunks: list[bytes]) -> tuple[int, TurnOutcome]:
    """Bytes the decoder holds after the chunks (before the terminal event), and the
    outcome."""
    decoder = StreamDecoder(load_adapter("gemini_interactions"), DEFAULT_LIMITS)
    tracemalloc.start()
    try:
        for chunk in chunks:
            decoder.feed(chunk)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    decoder.feed(completed())
    return held, decoder.finish()


def test_step_payloads_are_not_held_for_the_whole_stream() -> None:
    small = _steps_with_payload("x" * 300, 6)
    out = outcome(small + completed())
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    assert [c.arguments for c in out.calls] == [{"i": 0}, {"i": 3}]
    # 15 steps with 1 MiB each (15 MiB on the wire): none of it is held once a step
    # starts (fed whole, and at seeded random chunk boundaries up to 64 KiB).
    body = _steps_with_payload("x" * (1 << 20), 15)
    rng = random.Random(8)
    chunked, at = [], 0
    while at < len(body):
        n = rng.randint(1, 64 << 10)
        chunked.append(body[at : at + n])
        at += n
    for chunks in ([body], chunked):
        held, big = _held(chunks)
        assert held < 1 << 20, f"{held} bytes held"
        assert big.kind is OutcomeKind.TOOL_PROPOSALS and len(big.calls) == 5


def test_an_argument_delta_is_read_by_its_json_type_on_every_path() -> None:
    # A server whose `event:` name and JSON `event_type` disagree: the adapter goes by the
    # JSON type, so a "delta" that says it is a step stop closes the call step early
    # and the real stop that follows fails the turn, however the stream is chunked
    # (a run of argument fragments is taken on a fast path that reads the name first).
    name = "steps_api_function_call_requires_action.converted.sse"
    body = (FIXTURES / "gemini_interactions" / name).read_bytes()
    delta = b'"type":"arguments_delta"},"event_type":"step.delta"}'
    assert body.count(delta) == 1
    body = body.replace(delta, b'"type":"arguments_delta"},"event_type":"step.stop"}')
    whole = decode("gemini_interactions", [body])
    assert whole.kind is OutcomeKind.FAILED, whole.stop_reason
    for mode, chunks in chunkings(body, seed=3):
        assert decode("gemini_interactions", chunks) == whole, mode
