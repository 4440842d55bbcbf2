"""Every recorded stream decodes to its golden outcome, whatever the chunk boundaries, and
no cut of any stream is ever reported as a completed turn.

Golden outcomes live in tests/golden/outcomes.json (reviewed against each fixture's
description in tests/fixtures/SOURCES.md). Four fixtures end without the blank line that
terminates their last SSE event (three Anthropic ``message_stop``, one Chat ``[DONE]``); per
the event-stream rules an unterminated event is discarded, so they are ``truncated`` —
byte-identical to a stream cut just before its final blank line. Their done calls are
still listed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from callgate.engine.cli import outcome_json
from callgate.engine.core.decode import decode
from callgate.engine.core.outcome import OutcomeKind, TurnOutcome

from .conftest import FIXTURES, chunkings, fixture_files

GOLDEN = json.loads((Path(__file__).parent / "golden" / "outcomes.json").read_text())
FILES = fixture_files()
IDS = [f"{fam}/{p.name}" for fam, p in FILES]
FIELDS = ("kind", "raw_reason", "response_id", "text", "refusal", "calls", "incomplete_calls")


def _view(outcome: TurnOutcome) -> dict[str, object]:
    j = outcome_json(outcome)
    return {k: j[k] for k in FIELDS}


def test_every_fixture_has_a_golden_outcome() -> None:
    assert len(FILES) == 35
    assert sorted(GOLDEN) == sorted(IDS)


@pytest.mark.parametrize(("provider", "path"), FILES, ids=IDS)
def test_golden_outcome_in_all_three_feeding_modes(provider: str, path: Path) -> None:
    body = path.read_bytes()
    expected = GOLDEN[f"{provider}/{path.name}"]
    for mode, chunks in chunkings(body, seed=len(body)):
        assert _view(decode(provider, chunks)) == expected, mode


# The event whose dispatch completes a turn, per family (PROVIDERS.md); in every
# complete fixture it is the last event.
TERMINAL_EVENT = {
    "openai_chat": b"data: [DONE]",
    "openai_responses": b"event: response.completed\n",
    "anthropic": b"event: message_stop\n",
    "gemini": b'"finishReason"',
    "gemini_interactions": b"event: interaction.complete",
}


def _terminal_offset(provider: str, body: bytes, complete: bool) -> int:
    """The shortest prefix of a complete stream that may be complete, read off its bytes
    (never off ``decode``): just past the line end that dispatches its last event, which
    must be the family's terminal event. A CR alone ends a line, so a CRLF-framed stream
    completes at its final blank line's CR. A stream that is not complete: past its end."""
    if not complete:
        return len(body) + 1
    crlf = body.endswith(b"\r\n\r\n")
    assert crlf or body.endswith(b"\n\n"), "a complete stream ends with a blank line"
    events = body.replace(b"\r\n", b"\n").rstrip(b"\n").split(b"\n\n")
    assert TERMINAL_EVENT[provider] in events[-1], events[-1][:80]
    return len(body) - 1 if crlf else len(body)


@pytest.mark.parametrize(("provider", "path"), FILES, ids=IDS)
def test_truncation_at_every_byte_offset(provider: str, path: Path) -> None:
    body = path.read_bytes()
    full = decode(provider, [body])
    # The terminal event is the last thing that completes the stream: every cut before
    # the blank line that ends it is incomplete, every cut after it is the whole outcome.
    terminal = _terminal_offset(provider, body, full.complete)
    for cut in range(len(body) + 1):
        out = decode(provider, [body[:cut]])
        if cut < terminal:
            assert out.kind not in (OutcomeKind.FINAL_TEXT, OutcomeKind.TOOL_PROPOSALS), cut
        else:
            assert out.kind == full.kind, cut
        # A call is never listed complete without its done signal: every listed call
        # is also complete (with the same arguments) in the whole stream.
        whole_calls = {c.index: c for c in full.calls}
        for c in out.calls:
            assert c.index in whole_calls, cut
            if c.error is None:
                assert c.arguments == whole_calls[c.index].arguments, cut


def test_cut_inside_arguments_never_yields_a_call() -> None:
    body = (FIXTURES / "openai_chat" / "single_tool_call_get_weather.sse").read_bytes()
    cut = body.index(b"York")
    out = decode("openai_chat", [body[:cut]])
    assert out.kind is OutcomeKind.TRUNCATED
    assert out.calls == ()
    assert [c.name for c in out.incomplete_calls] == ["get_weather"]


def _cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "callgate.engine.cli", *args],
        input=stdin,
        capture_output=True,
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize("chunk", ["1", "7", None])
def test_cli_decode_prints_one_json_object(chunk: str | None) -> None:
    path = FIXTURES / "openai_responses" / "single_function_call_gpt4o.sse"
    extra = ["--chunk-size", chunk] if chunk else []
    res = _cli("decode", "--provider", "openai_responses", *extra, str(path))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["kind"] == "tool_proposals"
    assert out["calls"][0]["name"] == "get_capital"
    assert out["calls"][0]["arguments"] == {"country": "France"}
    assert {"kind", "raw_reason", "response_id", "text", "calls"} <= out.keys()


def test_cli_decode_reads_stdin() -> None:
    body = (FIXTURES / "gemini" / "max_tokens.converted.sse").read_bytes()
    res = _cli("decode", "--provider", "gemini", "-", stdin=body)
    assert res.returncode == 0
    assert json.loads(res.stdout)["kind"] == "truncated"


def test_cli_decode_unreadable_input_is_a_clear_error(tmp_path: Path) -> None:
    res = _cli("decode", "--provider", "anthropic", str(tmp_path / "missing.sse"))
    assert res.returncode != 0
    assert b"cannot read" in res.stderr
    assert b"Traceback" not in res.stderr


def test_cli_decode_rejects_unknown_provider(tmp_path: Path) -> None:
    res = _cli("decode", "--provider", "nope", str(tmp_path))
    assert res.returncode != 0 and b"Traceback" not in res.stderr
