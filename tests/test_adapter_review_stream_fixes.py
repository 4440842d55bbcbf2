"""Fixes from a review of the decode adapters, each stream fed whole, one byte at a time
and at seeded random chunk boundaries, with identical outcomes:

- Responses: the terminal event's ``response.output[]`` is read against the stream: a
  function_call it lists that never streamed fails the turn; one whose arguments differ
  is rejected as disagreeing done events are; a changed call_id, name or id fails.
- Responses: a refusal part announced only by ``content_part.added``/``.done`` is a
  refusal.
- Responses: every event is decoded (also those the adapter does not act on), and an
  event's ``type`` must be its ``event:`` name (argument deltas, nearly every event, are
  not checked: their done events repeat the whole text).
- Responses: the done text of a part that got no delta is read even when another part
  had deltas (per part).
- Interactions: the first status that ends the interaction short of success stands.
- Anthropic: a non-tool block left open at message_stop fails a turn that goes on.
- Gemini: a functionCall part after the chunk with finishReason fails the turn.
- Interactions: calls in an interaction without an id, or a call without an id, fail
  the turn at decode (nothing runs).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from callgate.engine import OutcomeKind, TurnOutcome, decode
from callgate.engine.core.events import CallDone
from callgate.engine.core.registry import Registry, RiskClass, ToolContext, ToolSpec
from callgate.engine.core.states import OpState
from callgate.engine.runtime.replay import ReplayServer

from .conftest import chunkings
from .loop_helpers import make_runner, turn
from .openai_responses_helpers import added, item_done, of, send

# --- feeding -------------------------------------------------------------------------------


def decode_all_ways(provider: str, body: bytes) -> TurnOutcome:
    outcomes = [decode(provider, chunks) for _, chunks in chunkings(body)]
    first = outcomes[0]
    assert all(o == first for o in outcomes[1:])  # whole, byte by byte, random cuts
    return first


def assert_failed(out: TurnOutcome, reason: str) -> None:
    assert out.kind is OutcomeKind.FAILED, out.stop_reason
    assert out.stop_reason.startswith("protocol error: ") and reason in out.stop_reason


def named(*events: dict[str, Any], key: str = "type") -> bytes:
    """Events framed as ``event: <name>`` + ``data: <json>``, the name being ``key``."""
    out = b""
    for ev in events:
        out += f"event: {ev[key]}\ndata: {json.dumps(ev)}\n\n".encode()
    return out


# --- Responses: stream builders ------------------------------------------------------------

CREATED = {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}
CALL = {
    "id": "fc_1",
    "type": "function_call",
    "call_id": "call_1",
    "name": "submit_refund",
    "arguments": "",
    "status": "in_progress",
}
ARGS = '{"amount":100}'
DONE_CALL = CALL | {"arguments": ARGS, "status": "completed"}


def completed(*output: dict[str, Any], kind: str = "response.completed") -> dict[str, Any]:
    status = "completed" if kind == "response.completed" else "incomplete"
    response: dict[str, Any] = {"id": "resp_1", "status": status, "output": list(output)}
    if status == "incomplete":
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    return {"type": kind, "response": response}


def streamed_call(index: int = 0, item: dict[str, Any] = CALL, args: str = ARGS) -> list[Any]:
    where = {"output_index": index, "item_id": item["id"]}
    return [
        added(index, item),
        {"type": "response.function_call_arguments.delta", **where, "delta": args},
        {"type": "response.function_call_arguments.done", **where, "arguments": args},
        item_done(index, item | {"arguments": args, "status": "completed"}),
    ]


def message(*parts: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": status}
    return item | {"content": list(parts)}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def part_event(kind: str, part: int, body: dict[str, Any]) -> dict[str, Any]:
    where = {"output_index": 0, "item_id": "msg_1", "content_index": part}
    return {"type": f"response.{kind}", **where, **body}


# --- 1. Responses: the terminal output against the stream ----------------------------------


@pytest.mark.parametrize("terminal", ["response.completed", "response.incomplete"])
def test_responses_terminal_function_call_that_never_streamed_fails_the_turn(
    terminal: str,
) -> None:
    msg = message(text_part("Sending the refund now."))
    body = named(
        CREATED,
        added(0, message(status="in_progress")),
        part_event("output_text.delta", 0, {"delta": "Sending the refund now."}),
        item_done(0, msg),
        completed(msg, DONE_CALL, kind=terminal),
    )
    assert_failed(decode_all_ways("openai_responses", body), "that never streamed")


def test_responses_terminal_output_naming_one_streamed_call_twice_fails_the_turn() -> None:
    body = named(CREATED, *streamed_call(), completed(DONE_CALL, DONE_CALL))
    assert_failed(decode_all_ways("openai_responses", body), "that never streamed")


def test_responses_terminal_arguments_that_differ_reject_the_call() -> None:
    body = named(CREATED, *streamed_call(), completed(DONE_CALL | {"arguments": '{"amount":999}'}))
    out = decode_all_ways("openai_responses", body)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    (call,) = out.calls
    # Exactly what an output_item.done disagreeing with arguments.done gives.
    assert call.arguments is None
    assert call.error == "done events disagree about the arguments"
    spoiled = named(
        CREATED,
        *streamed_call()[:3],
        item_done(0, DONE_CALL | {"arguments": '{"amount":999}'}),
        completed(),
    )
    assert decode_all_ways("openai_responses", spoiled).calls == out.calls


def test_responses_terminal_arguments_that_differ_without_a_status_reject_the_call() -> None:
    # A terminal function_call item that gives no status (compatible servers leave it
    # out) is read as completed: its arguments are still held to the streamed ones.
    no_status = {k: v for k, v in DONE_CALL.items() if k != "status"}
    body = named(CREATED, *streamed_call(), completed(no_status | {"arguments": '{"amount":999}'}))
    out = decode_all_ways("openai_responses", body)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    (call,) = out.calls
    assert call.arguments is None
    assert call.error == "done events disagree about the arguments"


def test_responses_terminal_output_is_not_the_done_signal_of_a_call_that_got_none() -> None:
    # A call whose arguments.done and output_item.done never came stays incomplete even
    # when the terminal output lists it completed with its arguments: that list is read
    # against the done events, never taken for one (the call must not become runnable).
    body = named(CREATED, *streamed_call()[:2], completed(DONE_CALL))
    out = decode_all_ways("openai_responses", body)
    assert out.calls == ()
    [incomplete] = out.incomplete_calls
    assert incomplete.call_id == "call_1"
    assert out.kind is OutcomeKind.TRUNCATED


def test_responses_terminal_call_with_another_name_fails_the_turn() -> None:
    body = named(CREATED, *streamed_call(), completed(DONE_CALL | {"name": "delete_account"}))
    out = decode_all_ways("openai_responses", body)
    assert_failed(out, "changed its name at the terminal event")


@pytest.mark.parametrize(
    "fresh",
    [
        {"call_id": "call_2"},
        {"id": "fc_2"},
        {"id": "fc_91aa", "call_id": "call_44bc"},  # vLLM rebuilds the output, fresh ids
    ],
)
def test_responses_terminal_ids_a_server_renders_afresh_do_not_fail_the_turn(
    fresh: dict[str, str],
) -> None:
    # Nothing of the terminal output is echoed or answered: the streamed call stands.
    body = named(CREATED, *streamed_call(), completed(DONE_CALL | fresh))
    out = decode_all_ways("openai_responses", body)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    plain = decode_all_ways("openai_responses", named(CREATED, *streamed_call(), completed()))
    assert out.calls == plain.calls


def test_responses_terminal_call_id_for_a_call_streamed_without_one_is_not_taken() -> None:
    bare = {k: v for k, v in CALL.items() if k != "call_id"}
    body = named(CREATED, *streamed_call(item=bare), completed(DONE_CALL))
    out = decode_all_ways("openai_responses", body)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    (call,) = out.calls
    assert call.call_id_derived  # the derived id stands: the terminal one is not echoed


def test_responses_terminal_output_that_repeats_the_stream_is_accepted() -> None:
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
    zurich = '{"city":"Zürich"}'
    cases = [
        ([], ARGS),  # compatible servers send no output: nothing to hold the stream to
        ([DONE_CALL], ARGS),  # named by its item id, not its position
        # The same text spelled otherwise (raw UTF-8 here, an escape in the stream).
        ([reasoning, DONE_CALL | {"arguments": zurich}], zurich),
    ]
    for output, args in cases:
        terminal = json.dumps(completed(*output), ensure_ascii=False)
        body = named(CREATED, *streamed_call(1, args=args))
        body += f"event: response.completed\ndata: {terminal}\n\n".encode()
        out = decode_all_ways("openai_responses", body)
        assert out.kind is OutcomeKind.TOOL_PROPOSALS, out.stop_reason
        (call,) = out.calls
        assert (call.arguments, call.error) == (json.loads(args), None)


def test_responses_terminal_output_byte_identical_to_the_stream_adds_no_done_event() -> None:
    # The API repeats the arguments' exact bytes: nothing new for the assembler to compare.
    events = send(*streamed_call(), completed(DONE_CALL))
    assert len(of(events, CallDone)) == 2  # arguments.done and output_item.done only
    changed = send(*streamed_call(), completed(DONE_CALL | {"arguments": '{"amount": 100}'}))
    assert len(of(changed, CallDone)) == 3


def test_responses_terminal_function_call_with_an_escaped_type_is_still_read() -> None:
    # The type is read as JSON, not matched as bytes: an escape spells the same type.
    msg = message(text_part("Done."))
    body = named(
        CREATED,
        added(0, message(status="in_progress")),
        part_event("output_text.delta", 0, {"delta": "Done."}),
        item_done(0, msg),
    )
    terminal = json.dumps(completed(msg, DONE_CALL)).replace(
        '"type": "function_call"', '"type": "function\\u005fcall"'
    )
    assert "\\u005f" in terminal
    body += f"event: response.completed\ndata: {terminal}\n\n".encode()
    assert_failed(decode_all_ways("openai_responses", body), "that never streamed")


@pytest.mark.parametrize("size", [1000, 1030, 4000])  # the 1,024-byte fingerprint bound
def test_responses_terminal_literals_near_the_fingerprint_bound(size: int) -> None:
    # Short literals are compared as they are, long ones by digest: either way an equal
    # one adds no done event and one that differs in a single byte is caught.
    args = json.dumps({"note": "x" * (size - 12)})
    same = send(*streamed_call(args=args), completed(DONE_CALL | {"arguments": args}))
    assert len(of(same, CallDone)) == 2
    changed = args.replace("x", "y", 1)
    assert len(changed) == len(args)
    other = send(*streamed_call(args=args), completed(DONE_CALL | {"arguments": changed}))
    assert len(of(other, CallDone)) == 3
    body = named(CREATED, *streamed_call(args=args), completed(DONE_CALL | {"arguments": changed}))
    (call,) = decode_all_ways("openai_responses", body).calls
    assert call.error == "done events disagree about the arguments"


# --- 2. Responses: a refusal part seen only as a content part ------------------------------


def test_responses_refusal_part_announced_only_by_content_part_events_is_a_refusal() -> None:
    refusal = {"type": "refusal", "refusal": "I can't help with that."}
    body = named(
        CREATED,
        added(0, message(status="in_progress")),
        part_event("content_part.added", 0, {"part": {"type": "refusal", "refusal": ""}}),
        part_event("content_part.done", 0, {"part": refusal}),
        completed(message(refusal)),
    )
    out = decode_all_ways("openai_responses", body)
    assert (out.kind, out.refusal, out.text) == (
        OutcomeKind.REFUSAL,
        "I can't help with that.",
        "",
    )
    # Announced and never given any text: still a refusal, never a final text.
    body = named(
        CREATED,
        added(0, message(status="in_progress")),
        part_event("content_part.added", 0, {"part": {"type": "refusal", "refusal": ""}}),
        completed(),
    )
    out = decode_all_ways("openai_responses", body)
    assert (out.kind, out.refusal) == (OutcomeKind.REFUSAL, "")


# --- 3. Responses: every event decodes, and is of the type its name says --------------------


def _resp_call_turn(extra: bytes) -> bytes:
    return (
        named(CREATED)
        + extra
        + named(*streamed_call(), {"type": "response.completed", "response": {"id": "resp_1"}})
    )


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("response.in_progress", b'{"type": "response.in_progress", "response": {"id": 1]}'),
        ("response.content_part.added", b'{"type":"response.content_part.added",,,}'),
        ("response.content_part.done", b'{"type":"response.content_part.done","part":{'),
        ("response.reasoning_summary_text.delta", b'{"type": "response.reasoning_summ'),
        ("response.something_new", b"not json"),
    ],
)
def test_responses_undecodable_event_the_adapter_does_not_act_on_fails_the_turn(
    name: str, data: bytes
) -> None:
    body = _resp_call_turn(f"event: {name}\ndata: ".encode() + data + b"\n\n")
    assert_failed(decode_all_ways("openai_responses", body), f"undecodable {name} event")


@pytest.mark.parametrize(
    ("name", "payload"),
    [
        ("response.in_progress", {"type": "response.output_text.delta", "delta": "x"}),
        ("response.output_text.delta", {"type": "response.refusal.delta", "delta": "No."}),
        ("response.something_new", {"type": "response.completed"}),
        (
            "response.function_call_arguments.done",
            {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "{}"},
        ),
    ],
)
def test_responses_event_whose_type_is_not_its_name_fails_the_turn(
    name: str, payload: dict[str, Any]
) -> None:
    body = (
        named(CREATED, added(0, CALL)) + f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()
    )
    body += named(completed())
    assert_failed(decode_all_ways("openai_responses", body), f"{name} event of ")


# --- 6. Responses: done texts fill in per part ---------------------------------------------


def _two_part_turn(*middle: dict[str, Any]) -> bytes:
    msg = message(text_part("Refund approved. "), text_part("Amount: $100."))
    return named(
        CREATED,
        added(0, message(status="in_progress")),
        part_event("content_part.added", 0, {"part": text_part("")}),
        part_event("output_text.delta", 0, {"delta": "Refund approved. "}),
        part_event("output_text.done", 0, {"text": "Refund approved. "}),
        *middle,
        item_done(0, msg),
        completed(msg),
    )


def test_responses_done_text_of_a_part_without_deltas_is_read_beside_a_streamed_part() -> None:
    for middle in (
        # Part 1 in output_text.done (and the done item) only ...
        [
            part_event("content_part.added", 1, {"part": text_part("")}),
            part_event("output_text.done", 1, {"text": "Amount: $100."}),
        ],
        # ... in content_part.done only, or in the message's done item alone.
        [part_event("content_part.done", 1, {"part": text_part("Amount: $100.")})],
        [],
    ):
        out = decode_all_ways("openai_responses", _two_part_turn(*middle))
        assert (out.kind, out.text) == (OutcomeKind.FINAL_TEXT, "Refund approved. Amount: $100.")


def test_responses_a_delta_for_a_part_whose_done_text_was_read_fails_the_turn() -> None:
    body = _two_part_turn(
        part_event("output_text.done", 1, {"text": "Amount: $100."}),
        part_event("output_text.delta", 1, {"delta": "Amount: $100."}),
    )
    assert_failed(decode_all_ways("openai_responses", body), "text delta after a done text")


# --- 4. Interactions: the first ending status stands ---------------------------------------


def _interaction(*events: dict[str, Any], iid: str | None = "v1_x") -> bytes:
    created: dict[str, Any] = {"status": "in_progress"} | ({} if iid is None else {"id": iid})
    return named(
        {"event_type": "interaction.created", "interaction": created},
        *events,
        key="event_type",
    )


def _call_steps(index: int = 0, **step: Any) -> list[dict[str, Any]]:
    start = {"type": "function_call", "id": "c1", "name": "submit_refund", "arguments": {}}
    return [
        {"event_type": "step.start", "index": index, "step": start | step},
        {
            "event_type": "step.delta",
            "index": index,
            "delta": {"type": "arguments_delta", "arguments": ARGS},
        },
        {"event_type": "step.stop", "index": index},
    ]


def _status(status: str) -> dict[str, Any]:
    return {"event_type": "interaction.status_update", "interaction_id": "v1_x", "status": status}


def _done(status: str, iid: str | None = "v1_x") -> dict[str, Any]:
    interaction = {"status": status} | ({} if iid is None else {"id": iid})
    return {"event_type": "interaction.completed", "interaction": interaction}


@pytest.mark.parametrize(
    ("reported", "final", "kind"),
    [
        ("failed", "requires_action", OutcomeKind.FAILED),
        ("cancelled", "completed", OutcomeKind.FAILED),
        ("failed", "in_progress", OutcomeKind.FAILED),
        ("incomplete", "requires_action", OutcomeKind.TRUNCATED),
    ],
)
def test_interactions_a_reported_ending_status_is_not_undone_by_a_later_one(
    reported: str, final: str, kind: OutcomeKind
) -> None:
    body = _interaction(*_call_steps(), _status(reported), _status("in_progress"), _done(final))
    out = decode_all_ways("gemini_interactions", body)
    assert (out.kind, out.raw_reason) == (kind, reported)


def test_interactions_requires_action_then_completed_is_still_a_tool_turn() -> None:
    body = _interaction(*_call_steps(), _status("requires_action"), _done("completed"))
    out = decode_all_ways("gemini_interactions", body)
    assert out.kind is OutcomeKind.TOOL_PROPOSALS


# --- 8. Interactions: a call must be answerable --------------------------------------------


@pytest.mark.parametrize("iid", ["", None])
def test_interactions_calls_in_an_interaction_without_an_id_fail_the_turn(
    iid: str | None,
) -> None:
    body = _interaction(*_call_steps(), _done("requires_action", iid), iid=iid)
    out = decode_all_ways("gemini_interactions", body)
    assert_failed(out, "function calls in an interaction without an id")


def test_interactions_an_id_only_in_interaction_completed_still_continues() -> None:
    body = _interaction(*_call_steps(), _done("requires_action"), iid="")
    out = decode_all_ways("gemini_interactions", body)
    assert (out.kind, out.response_id) == (OutcomeKind.TOOL_PROPOSALS, "v1_x")


def test_interactions_a_text_turn_without_an_interaction_id_still_completes() -> None:
    text = [
        {"event_type": "step.start", "index": 0, "step": {"type": "model_output"}},
        {"event_type": "step.delta", "index": 0, "delta": {"type": "text", "text": "Hi."}},
        {"event_type": "step.stop", "index": 0},
    ]
    out = decode_all_ways(
        "gemini_interactions", _interaction(*text, _done("completed", ""), iid="")
    )
    assert (out.kind, out.text, out.response_id) == (OutcomeKind.FINAL_TEXT, "Hi.", None)


@pytest.mark.parametrize("call_id", ["", None])
def test_interactions_a_function_call_step_without_an_id_fails_the_turn(
    call_id: str | None,
) -> None:
    steps = _call_steps()
    if call_id is None:
        del steps[0]["step"]["id"]
    else:
        steps[0]["step"]["id"] = call_id
    out = decode_all_ways("gemini_interactions", _interaction(*steps, _done("requires_action")))
    assert_failed(out, "function_call 0 has no id")


def test_interactions_a_legacy_function_call_without_an_id_fails_the_turn() -> None:
    call = {"type": "function_call", "name": "submit_refund", "arguments": {"amount": 100}}
    body = named(
        {"event_type": "interaction.start", "interaction": {"id": "v1_x", "status": "in_progress"}},
        {"event_type": "content.start", "index": 0, "content": {"type": "function_call"}},
        {"event_type": "content.delta", "index": 0, "delta": call},
        {"event_type": "content.stop", "index": 0},
        {
            "event_type": "interaction.complete",
            "interaction": {"id": "v1_x", "status": "requires_action"},
        },
        key="event_type",
    )
    assert_failed(decode_all_ways("gemini_interactions", body), "function_call 0 has no id")


class Refund(msgspec.Struct, forbid_unknown_fields=True):
    cents: int


@pytest.mark.anyio
@pytest.mark.parametrize(("call_id", "response_id"), [("c1", ""), ("", "v1_x")])
async def test_interactions_an_unanswerable_call_never_runs(call_id: str, response_id: str) -> None:
    ran: list[int] = []

    async def refund(args: Refund, ctx: ToolContext) -> dict[str, int]:
        ran.append(args.cents)
        return {"refunded": args.cents}

    registry = Registry(
        [
            ToolSpec(
                name="refund",
                description="Refund an order.",
                args_type=Refund,
                handler=refund,
                risk=RiskClass.WRITE,
            )
        ]
    )
    provider = "gemini_interactions"
    turns = [
        turn(provider, calls=[(call_id, "refund", '{"cents":500}')], response_id=response_id),
        turn(provider, text="done"),
    ]
    async with ReplayServer(turns) as server:
        runner, _ = make_runner(provider, server.base_url, registry)
        result = await runner.start("refund order 1")
        requests = list(server.requests)
    assert result.state is OpState.FAILED
    assert ran == [] and len(requests) == 1


# --- 5. Anthropic: a block left open ---------------------------------------------------------


_BLOCKS = {
    "thinking": (
        {"type": "thinking", "thinking": "", "signature": ""},
        [
            {"type": "thinking_delta", "thinking": "I should refund."},
            {"type": "signature_delta", "signature": "EoSIG"},
        ],
    ),
    "text": ({"type": "text", "text": ""}, [{"type": "text_delta", "text": "Refunding."}]),
    "redacted_thinking": ({"type": "redacted_thinking", "data": "EmwKAhgB"}, []),
}


def _anthropic(block: str, stop_reason: str, *, stop_it: bool = False) -> bytes:
    """A turn with one ``block`` at index 0 (stopped when ``stop_it``), then a client
    tool call unless the turn pauses (a paused turn carries no client call)."""
    start, deltas = _BLOCKS[block]
    message = {"id": "msg_1", "model": "c", "role": "assistant", "content": []}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": message | {"usage": {"input_tokens": 5}}},
        {"type": "content_block_start", "index": 0, "content_block": start},
        *({"type": "content_block_delta", "index": 0, "delta": d} for d in deltas),
    ]
    if stop_it:
        events.append({"type": "content_block_stop", "index": 0})
    tool = {"type": "tool_use", "id": "toolu_1", "name": "submit_refund", "input": {}}
    json_delta = {"type": "input_json_delta", "partial_json": ARGS}
    if stop_reason != "pause_turn":
        events += [
            {"type": "content_block_start", "index": 1, "content_block": tool},
            {"type": "content_block_delta", "index": 1, "delta": json_delta},
            {"type": "content_block_stop", "index": 1},
        ]
    events += [
        {"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {}},
        {"type": "message_stop"},
    ]
    return named(*events)


@pytest.mark.parametrize("block", sorted(_BLOCKS))
@pytest.mark.parametrize("stop_reason", ["tool_use", "end_turn", "pause_turn"])
def test_anthropic_a_block_left_open_fails_a_turn_that_goes_on(
    block: str, stop_reason: str
) -> None:
    out = decode_all_ways("anthropic", _anthropic(block, stop_reason))
    assert_failed(out, "content block 0 got no content_block_stop before message_stop")
    closed = decode_all_ways("anthropic", _anthropic(block, stop_reason, stop_it=True))
    assert closed.kind is not OutcomeKind.FAILED, closed.stop_reason
    assert closed.continuation[0].kind == block


def test_anthropic_a_block_left_open_by_max_tokens_is_still_truncated() -> None:
    out = decode_all_ways("anthropic", _anthropic("text", "max_tokens"))
    assert (out.kind, out.raw_reason) == (OutcomeKind.TRUNCATED, "max_tokens")


# --- 7. Gemini: no call after the finish ---------------------------------------------------


def _gemini(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)


def _chunk(*parts: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"parts": list(parts), "role": "model"}}
    if finish is not None:
        cand["finishReason"] = finish
    return {"candidates": [cand], "responseId": "r1", "modelVersion": "gemini-2.5-flash"}


REFUND = {"functionCall": {"name": "submit_refund", "args": {"amount": 100}}}


@pytest.mark.parametrize("finish", ["STOP", "MAX_TOKENS"])
def test_gemini_a_function_call_after_the_finish_reason_fails_the_turn(finish: str) -> None:
    body = _gemini(_chunk({"text": "Done."}, finish=finish), _chunk(REFUND))
    assert_failed(
        decode_all_ways("gemini", body), f"functionCall part after finishReason {finish!r}"
    )
    # In the chunk that carries the finish reason, or before it, the call is the turn's.
    for body in (
        _gemini(_chunk(REFUND, finish="STOP")),
        _gemini(_chunk(REFUND), _chunk(finish="STOP")),
    ):
        assert decode_all_ways("gemini", body).kind is OutcomeKind.TOOL_PROPOSALS


def test_gemini_a_streamed_call_continued_after_the_finish_reason_fails_the_turn() -> None:
    # Vertex: the continuation pieces take the adapter's fast path; after the finish they
    # must not.
    def piece(value: str, more: bool) -> dict[str, Any]:
        args = [
            {"jsonPath": "$.city", "stringValue": value} | ({"willContinue": True} if more else {})
        ]
        return {"functionCall": {"partialArgs": args, "willContinue": True}}

    opened = {"functionCall": {"name": "lookup", "willContinue": True}}
    pieces = [_chunk(piece("Par", True)), _chunk(piece("is", False)), _chunk({"functionCall": {}})]
    for sent in (pieces, pieces[:2]):  # (cut before the terminating piece: no _part call)
        body = _gemini(_chunk(opened, finish="STOP"), *sent)
        assert_failed(decode_all_ways("gemini", body), "functionCall part after finishReason")
    whole = decode_all_ways("gemini", _gemini(_chunk(opened), *pieces, _chunk(finish="STOP")))
    assert [c.arguments for c in whole.calls] == [{"city": "Paris"}]
