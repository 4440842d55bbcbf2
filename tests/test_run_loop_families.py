"""The run loop end to end over real HTTP for all five API families.

Turn 1 is a recorded fixture (with reasoning / thinking / thought signatures where the
family has them), turn 2 a rendered final answer. The follow-up request the replay server
received must carry the model's turn back verbatim and the results in the provider's own
shape (``../shared/PROVIDERS.md``, "Next request"). Every state change is checked against
the transition table (``Progress.path``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import msgspec
import pytest

from callgate.engine.core.registry import Decision, Registry, ToolContext, ToolSpec
from callgate.engine.core.states import OpInput, OpState
from callgate.engine.runtime.progress import CallFinished, CallPreparing, CallRejected
from callgate.engine.runtime.replay import ReceivedRequest, ReplayServer, ReplayTurn

from .conftest import FAMILIES, FIXTURES
from .loop_helpers import make_runner, turn, wire_results


class Empty(msgspec.Struct, forbid_unknown_fields=True):
    pass


class CalcArgs(msgspec.Struct, forbid_unknown_fields=True):
    a: int
    b: int
    op: str


class LocationArgs(msgspec.Struct, forbid_unknown_fields=True):
    location: str


class CityArgs(msgspec.Struct, forbid_unknown_fields=True):
    city: str
    country: str
    units: str


class TickerArgs(msgspec.Struct, forbid_unknown_fields=True):
    ticker: str
    exchange: str


class XArgs(msgspec.Struct, forbid_unknown_fields=True):
    x: int


def _sse_data(path: Path) -> list[dict[str, Any]]:
    """Every ``data:`` JSON object of a recorded stream, in order (test-side reading)."""
    out = []
    for line in path.read_bytes().splitlines():
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data and data != b"[DONE]":
                out.append(msgspec.json.decode(data))
    return out


@dataclass
class Case:
    provider: str
    fixture: Path
    tools: list[tuple[str, type[msgspec.Struct]]]
    call_ids: list[str | None]
    check: Callable[[dict[str, Any], Path], None]


def _check_chat(body: dict[str, Any], fixture: Path) -> None:
    user, assistant, *tools = body["messages"]
    assert user == {"role": "user", "content": "go"}
    assert assistant["role"] == "assistant" and assistant["content"] is None
    # The argument text is echoed exactly as streamed: the joined fragments per index.
    streamed: dict[int, str] = {}
    for chunk in _sse_data(fixture):
        for choice in chunk["choices"]:
            for tc in (choice.get("delta") or {}).get("tool_calls") or []:
                piece = tc.get("function", {}).get("arguments") or ""
                streamed[tc["index"]] = streamed.get(tc["index"], "") + piece
    sent = [c["function"]["arguments"] for c in assistant["tool_calls"]]
    assert sent == [streamed[0], streamed[1]]
    assert [c["id"] for c in assistant["tool_calls"]] == [
        "call_JMW1whyEaYG438VE1OIflxA2",
        "call_DNYTawLBoN8fj3KN6qU9N1Ou",
    ]
    assert [t["role"] for t in tools] == ["tool", "tool"]
    assert [set(t) for t in tools] == [{"role", "tool_call_id", "content"}] * 2
    assert [t["tool_call_id"] for t in tools] == [c["id"] for c in assistant["tool_calls"]]


def _check_responses(body: dict[str, Any], fixture: Path) -> None:
    done = [e["item"] for e in _sse_data(fixture) if e.get("type") == "response.output_item.done"]
    reasoning, call = done
    user, echo_reasoning, echo_call, output = body["input"]
    assert user == {"role": "user", "content": "go"}
    # Reasoning echoed verbatim from output_item.done (encrypted_content unmodified).
    assert echo_reasoning == {**reasoning, "summary": reasoning.get("summary") or []}
    assert echo_reasoning["encrypted_content"] == reasoning["encrypted_content"]
    assert echo_call == {k: v for k, v in call.items() if k != "status"}
    assert set(output) == {"type", "call_id", "output"}
    assert output["type"] == "function_call_output" and output["call_id"] == call["call_id"]
    assert body["store"] is False and "previous_response_id" not in body


def _check_anthropic(body: dict[str, Any], fixture: Path) -> None:
    events = _sse_data(fixture)
    thinking = "".join(
        e["delta"].get("thinking", "") for e in events if e.get("type") == "content_block_delta"
    )
    signature = "".join(
        e["delta"].get("signature", "") for e in events if e.get("type") == "content_block_delta"
    )
    user, assistant, results = body["messages"]
    assert user == {"role": "user", "content": "go"}
    think, use = assistant["content"]
    # The thinking block goes back complete and unmodified, before the tool_use block.
    assert think == {"type": "thinking", "thinking": thinking, "signature": signature}
    assert use == {
        "type": "tool_use",
        "id": "toolu_01825dXWLSoJwCst1qTsiWdb",
        "name": "fixed_version",
        "input": {},
    }
    assert results["role"] == "user"
    assert [b["type"] for b in results["content"]] == ["tool_result"]
    assert results["content"][0]["tool_use_id"] == use["id"]
    assert "is_error" not in results["content"][0]


def _check_gemini(body: dict[str, Any], fixture: Path) -> None:
    sig = next(
        p["thoughtSignature"]
        for e in _sse_data(fixture)
        for p in e["candidates"][0]["content"]["parts"]
        if "thoughtSignature" in p
    )
    user, model, results = body["contents"]
    assert user == {"role": "user", "parts": [{"text": "go"}]}
    # The signature stays on the very part that carried it: the functionCall part.
    assert model == {
        "role": "model",
        "parts": [
            {
                "functionCall": {"name": "get_user_country", "args": {}, "id": "96c1su3s"},
                "thoughtSignature": sig,
            }
        ],
    }
    (part,) = results["parts"]
    fr = part["functionResponse"]
    assert results["role"] == "user"
    assert fr["name"] == "get_user_country" and fr["id"] == "96c1su3s"
    assert set(fr["response"]) == {"output"}


def _check_interactions(body: dict[str, Any], fixture: Path) -> None:
    created = _sse_data(fixture)[0]["interaction"]["id"]
    assert body["previous_interaction_id"] == created
    (item,) = body["input"]  # stateful: only the results travel
    assert item["type"] == "function_result" and item["call_id"] == "61nzpsv4"
    assert item["name"] == "getWeather" and isinstance(item["result"], str)
    assert "is_error" not in item


CASES = {
    "openai_chat": Case(
        "openai_chat",
        FIXTURES / "openai_chat" / "parallel_tool_calls_two_functions.sse",
        [("GetWeatherArgs", CityArgs), ("get_stock_price", TickerArgs)],
        ["call_JMW1whyEaYG438VE1OIflxA2", "call_DNYTawLBoN8fj3KN6qU9N1Ou"],
        _check_chat,
    ),
    "openai_responses": Case(
        "openai_responses",
        FIXTURES / "openai_responses" / "reasoning_encrypted_content_function_call.converted.sse",
        [("calculator", CalcArgs)],
        ["call_AB6AaRZ1FYZB2RwS6A5vbdqn"],
        _check_responses,
    ),
    "anthropic": Case(
        "anthropic",
        FIXTURES / "anthropic" / "thinking_signature_then_tool_use.sse",
        [("fixed_version", Empty)],
        ["toolu_01825dXWLSoJwCst1qTsiWdb"],
        _check_anthropic,
    ),
    "gemini": Case(
        "gemini",
        FIXTURES / "gemini" / "function_call_with_id_gemini3flash.sse",
        [("get_user_country", Empty)],
        ["96c1su3s"],
        _check_gemini,
    ),
    "gemini_interactions": Case(
        "gemini_interactions",
        FIXTURES / "gemini_interactions" / "steps_api_function_call_requires_action.converted.sse",
        [("getWeather", LocationArgs)],
        ["61nzpsv4"],
        _check_interactions,
    ),
}


def _echo_registry(tools: list[tuple[str, type[msgspec.Struct]]], ran: list[str]) -> Registry:
    def make(name: str) -> Callable[[Any, ToolContext], Any]:
        async def handler(args: Any, ctx: ToolContext) -> dict[str, Any]:
            ran.append(ctx.call_id)
            return {"tool": name, "args": msgspec.to_builtins(args), "call_id": ctx.call_id}

        return handler

    return Registry(
        ToolSpec(name=n, description=f"{n} tool", args_type=t, handler=make(n)) for n, t in tools
    )


@pytest.mark.anyio
@pytest.mark.parametrize("provider", FAMILIES)
async def test_two_turn_operation_completes_with_exact_result_shape(provider: str) -> None:
    case = CASES[provider]
    ran: list[str] = []
    turns = [
        ReplayTurn.from_file(case.fixture, chunk_size=97),
        turn(provider, text="All done."),
    ]
    async with ReplayServer(turns) as server:
        runner, progress = make_runner(provider, server.base_url, _echo_registry(case.tools, ran))
        result = await runner.start("go")
        requests = list(server.requests)
    assert result.state is OpState.COMPLETED, result.stop
    assert result.stop is not None and result.stop.input.value == "final_text"
    assert result.text == "All done."
    assert len(requests) == 2
    # Correlated: every call ran once, results matched by id and in proposal order.
    assert sorted(ran) == sorted(case.call_ids)  # type: ignore[type-var]
    assert [c.call_id for c in result.calls] == case.call_ids
    assert all(c.status == "ok" and c.binding_sha256 for c in result.calls)
    wire = wire_results(provider, requests[1])
    assert [w.call_id for w in wire] == case.call_ids
    for w, name_type in zip(wire, case.tools, strict=True):
        assert w.payload["result"]["tool"] == name_type[0]
        assert w.payload["result"]["call_id"] == w.call_id
        assert w.is_error in (None, False)
    case.check(requests[1].json(), case.fixture)
    assert progress.path() == [
        "model_requested",
        "validating",
        "executing",
        "results_ready",
        "model_requested",
        "completed",
    ]
    # "Preparing" arrived for every call, before anything ran.
    preparing = progress.of(CallPreparing)
    assert [p.name for p in preparing] == [n for n, _ in case.tools]
    first_finished = next(i for i, e in enumerate(progress.events) if isinstance(e, CallFinished))
    assert all(progress.events.index(p) < first_finished for p in preparing)


@pytest.mark.anyio
async def test_anthropic_pause_turn_continues_the_same_turn() -> None:
    fixture = FIXTURES / "anthropic" / "pause_turn_web_search.trimmed.sse"
    turns = [ReplayTurn.from_file(fixture), turn("anthropic", text="Here are the results.")]
    async with ReplayServer(turns) as server:
        runner, progress = make_runner("anthropic", server.base_url, Registry([]))
        result = await runner.start("search")
        requests = list(server.requests)
    assert result.state is OpState.COMPLETED
    assert result.text == "Here are the results."
    assert progress.path() == ["model_requested", "model_requested", "completed"]
    first = requests[0].json()["messages"]
    messages = requests[1].json()["messages"]
    # The paused turn is sent back as-is: one assistant message, no new user message.
    assert messages[:-1] == first
    assert messages[-1]["role"] == "assistant"
    kinds = [b["type"] for b in messages[-1]["content"]]
    assert kinds[0] == "thinking" and "server_tool_use" in kinds
    assert "web_search_tool_result" in kinds
    starts = [e for e in _sse_data(fixture) if e.get("type") == "content_block_start"]
    assert len(messages[-1]["content"]) == len(starts)


# --- rejections: the handler never runs, the envelope code reaches the model --------------


def _guarded_registry(ran: list[str]) -> Registry:
    async def handler(args: XArgs, ctx: ToolContext) -> int:
        ran.append(ctx.call_id)
        return args.x

    return Registry(
        [
            ToolSpec(name="ok_tool", description="fine", args_type=XArgs, handler=handler),
            ToolSpec(
                name="admin_tool",
                description="admins only",
                args_type=XArgs,
                handler=handler,
                authorize=lambda auth, args: "admin" in auth.roles,
            ),
            ToolSpec(
                name="capped_tool",
                description="x must be small",
                args_type=XArgs,
                handler=handler,
                policy=lambda ctx, args: Decision(args.x < 10, "x too large"),
            ),
        ]
    )


REJECTIONS = [
    ("c_unknown", "no_such_tool", '{"x":1}', "unknown_tool"),
    ("c_invalid", "ok_tool", '{"x":"one"}', "invalid_arguments"),
    ("c_extra", "ok_tool", '{"x":1,"y":2}', "invalid_arguments"),
    ("c_unauth", "admin_tool", '{"x":1}', "unauthorized"),
    ("c_denied", "capped_tool", '{"x":99}', "denied"),
    ("c_fine", "ok_tool", '{"x":7}', "ok"),
]


@pytest.mark.anyio
@pytest.mark.parametrize("provider", FAMILIES)
async def test_rejected_calls_never_run_and_their_codes_reach_the_model(provider: str) -> None:
    ran: list[str] = []
    calls = [(cid, name, args) for cid, name, args, _ in REJECTIONS]
    turns = [turn(provider, calls=calls), turn(provider, text="ok")]
    async with ReplayServer(turns) as server:
        runner, progress = make_runner(provider, server.base_url, _guarded_registry(ran))
        result = await runner.start("go", roles=["user"])
        follow_up = server.requests[1]
    assert result.state is OpState.COMPLETED
    assert ran == ["c_fine"]
    assert [(c.call_id, c.status) for c in result.calls] == [(r[0], r[3]) for r in REJECTIONS]
    wire = wire_results(provider, follow_up)
    assert [w.call_id for w in wire] == [r[0] for r in REJECTIONS]
    for w, (_, _, _, code) in zip(wire, REJECTIONS, strict=True):
        if code == "ok":
            assert w.payload == {"result": 7} and w.is_error in (None, False)
        else:
            assert w.payload["error"]["code"] == code
            # Anthropic, Gemini and Interactions flag errors natively; Chat/Responses can't.
            assert w.is_error is (None if provider.startswith("openai") else True)
            # Safe text only: no argument value, no host reason.
            assert "99" not in w.payload["error"]["message"]
            assert "too large" not in w.payload["error"]["message"]
    assert {e.code for e in progress.of(CallRejected)} == {r[3] for r in REJECTIONS} - {"ok"}
    progress.path()


@pytest.mark.anyio
async def test_invalid_argument_detail_names_the_path_not_the_value() -> None:
    ran: list[str] = []
    turns = [
        turn("anthropic", calls=[("c1", "ok_tool", '{"x":"secret-value"}')]),
        turn("anthropic", text="ok"),
    ]
    async with ReplayServer(turns) as server:
        runner, _ = make_runner("anthropic", server.base_url, _guarded_registry(ran))
        await runner.start("go")
        (w,) = wire_results("anthropic", server.requests[1])
    assert w.payload["error"]["code"] == "invalid_arguments"
    assert "$.x" in w.payload["error"]["message"]
    assert "secret-value" not in w.payload["error"]["message"]
    assert ran == []


def echoed_call_ids(provider: str, body: dict[str, Any]) -> list[str]:
    """The call ids of the model turn echoed in a follow-up request body."""
    if provider == "openai_chat":
        return [
            tc["id"] for m in body["messages"] if m["role"] == "assistant"
            for tc in m.get("tool_calls", ())
        ]  # fmt: skip
    if provider == "openai_responses":
        return [i["call_id"] for i in body["input"] if i.get("type") == "function_call"]
    if provider == "anthropic":
        return [
            b["id"] for m in body["messages"] if m["role"] == "assistant"
            for b in m["content"] if b["type"] == "tool_use"
        ]  # fmt: skip
    return [
        p["functionCall"]["id"] for c in body["contents"] if c["role"] == "model"
        for p in c["parts"] if "functionCall" in p
    ]  # fmt: skip


@pytest.mark.anyio
@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses", "anthropic", "gemini"])
async def test_repeated_call_id_is_answered_once_and_the_operation_goes_on(
    provider: str,
) -> None:
    ran: list[str] = []
    calls = [("dup", "ok_tool", '{"x":1}'), ("dup", "ok_tool", '{"x":2}')]
    turns = [turn(provider, calls=calls), turn(provider, text="ok")]
    async with ReplayServer(turns) as server:
        runner, progress = make_runner(provider, server.base_url, _guarded_registry(ran))
        result = await runner.start("go")
        wire = wire_results(provider, server.requests[1])
    assert result.state is OpState.COMPLETED
    assert ran == ["dup"]  # the first occurrence only
    assert [(c.call_id, c.status) for c in result.calls] == [
        ("dup", "ok"),
        ("dup", "duplicate_call"),
    ]
    # Providers key results by call id: exactly one result for the id, and the echo
    # holds the call it answers, not the repeat (Anthropic and Gemini answer 400 to calls
    # and results that do not pair up).
    assert [(w.call_id, w.payload) for w in wire] == [("dup", {"result": 1})]
    assert echoed_call_ids(provider, server.requests[1].json()) == ["dup"]
    assert [e.code for e in progress.of(CallRejected)] == ["duplicate_call"]
    progress.path()


# --- handlers: sync and async; results in proposal order ----------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("provider", FAMILIES)
async def test_sync_and_async_handlers_answer_in_proposal_order(provider: str) -> None:
    """Completion order is forced to be the reverse of proposal order (call i waits until
    call i+1 finished); results still go back in proposal order, matched by call id.
    Even calls are async handlers, odd ones sync (run in a worker thread)."""
    n = 4
    finished: list[int] = []
    done_async = [anyio.Event() for _ in range(n)]
    done_thread = [threading.Event() for _ in range(n)]

    async def async_handler(args: XArgs, ctx: ToolContext) -> dict[str, int]:
        if args.x + 1 < n:
            await done_async[args.x + 1].wait()
        finished.append(args.x)
        done_thread[args.x].set()
        done_async[args.x].set()
        return {"x": args.x, "kind": 0}

    def sync_handler(args: XArgs, ctx: ToolContext) -> dict[str, int]:
        if args.x + 1 < n:
            assert done_thread[args.x + 1].wait(10)
        finished.append(args.x)
        done_thread[args.x].set()
        anyio.from_thread.run_sync(done_async[args.x].set)
        return {"x": args.x, "kind": 1}

    registry = Registry(
        [
            ToolSpec(name="a", description="async", args_type=XArgs, handler=async_handler),
            ToolSpec(name="s", description="sync", args_type=XArgs, handler=sync_handler),
        ]
    )
    calls = [(f"id{i}", "a" if i % 2 == 0 else "s", f'{{"x":{i}}}') for i in range(n)]
    async with ReplayServer([turn(provider, calls=calls), turn(provider, text="ok")]) as server:
        runner, _ = make_runner(provider, server.base_url, registry)
        result = await runner.start("go")
        wire = wire_results(provider, server.requests[1])
    assert result.state is OpState.COMPLETED
    assert finished == [3, 2, 1, 0]
    assert [w.call_id for w in wire] == ["id0", "id1", "id2", "id3"]
    assert [w.payload["result"] for w in wire] == [{"x": i, "kind": i % 2} for i in range(n)]
    assert [c.call_id for c in result.calls] == ["id0", "id1", "id2", "id3"]


# --- disconnects ---------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("provider", FAMILIES)
async def test_disconnect_mid_arguments_never_executes(provider: str) -> None:
    ran: list[str] = []
    calls = [("c1", "ok_tool", '{"x": 12345678}')]
    full = turn(provider, calls=calls, fragment_size=3)
    # Inside the argument text: a streamed fragment, or Gemini's whole args object.
    cut = full.body.index(b"12345678" if provider == "gemini" else b'"456"')
    turns = [
        ReplayTurn(body=full.body, chunk_size=16, disconnect_after=cut),
        full,
        turn(provider, text="ok"),
    ]
    async with ReplayServer(turns) as server:
        runner, progress = make_runner(provider, server.base_url, _guarded_registry(ran))
        result = await runner.start("go")
        requests = list(server.requests)
    if provider == "gemini":
        # Gemini sends a call whole in one event: cut inside it, nothing of the call was
        # received, so the transport retries the request (and the retry completes).
        assert result.state is OpState.COMPLETED
        assert len(requests) == 3 and requests[0].body == requests[1].body
        assert ran == ["c1"]
    else:
        # Argument fragments had arrived: no retry (it could duplicate a call); the cut
        # turn ends the operation INCOMPLETE and nothing runs.
        assert result.state is OpState.INCOMPLETE
        assert result.stop is not None and "cut" in result.stop.reason
        assert len(requests) == 1
        assert ran == []
        assert result.calls == ()
    progress.path()


@pytest.mark.anyio
@pytest.mark.parametrize("provider", FAMILIES)
async def test_disconnect_before_any_call_is_retried(provider: str) -> None:
    ran: list[str] = []
    full = turn(provider, calls=[("c1", "ok_tool", '{"x":5}')])
    turns = [ReplayTurn(body=full.body, disconnect_after=20), full, turn(provider, text="ok")]
    async with ReplayServer(turns) as server:
        runner, progress = make_runner(provider, server.base_url, _guarded_registry(ran))
        result = await runner.start("go")
        requests: list[ReceivedRequest] = list(server.requests)
    assert result.state is OpState.COMPLETED
    assert len(requests) == 3 and requests[0].body == requests[1].body
    assert ran == ["c1"]
    path = progress.path()
    # The transport's retry is a pass through RETRY, not invisible to the state machine.
    assert path[:3] == ["model_requested", "retry", "model_requested"]


@pytest.mark.anyio
async def test_retries_that_run_out_end_failed_through_retry_exhausted() -> None:
    provider = "openai_chat"
    busy = ReplayTurn(
        status=503, body=b'{"error":{"message":"busy"}}', content_type="application/json"
    )
    async with ReplayServer([busy] * 3) as server:
        runner, progress = make_runner(provider, server.base_url, _guarded_registry([]))
        result = await runner.start("go")
        asked = len(server.requests)
    assert asked == 3  # FAST_RETRY's three attempts
    assert result.state is OpState.FAILED
    assert result.stop is not None and result.stop.input is OpInput.RETRY_EXHAUSTED
    assert progress.path() == [
        "model_requested",
        *["retry", "model_requested"] * 2,
        "retry",
        "failed",
    ]


# --- approvals: the pause and the resume walk the table too --------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("approve", [True, False])
async def test_approval_pause_and_resume_follow_the_table(approve: bool) -> None:
    import time

    from callgate.engine.core.registry import RiskClass
    from callgate.engine.store.memory import MemoryStore

    ran: list[int] = []

    async def pay(args: XArgs, ctx: ToolContext) -> int:
        ran.append(args.x)
        return args.x

    registry = Registry(
        [
            ToolSpec(
                name="pay",
                description="p",
                args_type=XArgs,
                handler=pay,
                risk=RiskClass.IRREVERSIBLE,
            ),
            ToolSpec(name="peek", description="r", args_type=XArgs, handler=pay),
        ]
    )
    calls = [("c_pay", "pay", '{"x":100}'), ("c_peek", "peek", '{"x":1}')]
    store = MemoryStore()
    async with ReplayServer([turn("anthropic", calls=calls), turn("anthropic", text="ok")]) as s:
        runner, progress = make_runner("anthropic", s.base_url, registry, store=store)
        paused = await runner.start("go")
        assert paused.state is OpState.WAITING_APPROVAL and ran == []
        (approval_id,) = paused.pending_approvals
        await store.decide_approval(approval_id, approve, "alice", "reason", now=time.time())
        # A fresh runner resumes; one event log spans both drives.
        again, _ = make_runner("anthropic", s.base_url, registry, store=store, progress=progress)
        done = await again.resume(paused.operation_id)
        wire = wire_results("anthropic", s.requests[1])
    assert done.state is OpState.COMPLETED
    assert sorted(ran) == ([1, 100] if approve else [1])  # concurrent: any order
    assert [w.payload.get("error", {}).get("code") for w in wire] == [
        None if approve else "denied",
        None,
    ]
    path = progress.path()
    assert path[:3] == ["model_requested", "validating", "waiting_approval"]
    assert path[3:] == [
        "validating",
        "executing",
        "results_ready",
        "model_requested",
        "completed",
    ]
