"""Every budget at its limit and one past it, end to end over real HTTP: at the limit the
operation completes; past it the operation ends in an explicit state (ESCALATED, with the
budget named in the stop reason) and the results gathered so far are kept."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import anyio
import msgspec
import pytest

from callgate.engine.core.guards import Budgets
from callgate.engine.core.registry import Registry, ToolContext, ToolSpec
from callgate.engine.core.states import OpInput, OpState
from callgate.engine.runtime.loop import OperationResult
from callgate.engine.runtime.replay import ReceivedRequest, ReplayServer, ReplayTurn

from .conftest import FAMILIES
from .loop_helpers import Progress, make_runner, turn, wire_results


class N(msgspec.Struct, forbid_unknown_fields=True):
    n: int


class FakeClock:
    """The operation's clock (budgets and audit); handlers move it forward."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Tools:
    """A registry whose handlers record what ran."""

    def __init__(self, clock: FakeClock | None = None, advance: float = 0.0) -> None:
        self.ran: list[tuple[str, int]] = []
        self.clock = clock
        self.advance = advance
        self.polls = 0

    async def echo(self, args: N, ctx: ToolContext) -> int:
        self.ran.append((ctx.tool, args.n))
        if self.clock is not None:
            self.clock.now += self.advance
        return args.n

    async def poll(self, args: N, ctx: ToolContext) -> int:
        # A changing result: every poll is new information.
        self.ran.append((ctx.tool, args.n))
        self.polls += 1
        return self.polls

    async def text(self, args: N, ctx: ToolContext) -> str:
        self.ran.append((ctx.tool, args.n))
        return "x" * args.n

    async def hang(self, args: N, ctx: ToolContext) -> int:
        self.ran.append((ctx.tool, args.n))
        await anyio.sleep(60)
        return 0

    def registry(self) -> Registry:
        return Registry(
            [
                ToolSpec(name="echo", description="e", args_type=N, handler=self.echo),
                ToolSpec(name="poll", description="p", args_type=N, handler=self.poll),
                ToolSpec(name="text", description="t", args_type=N, handler=self.text),
                ToolSpec(name="hang", description="h", args_type=N, handler=self.hang, timeout=30),
            ]
        )


async def run(
    provider: str, turns: list[ReplayTurn], tools: Tools, **kw: Any
) -> tuple[OperationResult, list[ReceivedRequest], Progress]:
    async with ReplayServer(turns) as server:
        runner, progress = make_runner(provider, server.base_url, tools.registry(), **kw)
        result = await runner.start("go")
        requests = list(server.requests)
    progress.path()  # every transition was a row of the table
    return result, requests, progress


def call(i: int, tool: str = "echo", n: int | None = None) -> tuple[str, str, str]:
    return (f"c{i}", tool, f'{{"n":{i if n is None else n}}}')


def assert_escalated(result: OperationResult, budget: str, event: OpInput) -> None:
    assert result.state is OpState.ESCALATED, result.stop
    assert result.stop is not None
    assert result.stop.input is event
    assert budget in result.stop.reason


P = "openai_chat"


# --- turns and tool calls -----------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(("max_turns", "state"), [(2, OpState.COMPLETED), (1, OpState.ESCALATED)])
async def test_max_turns(max_turns: int, state: OpState) -> None:
    tools = Tools()
    turns = [turn(P, calls=[call(1)]), turn(P, text="done")]
    result, requests, _ = await run(P, turns, tools, budgets=Budgets(max_turns=max_turns))
    assert result.state is state
    assert len(requests) == max_turns
    # The first turn's call ran and its result is kept either way.
    assert tools.ran == [("echo", 1)]
    assert [(c.call_id, c.status) for c in result.calls] == [("c1", "ok")]
    if state is OpState.ESCALATED:
        assert_escalated(result, "max_turns", OpInput.BUDGET_EXHAUSTED)


@pytest.mark.anyio
@pytest.mark.parametrize("proposed", [2, 3])
async def test_max_tool_calls(proposed: int) -> None:
    tools = Tools()
    turns = [turn(P, calls=[call(i) for i in range(proposed)]), turn(P, text="done")]
    result, requests, _ = await run(P, turns, tools, budgets=Budgets(max_tool_calls=2))
    # Which calls ran, not in what order: the two run concurrently, and trio starts new
    # tasks in no set order (on purpose), asyncio in the order they were started.
    assert sorted(tools.ran) == [("echo", 0), ("echo", 1)]
    if proposed == 2:
        assert result.state is OpState.COMPLETED
    else:
        assert_escalated(result, "max_tool_calls", OpInput.BUDGET_EXHAUSTED)
        assert len(requests) == 1
        assert [c.status for c in result.calls] == ["ok", "ok", "budget_exhausted"]


# --- tokens and cost (usage as each family reports it) ------------------------------------


TOKEN_CASES = [(99, OpState.COMPLETED), (100, OpState.ESCALATED)]


@pytest.mark.anyio
@pytest.mark.parametrize("provider", FAMILIES)
@pytest.mark.parametrize(("first", "state"), TOKEN_CASES)
async def test_max_input_tokens(provider: str, first: int, state: OpState) -> None:
    """Budget 100; turn 2 needs 1 more. 99 + 1 = 100 fits; 100 + 1 does not, so the
    operation stops before asking again (after running turn 1's call)."""
    tools = Tools()
    turns = [
        turn(provider, calls=[call(1)], input_tokens=first, output_tokens=1),
        turn(provider, text="done", input_tokens=1, output_tokens=1),
    ]
    result, requests, _ = await run(provider, turns, tools, budgets=Budgets(max_input_tokens=100))
    assert result.state is state, result.stop
    assert tools.ran == [("echo", 1)]
    if state is OpState.ESCALATED:
        assert_escalated(result, "max_input_tokens", OpInput.BUDGET_EXHAUSTED)
        assert "used 100 of 100" in result.stop.reason  # type: ignore[union-attr]
        assert len(requests) == 1 and result.calls[0].status == "ok"


@pytest.mark.anyio
@pytest.mark.parametrize("provider", FAMILIES)
@pytest.mark.parametrize(("first", "state"), TOKEN_CASES)
async def test_max_output_tokens(provider: str, first: int, state: OpState) -> None:
    tools = Tools()
    turns = [
        turn(provider, calls=[call(1)], input_tokens=1, output_tokens=first),
        turn(provider, text="done", input_tokens=1, output_tokens=1),
    ]
    result, requests, _ = await run(provider, turns, tools, budgets=Budgets(max_output_tokens=100))
    assert result.state is state, result.stop
    if state is OpState.ESCALATED:
        assert_escalated(result, "max_output_tokens", OpInput.BUDGET_EXHAUSTED)
        assert len(requests) == 1 and result.calls[0].status == "ok"


@pytest.mark.anyio
@pytest.mark.parametrize("provider", ["openai_chat", "anthropic", "gemini"])
@pytest.mark.parametrize(("first", "state"), TOKEN_CASES)
async def test_max_cost_with_a_price_table(provider: str, first: int, state: OpState) -> None:
    # 1 currency unit per input token, 0.5 per output token; the provider names a dated
    # model, priced by its longest prefix.
    budgets = Budgets(
        max_cost=Decimal("100.5"),
        prices={"model-x": (Decimal(1_000_000), Decimal(500_000)), "other": (0, 0)},
    )
    tools = Tools()
    turns = [
        turn(provider, calls=[call(1)], input_tokens=first, output_tokens=1, model="model-x-2025"),
        turn(provider, text="done", input_tokens=0, output_tokens=1, model="model-x-2025"),
    ]
    result, requests, _ = await run(provider, turns, tools, budgets=budgets)
    assert result.state is state, result.stop
    if state is OpState.ESCALATED:
        assert_escalated(result, "max_cost", OpInput.BUDGET_EXHAUSTED)
        assert len(requests) == 1


@pytest.mark.anyio
async def test_unpriced_model_exhausts_the_cost_budget() -> None:
    tools = Tools()
    turns = [turn(P, calls=[call(1)], model="mystery-1"), turn(P, text="done")]
    budgets = Budgets(max_cost=1000, prices={"model-x": (1, 1)})
    result, requests, _ = await run(P, turns, tools, budgets=budgets)
    assert_escalated(result, "max_cost", OpInput.BUDGET_EXHAUSTED)
    assert "unknown" in result.stop.reason  # type: ignore[union-attr]
    # The turn that overran the budget does not get its call run.
    assert len(requests) == 1 and tools.ran == []


# --- time ------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(("spent", "state"), [(9.5, OpState.COMPLETED), (10.0, OpState.ESCALATED)])
async def test_deadline_by_the_operation_clock(spent: float, state: OpState) -> None:
    """The handler spends ``spent`` of a 10 s deadline on the operation's clock. What is
    left is also the real time the next model request may take (0.5 s here)."""
    clock = FakeClock()
    tools = Tools(clock, advance=spent)
    turns = [turn(P, calls=[call(1)]), turn(P, text="done")]
    result, requests, _ = await run(
        P, turns, tools, budgets=Budgets(deadline_seconds=10), clock=clock
    )
    assert result.state is state
    assert tools.ran == [("echo", 1)]
    if state is OpState.ESCALATED:
        assert_escalated(result, "deadline_seconds", OpInput.DEADLINE)
        assert len(requests) == 1 and result.calls[0].status == "ok"


@pytest.mark.anyio
async def test_deadline_cancels_a_running_call_and_keeps_every_result() -> None:
    tools = Tools()
    turns = [turn(P, calls=[call(1), call(2, "hang")]), turn(P, text="done")]
    started = anyio.current_time()
    result, requests, progress = await run(P, turns, tools, budgets=Budgets(deadline_seconds=0.3))
    assert anyio.current_time() - started < 3
    assert_escalated(result, "deadline_seconds", OpInput.DEADLINE)
    assert [(c.call_id, c.status) for c in result.calls] == [("c1", "ok"), ("c2", "timeout")]
    assert len(requests) == 1
    assert progress.path()[-3:] == ["results_ready", "model_requested", "escalated"]


@pytest.mark.anyio
async def test_deadline_during_a_slow_stream_is_the_deadline_not_a_cut() -> None:
    tools = Tools()
    body = turn(P, text="a slow answer " * 20).body
    turns = [ReplayTurn(body=body, chunk_size=64, delay_s=0.1)]
    result, _, _ = await run(P, turns, tools, budgets=Budgets(deadline_seconds=0.3))
    assert_escalated(result, "deadline_seconds", OpInput.DEADLINE)
    assert result.stop is not None and result.stop.provider_reason is None


# --- result size ----------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("provider", ["openai_chat", "gemini"])
async def test_max_result_bytes(provider: str) -> None:
    # {"result":"xx…"} is 13 bytes of framing: n=87 is exactly 100 bytes, n=88 is 101.
    tools = Tools()
    turns = [
        turn(provider, calls=[call(87, "text"), call(88, "text")]),
        turn(provider, text="done"),
    ]
    async with ReplayServer(turns) as server:
        runner, _ = make_runner(
            provider, server.base_url, tools.registry(), budgets=Budgets(max_result_bytes=100)
        )
        result = await runner.start("go")
        wire = wire_results(provider, server.requests[1])
    assert result.state is OpState.COMPLETED
    assert [c.status for c in result.calls] == ["ok", "result_too_large"]
    assert wire[0].payload == {"result": "x" * 87}
    assert wire[1].payload["error"]["code"] == "result_too_large"
    assert "xxx" not in msgspec.json.encode(wire[1].payload).decode()


# --- duplicates and progress ------------------------------------------------------------------


@pytest.mark.anyio
async def test_identical_call_without_new_information_is_not_run_again() -> None:
    tools = Tools()
    turns = [
        turn(P, calls=[call(1, n=7)]),
        turn(P, calls=[("c2", "echo", '{"n": 7}')]),  # same tool and canonical arguments
        turn(P, text="done"),
    ]
    async with ReplayServer(turns) as server:
        runner, _ = make_runner(P, server.base_url, tools.registry())
        result = await runner.start("go")
        wire = wire_results(P, server.requests[2])
    assert result.state is OpState.COMPLETED
    assert tools.ran == [("echo", 7)]
    assert [c.status for c in result.calls] == ["ok", "no_progress"]
    assert wire[-1].payload["error"]["code"] == "no_progress"


@pytest.mark.anyio
async def test_an_identical_retry_after_a_timeout_runs() -> None:
    # The timeout's envelope says "retryable": the model's identical retry is admitted.
    attempts: list[int] = []

    async def flaky(args: N, ctx: ToolContext) -> int:
        attempts.append(args.n)
        if len(attempts) == 1:
            await anyio.sleep(5)  # the first attempt times out
        return args.n

    reg = Registry(
        [ToolSpec(name="flaky", description="f", args_type=N, handler=flaky, timeout=0.2)]
    )
    turns = [
        turn(P, calls=[("c1", "flaky", '{"n": 7}')]),
        turn(P, calls=[("c2", "flaky", '{"n": 7}')]),
        turn(P, text="done"),
    ]
    async with ReplayServer(turns) as server:
        runner, _ = make_runner(P, server.base_url, reg)
        result = await runner.start("go")
        wire = wire_results(P, server.requests[2])
    assert result.state is OpState.COMPLETED
    assert [c.status for c in result.calls] == ["timeout", "ok"]
    assert attempts == [7, 7] and wire[-1].payload == {"result": 7}


@pytest.mark.anyio
async def test_identical_calls_in_one_response_run_once() -> None:
    tools = Tools()
    turns = [turn(P, calls=[call(1, n=5), call(2, n=5), call(3, n=6)]), turn(P, text="done")]
    result, _, _ = await run(P, turns, tools)
    assert result.state is OpState.COMPLETED
    assert sorted(tools.ran) == [("echo", 5), ("echo", 6)]  # (concurrent: in either order)
    assert [c.status for c in result.calls] == ["ok", "no_progress", "ok"]


@pytest.mark.anyio
@pytest.mark.parametrize(("threshold", "polls"), [(3, 3), (2, 2)])
async def test_duplicate_threshold(threshold: int, polls: int) -> None:
    """The same poll three times, with new information (another call's fresh result)
    between: allowed at threshold 3, the third refused at threshold 2."""
    tools = Tools()
    turns = [
        turn(P, calls=[call(1, "poll", n=0)]),
        turn(P, calls=[call(2, "echo", n=1)]),
        turn(P, calls=[call(3, "poll", n=0)]),
        turn(P, calls=[call(4, "echo", n=2)]),
        turn(P, calls=[call(5, "poll", n=0)]),
        turn(P, text="done"),
    ]
    result, _, _ = await run(P, turns, tools, budgets=Budgets(duplicate_threshold=threshold))
    assert result.state is OpState.COMPLETED
    assert tools.polls == polls
    assert result.calls[-1].status == ("ok" if polls == 3 else "no_progress")


@pytest.mark.anyio
@pytest.mark.parametrize(("repeats", "state"), [(1, OpState.COMPLETED), (2, OpState.ESCALATED)])
async def test_no_progress_counter(repeats: int, state: OpState) -> None:
    """no_progress_limit=2: one futile turn is answered with no_progress and the model may
    change course; the second consecutive futile turn ends the operation ESCALATED."""
    tools = Tools()
    same = [call(1, n=3)]
    turns = [turn(P, calls=same)] + [turn(P, calls=same)] * repeats + [turn(P, text="done")]
    result, requests, _ = await run(P, turns, tools, budgets=Budgets(no_progress_limit=2))
    assert tools.ran == [("echo", 3)]
    assert result.state is state
    if state is OpState.ESCALATED:
        assert_escalated(result, "no_progress_limit", OpInput.NO_PROGRESS)
        assert len(requests) == 3
        # The results gathered before the stop are kept.
        assert [c.status for c in result.calls] == ["ok", "no_progress"]
