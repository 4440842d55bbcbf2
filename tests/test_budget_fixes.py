"""Budgets and approvals around a pause (found by a review): a call a person denied (or
let expire) never runs, even if the approval rule would no longer ask; a turn that
overran a token or cost budget runs none of its calls and asks no person; out of time,
no approval is requested or spent; Gemini's thought tokens and Anthropic's cache reads
and writes count against the token and cost budgets; a priced model's price does not
stretch to another model that shares its prefix."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import msgspec
import pytest

from callgate.adapters.render import RenderCall, render_turn
from callgate.engine.core.guards import Budgets, BudgetTracker
from callgate.engine.core.outcome import Usage
from callgate.engine.core.registry import Registry, RiskClass, ToolContext, ToolSpec
from callgate.engine.core.states import OpState
from callgate.engine.runtime.loop import Runner
from callgate.engine.runtime.progress import StateChanged
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn
from callgate.engine.runtime.transport import ProviderEndpoint, RetryPolicy
from callgate.engine.store.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio
P = "openai_chat"
FAST_RETRY = RetryPolicy(max_attempts=3, base_delay=0.0, jitter=0.0)


class N(msgspec.Struct, forbid_unknown_fields=True):
    n: int


class Tools:
    def __init__(self) -> None:
        self.ran: list[tuple[str, int]] = []

    async def echo(self, args: N, ctx: ToolContext) -> int:
        self.ran.append(("echo", args.n))
        return args.n

    def registry(self, **kw: Any) -> Registry:
        spec = ToolSpec(name="echo", description="e", args_type=N, handler=self.echo, **kw)
        return Registry([spec])


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def turn(provider: str, *, text: str = "", calls: Any = (), **kw: Any) -> ReplayTurn:
    body = render_turn(provider, text=text, calls=[RenderCall(*c) for c in calls], **kw)
    return ReplayTurn(body=body)


def runner(provider: str, base_url: str, registry: Registry, **kw: Any) -> Runner:
    kw.setdefault("retry", FAST_RETRY)
    return Runner(
        provider=provider,
        model=kw.pop("model", "model-1"),
        registry=registry,
        endpoint=ProviderEndpoint(base_url=base_url, api_key="k"),
        **kw,
    )


# --- decisions stand ------------------------------------------------------------------


@pytest.mark.parametrize("decide", ["deny", "expire"])
async def test_a_denied_or_expired_call_never_runs_when_the_rule_flips(
    tmp_path: Any, decide: str
) -> None:
    clock = FakeClock()
    tools = Tools()
    flagged = {"on": True}  # e.g. "approval needed while the account is flagged"
    reg = tools.registry(risk=RiskClass.WRITE, approval=lambda args, ctx: flagged["on"])
    turns = [turn(P, calls=[("c1", "echo", '{"n":1}')]), turn(P, text="done")]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        kw: dict[str, Any] = {"store": store, "clock": clock, "approval_ttl": 60.0}
        paused = await runner(P, server.base_url, reg, **kw).start("go")
        assert paused.state is OpState.WAITING_APPROVAL
        (approval_id,) = paused.pending_approvals
        if decide == "deny":
            await store.decide_approval(approval_id, False, "alice", "no", now=clock.now)
        else:
            clock.now += 120  # nobody decided in time
        flagged["on"] = False  # the rule's input changed while the operation was paused
        result = await runner(P, server.base_url, reg, **kw).resume(paused.operation_id)
    assert tools.ran == []
    assert [c.status for c in result.calls] == [
        "denied" if decide == "deny" else "approval_expired"
    ]


# --- overruns ----------------------------------------


async def test_overrun_turn_still_runs_its_calls():
    tools = Tools()
    turns = [
        turn(P, calls=[("c1", "echo", '{"n":1}')], input_tokens=1, output_tokens=5000),
        turn(P, text="done"),
    ]
    async with ReplayServer(turns) as server:
        r = runner(P, server.base_url, tools.registry(), budgets=Budgets(max_output_tokens=100))
        res = await r.start("go")
    assert res.state is OpState.ESCALATED
    assert tools.ran == [], "the call ran after the budget was already overrun"


async def test_an_overrun_turn_asks_no_person_and_runs_nothing(tmp_path: Any) -> None:
    tools = Tools()
    turns = [
        turn(P, calls=[("c1", "echo", '{"n":1}')], input_tokens=1, output_tokens=1, model="m"),
        turn(P, text="done"),
    ]
    # $1 per output token: this turn costs 1 against a cap of 0.5.
    budgets = Budgets(max_cost=Decimal("0.5"), prices={"m": (Decimal(0), Decimal(1_000_000))})
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        reg = tools.registry(risk=RiskClass.IRREVERSIBLE)
        r = runner(P, server.base_url, reg, budgets=budgets, store=store, model="m")
        result = await r.start("go")
        approvals = await store.list_approvals()
    assert result.state is OpState.ESCALATED and result.pending_approvals == ()
    assert result.stop is not None and "max_cost" in result.stop.reason
    assert approvals == [] and tools.ran == []


async def test_out_of_time_no_approval_is_requested(tmp_path: Any) -> None:
    clock = FakeClock()
    tools = Tools()

    async def progress(event: Any) -> None:
        if isinstance(event, StateChanged) and event.new == "validating":
            clock.now += 11  # the model turn took 11 s of a 10 s deadline

    turns = [turn(P, calls=[("c1", "echo", '{"n":1}')]), turn(P, text="done")]
    async with ReplayServer(turns) as server, SQLiteStore(tmp_path / "db") as store:
        reg = tools.registry(risk=RiskClass.IRREVERSIBLE)
        r = runner(
            P,
            server.base_url,
            reg,
            budgets=Budgets(deadline_seconds=10),
            store=store,
            clock=clock,
            progress=progress,
            approval_ttl=10**9,
        )
        result = await r.start("go")
        approvals = await store.list_approvals()
    assert result.state is OpState.ESCALATED
    assert result.stop is not None and "deadline" in result.stop.reason
    assert approvals == [] and tools.ran == []


# --- billed tokens --------------------------------------------------------------------


async def _run(provider: str, turns: list[ReplayTurn], budgets: Budgets) -> Any:
    tools = Tools()
    async with ReplayServer(turns) as server:
        r = runner(provider, server.base_url, tools.registry(), budgets=budgets, model="model")
        return await r.start("go")


def _with_thoughts(body: bytes, thoughts: int) -> bytes:
    count = b'"candidatesTokenCount":1,'
    assert count in body
    return body.replace(count, count + b'"thoughtsTokenCount":%d,' % thoughts)


async def test_gemini_thought_tokens_count_against_max_output_tokens() -> None:
    first = turn("gemini", calls=[("c1", "echo", '{"n":1}')], input_tokens=1, output_tokens=1)
    first = ReplayTurn(body=_with_thoughts(first.body, 5000))
    done = turn("gemini", text="done", input_tokens=1, output_tokens=1)
    result = await _run("gemini", [first, done], Budgets(max_output_tokens=100))
    assert result.state is OpState.ESCALATED  # 5001 billed output tokens against 100
    assert result.stop is not None and "max_output_tokens" in result.stop.reason


async def test_gemini_thought_tokens_count_against_max_cost() -> None:
    first = turn("gemini", calls=[("c1", "echo", '{"n":1}')], input_tokens=1, output_tokens=1)
    first = ReplayTurn(body=_with_thoughts(first.body, 1_000_000))
    done = turn("gemini", text="done", input_tokens=1, output_tokens=1)
    budgets = Budgets(
        max_cost=Decimal(1),
        prices={"model": (Decimal(0), Decimal(10))},
        max_output_tokens=10_000_000,  # only the cost cap applies
    )
    result = await _run("gemini", [first, done], budgets)  # $10 of thoughts against $1
    assert result.state is OpState.ESCALATED
    assert result.stop is not None and "max_cost" in result.stop.reason


async def test_anthropic_cache_reads_and_writes_count_against_max_input_tokens() -> None:
    first = turn("anthropic", calls=[("c1", "echo", '{"n":1}')], input_tokens=5, output_tokens=1)
    plain = b'"usage":{"input_tokens":5,"output_tokens":1}'
    assert plain in first.body
    cached = (
        b'"usage":{"input_tokens":5,"cache_read_input_tokens":100000,'
        b'"cache_creation_input_tokens":50000,"output_tokens":1}'
    )
    first = ReplayTurn(body=first.body.replace(plain, cached))
    done = turn("anthropic", text="done", input_tokens=5, output_tokens=1)
    result = await _run("anthropic", [first, done], Budgets(max_input_tokens=1000))
    assert result.state is OpState.ESCALATED  # 150,005 prompt tokens against 1,000
    assert result.stop is not None and "max_input_tokens" in result.stop.reason


# --- prices -----------------------------------------------------------------------------


def test_a_price_does_not_stretch_to_another_model_sharing_its_prefix() -> None:
    budgets = Budgets(max_cost=Decimal(10), prices={"o1": (15, 60), "gpt-4o": (Decimal("2.5"), 10)})
    assert budgets.price_for("o1-pro") is None
    assert budgets.price_for("gpt-4o-mini") is None
    assert budgets.price_for("gpt-4o-2024-08-06") == (Decimal("2.5"), Decimal(10))
    assert budgets.price_for("o1-20241217") == (Decimal(15), Decimal(60))
    assert budgets.price_for("gpt-4o-latest") == (Decimal("2.5"), Decimal(10))
    tracker = BudgetTracker(budgets, now=0)
    spent = tracker.record_turn(Usage(input_tokens=1, output_tokens=1), "o1-pro")
    assert spent is not None and spent.budget == "max_cost"  # unpriced: the cap stops it


def test_a_preview_or_short_dated_name_takes_its_models_price() -> None:
    budgets = Budgets(max_cost=Decimal(10), prices={"gemini-2.5-flash": (1, 2), "o1": (15, 60)})
    assert budgets.price_for("gemini-2.5-flash-preview-05-20") == (Decimal(1), Decimal(2))
    assert budgets.price_for("o1-preview") == (Decimal(15), Decimal(60))
    assert budgets.price_for("gemini-2.5-flash-lite") is None  # another model
