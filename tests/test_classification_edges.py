"""Endings the recorded fixtures do not show (found by a review), each fed whole, one byte
at a time and at seeded random chunk boundaries: the first ending reason counts (a later
"stop" cannot undo "length", "max_tokens", MAX_TOKENS or SAFETY); a Responses refusal part
that arrives without refusal deltas (with text, or empty) is a refusal; only Gemini's
candidate 0 is the turn; a Gemini responseId that arrives after the model version still
names the derived call ids; an interaction whose last status was failed (no
interaction.completed after it) is failed, not truncated; an Anthropic paused turn that
holds a complete client call is failed (sent back as it is, the call would go unanswered).
Streams:
tests/streams/classification/."""

from __future__ import annotations

from pathlib import Path

import pytest

from callgate.engine import OutcomeKind, TurnOutcome, decode
from callgate.engine.core.ids import derive_call_id

from .conftest import chunkings

STREAMS = Path(__file__).parent / "streams" / "classification"

CASES = [
    # (file, provider, kind, raw_reason, number of complete calls)
    ("chat_length_then_stop.sse", "openai_chat", OutcomeKind.TRUNCATED, "length", 0),
    ("chat_length_then_stop_call.sse", "openai_chat", OutcomeKind.TRUNCATED, "length", 1),
    ("ant_dup_message_delta.sse", "anthropic", OutcomeKind.TRUNCATED, "max_tokens", 0),
    ("gem_max_then_stop.sse", "gemini", OutcomeKind.TRUNCATED, "MAX_TOKENS", 0),
    ("resp_refusal_no_delta.sse", "openai_responses", OutcomeKind.REFUSAL, "completed", 0),
    ("resp_refusal_empty.sse", "openai_responses", OutcomeKind.REFUSAL, "completed", 0),
    ("gem_cand1_later.sse", "gemini", OutcomeKind.FINAL_TEXT, "STOP", 0),
    ("gem_cand1_fc.sse", "gemini", OutcomeKind.FINAL_TEXT, "STOP", 0),
    # A paused turn is sent back as it is: a client call in it would go unanswered.
    ("ant_pause_with_client_call.sse", "anthropic", OutcomeKind.FAILED, "pause_turn", 1),
    (
        "inter_status_failed_no_completed.sse",
        "gemini_interactions",
        OutcomeKind.FAILED,
        "failed",
        0,
    ),
]


def _decode_all_ways(provider: str, body: bytes) -> TurnOutcome:
    outcomes = [decode(provider, chunks) for _, chunks in chunkings(body)]
    first = outcomes[0]
    assert all(o == first for o in outcomes[1:])  # whole, byte by byte, random cuts
    return first


@pytest.mark.parametrize(("name", "provider", "kind", "raw", "calls"), CASES)
def test_edge_endings(name: str, provider: str, kind: OutcomeKind, raw: str, calls: int) -> None:
    out = _decode_all_ways(provider, (STREAMS / name).read_bytes())
    assert (out.kind, out.raw_reason, len(out.calls)) == (kind, raw, calls)


def test_a_refusal_without_deltas_keeps_its_text() -> None:
    out = _decode_all_ways("openai_responses", (STREAMS / "resp_refusal_no_delta.sse").read_bytes())
    assert out.refusal == "I can't" and out.text == ""


def test_only_candidate_zero_is_the_turn() -> None:
    out = _decode_all_ways("gemini", (STREAMS / "gem_cand1_fc.sse").read_bytes())
    assert out.calls == () and "b" not in out.text  # candidate 1's call and text are not read


def test_a_late_response_id_names_the_derived_call_ids() -> None:
    out = _decode_all_ways("gemini", (STREAMS / "gem_late_response_id.sse").read_bytes())
    assert out.kind is OutcomeKind.TOOL_PROPOSALS and out.response_id == "late-id-1"
    (call,) = out.calls
    assert call.call_id_derived and call.call_id == derive_call_id("late-id-1", 0)
