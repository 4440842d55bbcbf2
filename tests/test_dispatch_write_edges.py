"""Side effects at the edges of dispatch, end to end on every family (real SQLite file
store, real loopback replay server):

- a write handler that edits its arguments in place is still answered (its idempotency
  key is callgate's, computed before any handler ran), and the effect ran once;
- a write whose value could not go back (outcome unknown) stays unknown when the model
  repeats the call: the ledger's replay settles nothing, the operation escalates;
- a write whose handler raised is final: its identical retry is not run again.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest

from callgate.engine.core.guards import Budgets
from callgate.engine.core.registry import Registry, RiskClass, ToolContext, ToolSpec
from callgate.engine.core.states import OpInput, OpState
from callgate.engine.runtime.replay import ReplayServer
from callgate.engine.store.sqlite import SQLiteStore

from .conftest import FAMILIES
from .loop_helpers import make_runner, turn, wire_results

pytestmark = pytest.mark.anyio


class Order(msgspec.Struct, forbid_unknown_fields=True):
    items: list[str]


def _write(handler: object) -> Registry:
    return Registry(
        [
            ToolSpec(
                name="place_order",
                description="Place an order.",
                args_type=Order,
                handler=handler,  # type: ignore[arg-type]
                risk=RiskClass.WRITE,
            )
        ]
    )


CALL = '{"items":["b","a"]}'


@pytest.mark.parametrize("provider", FAMILIES)
async def test_a_write_handler_that_edits_its_arguments_is_still_answered(
    provider: str, tmp_path: Path
) -> None:
    effects: list[str] = []

    async def place(args: Order, ctx: ToolContext) -> str:
        args.items.sort()  # host code normalising its input in place
        args.items.append("c")
        effects.append(ctx.idempotency_key)
        return "placed"

    turns = [turn(provider, calls=[("c1", "place_order", CALL)]), turn(provider, text="Done.")]
    async with SQLiteStore(tmp_path / "db") as store, ReplayServer(turns) as server:
        runner, _ = make_runner(provider, server.base_url, _write(place), store=store)
        result = await runner.start("go")
        (answer,) = wire_results(provider, server.requests[1])
    assert result.state is OpState.COMPLETED, result.stop
    assert [(c.status, c.idempotency_key) for c in result.calls] == [("ok", effects[0])]
    assert answer.payload == {"result": "placed"} and len(effects) == 1


@pytest.mark.parametrize("provider", ["openai_chat", "anthropic", "gemini"])
async def test_a_repeated_write_whose_outcome_is_unknown_stays_unknown(
    provider: str, tmp_path: Path
) -> None:
    runs: list[str] = []

    async def place(args: Order, ctx: ToolContext) -> object:
        runs.append(ctx.call_id)
        return {"at": object()}  # the effect happened; the value is not JSON data

    turns = [
        turn(provider, calls=[("c1", "place_order", CALL)]),
        turn(provider, calls=[("c2", "place_order", CALL)]),  # the model repeats it
        turn(provider, text="Your order went through."),
    ]
    async with SQLiteStore(tmp_path / "db") as store, ReplayServer(turns) as server:
        runner, _ = make_runner(provider, server.base_url, _write(place), store=store)
        result = await runner.start("go")
    assert runs == ["c1"]
    assert [c.status for c in result.calls] == ["outcome_unknown", "outcome_unknown"]
    assert result.state is OpState.ESCALATED and result.stop is not None
    assert result.stop.input is OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE


@pytest.mark.parametrize("provider", ["openai_chat", "anthropic", "gemini"])
async def test_a_write_whose_handler_raised_is_not_run_again(provider: str, tmp_path: Path) -> None:
    runs: list[str] = []

    async def place(args: Order, ctx: ToolContext) -> str:
        runs.append(ctx.call_id)
        raise RuntimeError("downstream said 503")

    turns = [
        turn(provider, calls=[("c1", "place_order", CALL)]),
        turn(provider, calls=[("c2", "place_order", CALL)]),
        turn(provider, text="Sorry."),
    ]
    async with SQLiteStore(tmp_path / "db") as store, ReplayServer(turns) as server:
        runner, _ = make_runner(provider, server.base_url, _write(place), store=store)
        result = await runner.start("go")
    assert runs == ["c1"]
    assert [c.status for c in result.calls] == ["handler_error", "no_progress"]
    assert result.state is OpState.COMPLETED


async def test_a_write_that_edits_its_arguments_and_outlives_the_deadline_escalates(
    tmp_path: Path,
) -> None:
    async def place(args: Order, ctx: ToolContext) -> str:
        args.items.append("c")  # edited, then cut by the operation deadline
        await anyio.sleep(30)
        return "placed"

    provider = "openai_chat"
    turns = [turn(provider, calls=[("c1", "place_order", CALL)]), turn(provider, text="Done.")]
    async with SQLiteStore(tmp_path / "db") as store, ReplayServer(turns) as server:
        runner, _ = make_runner(
            provider,
            server.base_url,
            _write(place),
            store=store,
            budgets=Budgets(deadline_seconds=1.0),
        )
        result = await runner.start("go")
    # Answered under the key it held when it started: the may-have-happened effect is
    # the operation's ending, not a binding failure that loses the call.
    assert result.state is OpState.ESCALATED, result.stop
    assert [c.status for c in result.calls] == ["outcome_unknown"]
