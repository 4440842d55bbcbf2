# Invariant: TurnAssembler never reports an open call as done; holds only what its caps count.
#   apply() raises only LimitExceeded/StreamProtocolError, each for a real violation; outcome()
#   never raises; raw arguments are the joined fragments, arguments exactly parse_arguments(raw).
"""Fuzz target: ``callgate.engine.core.decode.TurnAssembler`` (and the per-call
``CallAccumulator`` inside it), fed engine events decoded from the fuzzer's bytes.

Each pair of bytes is one event: the first picks the kind, the second the call index and
a fragment from a small JSON-token vocabulary (or raw bytes decoded with
``surrogateescape``, so lone surrogates appear). A small model tracks what the stream
said (started, fragments, done, repeated done) to check the outcome against, and after
every event the assembler's held fragments and text are measured (white box).
"""

from __future__ import annotations

from collections.abc import Iterator

from callgate.engine.core.arguments import ArgumentsRejected, parse_arguments
from callgate.engine.core.decode import TurnAssembler
from callgate.engine.core.errors import LimitExceeded, StreamProtocolError
from callgate.engine.core.events import (
    ArgumentsDelta,
    CallDone,
    CallStarted,
    Completion,
    ContinuationItem,
    EngineEvent,
    ProviderDetail,
    ProviderError,
    RefusalDelta,
    ResponseMeta,
    TextDelta,
    UsageReport,
)
from callgate.engine.core.outcome import OutcomeKind, ProviderErrorInfo, Usage
from fuzz.harness import ROOMY_LIMITS, TIGHT_LIMITS, expect, fuzz_main, stream_seed

__all__ = ["check", "encode_events", "events_from_bytes"]

_VOCAB = (
    "{",
    "}",
    '"a"',
    ":",
    "1",
    ",",
    '"b":',
    "[",
    "]",
    '"',
    "\\u003a",
    "\\ud800",
    " ",
    "null",
    '"k":"v"',
    '{"a":1}',
    "",
    "\u00e9",
    "\ud800",
    "1e999",
    "NaN",
    '{"a":1,"a":2}',
)
_KINDS = tuple(OutcomeKind)


def _text(data: bytes, at: int, selector: int) -> tuple[str, int]:
    """A fragment: a vocabulary token, or up to 7 raw bytes from the input."""
    if selector & 1:
        return _VOCAB[(selector >> 1) % len(_VOCAB)], at
    n = (selector >> 1) % 8
    return data[at : at + n].decode("utf-8", "surrogateescape"), at + n


def events_from_bytes(data: bytes) -> Iterator[EngineEvent]:
    """The engine events encoded by ``data`` (two bytes per event, plus raw text)."""
    i = 0
    while i + 1 < len(data):
        op, arg = data[i] % 13, data[i + 1]
        i += 2
        index = arg % 4 if arg < 250 else 2**62
        if op == 0:
            call_id = None if arg & 0x10 else f"id{(arg >> 5) % 3}"
            yield CallStarted(index, ("f", "g", "")[(arg >> 2) % 3], call_id)
        elif op in (1, 2, 3):
            fragment, i = _text(data, i, arg >> 2)
            yield ArgumentsDelta(index, fragment)
        elif op == 4:
            yield CallDone(index)
        elif op == 5:
            whole, i = _text(data, i, arg >> 2)
            yield CallDone(index, whole)
        elif op == 6:
            text, i = _text(data, i, arg)
            yield TextDelta(text)
        elif op == 7:
            text, i = _text(data, i, arg)
            yield RefusalDelta(text)
        elif op == 8:
            yield Completion(_KINDS[arg % len(_KINDS)], f"raw{arg % 3}")
        elif op == 9:
            yield ProviderError(ProviderErrorInfo(code="e", retryable=bool(arg & 1)))
        elif op == 10:
            yield ContinuationItem("k", index, {"n": arg})
        elif op == 11:
            yield UsageReport(Usage(input_tokens=arg, output_tokens=arg if arg & 1 else None))
        else:
            yield (
                ResponseMeta("r" if arg & 1 else None, "m")
                if arg & 2
                else ProviderDetail("d", {"n": arg})
            )


def _raw_pieces(op: int, index: int, text: str, shift: int) -> bytes:
    """``text`` as raw-text events of ``op`` (at most 7 bytes each)."""
    raw = text.encode("utf-8", "surrogateescape")
    out = b""
    for at in range(0, len(raw), 7):
        piece = raw[at : at + 7]
        out += bytes((op, index | ((len(piece) << 1) << shift))) + piece
    return out


def encode_events(events: list[EngineEvent]) -> bytes:
    """The byte form of the call, text and completion events in ``events`` (indexes
    folded into 0-3), so real streams' event sequences can seed the corpus."""
    out = b""
    for ev in events:
        if isinstance(ev, CallStarted):
            out += bytes((0, ev.index % 4 | (0x10 if ev.call_id is None else 0)))
        elif isinstance(ev, ArgumentsDelta):
            out += _raw_pieces(1, ev.index % 4, ev.fragment, 2)
        elif isinstance(ev, CallDone):
            out += bytes((4, ev.index % 4))
        elif isinstance(ev, TextDelta):
            out += _raw_pieces(6, 0, ev.text, 0)
        elif isinstance(ev, Completion):
            out += bytes((8, _KINDS.index(ev.kind)))
    return out


class _Call:
    def __init__(self) -> None:
        self.parts: list[str] = []
        self.done = False
        self.done_text: str | None = None
        self.disagree = False


def _check_held(turn: TurnAssembler) -> None:
    # White box: what the assembler retains must be proportional to what it counts
    # against the caps (an empty piece costs a list slot but counts nothing).
    for call in turn._calls._calls.values():
        expect(len(call.parts) <= call.size, f"call {call.index} holds empty fragments")
    expect(len(turn._text) + len(turn._refusal) <= turn._text_size, "empty text pieces held")


def check(data: bytes) -> None:
    limits = TIGHT_LIMITS if stream_seed(data) & 1 else ROOMY_LIMITS
    turn = TurnAssembler(limits)
    model: dict[int, _Call] = {}
    for event in events_from_bytes(data):
        try:
            turn.apply(event)
        except StreamProtocolError as exc:
            _expect_violation(event, model)
            turn.fail(f"protocol error: {exc}")
            break
        except LimitExceeded as exc:
            turn.fail(f"limit exceeded: {exc.limit}={exc.value}")
            break
        _track(event, model)
        _check_held(turn)
    outcome = turn.outcome()
    started = set(model)
    done = {i for i, c in model.items() if c.done}
    if outcome.complete:
        expect(done == started, "complete turn with a call that never got its done signal")
        expect(not outcome.incomplete_calls, "complete turn with incomplete calls")
    expect([c.index for c in outcome.calls] == sorted(done), "calls are not the done ones")
    expect({c.index for c in outcome.incomplete_calls} == started - done, "incomplete mismatch")
    for call in outcome.calls:
        state = model[call.index]
        joined = "".join(state.parts)
        if not joined and state.done_text is not None:
            joined = state.done_text
        expect(len(call.raw_arguments) <= limits.max_call_argument_bytes, "call over its cap")
        if call.error is not None:
            expect(call.arguments is None, "a call with an error kept its arguments")
            continue
        expect(not state.disagree, "disagreeing done events left the call accepted")
        expect(call.raw_arguments == joined.encode(), "raw arguments are not the fragments")
        try:
            parsed = parse_arguments(call.raw_arguments, limits.max_json_depth)
        except ArgumentsRejected:
            raise AssertionError("accepted arguments that the parser rejects") from None
        expect(parsed == call.arguments, "arguments differ from the parser's reading")
    total = sum(len(c.raw_arguments) for c in outcome.calls)
    expect(total <= limits.max_response_argument_bytes, "turn over its argument cap")
    expect(len(outcome.text) + len(outcome.refusal) <= limits.max_text_bytes, "text over cap")


def _expect_violation(event: EngineEvent, model: dict[int, _Call]) -> None:
    """A ``StreamProtocolError`` must answer a real protocol violation."""
    if isinstance(event, CallStarted):
        expect(event.index in model, "a first CallStarted was refused")
    elif isinstance(event, ArgumentsDelta):
        call = model.get(event.index)
        expect(call is None or call.done, "a fragment for an open call was refused")
    elif isinstance(event, CallDone):
        expect(event.index not in model, "a done signal for a started call was refused")
    else:
        raise AssertionError(f"{type(event).__name__} raised StreamProtocolError")


def _track(event: EngineEvent, model: dict[int, _Call]) -> None:
    if isinstance(event, CallStarted):
        model[event.index] = _Call()
    elif isinstance(event, ArgumentsDelta):
        model[event.index].parts.append(event.fragment)
    elif isinstance(event, CallDone):
        call = model[event.index]
        if call.done:
            if event.arguments is not None:
                joined = "".join(call.parts) or call.done_text or ""
                call.disagree |= event.arguments != joined
        else:
            call.done = True
            call.done_text = event.arguments
            joined = "".join(call.parts)
            call.disagree = bool(joined) and event.arguments not in (None, joined)


if __name__ == "__main__":
    fuzz_main(check)
