"""``render_turn`` round-trips through the real decoder for every family and finish kind."""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.adapters.render import RenderCall, render_turn
from callgate.engine.core.decode import decode
from callgate.engine.core.outcome import OutcomeKind

from .conftest import FAMILIES, FIXTURES, chunkings

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


# --- the wire details the recorded streams have ------------------------------------------


def _payloads(body: bytes) -> list[dict[str, Any]]:
    """Each ``data:`` JSON of a rendered (or recorded) stream, in order."""
    lines = body.decode().splitlines()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


RAW_FINISH = {
    "openai_chat": {"stop": "stop", "tool_use": "tool_calls", "max_tokens": "length"},
    "openai_responses": {"stop": "completed", "max_tokens": "max_output_tokens"},
    "anthropic": {"stop": "end_turn", "tool_use": "tool_use", "max_tokens": "max_tokens"},
    "gemini": {"stop": "STOP", "tool_use": "STOP", "max_tokens": "MAX_TOKENS"},
    "gemini_interactions": {
        "stop": "completed",
        "tool_use": "requires_action",
        "max_tokens": "incomplete",
        "refusal": "failed",
    },
}
RAW_FINISH["openai_chat"]["refusal"] = "stop"  # refusal deltas, then a plain stop
RAW_FINISH["openai_responses"]["tool_use"] = RAW_FINISH["openai_responses"]["refusal"] = "completed"
RAW_FINISH["anthropic"]["refusal"] = "refusal"
RAW_FINISH["gemini"]["refusal"] = "SAFETY"


@pytest.mark.parametrize("provider", FAMILIES)
@pytest.mark.parametrize("finish", ["stop", "tool_use", "max_tokens", "refusal"])
def test_each_finish_kind_is_the_raw_signal_of_the_module_table(provider: str, finish: str) -> None:
    """The finish table of ``render``'s docstring, as the raw reason the decoder reads
    (a Chat refusal ends with ``stop`` as recorded, an Interactions tool turn with
    ``requires_action``)."""
    calls = CALLS if finish == "tool_use" else ()
    text = "" if calls else TEXT
    out = decode(provider, [render_turn(provider, text=text, calls=calls, finish=finish)])  # type: ignore[arg-type]
    assert out.raw_reason == RAW_FINISH[provider][finish]


@pytest.mark.parametrize("provider", FAMILIES)
def test_reported_usage_totals_add_up(provider: str) -> None:
    """Where the family reports a total, it is input plus output, as the APIs send it."""
    body = render_turn(provider, text=TEXT, input_tokens=7, output_tokens=3)
    totals = []
    for payload in _payloads(body):
        for holder in (payload, payload.get("response") or {}, payload.get("interaction") or {}):
            usage = holder.get("usage") or holder.get("usageMetadata") or {}
            for key in ("total_tokens", "totalTokenCount"):
                if key in usage:
                    totals.append(usage[key])
    if provider != "anthropic":  # Anthropic reports no total
        assert totals
    assert all(total == 10 for total in totals)


def test_chat_refusal_opens_as_the_recorded_stream() -> None:
    """The first delta of a refusal is the recorded one: ``content`` null and an empty
    ``refusal`` (rec: refusal_deltas_finish_stop.sse)."""
    recorded = _payloads((FIXTURES / "openai_chat" / "refusal_deltas_finish_stop.sse").read_bytes())
    rendered = _payloads(render_turn("openai_chat", text="No.", finish="refusal"))
    first = rendered[0]["choices"][0]["delta"]
    assert first == recorded[0]["choices"][0]["delta"]
    assert first == {"role": "assistant", "content": None, "refusal": ""}


def test_responses_sequence_numbers_count_every_event_from_zero() -> None:
    body = render_turn("openai_responses", text=TEXT, calls=CALLS)
    numbers = [payload["sequence_number"] for payload in _payloads(body)]
    assert numbers == list(range(len(numbers)))


def test_responses_items_have_their_own_ids_and_text_parts_annotations() -> None:
    """Each function_call item has its own id (two calls never share one) and an
    ``output_text`` part carries ``annotations: []``, as the API sends them."""
    body = render_turn("openai_responses", text=TEXT, calls=CALLS)
    done = [p["item"] for p in _payloads(body) if p["type"] == "response.output_item.done"]
    ids = [item["id"] for item in done]
    assert len(set(ids)) == len(ids) == 3
    [message] = [item for item in done if item["type"] == "message"]
    assert message["content"] == [{"type": "output_text", "text": TEXT, "annotations": []}]


def test_responses_max_tokens_with_calls_leaves_the_text_message_completed() -> None:
    """Only the item being written when the tokens ran out is incomplete: with calls, the
    text message before them is completed (the cut call is the incomplete item)."""
    body = render_turn(
        "openai_responses", text=TEXT, calls=CALLS, finish="max_tokens", cut_mid_arguments=True
    )
    done = [p["item"] for p in _payloads(body) if p["type"] == "response.output_item.done"]
    assert [item["status"] for item in done] == ["completed", "completed", "incomplete"]
    text_only = render_turn("openai_responses", text=TEXT, finish="max_tokens")
    [message] = [p["item"] for p in _payloads(text_only) if p["type"].endswith("item.done")]
    assert message["status"] == "incomplete"


def test_anthropic_tool_input_opens_with_an_empty_delta_as_recorded() -> None:
    recorded = _payloads((FIXTURES / "anthropic" / "text_then_tool_use.sse").read_bytes())
    rendered = _payloads(render_turn("anthropic", text=TEXT, calls=CALLS[:1]))
    for payloads in (recorded, rendered):
        deltas = [p["delta"] for p in payloads if p["type"] == "content_block_delta"]
        json_deltas = [d for d in deltas if d["type"] == "input_json_delta"]
        assert json_deltas[0] == {"type": "input_json_delta", "partial_json": ""}


def test_anthropic_refusal_carries_stop_details() -> None:
    recorded = (FIXTURES / "anthropic" / "refusal_stop_details.synthetic.sse").read_bytes()
    rendered = render_turn("anthropic", text="No.", finish="refusal")
    shapes = []
    for body in (recorded, rendered):
        [delta] = [p["delta"] for p in _payloads(body) if p["type"] == "message_delta"]
        assert delta["stop_reason"] == "refusal"
        shapes.append(sorted(delta["stop_details"]))
    assert shapes[0] == shapes[1]


def test_gemini_finish_chunk_carries_an_empty_text_part_as_recorded() -> None:
    name = "function_call_thought_signature_then_empty_stop_chunk.sse"
    recorded = _payloads((FIXTURES / "gemini" / name).read_bytes())
    rendered = _payloads(render_turn("gemini", calls=CALLS))
    for payloads in (recorded, rendered):
        [cand] = payloads[-1]["candidates"]
        assert cand["finishReason"] == "STOP"
        assert cand["content"]["parts"] == [{"text": ""}]


def test_interactions_every_whole_step_is_stopped() -> None:
    """Each step, the text one too, ends with its ``step.stop`` (only a cut call's does
    not)."""
    whole = _payloads(render_turn("gemini_interactions", text=TEXT, calls=CALLS))
    starts = [p["index"] for p in whole if p["event_type"] == "step.start"]
    stops = [p["index"] for p in whole if p["event_type"] == "step.stop"]
    assert starts == stops == [0, 1, 2]
    cut = render_turn(
        "gemini_interactions", text=TEXT, calls=CALLS, finish="max_tokens", cut_mid_arguments=True
    )
    assert [p["index"] for p in _payloads(cut) if p["event_type"] == "step.stop"] == [0, 1]


@pytest.mark.parametrize("provider", FAMILIES)
def test_derived_ids_differ_with_the_calls_and_the_finish(provider: str) -> None:
    """A derived id is a digest of the turn: turns that differ only in their calls, or
    only in their finish, get different ids."""
    one = decode(provider, [render_turn(provider, calls=CALLS[:1])]).response_id
    other = decode(provider, [render_turn(provider, calls=CALLS[1:])]).response_id
    assert one and other and one != other
    stop = decode(provider, [render_turn(provider, text=TEXT)]).response_id
    cut = decode(provider, [render_turn(provider, text=TEXT, finish="max_tokens")]).response_id
    assert stop and cut and stop != cut
