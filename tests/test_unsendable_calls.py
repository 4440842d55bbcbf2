"""A call the provider would refuse to take back in the conversation (a name no tool can
have, such as OpenAI's hallucinated ``multi_tool_use.parallel``) fails the turn before
any of its calls runs: echoed, it would make the next request fail after the turn's
other side effects. Call ids are not held to a pattern. Real loopback replay server,
every family."""

from __future__ import annotations

import re

import pytest

from callgate.engine import OpState, Registry, RiskClass, ToolContext, ToolSpec
from callgate.engine.core.adapter import load_adapter, unsendable_call
from callgate.engine.core.outcome import ProposedCall
from callgate.engine.core.states import OpInput
from callgate.engine.runtime.replay import ReplayServer

from .conftest import FAMILIES
from .loop_helpers import OrderArgs, make_runner, turn

pytestmark = pytest.mark.anyio

# A name each family's API refuses back (Gemini takes dots and colons, not spaces).
BAD_NAME = {
    "openai_chat": "multi_tool_use.parallel",
    "openai_responses": "multi_tool_use.parallel",
    "anthropic": "functions.pay",
    "gemini": "pay now",
    "gemini_interactions": "pay now",
}


def _registry(ran: list[str]) -> Registry:
    def write(args: OrderArgs, ctx: ToolContext) -> dict[str, bool]:
        ran.append(args.order_id)
        return {"done": True}

    return Registry(
        [
            ToolSpec(
                name="mark_shipped",
                description="Mark shipped.",
                args_type=OrderArgs,
                handler=write,
                risk=RiskClass.WRITE,
            )
        ]
    )


@pytest.mark.parametrize("provider", FAMILIES)
async def test_a_turn_with_a_call_the_provider_cannot_take_back_runs_nothing(
    provider: str,
) -> None:
    ran: list[str] = []
    calls = [
        ("c1", "mark_shipped", '{"order_id":"o1"}'),
        ("c2", BAD_NAME[provider], '{"order_id":"o2"}'),
    ]
    async with ReplayServer([turn(provider, calls=calls), turn(provider, text="ok")]) as server:
        runner, progress = make_runner(provider, server.base_url, _registry(ran))
        result = await runner.start("Ship o1")
        asked = len(server.requests)
    assert ran == []  # the valid call did not run either
    assert asked == 1
    assert result.state is OpState.FAILED
    assert result.stop is not None and result.stop.input is OpInput.API_FAILURE
    assert "refuses in a conversation" in result.stop.reason
    progress.path()


@pytest.mark.parametrize("provider", FAMILIES)
async def test_an_unknown_tool_with_a_name_the_provider_takes_back_is_still_answered(
    provider: str,
) -> None:
    # The model recovers from an unknown tool whose name can be echoed (the README's
    # unknown-tool scenario): only unsendable names fail the turn.
    ran: list[str] = []
    calls = [("c1", "no_such_tool", '{"order_id":"o1"}')]
    async with ReplayServer([turn(provider, calls=calls), turn(provider, text="ok")]) as server:
        runner, _ = make_runner(provider, server.base_url, _registry(ran))
        result = await runner.start("Ship o1")
    assert result.state is OpState.COMPLETED
    assert [c.status for c in result.calls] == ["unknown_tool"]


def _call(name: str, call_id: str = "toolu_01", derived: bool = False) -> ProposedCall:
    return ProposedCall(
        index=0,
        call_id=call_id,
        name=name,
        arguments={},
        raw_arguments=b"{}",
        call_id_derived=derived,
    )


def test_call_ids_are_not_held_to_a_pattern_and_names_are_per_family() -> None:
    # Compatible Anthropic servers serving Kimi K2 issue and take back "functions.x:0".
    anthropic = load_adapter("anthropic")
    assert anthropic.unsendable(_call("pay", "functions.pay:0")) is None  # type: ignore[attr-defined]
    assert anthropic.unsendable(_call("functions.pay", "toolu_01")) is not None  # type: ignore[attr-defined]
    gemini = load_adapter("gemini")
    assert gemini.unsendable(_call("ns.pay:v1", "cgcall_x", derived=True)) is None  # type: ignore[attr-defined]
    for provider in FAMILIES:  # every name a ToolSpec can have is sendable everywhere
        adapter = load_adapter(provider)
        assert adapter.unsendable(_call("A_b-9" * 12)) is None, provider  # type: ignore[attr-defined]
    assert set(BAD_NAME) == set(FAMILIES)


def test_a_call_id_pattern_judges_the_models_ids_never_a_derived_one() -> None:
    # unsendable_call's optional id pattern (for a family whose API refuses some ids):
    # an id callgate derived is never sent, so it is never held to the pattern.
    name, call_id = re.compile(r"[A-Za-z0-9_-]{1,64}"), re.compile(r"toolu_[A-Za-z0-9]+")
    assert unsendable_call(_call("pay", "cg:0", derived=True), name, call_id) is None
    reason = unsendable_call(_call("pay", "cg:0"), name, call_id)
    assert reason is not None and "call id 'cg:0'" in reason
    assert unsendable_call(_call("pay", "toolu_01"), name, call_id) is None
