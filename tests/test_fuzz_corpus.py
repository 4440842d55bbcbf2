"""Every fuzz corpus file and regression input, replayed through its target's ``check``.

``fuzz/corpus/<target>/`` holds the seeds (``seed-*``, from the recorded fixtures), the
inputs that reproduced past findings (``regress-*``, always replayed) and inputs merged
from long runs for their coverage (replayed up to a cap, smallest first, so the suite
stays fast). A failure names the file: ``python -m fuzz.targets.<target> <file>`` reruns
it under atheris.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from callgate.engine import Limits, OutcomeKind, TurnOutcome, decode
from fuzz.stream_checks import _decode_recorded, _guard_explains

ROOT = Path(__file__).resolve().parent.parent
LIMITS = Limits()
CORPUS = ROOT / "fuzz" / "corpus"
TARGETS = sorted(p.stem for p in (ROOT / "fuzz" / "targets").glob("*.py") if p.stem != "__init__")
# Merged coverage inputs replayed per target (regressions and seeds are always replayed).
MERGED_PER_TARGET = 60


def _target(name: str) -> ModuleType:
    return importlib.import_module(f"fuzz.targets.{name}")


def _files(name: str) -> list[Path]:
    files = sorted(p for p in (CORPUS / name).iterdir() if p.is_file())
    kept = [p for p in files if p.name.startswith(("regress-", "seed-"))]
    merged = sorted(
        (p for p in files if not p.name.startswith(("regress-", "seed-"))),
        key=lambda p: (p.stat().st_size, p.name),
    )
    return kept + merged[:MERGED_PER_TARGET]


@pytest.mark.parametrize("name", TARGETS)
def test_corpus_replays_clean(name: str) -> None:
    check = _target(name).check
    failures = []
    for path in _files(name):
        try:
            check(path.read_bytes())
        except Exception as exc:
            failures.append(f"{path.relative_to(ROOT)}: {type(exc).__name__}: {exc}"[:300])
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", TARGETS)
def test_target_states_its_invariant_and_has_seeds(name: str) -> None:
    source = (ROOT / "fuzz" / "targets" / f"{name}.py").read_text()
    assert source.startswith("# Invariant: ")
    assert callable(_target(name).check)
    assert any(p.name.startswith("seed-") for p in (CORPUS / name).iterdir())


def test_the_runner_knows_every_target() -> None:
    from fuzz.run import STREAMING
    from fuzz.run import TARGETS as RUN_TARGETS

    assert sorted(RUN_TARGETS) == TARGETS
    assert "diff_sdk" not in STREAMING and "sse_decoder" in STREAMING


def test_regressions_exist_for_the_fixed_findings() -> None:
    regressions = {p.parent.name + "/" + p.name for p in CORPUS.glob("*/regress-*")}
    for expected in (
        "decode_openai_chat/regress-provider-error-then-overlong-line",
        "adapter_openai_responses/regress-call-after-completed",
        "accumulator/regress-empty-fragment",
        "accumulator/regress-empty-text-piece",
        "accumulator/regress-lone-surrogate-repeated-done",
        "sse_decoder/regress-pairs-bad-event-name-salvage",
        "decode_gemini/regress-invalid-utf8-in-args",
    ):
        assert expected in regressions


def test_the_salvage_regression_fails_without_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without take_salvaged() the events before an SSE error in the same chunk are lost,
    # and the provider error before an over-long line decides retry-or-fail by chunking.
    from callgate.engine.core.sse import SSEDecoder

    data = (
        CORPUS / "decode_openai_chat" / "regress-provider-error-then-overlong-line"
    ).read_bytes()
    check = _target("decode_openai_chat").check
    check(data)
    monkeypatch.setattr(SSEDecoder, "take_salvaged", lambda self: [])
    with pytest.raises(AssertionError, match="re-chunking changed the outcome"):
        check(data)


def test_the_late_call_regression_fails_without_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import callgate.adapters.openai_responses as responses

    data = (CORPUS / "adapter_openai_responses" / "regress-call-after-completed").read_bytes()
    check = _target("adapter_openai_responses").check
    check(data)
    monkeypatch.setattr(responses, "_TERMINAL_EVENTS", frozenset(responses._HANDLERS))
    with pytest.raises(AssertionError, match="after the Completion"):
        check(data)


def test_the_argument_parser_target_catches_a_lenient_parser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = _target("arguments")
    monkeypatch.setattr(target, "parse_arguments", lambda raw, depth: {"a": 1})
    with pytest.raises(AssertionError):
        target.check(b'{"a":1,"a":2}')


# --- the one tolerance of the re-chunking check ----------------------------------------------

_NEST = 600  # under the headroom of a shallow stack, over that of one 500 frames deeper
_DEEP_BODY = (
    b'event: response.created\ndata: {"type":"response.created","x":'
    + b"[" * _NEST
    + b"!"
    + b"]" * _NEST
    + b"}\n\n"
)


def _decode_at_depth(frames: int, body: bytes) -> TurnOutcome:
    """``decode`` called ``frames`` Python frames deeper than this test."""
    if frames:
        return _decode_at_depth(frames - 1, body)
    return decode("openai_responses", [body])


@pytest.mark.skipif(
    sys.version_info >= (3, 12),
    reason="from 3.12 msgspec's guard counts C recursion only: Python frames do not use it up",
)
def test_an_event_nested_near_the_recursion_limit_fails_at_any_stack_depth() -> None:
    """On 3.11 msgspec's nesting guard shares the interpreter's recursion limit with
    Python frames, so the same broken, deeply nested event is reported as nesting too
    deeply from a deep stack and as its other defect (a bad byte after the nesting) from
    a shallow one. The turn fails both ways, and with the limit raised the two agree:
    what ``check_decode`` asks before it lets such a difference through."""
    shallow = _decode_at_depth(0, _DEEP_BODY)
    deep = _decode_at_depth(500, _DEEP_BODY)
    assert shallow.kind is OutcomeKind.FAILED and deep.kind is OutcomeKind.FAILED
    assert "nests too deeply" not in shallow.stop_reason
    assert "nests too deeply" in deep.stop_reason
    # The fuzz check's own case: a nesting at which decode() and the recorded decode (a
    # few frames deeper) disagree at this very stack depth; the raised limit resolves it.
    for nest in range(700, 1100):
        body = _DEEP_BODY.replace(b"[" * _NEST, b"[" * nest).replace(b"]" * _NEST, b"]" * nest)
        whole = decode("openai_responses", [body])
        recorded, _ = _decode_recorded("openai_responses", [body], LIMITS)
        if whole != recorded:
            break
    else:
        pytest.fail("no nesting depth made the two decodes disagree")
    reasons = (whole.stop_reason, recorded.stop_reason)
    assert _guard_explains("openai_responses", body, [body], LIMITS, reasons)


def test_a_difference_without_the_guard_reason_is_never_excused() -> None:
    """Only a guard reason earns the re-check; without one the difference stands."""
    reasons = ("protocol error: one thing", "protocol error: another")
    assert not _guard_explains("openai_responses", _DEEP_BODY, [_DEEP_BODY], LIMITS, reasons)
