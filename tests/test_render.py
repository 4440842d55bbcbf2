"""``render_turn`` round-trips through the real decoder for every family and finish kind."""

from __future__ import annotations

import pytest

from callgate.adapters.render import RenderCall, render_turn
from callgate.engine.core.decode import decode
from callgate.engine.core.outcome import OutcomeKind

from .conftest import FAMILIES, chunkings

CALLS = (
    RenderCall("call_a1", "get_weather", '{"city":"Paris \\"rive gauche\\"","days":3}'),
    RenderCall("call_b2", "add", '{"a":1,"b":[2,3],"note":"ünïcödé ✓"}'),
)
PARSED = [
    ("call_a1", "get_weather", {"city": 'Paris "rive gauche"', "days": 3}),
    ("call_b2", "add", {"a": 1, "b": [2, 3], "note": "ünïcödé ✓"}),
]
TEXT = "Let me check that for you — one moment."


def _calls(outcome: object) -> list[tuple[str, str, object]]:
    return [(c.call_id, c.name, c.arguments) for c in outcome.calls]  # type: ignore[attr-defined]


@pytest.mark.parametrize("provider", FAMILIES)
@pytest.mark.parametrize("fragment", [1, 3, 8, 1000])
def test_text_only_final_stream(provider: str, fragment: int) -> None:
    body = render_turn(provider, text=TEXT, fragment_size=fragment, input_tokens=7, output_tokens=3)
    for mode, chunks in chunkings(body):
        out = decode(provider, chunks)
        assert out.kind is OutcomeKind.FINAL_TEXT, mode
        assert out.text == TEXT
        assert out.calls == ()
        assert out.usage.input_tokens == 7 and out.usage.output_tokens == 3


@pytest.mark.parametrize("provider", FAMILIES)
def test_tool_use_turn_with_text(provider: str) -> None:
    out = decode(provider, [render_turn(provider, text=TEXT, calls=CALLS)])
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    assert out.text == TEXT
    assert _calls(out) == PARSED
    assert all(c.error is None for c in out.calls)


@pytest.mark.parametrize("provider", FAMILIES)
def test_default_finish_follows_calls(provider: str) -> None:
    assert render_turn(provider, calls=CALLS) == render_turn(
        provider, calls=CALLS, finish="tool_use"
    )
    assert render_turn(provider, text="x") == render_turn(provider, text="x", finish="stop")


@pytest.mark.parametrize("provider", FAMILIES)
def test_response_id_given_or_derived(provider: str) -> None:
    out = decode(provider, [render_turn(provider, text="hi", response_id="rid-42", model="m-1")])
    assert out.response_id == "rid-42"
    assert out.model == "m-1"
    # Derived ids are deterministic and differ between different turns.
    a = decode(provider, [render_turn(provider, text="one")]).response_id
    b = decode(provider, [render_turn(provider, text="two")]).response_id
    assert a and b and a != b
    assert render_turn(provider, text="one") == render_turn(provider, text="one")


@pytest.mark.parametrize("provider", FAMILIES)
def test_max_tokens_with_whole_calls_is_truncated(provider: str) -> None:
    out = decode(provider, [render_turn(provider, calls=CALLS, finish="max_tokens")])
    assert out.kind is OutcomeKind.TRUNCATED
    assert out.raw_reason in {
        "length",
        "max_output_tokens",
        "max_tokens",
        "MAX_TOKENS",
        "incomplete",
    }


@pytest.mark.parametrize("provider", FAMILIES)
def test_max_tokens_text_only(provider: str) -> None:
    out = decode(provider, [render_turn(provider, text=TEXT, finish="max_tokens")])
    assert out.kind is OutcomeKind.TRUNCATED
    assert out.text == TEXT


@pytest.mark.parametrize("provider", FAMILIES)
def test_max_tokens_cut_mid_arguments(provider: str) -> None:
    body = render_turn(provider, calls=CALLS, finish="max_tokens", cut_mid_arguments=True)
    out = decode(provider, [body])
    assert out.kind is OutcomeKind.TRUNCATED
    # The first call is whole; the cut one never becomes executable.
    assert _calls(out)[0] == PARSED[0]
    executable = [c for c in out.calls if c.arguments is not None]
    assert [c.call_id for c in executable] == ["call_a1"]
    if provider == "openai_chat":
        # Chat's finish chunk closes every call: the cut one fails to parse.
        assert out.calls[1].arguments is None and out.calls[1].error
    elif provider == "gemini":
        # The Gemini API sends argument objects whole: the cut call is absent.
        assert len(out.calls) == 1 and out.incomplete_calls == ()
    else:
        assert [c.call_id for c in out.incomplete_calls] == ["call_b2"]


@pytest.mark.parametrize("provider", FAMILIES)
def test_refusal(provider: str) -> None:
    out = decode(
        provider, [render_turn(provider, text="I can't help with that.", finish="refusal")]
    )
    assert out.calls == ()
    if provider in ("openai_chat", "openai_responses"):
        assert out.kind is OutcomeKind.REFUSAL
        assert out.refusal == "I can't help with that." and out.text == ""
    elif provider == "gemini_interactions":
        # No refusal status exists on the Interactions API: "failed" is the closest.
        assert out.kind is OutcomeKind.FAILED and out.raw_reason == "failed"
    else:
        assert out.kind is OutcomeKind.REFUSAL
        assert out.raw_reason in ("refusal", "SAFETY")
        assert out.text == "I can't help with that."


@pytest.mark.parametrize("provider", FAMILIES)
def test_error_mid_stream_is_failed_and_retryable(provider: str) -> None:
    out = decode(provider, [render_turn(provider, text=TEXT, calls=CALLS, finish="error")])
    assert out.kind is OutcomeKind.FAILED
    assert out.error is not None and out.error.retryable


@pytest.mark.parametrize("provider", FAMILIES)
def test_framing(provider: str) -> None:
    body = render_turn(provider, text="a", calls=CALLS[:1])
    if provider == "gemini":
        assert body.startswith(b"data: {") and body.endswith(b"\r\n\r\n")
        assert b"\n\n" not in body.replace(b"\r\n\r\n", b"")
    elif provider == "openai_chat":
        assert body.endswith(b"data: [DONE]\n\n") and b"event:" not in body
    else:
        assert body.startswith(b"event: ") and body.endswith(b"\n\n")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"provider": "nope"}, "unknown provider"),
        ({"finish": "bogus"}, "unknown finish"),
        ({"finish": "refusal", "calls": CALLS}, "no calls"),
        ({"cut_mid_arguments": True, "calls": CALLS}, "cut_mid_arguments"),
        ({"cut_mid_arguments": True, "finish": "max_tokens"}, "cut_mid_arguments"),
        ({"fragment_size": 0}, "fragment_size"),
    ],
)
def test_bad_requests_raise_value_error(kwargs: dict[str, object], match: str) -> None:
    provider = str(kwargs.pop("provider", "anthropic"))
    with pytest.raises(ValueError, match=match):
        render_turn(provider, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("args", ["{not json", "[1, 2]"])
def test_gemini_needs_object_arguments(args: str) -> None:
    with pytest.raises(ValueError, match="gemini"):
        render_turn("gemini", calls=[RenderCall("c", "f", args)])
