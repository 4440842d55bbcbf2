"""Fixes in the OpenAI decode adapters (found by a review), each stream fed whole, one byte
at a time and at seeded random chunk boundaries, with identical outcomes:

- Chat: the first finish_reason decides. A tool-call fragment after it (a new call, or
  more of a closed one) fails the turn: a text answer never becomes a tool turn, and a
  repeated finish closes nothing. A fragment without an index whose id names a started
  call (indexed or not) continues that call.
- Responses: an argument event whose item_id and output_index name different calls, or
  an item_id no call was added with, fails the turn; so do an ``output_item.done`` that
  changes a call's call_id, name or id and two calls added with one item id.
- Responses: an output_text part whose text came in no delta takes it once from its done
  text (``output_text.done``, else the message's done item); a part whose text came in
  deltas keeps the deltas' text, its done text is not read (as for a refusal).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.engine import OutcomeKind, TurnOutcome, decode
from callgate.engine.core.adapter import load_adapter

from .conftest import chunkings

# --- stream builders ---------------------------------------------------------------------


def chat_body(*chunks: dict[str, Any] | bytes) -> bytes:
    out = b""
    for c in chunks:
        out += b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n"
    return out


def ch(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": "m",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }


def tc(**fragment: Any) -> dict[str, Any]:
    return {"tool_calls": [fragment]}


def resp_body(*events: dict[str, Any], named: bool = True) -> bytes:
    out = b""
    for ev in events:
        if named:
            out += b"event: " + ev["type"].encode() + b"\n"
        out += b"data: " + json.dumps(ev).encode() + b"\n\n"
    return out


CREATED = {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}
COMPLETED = {"type": "response.completed", "response": {"id": "resp_1", "status": "completed"}}


def fc(item_id: str, name: str, **extra: Any) -> dict[str, Any]:
    item = {"type": "function_call", "id": item_id, "call_id": "call_" + item_id, "name": name}
    return {**item, "arguments": "", "status": "in_progress", **extra}


def added(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": index, "item": item}


def item_done(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.done", "output_index": index, "item": item}


def args_delta(delta: str, **where: Any) -> dict[str, Any]:
    return {"type": "response.function_call_arguments.delta", **where, "delta": delta}


def args_done(arguments: str, **where: Any) -> dict[str, Any]:
    return {"type": "response.function_call_arguments.done", **where, "arguments": arguments}


def text_delta(index: int, part: int, delta: str) -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "item_id": f"msg_{index}",
        "output_index": index,
        "content_index": part,
        "delta": delta,
    }


def text_done(index: int, part: int, text: str) -> dict[str, Any]:
    return {
        "type": "response.output_text.done",
        "item_id": f"msg_{index}",
        "output_index": index,
        "content_index": part,
        "text": text,
    }


def message(index: int, *texts: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": t, "annotations": []} for t in texts]
    item = {"type": "message", "id": f"msg_{index}", "role": "assistant"}
    return {**item, "status": "completed", "content": content}


def message_added(index: int) -> dict[str, Any]:
    return added(index, {**message(index), "status": "in_progress"})


def decode_all_ways(provider: str, body: bytes) -> TurnOutcome:
    outcomes = [decode(provider, chunks) for _, chunks in chunkings(body)]
    first = outcomes[0]
    assert all(o == first for o in outcomes[1:])  # whole, byte by byte, random cuts
    return first


def assert_failed(out: TurnOutcome, reason: str) -> None:
    assert out.kind is OutcomeKind.FAILED
    assert out.stop_reason.startswith("protocol error: ") and reason in out.stop_reason


# --- Chat: the first finish decides --------------------------------------------------------


def test_chat_a_call_after_a_stop_finish_and_a_repeated_finish_fails_the_turn() -> None:
    body = chat_body(
        ch({"content": "All done."}),
        ch(finish="stop"),
        ch(
            tc(index=0, id="call_x", type="function", function={"name": "rm", "arguments": "{}"}),
            finish="stop",
        ),
        b"[DONE]",
    )
    out = decode_all_ways("openai_chat", body)
    assert_failed(out, "tool call fragment after finish_reason 'stop'")
    assert out.calls == ()


def test_chat_a_call_after_the_finish_fails_the_turn_without_a_repeated_finish() -> None:
    body = chat_body(
        ch({"content": "All done."}),
        ch(finish="stop"),
        ch(tc(index=0, id="call_x", type="function", function={"name": "rm", "arguments": "{}"})),
        b"[DONE]",
    )
    out = decode_all_ways("openai_chat", body)
    assert_failed(out, "tool call fragment after finish_reason 'stop'")
    assert out.calls == () and out.incomplete_calls == ()


@pytest.mark.parametrize("repeat", [None, "tool_calls"], ids=["no_repeat", "repeated_finish"])
def test_chat_more_arguments_for_a_closed_call_fail_the_turn(repeat: str | None) -> None:
    # The late fragment is a pure fragment chunk of a started call: the shape the batch
    # fast path takes, which must not take it after the finish either.
    body = chat_body(
        ch(tc(index=0, id="call_a", type="function", function={"name": "f", "arguments": ""})),
        ch(tc(index=0, function={"arguments": '{"a":1}'})),
        ch(finish="tool_calls"),
        ch(tc(index=0, function={"arguments": '{"b":2}'})),
        ch(finish=repeat),
        b"[DONE]",
    )
    out = decode_all_ways("openai_chat", body)
    assert_failed(out, "tool call fragment after finish_reason 'tool_calls'")


@pytest.mark.parametrize(
    "late",
    [
        {"index": 0, "function": {"arguments": ""}},
        {"index": 0, "id": "call_a", "type": "function", "function": {"name": "f"}},
        {"id": "call_a", "function": {"name": "f", "arguments": ""}},
    ],
    ids=["empty_arguments", "same_id_and_name", "by_id_only"],
)
def test_chat_a_fragment_after_the_finish_that_only_repeats_a_call_is_let_through(
    late: dict[str, Any],
) -> None:
    body = chat_body(
        ch(tc(index=0, id="call_a", type="function", function={"name": "f", "arguments": "{}"})),
        ch(finish="tool_calls"),
        ch(tc(**late)),
        b"[DONE]",
    )
    out = decode_all_ways("openai_chat", body)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    assert [(c.call_id, c.arguments) for c in out.calls] == [("call_a", {})]


def test_chat_a_fragment_without_an_index_continues_the_indexed_call_with_its_id() -> None:
    body = chat_body(
        ch(tc(index=0, id="call_a", type="function", function={"name": "f", "arguments": '{"x":'})),
        ch(tc(id="call_a", type="function", function={"name": "f", "arguments": "1}"})),
        ch(finish="tool_calls"),
        b"[DONE]",
    )
    out = decode_all_ways("openai_chat", body)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    ((index, call_id, arguments),) = [(c.index, c.call_id, c.arguments) for c in out.calls]
    assert (index, call_id, arguments) == (0, "call_a", {"x": 1})


def test_chat_a_fragment_without_an_index_continues_a_later_indexed_call() -> None:
    # Two indexed calls (3 and 7); index-less fragments name the second, then the first.
    body = chat_body(
        ch(tc(index=3, id="call_a", type="function", function={"name": "f", "arguments": '{"a":'})),
        ch(tc(index=7, id="call_b", type="function", function={"name": "g", "arguments": '{"b":'})),
        ch(tc(id="call_b", function={"arguments": "2}"})),
        ch(tc(id="call_a", function={"arguments": "1}"})),
        ch(finish="tool_calls"),
        b"[DONE]",
    )
    out = decode_all_ways("openai_chat", body)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    assert [(c.index, c.call_id, c.arguments) for c in out.calls] == [
        (3, "call_a", {"a": 1}),
        (7, "call_b", {"b": 2}),
    ]


def test_chat_a_fragment_without_an_index_naming_an_id_two_calls_share_fails() -> None:
    body = chat_body(
        ch(tc(index=0, id="dup", type="function", function={"name": "f", "arguments": "{}"})),
        ch(tc(index=1, id="dup", type="function", function={"name": "f", "arguments": "{}"})),
        ch(tc(id="dup", type="function", function={"name": "f", "arguments": ""})),
        ch(finish="tool_calls"),
        b"[DONE]",
    )
    out = decode_all_ways("openai_chat", body)
    assert_failed(out, "names id 'dup', which two calls started with")


# --- Responses: a call is what output_item.added says --------------------------------------


def _two_calls(*middle: dict[str, Any], named: bool = True) -> bytes:
    return resp_body(
        CREATED,
        added(0, fc("fc_read", "read_file")),
        added(1, fc("fc_del", "delete_file")),
        *middle,
        COMPLETED,
        named=named,
    )


PAIRING = "which output_item.added did not pair"


@pytest.mark.parametrize("named", [True, False], ids=["event_line", "no_event_line"])
def test_resp_an_argument_delta_naming_two_calls_fails_the_turn(named: bool) -> None:
    # item_id says read_file, output_index says delete_file (also through the handler
    # an event without its `event:` line takes).
    body = _two_calls(
        args_delta('{"path":"/"}', item_id="fc_read", output_index=1),
        args_done('{"path":"/"}', item_id="fc_read", output_index=0),
        args_done("", item_id="fc_del", output_index=1),
        named=named,
    )
    out = decode_all_ways("openai_responses", body)
    assert_failed(out, PAIRING)
    assert out.calls == ()


def test_resp_a_mismatch_after_matching_deltas_of_the_same_call_fails_the_turn() -> None:
    # Deltas for one call first (the fast path's common shape), then one whose item_id
    # names the other call.
    body = _two_calls(
        args_delta('{"pa', item_id="fc_del", output_index=1),
        args_delta('th":', item_id="fc_del", output_index=1),
        args_delta('"/"}', item_id="fc_read", output_index=1),
        args_done('{"path":"/"}', item_id="fc_del", output_index=1),
    )
    assert_failed(decode_all_ways("openai_responses", body), PAIRING)


def test_resp_arguments_done_naming_two_calls_fails_the_turn() -> None:
    body = _two_calls(
        args_delta('{"path":"/"}', item_id="fc_del", output_index=1),
        args_done('{"path":"/"}', item_id="fc_read", output_index=1),
    )
    out = decode_all_ways("openai_responses", body)
    assert_failed(out, PAIRING)


def test_resp_an_item_id_no_call_was_added_with_defers_to_the_output_index() -> None:
    # (A compatible server may name the item by an id output_item.added never gave.)
    body = _two_calls(
        args_delta("{}", item_id="fc_other", output_index=0),
        args_done("{}", output_index=0),
        args_done("", output_index=1),
    )
    out = decode_all_ways("openai_responses", body)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    assert [c.arguments for c in out.calls] == [{}, {}]


def test_resp_an_item_id_two_calls_share_names_neither() -> None:
    # A shared id (a compatible server's constant or "") attributes nothing: the
    # output_index decides; an event with only that id names no call.
    shared = resp_body(
        CREATED,
        added(0, fc("fc_a", "read_file")),
        added(1, {**fc("fc_a", "delete_file"), "call_id": "call_b"}),
        args_delta('{"p":1}', item_id="fc_a", output_index=1),
        args_done("", output_index=0),
        args_done('{"p":1}', item_id="fc_a", output_index=1),
        COMPLETED,
    )
    out = decode_all_ways("openai_responses", shared)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    assert [(c.name, c.arguments) for c in out.calls] == [
        ("read_file", {}),
        ("delete_file", {"p": 1}),
    ]
    only_id = resp_body(
        CREATED,
        added(0, fc("fc_a", "read_file")),
        added(1, {**fc("fc_a", "delete_file"), "call_id": "call_b"}),
        args_delta("{}", item_id="fc_a"),
        COMPLETED,
    )
    assert_failed(decode_all_ways("openai_responses", only_id), "names no known")


@pytest.mark.parametrize(
    ("key", "value"),
    [("call_id", "call_zzz"), ("name", "delete_file"), ("id", "fc_zzz")],
)
def test_resp_a_done_item_that_changes_the_calls_identity_fails_the_turn(
    key: str, value: str
) -> None:
    body = resp_body(
        CREATED,
        added(0, fc("fc_a", "read_file")),
        args_delta('{"p":1}', item_id="fc_a", output_index=0),
        args_done('{"p":1}', item_id="fc_a", output_index=0),
        item_done(
            0,
            {**fc("fc_a", "read_file"), key: value, "arguments": '{"p":1}', "status": "completed"},
        ),
        COMPLETED,
    )
    out = decode_all_ways("openai_responses", body)
    assert_failed(out, f"changed its {key} at output_item.done")
    assert out.continuation == ()  # the echo never carries an identity never proposed


DONE = {"status": "completed"}


def test_resp_a_call_id_that_comes_only_with_the_done_item_fails_the_turn() -> None:
    # Proposed without a call_id, the call is answered under a derived id: a call_id
    # first seen at output_item.done would put another id in the echo.
    anonymous = {key: v for key, v in fc("fc_a", "read_file").items() if key != "call_id"}
    body = resp_body(
        CREATED,
        added(0, anonymous),
        args_delta('{"p":1}', item_id="fc_a", output_index=0),
        item_done(0, {**anonymous, "call_id": "call_late", "arguments": '{"p":1}', **DONE}),
        COMPLETED,
    )
    out = decode_all_ways("openai_responses", body)
    assert_failed(out, "gave its call_id only at output_item.done")
    assert out.continuation == ()
    # Without a call_id at either, the derived id is the call's everywhere.
    body = resp_body(
        CREATED,
        added(0, anonymous),
        args_delta('{"p":1}', item_id="fc_a", output_index=0),
        item_done(0, {**anonymous, "arguments": '{"p":1}', **DONE}),
        COMPLETED,
    )
    out = decode_all_ways("openai_responses", body)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    (call,) = out.calls
    assert call.call_id_derived
    (item,) = load_adapter("openai_responses").assistant_echo(out)
    assert item["call_id"] == call.call_id


# --- Responses: text that came in no delta ---------------------------------------------------


def _text_turn(*middle: dict[str, Any]) -> bytes:
    return resp_body(CREATED, *middle, COMPLETED)


def test_resp_text_only_in_output_text_done_and_the_done_item_is_read_once() -> None:
    body = _text_turn(
        message_added(0),
        text_done(0, 0, "Paris."),
        item_done(0, message(0, "Paris.")),
    )
    out = decode_all_ways("openai_responses", body)
    assert (out.kind, out.text) == (OutcomeKind.FINAL_TEXT, "Paris.")


def test_resp_text_only_in_the_done_item_is_read() -> None:
    body = _text_turn(message_added(0), item_done(0, message(0, "Paris.")))
    out = decode_all_ways("openai_responses", body)
    assert (out.kind, out.text) == (OutcomeKind.FINAL_TEXT, "Paris.")


def test_resp_streamed_text_is_never_doubled() -> None:
    # Once any text came in deltas, done texts are not read: deltas and done events may
    # index the same part differently (a reviewer's stream doubled "Hello" that way).
    body = _text_turn(
        message_added(0),
        text_delta(0, 0, "The capital "),
        text_delta(0, 0, "is Paris."),
        text_done(0, 0, "The capital is Paris."),
        item_done(0, message(0, "The capital is Paris.")),
    )
    out = decode_all_ways("openai_responses", body)
    assert (out.kind, out.text) == (OutcomeKind.FINAL_TEXT, "The capital is Paris.")
    misindexed = _text_turn(
        message_added(1),
        text_delta(0, 0, "Hel"),
        text_delta(0, 0, "lo"),
        text_done(0, 0, "Hello"),
        item_done(1, message(1, "Hello")),
    )
    assert decode_all_ways("openai_responses", misindexed).text == "Hello"


def test_resp_parts_and_messages_without_deltas_each_count_once() -> None:
    body = _text_turn(
        message_added(0),
        text_done(0, 0, "The capital is "),
        text_done(0, 1, "Paris"),
        item_done(0, message(0, "The capital is ", "Paris")),
        message_added(1),
        item_done(1, message(1, ".")),
    )
    out = decode_all_ways("openai_responses", body)
    assert (out.kind, out.text) == (OutcomeKind.FINAL_TEXT, "The capital is Paris.")


def test_resp_a_done_text_that_differs_from_the_deltas_is_not_read() -> None:
    # As for a refusal: the deltas' text stands.
    body = _text_turn(
        message_added(0),
        text_delta(0, 0, "Hello"),
        text_done(0, 0, "Goodbye"),
        item_done(0, message(0, "Goodbye", " world")),
    )
    out = decode_all_ways("openai_responses", body)
    assert (out.kind, out.text) == (OutcomeKind.FINAL_TEXT, "Hello")


def test_resp_a_text_delta_after_a_done_text_fails_the_turn() -> None:
    body = _text_turn(
        message_added(0),
        text_done(0, 0, "Paris."),
        text_delta(0, 0, "Paris."),
        item_done(0, message(0, "Paris.")),
    )
    assert_failed(decode_all_ways("openai_responses", body), "text delta after a done text")


def test_resp_a_done_item_may_add_an_id_the_added_item_lacked() -> None:
    item = fc("fc_a", "read_file")
    del item["id"]
    body = resp_body(
        CREATED,
        added(0, item),
        args_delta("{}", output_index=0),
        args_done("{}", output_index=0),
        item_done(0, {**fc("fc_a", "read_file"), "arguments": "{}", "status": "completed"}),
        COMPLETED,
    )
    assert decode_all_ways("openai_responses", body).kind is OutcomeKind.TOOL_PROPOSALS


def test_resp_a_refusal_part_and_a_text_part_without_deltas_both_count() -> None:
    item = message(0, "Paris.")
    item["content"].insert(0, {"type": "refusal", "refusal": "Not that."})
    body = _text_turn(message_added(0), item_done(0, item))
    out = decode_all_ways("openai_responses", body)
    assert (out.refusal, out.text) == ("Not that.", "Paris.")
