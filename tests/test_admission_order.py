"""Calls take the slots free at once in proposal order, on every backend.

Each call's task acquired its own slots, so the order was the order the backend first
ran the tasks: FIFO on asyncio, shuffled on purpose on trio, where with
``max_parallelism`` below the number of calls a later slow call could take the slot an
earlier fast one was proposed for (and the fast one then timed out).
"""

from __future__ import annotations

import anyio
import pytest

from callgate.engine.core.registry import Registry, ToolContext, ToolSpec
from callgate.engine.runtime.dispatch import execute_calls

from .test_dispatch import N, _ctx, _executables

pytestmark = pytest.mark.anyio


async def test_the_free_slots_go_to_the_first_calls_proposed() -> None:
    entered: list[str] = []

    async def work(args: N, ctx: ToolContext) -> int:
        entered.append(ctx.call_id)
        await anyio.sleep(0.01)
        return args.n

    registry = Registry([ToolSpec(name="t", description="t", args_type=N, handler=work)])
    for _ in range(20):  # trio reverses a batch of new tasks about every other time
        entered.clear()
        results = await execute_calls(
            _executables(registry, ["t"] * 5), _ctx(parallelism=2), remaining_seconds=30
        )
        assert [r.status for r in results] == ["ok"] * 5
        assert sorted(entered[:2]) == ["call_0", "call_1"], entered


async def test_slots_taken_for_calls_cut_before_they_ran_are_given_back() -> None:
    async def work(args: N, ctx: ToolContext) -> int:
        return args.n

    spec = ToolSpec(name="t", description="t", args_type=N, handler=work, max_concurrency=2)
    registry = Registry([spec])
    ctx = _ctx(parallelism=3)
    results = await execute_calls(_executables(registry, ["t"] * 4), ctx, remaining_seconds=0.0)
    assert [(r.status, r.ran) for r in results] == [("timeout", False)] * 4
    assert ctx.limiter.borrowed_tokens == 0
    assert ctx.tool_limiter(spec) is not None
    assert ctx.tool_limiter(spec).borrowed_tokens == 0


@pytest.mark.parametrize("limit", ["tool", "batch"])
async def test_calls_waiting_for_a_one_slot_limiter_take_it_in_proposal_order(limit: str) -> None:
    # A tool limited to one call at a time runs a turn's calls one after the other, in
    # the order proposed (and so does a batch of one slot): waiting calls queue behind the
    # call proposed before them, not in the order the backend first runs their tasks.
    entered: list[str] = []

    async def work(args: N, ctx: ToolContext) -> int:
        entered.append(ctx.call_id)
        await anyio.sleep(0.002)
        return args.n

    one = 1 if limit == "tool" else None
    registry = Registry(
        [ToolSpec(name="t", description="t", args_type=N, handler=work, max_concurrency=one)]
    )
    for _ in range(15):
        entered.clear()
        results = await execute_calls(
            _executables(registry, ["t"] * 5),
            _ctx(parallelism=8 if limit == "tool" else 1),
            remaining_seconds=30,
        )
        assert [r.status for r in results] == ["ok"] * 5
        assert entered == [f"call_{i}" for i in range(5)]


@pytest.mark.parametrize(
    "names", [["u", "t", "u", "t"], ["t", "u", "t", "u"], ["t", "t", "u", "t"]]
)
async def test_a_batch_of_one_runs_calls_with_their_own_limits_in_proposal_order(
    names: list[str],
) -> None:
    # With max_parallelism=1 a turn runs strictly in sequence. A call that took its
    # tool's one slot still waits for the batch's: the call behind it must not get the
    # batch slot first (it queues only once the call ahead holds all of its slots).
    entered: list[str] = []

    async def work(args: N, ctx: ToolContext) -> int:
        entered.append(ctx.call_id)
        await anyio.sleep(0.002)
        return args.n

    registry = Registry(
        [
            ToolSpec(name="t", description="t", args_type=N, handler=work, max_concurrency=1),
            ToolSpec(name="u", description="u", args_type=N, handler=work),
        ]
    )
    for _ in range(15):
        entered.clear()
        ctx = _ctx(parallelism=1)
        results = await execute_calls(_executables(registry, names), ctx, remaining_seconds=30)
        assert [r.status for r in results] == ["ok"] * len(names)
        assert entered == [f"call_{i}" for i in range(len(names))]
        assert ctx.limiter.borrowed_tokens == 0


async def test_a_chained_call_behind_one_that_fails_or_times_out_still_runs() -> None:
    # The call ahead in the chain gives way however it ends (an error, its deadline).
    entered: list[str] = []

    async def boom(args: N, ctx: ToolContext) -> int:
        entered.append(ctx.call_id)
        raise RuntimeError("no")

    async def slow(args: N, ctx: ToolContext) -> int:
        entered.append(ctx.call_id)
        await anyio.sleep(5)
        return args.n

    async def work(args: N, ctx: ToolContext) -> int:
        entered.append(ctx.call_id)
        return args.n

    registry = Registry(
        [
            ToolSpec(name="b", description="b", args_type=N, handler=boom, max_concurrency=1),
            ToolSpec(name="s", description="s", args_type=N, handler=slow, timeout=0.05),
            ToolSpec(name="u", description="u", args_type=N, handler=work),
        ]
    )
    ctx = _ctx(parallelism=1)
    results = await execute_calls(
        _executables(registry, ["u", "b", "s", "u", "b"]), ctx, remaining_seconds=30
    )
    assert [r.status for r in results] == ["ok", "handler_error", "timeout", "ok", "handler_error"]
    assert entered == [f"call_{i}" for i in range(5)]
    assert ctx.limiter.borrowed_tokens == 0
