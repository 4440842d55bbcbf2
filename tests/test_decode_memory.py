"""What ``decode`` holds beside a captured body handed over whole (one chunk).

Split all at once, a body held 2.5-4 times its size beside it (every line,
event and view alive together); a long chunk is now decoded in slices.
"""

from __future__ import annotations

import json
import tracemalloc

import pytest

from callgate.adapters.render import RenderCall, render_turn
from callgate.engine import TurnOutcome, decode
from callgate.engine.core.pieces import RUN, RUN_CHARS, TextPieces

from .conftest import FAMILIES


def _peak(provider: str, chunks: list[bytes]) -> tuple[TurnOutcome, int]:
    tracemalloc.start()
    try:
        outcome = decode(provider, chunks)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return outcome, peak


@pytest.mark.parametrize("provider", FAMILIES)
def test_a_whole_body_is_decoded_in_slices(provider: str) -> None:
    # Megabytes of text and of arguments in small pieces (Gemini sends its arguments
    # whole: one event, of 256 KiB).
    arguments = '{"content":"' + "w" * (256 * 1024) + '"}'
    call = RenderCall("call_1", "write_file", arguments)
    body = render_turn(provider, text="t" * (512 * 1024), calls=[call], fragment_size=64)
    assert len(body) > 2_000_000
    chunked, chunked_peak = _peak(provider, [body[i : i + 4096] for i in range(0, len(body), 4096)])
    whole, whole_peak = _peak(provider, [body])
    assert whole == chunked
    # What the outcome keeps is the same either way; the whole body once held 3-4 times
    # more than the chunked decode beside it.
    assert whole_peak <= 1.25 * chunked_peak + 256 * 1024, (whole_peak, chunked_peak)


@pytest.mark.parametrize("provider", FAMILIES)
def test_text_streamed_in_short_pieces_is_not_held_piece_by_piece(provider: str) -> None:
    # Every 4-character delta was its own object in the turn (and in the Anthropic and
    # Responses adapters, which keep a block's or part's text for the echo or a check):
    # 16-21 times the text at its peak. Pieces are now joined in runs as they arrive.
    text = "abcdefgh" * (64 * 1024)
    body = render_turn(provider, text=text, fragment_size=4)
    outcome, peak = _peak(provider, [body[i : i + 65536] for i in range(0, len(body), 65536)])
    assert outcome.text == text
    assert peak <= 7 * len(text), peak / len(text)


def test_a_gemini_thought_streamed_in_short_pieces_is_held_in_runs() -> None:
    # The merged thought an echo sends back, kept by the adapter until the thought ends.
    def chunk(part: dict[str, object], finish: str | None = None) -> bytes:
        cand: dict[str, object] = {"content": {"role": "model", "parts": [part]}}
        if finish:
            cand["finishReason"] = finish
        return (
            b"data: " + json.dumps({"candidates": [cand], "responseId": "r"}).encode() + b"\r\n\r\n"
        )

    n = 64 * 1024
    body = b"".join(chunk({"text": "abcd", "thought": True}) for _ in range(n))
    body += chunk({"text": "ok"}, "STOP")
    outcome, peak = _peak("gemini", [body[i : i + 65536] for i in range(0, len(body), 65536)])
    [thought] = outcome.continuation
    assert thought.item["text"] == "abcd" * n and outcome.text == "ok"
    assert peak <= 7 * 4 * n, peak / (4 * n)


def test_short_pieces_are_joined_and_long_ones_kept_as_they_are() -> None:
    # Long pieces cost little apart, and the Responses adapter's done-text check holds the
    # same str objects the turn does: joined, they would be a second copy of the text.
    short = [f"{i:04d}" for i in range(RUN)]
    long = [c * 1024 for c in "abcdefghijklmnopqrstuvwxyz0123456789"[: RUN // 2]] * 2
    pieces = TextPieces()
    for piece in [*short, *long, "tail"]:
        pieces.add(piece)
    held = list(pieces)
    assert held[0] == "".join(short) and len(held) == 1 + len(long) + 1
    assert all(a is b for a, b in zip(held[1:], [*long, "tail"], strict=True))
    assert pieces.joined() == "".join([*short, *long, "tail"]) and len(pieces) == len(held)


def test_a_run_of_exactly_run_chars_is_joined_and_one_more_is_kept_apart() -> None:
    # RUN_CHARS is the longest run joined (the bound is inclusive), one character more
    # and the run's pieces are kept as they are.
    size = RUN_CHARS // RUN
    at_bound = [chr(97 + i % 26) * size for i in range(RUN)]
    over = [*at_bound[:-1], at_bound[-1] + "z"]
    for pieces_in, runs in ((at_bound, 1), (over, RUN)):
        pieces = TextPieces()
        for piece in pieces_in:
            pieces.add(piece)
        assert len(pieces) == runs
        assert pieces.joined() == "".join(pieces_in)
        # Text held all in joined runs (no loose piece left) is still text.
        assert pieces


@pytest.mark.parametrize("count", [RUN - 1, RUN, 2 * RUN])
def test_a_thinking_block_of_a_whole_number_of_runs_is_echoed_whole(count: int) -> None:
    # A block whose deltas fill whole runs holds no loose piece: it must still count as
    # text, or the echo would drop the thinking the API asks to be sent back.
    def ev(kind: str, **fields: object) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"

    def delta(index: int, **fields: str) -> str:
        return ev("content_block_delta", index=index, delta=fields)

    thinking = [f"t{i:03d} " for i in range(count)]
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
               "content": [], "stop_reason": None,
               "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip
    thought = {"type": "thinking", "thinking": "", "signature": ""}
    events = [
        ev("message_start", message=message),
        ev("content_block_start", index=0, content_block=thought),
        *(delta(0, type="thinking_delta", thinking=piece) for piece in thinking),
        delta(0, type="signature_delta", signature="SIG"),
        ev("content_block_stop", index=0),
        ev("content_block_start", index=1, content_block={"type": "text", "text": ""}),
        delta(1, type="text_delta", text="Hi."),
        ev("content_block_stop", index=1),
        ev("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 2}),
        ev("message_stop"),
    ]
    out = decode("anthropic", ["".join(events).encode()])
    assert out.text == "Hi."
    [block] = [c.item for c in out.continuation if c.item.get("type") == "thinking"]
    assert block["thinking"] == "".join(thinking) and block["signature"] == "SIG"
