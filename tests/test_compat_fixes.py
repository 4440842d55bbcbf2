"""Compatibility fixes in the OpenAI decode adapters, each stream fed whole, one byte at a
time and at seeded random chunk boundaries, with identical outcomes:

- Responses: a ``data: [DONE]`` payload (LiteLLM's proxy sends it after
  ``response.completed``, with or without ``event:`` lines; openai-python stops on it) is
  an end-of-stream marker and is ignored. It never completes a turn by itself: a stream
  with ``[DONE]`` but no terminal event stays truncated.
- Chat (Azure): an empty ``id`` or ``model`` is no value. Azure's first chunk carries
  ``"id":"","model":""`` (prompt filter results); the real ones come in a later chunk and
  are the turn's. An id or model that the first chunk leaves out is taken from a later
  chunk. The assembler never keeps an empty id or model, whatever the adapter.
- Chat: a repeated ``[DONE]`` (one-api, Ray Serve LLM send it twice) is ignored; any other
  data after ``[DONE]`` still fails the turn.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.engine import OutcomeKind, TurnOutcome, decode
from callgate.engine.core.decode import TurnAssembler
from callgate.engine.core.events import ResponseMeta
from callgate.engine.core.ids import derive_call_id

from .conftest import chunkings
from .test_openai_decode_fixes import resp_body

# --- feeding -------------------------------------------------------------------------------

WAYS = ("whole", "bytewise", "random")


@pytest.fixture(params=WAYS)
def way(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run(provider: str, body: bytes, way: str) -> TurnOutcome:
    """The outcome of ``body`` fed one way; the random way tries several seeds, which must
    all agree."""
    seeds = range(8) if way == "random" else range(1)
    outcomes = [decode(provider, dict(chunkings(body, seed))[way]) for seed in seeds]
    assert all(o == outcomes[0] for o in outcomes[1:])
    return outcomes[0]


def assert_failed(out: TurnOutcome, reason: str) -> None:
    assert out.kind is OutcomeKind.FAILED
    assert out.stop_reason.startswith("protocol error: ") and reason in out.stop_reason


# --- stream builders -----------------------------------------------------------------------


def lifecycle(kind: str, status: str, rid: str = "resp_1", model: str = "gpt-5") -> dict[str, Any]:
    return {"type": kind, "response": {"id": rid, "status": status, "model": model, "output": []}}


CALL_ITEM = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "get_order"}
ARGS = '{"order_id":"A1"}'
RESP_CALL = (
    lifecycle("response.created", "in_progress"),
    {
        "type": "response.output_item.added",
        "output_index": 0,
        "item": {**CALL_ITEM, "status": "in_progress", "arguments": ""},
    },
    {
        "type": "response.function_call_arguments.delta",
        "item_id": "fc_1",
        "output_index": 0,
        "delta": ARGS,
    },
    {
        "type": "response.function_call_arguments.done",
        "item_id": "fc_1",
        "output_index": 0,
        "arguments": ARGS,
    },
    {
        "type": "response.output_item.done",
        "output_index": 0,
        "item": {**CALL_ITEM, "status": "completed", "arguments": ARGS},
    },
)
COMPLETED = lifecycle("response.completed", "completed")
DONE = b"data: [DONE]\n\n"


def chat_body(*chunks: dict[str, Any] | bytes) -> bytes:
    out = b""
    for c in chunks:
        out += b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n"
    return out


def ch(
    delta: dict[str, Any] | None = None, finish: str | None = None, **meta: Any
) -> dict[str, Any]:
    """A chunk of choice 0; ``meta`` gives its id and model (both absent by default)."""
    return {**meta, "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}


def call_start(call_id: str | None = "call_1", arguments: str = "") -> dict[str, Any]:
    fragment: dict[str, Any] = {"index": 0, "type": "function"}
    if call_id is not None:
        fragment["id"] = call_id
    fragment["function"] = {"name": "get_order", "arguments": arguments}
    return {"tool_calls": [fragment]}


def call_args(arguments: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}


def calls_of(out: TurnOutcome) -> list[tuple[str, str, Any]]:
    return [(c.call_id, c.name, c.arguments) for c in out.calls]


# --- Responses: [DONE] is an end-of-stream marker ------------------------------------------


@pytest.mark.parametrize("named", [True, False], ids=["event_lines", "data_only"])
def test_responses_done_after_completed_is_ignored(named: bool, way: str) -> None:
    body = resp_body(*RESP_CALL, COMPLETED, named=named) + DONE
    out = run("openai_responses", body, way)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    assert out.raw_reason == "completed"
    assert out.stop_reason == "explicit completion with complete tool calls"
    assert out.response_id == "resp_1" and out.model == "gpt-5"
    assert calls_of(out) == [("call_1", "get_order", {"order_id": "A1"})]
    # The same outcome as without the marker.
    assert out == decode("openai_responses", [resp_body(*RESP_CALL, COMPLETED, named=named)])


@pytest.mark.parametrize(
    "marker",
    [b"data:[DONE]\n\n", b"data:  [DONE] \n\n", b"data: [DONE]\r\n\r\n", DONE + DONE],
    ids=["no_space", "padded", "crlf", "twice"],
)
def test_responses_done_spellings_after_completed_are_ignored(marker: bytes, way: str) -> None:
    body = resp_body(lifecycle("response.created", "in_progress"), COMPLETED) + marker
    out = run("openai_responses", body, way)
    assert out.kind is OutcomeKind.FINAL_TEXT and out.raw_reason == "completed"
    assert out.response_id == "resp_1" and out.model == "gpt-5"


@pytest.mark.parametrize("named", [True, False], ids=["event_lines", "data_only"])
def test_responses_done_without_a_terminal_event_stays_truncated(named: bool, way: str) -> None:
    out = run("openai_responses", resp_body(*RESP_CALL, named=named) + DONE, way)
    assert out.kind is OutcomeKind.TRUNCATED
    assert out.raw_reason is None
    assert out.stop_reason == "the stream ended before the provider's terminal signal"
    assert out.response_id == "resp_1" and out.model == "gpt-5"
    # The call got its done signals, but the turn never completed: no tool proposals.
    assert calls_of(out) == [("call_1", "get_order", {"order_id": "A1"})]


def test_responses_done_after_incomplete_keeps_the_incomplete_reason(way: str) -> None:
    incomplete = lifecycle("response.incomplete", "incomplete")
    incomplete["response"]["incomplete_details"] = {"reason": "max_output_tokens"}
    body = resp_body(lifecycle("response.created", "in_progress"), incomplete) + DONE
    out = run("openai_responses", body, way)
    assert out.kind is OutcomeKind.TRUNCATED and out.raw_reason == "max_output_tokens"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [(b"[1]", "undecodable event"), (b"DONE", "undecodable event"), (b"[DONE", "undecodable")],
    ids=["array", "bare_word", "unclosed"],
)
def test_responses_other_undecodable_data_still_fails(
    payload: bytes, reason: str, way: str
) -> None:
    body = resp_body(*RESP_CALL, COMPLETED) + b"data: " + payload + b"\n\n"
    assert_failed(run("openai_responses", body, way), reason)


def test_responses_an_empty_id_at_created_does_not_hide_the_real_one(way: str) -> None:
    body = resp_body(
        lifecycle("response.created", "in_progress", rid="", model=""),
        lifecycle("response.in_progress", "in_progress"),
        COMPLETED,
    )
    out = run("openai_responses", body, way)
    assert out.kind is OutcomeKind.FINAL_TEXT
    assert out.response_id == "resp_1" and out.model == "gpt-5"


# --- Chat (Azure): an empty id or model is no value ------------------------------------------

# An Azure OpenAI stream with the asynchronous content filter, verbatim: the file
# dotnet/src/Connectors/Connectors.UnitTests/TestData/
# chat_completion_streaming_async_filter_response.txt of microsoft/semantic-kernel
# (MIT License, Copyright (c) Microsoft Corporation). It ends at "data: [DONE]\n", without
# the blank line that dispatches the event.
AZURE_ASYNC_FILTER = (
    b'data: {"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_result'
    b's":[{"prompt_index":0,"content_filter_results":{"hate":{"filtered":false,"severity":'
    b'"safe"},"jailbreak":{"filtered":false,"detected":false},"self_harm":{"filtered":fals'
    b'e,"severity":"safe"},"sexual":{"filtered":false,"severity":"safe"},"violence":{"filt'
    b'ered":false,"severity":"safe"}}}]}\n'
    b"\n"
    b'data: {"choices":[{"delta":{"content":"","role":"assistant"},"finish_reason":null,"i'
    b'ndex":0,"logprobs":null}],"created":1724860848,"id":"chatcmpl-A1FOCU4vamBSxxqjaKcvAD'
    b'YMlwlaC","model":"gpt-4o-2024-05-13","object":"chat.completion.chunk","system_finger'
    b'print":"fp_abc28019ad"}\n'
    b"\n"
    b'data: {"choices":[{"delta":{"content":"Kindness"},"finish_reason":null,"index":0,"lo'
    b'gprobs":null}],"created":1724860848,"id":"chatcmpl-A1FOCU4vamBSxxqjaKcvADYMlwlaC","m'
    b'odel":"gpt-4o-2024-05-13","object":"chat.completion.chunk","system_fingerprint":"fp_'
    b'abc28019ad"}\n'
    b"\n"
    b'data: {"choices":[{"delta":{},"finish_reason":"stop","index":0,"logprobs":null}],"cr'
    b'eated":1724860848,"id":"chatcmpl-A1FOCU4vamBSxxqjaKcvADYMlwlaC","model":"gpt-4o-2024'
    b'-05-13","object":"chat.completion.chunk","system_fingerprint":"fp_abc28019ad"}\n'
    b"\n"
    b'data: {"choices":[{"content_filter_offsets":{"check_offset":1576,"start_offset":1576'
    b',"end_offset":2318},"content_filter_results":{"hate":{"filtered":false,"severity":"s'
    b'afe"},"self_harm":{"filtered":false,"severity":"safe"},"sexual":{"filtered":false,"s'
    b'everity":"safe"},"violence":{"filtered":false,"severity":"safe"}},"finish_reason":nu'
    b'll,"index":0}],"created":0,"id":"","model":"","object":""}\n'
    b"\n"
    b'data: {"choices":[{"content_filter_offsets":{"check_offset":1576,"start_offset":1576'
    b',"end_offset":2318},"content_filter_results":{"protected_material_code":{"filtered":'
    b'false,"detected":false},"protected_material_text":{"filtered":false,"detected":false'
    b'}},"finish_reason":null,"index":0}],"created":0,"id":"","model":"","object":""}\n'
    b"\n"
    b"data: [DONE]\n"
)
AZURE_ID = "chatcmpl-A1FOCU4vamBSxxqjaKcvADYMlwlaC"
AZURE_MODEL = "gpt-4o-2024-05-13"
AZURE_EMPTY = {
    "choices": [],
    "created": 0,
    "id": "",
    "model": "",
    "object": "",
    "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}],
}


def test_chat_azure_recording_takes_the_real_id_and_model(way: str) -> None:
    out = run("openai_chat", AZURE_ASYNC_FILTER + b"\n", way)
    assert out.kind is OutcomeKind.FINAL_TEXT
    assert out.raw_reason == "stop"
    assert out.text == "Kindness"
    assert out.response_id == AZURE_ID
    assert out.model == AZURE_MODEL


def test_chat_azure_recording_verbatim_is_cut_but_keeps_the_id_and_model(way: str) -> None:
    # Without the blank line after it, the [DONE] event is never dispatched.
    out = run("openai_chat", AZURE_ASYNC_FILTER, way)
    assert out.kind is OutcomeKind.TRUNCATED
    assert out.response_id == AZURE_ID and out.model == AZURE_MODEL


def test_chat_azure_derived_call_ids_differ_between_responses(way: str) -> None:
    # A call without an id gets one derived from the response id: an empty response id
    # would make the derived ids of every Azure response the same.
    def body(rid: str) -> bytes:
        meta = {"id": rid, "model": "gpt-4o"}
        return chat_body(
            AZURE_EMPTY,
            ch(call_start(None, '{"order_id":'), **meta),
            ch(call_args('"A1"}'), **meta),
            ch(finish="tool_calls", **meta),
            {**AZURE_EMPTY, "prompt_filter_results": None},
            b"[DONE]",
        )

    first = run("openai_chat", body("chatcmpl-a"), way)
    second = run("openai_chat", body("chatcmpl-b"), way)
    for out, rid in ((first, "chatcmpl-a"), (second, "chatcmpl-b")):
        assert out.kind is OutcomeKind.TOOL_PROPOSALS
        assert out.response_id == rid and out.model == "gpt-4o"
        assert calls_of(out) == [(derive_call_id(rid, 0), "get_order", {"order_id": "A1"})]
        assert out.calls[0].call_id_derived
    assert first.calls[0].call_id != second.calls[0].call_id


@pytest.mark.parametrize(
    ("first", "later"),
    [
        ({"id": "chatcmpl-1"}, {"model": "m-1"}),
        ({"id": "chatcmpl-1", "model": ""}, {"id": "chatcmpl-1", "model": "m-1"}),
        ({"model": "m-1"}, {"id": "chatcmpl-1"}),
        ({"id": "", "model": "m-1"}, {"id": "chatcmpl-1", "model": "m-1"}),
    ],
    ids=["model_later", "empty_model_then_model", "id_later", "empty_id_then_id"],
)
@pytest.mark.parametrize("on", ["fragment", "text"])
def test_chat_an_id_or_model_the_first_chunk_lacks_is_taken_later(
    first: dict[str, Any], later: dict[str, Any], on: str, way: str
) -> None:
    # ``fragment``: the later value comes on a chunk that only continues a call (the
    # shape the batch fast path takes); ``text``: on a text chunk. A value reported
    # once is not replaced by a later chunk's.
    if on == "fragment":
        middle = [ch(call_start(arguments='{"order_id":'), **first)]
        middle += [ch(call_args('"A1"}'), **later), ch(call_args(""), id="other", model="x")]
        finish = "tool_calls"
    else:
        middle = [ch({"content": "Hel"}, **first), ch({"content": "lo"}, **later)]
        middle += [ch({"content": "!"}, id="other", model="x")]
        finish = "stop"
    out = run("openai_chat", chat_body(*middle, ch(finish=finish), b"[DONE]"), way)
    assert out.response_id == "chatcmpl-1" and out.model == "m-1"
    if on == "fragment":
        assert out.kind is OutcomeKind.TOOL_PROPOSALS
        assert calls_of(out) == [("call_1", "get_order", {"order_id": "A1"})]
    else:
        assert out.kind is OutcomeKind.FINAL_TEXT and out.text == "Hello!"


@pytest.mark.parametrize(
    "meta",
    [{}, {"id": "", "model": ""}, {"id": "chatcmpl-1"}, {"model": "m-1"}],
    ids=["none", "empty", "id_only", "model_only"],
)
def test_chat_an_id_or_model_never_given_stays_none(meta: dict[str, Any], way: str) -> None:
    body = chat_body(
        ch(call_start(arguments='{"order_id":'), **meta),
        *[ch(call_args(piece), **meta) for piece in ('"A', "1", '"}')],
        ch(finish="tool_calls", **meta),
        b"[DONE]",
    )
    out = run("openai_chat", body, way)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    assert out.response_id == (meta.get("id") or None)
    assert out.model == (meta.get("model") or None)
    assert calls_of(out) == [("call_1", "get_order", {"order_id": "A1"})]


def test_the_assembler_never_keeps_an_empty_id_or_model() -> None:
    turn = TurnAssembler()
    turn.apply(ResponseMeta("", ""))
    turn.apply(ResponseMeta(None, None))
    turn.apply(ResponseMeta("resp_1", ""))
    turn.apply(ResponseMeta("", "m-1"))
    turn.apply(ResponseMeta("resp_2", "m-2"))  # the first non-empty value counts
    out = turn.outcome()
    assert out.response_id == "resp_1" and out.model == "m-1"
    empty = TurnAssembler()
    empty.apply(ResponseMeta("", ""))
    assert empty.outcome().response_id is None and empty.outcome().model is None


# --- Chat: a repeated [DONE] is ignored ------------------------------------------------------

CHAT_CALL = (
    ch(call_start(arguments=ARGS), id="chatcmpl-1", model="m"),
    ch(finish="tool_calls", id="chatcmpl-1", model="m"),
)


@pytest.mark.parametrize(
    "tail",
    [DONE, DONE + DONE, b"data:[DONE]\n\n", b"data:  [DONE] \n\n", b"data: [DONE]\r\n\r\n"],
    ids=["twice", "three_times", "no_space", "padded", "crlf"],
)
def test_chat_a_repeated_done_is_ignored(tail: bytes, way: str) -> None:
    body = chat_body(*CHAT_CALL, b"[DONE]") + tail
    out = run("openai_chat", body, way)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS and out.raw_reason == "tool_calls"
    assert out.response_id == "chatcmpl-1" and out.model == "m"
    assert calls_of(out) == [("call_1", "get_order", {"order_id": "A1"})]
    assert out == decode("openai_chat", [chat_body(*CHAT_CALL, b"[DONE]")])


def test_chat_a_repeated_done_after_a_text_answer_and_usage_is_ignored(way: str) -> None:
    usage = {
        "id": "chatcmpl-1",
        "choices": [],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
    body = chat_body(
        ch({"content": "Hi"}, id="chatcmpl-1", model="m"), ch(finish="stop"), usage, b"[DONE]"
    )
    out = run("openai_chat", body + DONE, way)
    assert out.kind is OutcomeKind.FINAL_TEXT and out.text == "Hi"
    assert out.usage.input_tokens == 3 and out.usage.output_tokens == 1


def test_chat_a_repeated_done_without_a_finish_stays_truncated(way: str) -> None:
    body = chat_body(CHAT_CALL[0], b"[DONE]", b"[DONE]")
    out = run("openai_chat", body, way)
    assert out.kind is OutcomeKind.TRUNCATED and out.raw_reason is None
    assert out.calls == () and [c.name for c in out.incomplete_calls] == ["get_order"]


@pytest.mark.parametrize(
    "late",
    [
        json.dumps(CHAT_CALL[1]).encode(),
        json.dumps(ch({"content": "more"})).encode(),
        b"[DONE]x",
        b"{}",
    ],
    ids=["finish_chunk", "text_chunk", "done_with_suffix", "empty_object"],
)
@pytest.mark.parametrize("dones", [1, 2], ids=["after_done", "after_two_dones"])
def test_chat_other_data_after_done_still_fails(late: bytes, dones: int, way: str) -> None:
    body = chat_body(*CHAT_CALL, *[b"[DONE]"] * dones, late)
    assert_failed(run("openai_chat", body, way), "data after the [DONE] sentinel")
