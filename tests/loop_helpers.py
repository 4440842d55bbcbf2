"""Shared helpers for the run-loop tests: a runner against the replay server, a progress
recorder that checks every state transition against the table, and per-family readers
of the tool results a follow-up request carried back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from callgate.adapters.render import RenderCall, render_turn
from callgate.engine.core.registry import Registry, RiskClass, ToolContext, ToolSpec
from callgate.engine.core.states import INITIAL, TRANSITIONS, OpInput, OpState
from callgate.engine.runtime.loop import Runner
from callgate.engine.runtime.progress import ProgressEvent, StateChanged
from callgate.engine.runtime.replay import ReceivedRequest, ReplayTurn
from callgate.engine.runtime.transport import ProviderEndpoint, RetryPolicy

__all__ = [
    "FAST_RETRY",
    "Progress",
    "WireResult",
    "make_runner",
    "turn",
    "wire_results",
]

# Retries in tests wait nothing: the policy is exercised, not the clock.
FAST_RETRY = RetryPolicy(max_attempts=3, base_delay=0.0, jitter=0.0)


class Progress:
    """A progress sink that keeps every event and checks each state change is a row of
    the transition table (the loop's own ``transition`` raises otherwise; this also
    proves the events report what the table did)."""

    def __init__(self) -> None:
        self.events: list[ProgressEvent] = []

    async def __call__(self, event: ProgressEvent) -> None:
        self.events.append(event)

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    def path(self) -> list[str]:
        """States visited, starting with the initial one; asserts every step is legal."""
        states = [INITIAL.value]
        for change in self.of(StateChanged):
            assert change.old == states[-1], (change, states)
            key = (OpState(change.old), OpInput(change.input))
            assert key in TRANSITIONS, key
            assert TRANSITIONS[key].value == change.new, (key, change.new)
            states.append(change.new)
        return states


def make_runner(
    provider: str,
    base_url: str,
    registry: Registry,
    *,
    progress: Progress | None = None,
    **kw: Any,
) -> tuple[Runner, Progress]:
    """A runner for ``provider`` against ``base_url``; pass ``progress`` to share one
    event log between runners (e.g. across an approval pause)."""
    progress = progress or Progress()
    kw.setdefault("retry", FAST_RETRY)
    runner = Runner(
        provider=provider,
        model=kw.pop("model", "model-1"),
        registry=registry,
        endpoint=ProviderEndpoint(base_url=base_url, api_key="test-key"),
        progress=progress,
        **kw,
    )
    return runner, progress


def turn(
    provider: str,
    *,
    text: str = "",
    calls: Sequence[tuple[str, str, str]] = (),
    **kw: Any,
) -> ReplayTurn:
    """A scripted turn: ``calls`` are (call_id, name, arguments JSON text)."""
    replay = {k: kw.pop(k) for k in ("chunk_size", "disconnect_after", "delay_s") if k in kw}
    body = render_turn(provider, text=text, calls=[RenderCall(*c) for c in calls], **kw)
    return ReplayTurn(body=body, **replay)


class WireResult(msgspec.Struct, frozen=True):
    """One tool result as it travelled to the provider. ``is_error`` is the family's own
    error flag (None where the family has none: Chat, Responses)."""

    call_id: str | None
    payload: Any
    is_error: bool | None


def wire_results(provider: str, request: ReceivedRequest) -> list[WireResult]:
    """The tool results carried by one request, in wire order, for any family."""
    body = request.json()
    out: list[WireResult] = []
    if provider == "openai_chat":
        for m in body["messages"]:
            if m.get("role") == "tool":
                out.append(WireResult(m["tool_call_id"], _loads(m["content"]), None))
    elif provider == "openai_responses":
        for item in body["input"]:
            if item.get("type") == "function_call_output":
                out.append(WireResult(item["call_id"], _loads(item["output"]), None))
    elif provider == "anthropic":
        last = body["messages"][-1]
        assert last["role"] == "user"
        for block in last["content"]:
            assert block["type"] == "tool_result"
            flag = block.get("is_error", False)
            out.append(WireResult(block["tool_use_id"], _loads(block["content"]), flag))
    elif provider == "gemini":
        last = body["contents"][-1]
        assert last["role"] == "user"
        for part in last["parts"]:
            fr = part["functionResponse"]
            response = fr["response"]
            assert isinstance(response, dict) and len(response) == 1
            (key, value) = next(iter(response.items()))
            assert key in ("output", "error")
            # Gemini names the two cases itself, so the adapter sends the bare value;
            # re-wrap it into callgate's model_result shape for the shared assertions.
            wrapped = {"error": value} if key == "error" else {"result": value}
            out.append(WireResult(fr.get("id"), wrapped, key == "error"))
    elif provider == "gemini_interactions":
        for item in body["input"]:
            if item.get("type") == "function_result":
                flag = item.get("is_error", False)
                out.append(WireResult(item["call_id"], _loads(item["result"]), flag))
    else:  # pragma: no cover - a new family needs its reader here
        raise AssertionError(provider)
    return out


def _loads(text: Any) -> Any:
    assert isinstance(text, str), text
    return msgspec.json.decode(text)


class OrderArgs(msgspec.Struct, forbid_unknown_fields=True):
    order_id: str


def refund_and_lookup(ran: list[str], refund_policy: Any = None) -> Registry:
    """An irreversible ``refund`` (needs approval) and a read ``get_order``, both over an
    order id; each run is appended to ``ran`` as "<tool> <order_id>"."""

    def refund(args: OrderArgs, ctx: ToolContext) -> dict[str, object]:
        ran.append(f"refund {args.order_id}")
        return {"refunded": True}

    def get_order(args: OrderArgs, ctx: ToolContext) -> dict[str, object]:
        ran.append(f"get_order {args.order_id}")
        return {"status": "shipped"}

    return Registry(
        [
            ToolSpec(
                name="refund",
                description="Refund an order.",
                args_type=OrderArgs,
                handler=refund,
                risk=RiskClass.IRREVERSIBLE,
                policy=refund_policy,
            ),
            ToolSpec(
                name="get_order",
                description="Look up an order.",
                args_type=OrderArgs,
                handler=get_order,
                risk=RiskClass.READ,
            ),
        ]
    )


def chat_runner(base_url: str, registry: Registry, store: Any, **kw: Any) -> Runner:
    """A Chat Completions runner on the loopback replay server at ``base_url``."""
    kw.setdefault("retry", FAST_RETRY)
    return Runner(
        provider="openai_chat",
        model="gpt-4o",
        registry=registry,
        endpoint=ProviderEndpoint(base_url=base_url, api_key="sk-test"),
        store=store,
        **kw,
    )
