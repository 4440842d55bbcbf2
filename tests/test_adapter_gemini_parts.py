"""The Gemini generateContent adapter, part by part: consecutive thoughts merge and a
signature closes the thought, Vertex streamed arguments are assembled into one object,
protocol violations raise, and what the adapter buffers is capped."""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.engine.core.errors import LimitExceeded, StreamProtocolError
from callgate.engine.core.events import (
    ArgumentsDelta,
    CallDone,
    CallStarted,
    ContinuationItem,
    ProviderDetail,
    TextDelta,
    UsageReport,
)
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import Usage
from callgate.engine.core.sse import SSEEvent

from .gemini_helpers import STOP, candidate, joined_arguments, of, run_chunks


def fc(**fields: Any) -> dict[str, Any]:
    return {"functionCall": fields}


def piece(path: str, **value: Any) -> dict[str, Any]:
    return {"jsonPath": path, **value}


def streamed_call(name: str, *pieces: dict[str, Any]) -> list[dict[str, Any]]:
    """A Vertex streamed call: open, one chunk per piece, empty terminator."""
    return [
        candidate(fc(name=name, willContinue=True)),
        *(candidate(fc(partialArgs=[p], willContinue=True)) for p in pieces),
        candidate(fc()),
    ]


# --- parts ---------------------------------------------------------------------------------


def test_consecutive_thoughts_merge_and_a_signature_closes_the_thought() -> None:
    events = run_chunks(
        candidate({"text": "a", "thought": True}),
        candidate({"text": "b", "thought": True, "thoughtSignature": "S1"}),
        candidate({"text": "c", "thought": True}),
        candidate({"text": "answer", "thoughtSignature": "S2"}),
        STOP,
    )
    assert of(events, ContinuationItem) == [
        ContinuationItem("thought", 0, {"text": "ab", "thought": True, "thoughtSignature": "S1"}),
        ContinuationItem("thought", 2, {"text": "c", "thought": True}),
        ContinuationItem("text_signature", 3, {"thoughtSignature": "S2"}),
    ]
    assert of(events, TextDelta) == [TextDelta("answer")]


def test_other_part_kinds_become_provider_details() -> None:
    code = {"language": "PYTHON", "code": "print(1)"}
    events = run_chunks(candidate({"executableCode": code}), STOP)
    assert ProviderDetail("gemini_part", {"executableCode": code}) in events


def test_usage_is_reported_only_when_it_changes() -> None:
    usage = {"promptTokenCount": 1, "candidatesTokenCount": 2}
    events = run_chunks(
        {**candidate({"text": "a"}), "usageMetadata": usage},
        {**candidate({"text": "b"}), "usageMetadata": usage},
        {
            **STOP,
            "usageMetadata": {**usage, "candidatesTokenCount": 3, "cachedContentTokenCount": 1},
        },
    )
    assert of(events, UsageReport) == [
        UsageReport(Usage(input_tokens=1, output_tokens=2)),
        UsageReport(Usage(input_tokens=1, output_tokens=3, cached_input_tokens=1)),
    ]


def test_vertex_nested_paths_and_scalar_values() -> None:
    events = run_chunks(
        *streamed_call(
            "f",
            piece("$.place.city", stringValue="Bos", willContinue=True),
            piece("$.place.city", stringValue="ton"),
            piece("$.tags[0]", stringValue="a"),
            piece("$.tags[1]", stringValue="b"),
            piece("$.days", numberValue=3),
            piece("$.ratio", numberValue=0.5),
            piece("$.metric", boolValue=False),
            piece("$.note", nullValue=None),
            piece("$.rows[0].id", numberValue=7),
        ),
        STOP,
    )
    [(index, text)] = joined_arguments(events).items()
    assert index == 0
    assert json.loads(text) == {
        "place": {"city": "Boston"},
        "tags": ["a", "b"],
        "days": 3,
        "ratio": 0.5,
        "metric": False,
        "note": None,
        "rows": [{"id": 7}],
    }
    assert [ev.index for ev in of(events, CallDone)] == [0]


def test_vertex_call_cut_before_its_terminator_stays_open() -> None:
    events = run_chunks(*streamed_call("f", piece("$.a", stringValue="x"))[:-1], STOP)
    assert of(events, CallStarted) == [CallStarted(0, "f")]
    assert not of(events, CallDone) and not of(events, ArgumentsDelta)


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param([SSEEvent(data=b"{nope")], id="bad-json"),
        pytest.param(
            [candidate(fc(partialArgs=[piece("$.a", stringValue="x")]))],
            id="piece-without-open-call",
        ),
        pytest.param([candidate(fc())], id="terminator-without-open-call"),
        pytest.param(
            [candidate(fc(name="f", willContinue=True)), candidate(fc(name="g", args={}))],
            id="new-call-while-streaming",
        ),
        pytest.param(
            [candidate(fc(name="f", willContinue=True, args={"a": 1}))], id="args-and-continue"
        ),
        pytest.param(
            [candidate(fc(name="f", partialArgs=[piece("$.a", stringValue="x")]))],
            id="pieces-without-continue",
        ),
        pytest.param(streamed_call("f", piece("$['a']", stringValue="x")), id="quoted-path"),
        pytest.param(streamed_call("f", piece("a", stringValue="x")), id="path-without-root"),
        pytest.param(streamed_call("f", piece("$", stringValue="x")), id="root-path"),
        pytest.param(streamed_call("f", piece("$.a[*]", stringValue="x")), id="wildcard"),
        pytest.param(streamed_call("f", piece("$.a[1]", stringValue="x")), id="skipped-index"),
        pytest.param(
            streamed_call("f", piece("$.a", stringValue="x"), piece("$.a.b", stringValue="y")),
            id="scalar-then-object",
        ),
        pytest.param(
            streamed_call("f", piece("$.a.b", stringValue="x"), piece("$.a", stringValue="y")),
            id="object-then-scalar",
        ),
        pytest.param(
            streamed_call("f", piece("$.a", stringValue="x"), piece("$.a", stringValue="y")),
            id="string-repeated-after-end",
        ),
        pytest.param(
            streamed_call("f", piece("$.a", numberValue=1), piece("$.a", numberValue=2)),
            id="number-repeated",
        ),
        pytest.param(streamed_call("f", piece("$.a")), id="piece-without-value"),
        pytest.param(
            streamed_call("f", piece("$.a[0]", stringValue="x"), piece("$.a.b", stringValue="y")),
            id="array-then-key",
        ),
    ],
)
def test_protocol_violations_raise(chunks: list[Any]) -> None:
    with pytest.raises(StreamProtocolError):
        run_chunks(*chunks)


# --- limits on what the adapter buffers ----------------------------------------------------


def test_streamed_arguments_over_the_call_cap_refuse_that_call_alone() -> None:
    # The per-call caps judge one call, as for args that come whole: the call is done
    # and refused, the next call and the turn keep going.
    limits = Limits(max_call_argument_bytes=12)
    ok = [piece("$.ab", stringValue="1234", willContinue=True), piece("$.ab", stringValue="1234")]
    at_cap = of(run_chunks(*streamed_call("f", *ok), limits=limits), CallDone)
    assert at_cap == [CallDone(0, raw=b'{"ab":"12341234"}')]  # 4 + 4 + 4 bytes: the cap
    over = run_chunks(
        *streamed_call("f", *ok, piece("$.c", stringValue="")),
        candidate(fc(name="g", args={"a": 1})),
        limits=limits,
    )
    assert of(over, CallDone) == [
        # (refused_bytes: the 12 held, and the path "$.c" of the piece that passed the cap)
        CallDone(0, error="arguments exceed max_call_argument_bytes (12)", refused_bytes=15),
        CallDone(1, raw=b'{"a": 1}'),  # (json.dumps spacing: the exact bytes)
    ]


def test_streamed_arguments_past_the_depth_cap_refuse_that_call_alone() -> None:
    events = run_chunks(
        *streamed_call("f", piece("$.a.b.c", numberValue=1)), limits=Limits(max_json_depth=2)
    )
    assert of(events, CallDone) == [
        CallDone(0, error="arguments nest deeper than 2 levels", refused_bytes=7)
    ]


def test_thought_text_is_capped() -> None:
    with pytest.raises(LimitExceeded) as info:
        run_chunks(
            candidate({"text": "12345", "thought": True}),
            candidate({"text": "6é", "thought": True}),
            limits=Limits(max_call_argument_bytes=7),
        )
    assert info.value.limit == "max_call_argument_bytes"


def test_continuation_items_are_capped() -> None:
    # Each signature closes its thought: one item per part, in the usual order.
    parts = [{"text": "t", "thought": True, "thoughtSignature": f"S{i}"} for i in range(3)]
    run_chunks(candidate(*parts[:2]), limits=Limits(max_continuation_items=2))
    with pytest.raises(LimitExceeded) as info:
        run_chunks(candidate(*parts), limits=Limits(max_continuation_items=2))
    assert info.value.limit == "max_continuation_items"


def test_the_part_order_is_a_detail_that_never_fails_a_stream_at_the_item_cap() -> None:
    # Two signed text parts: two text_signature items (the cap), and the order (two text
    # parts, which the default echo would merge): callgate's bookkeeping, a detail.
    parts = [{"text": "", "thoughtSignature": f"S{i}"} for i in range(2)]
    events = run_chunks(candidate(*parts), limits=Limits(max_continuation_items=2))
    assert len(of(events, ContinuationItem)) == 2
    assert of(events, ProviderDetail)[-1] == ProviderDetail(
        "gemini_part_order", {"parts": [["text", 0, 0, "S0"], ["text", 0, 0, "S1"]]}
    )
