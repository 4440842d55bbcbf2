"""A refund service with callgate embedded: the model proposes, the service decides.

    python examples/refund_service.py            # a scripted model over loopback HTTP
    python examples/refund_service.py --live     # the real API (OPENAI_API_KEY, ...)
    python examples/refund_service.py --provider anthropic

What to copy: the three ``ToolSpec``s (argument types that forbid unknown fields, a risk
class, authorization, a policy, approval for the irreversible tool, and a ``reconcile``
hook that finds an earlier attempt by its idempotency key), and ``RefundService``, which
is all a web handler needs: ``request_refund`` starts an operation and returns when it
ends or waits for a person; ``decide`` records that person's decision and resumes — in
any process, because everything lives in the store, never in this object.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec

from callgate.engine.core.errors import CallgateError
from callgate.engine.core.registry import (
    AuthContext,
    Decision,
    PolicyContext,
    Registry,
    RiskClass,
    ToolContext,
    ToolSpec,
)
from callgate.engine.runtime.audit_sink import JsonlAuditSink
from callgate.engine.runtime.demo_scenarios import SCENARIOS, render_script
from callgate.engine.runtime.loop import OperationResult, Runner
from callgate.engine.runtime.replay import ReplayServer
from callgate.engine.runtime.transport import ProviderEndpoint
from callgate.engine.store import Store, open_store

# --- your systems (in memory here) -----------------------------------------------------------


class Payments:
    """Stands in for the order database and the payment provider."""

    def __init__(self) -> None:
        self.orders = {"4815": {"item": "Blender Pro 500", "total_cents": 8999, "tenant": "acme"}}
        self.drafts: dict[str, dict[str, Any]] = {}
        self.refunds: dict[str, dict[str, Any]] = {}  # by client reference (idempotency key)


# --- the tools: the only things the model can ask for ------------------------------------------


class GetOrder(msgspec.Struct, forbid_unknown_fields=True):
    order_id: str


class CreateDraft(msgspec.Struct, forbid_unknown_fields=True):
    order_id: str
    amount_cents: int
    reason: str


class SubmitRefund(msgspec.Struct, forbid_unknown_fields=True):
    draft_id: str


def build_registry(pay: Payments) -> Registry:
    def support_only(auth: AuthContext, args: Any) -> bool:
        return "support" in auth.roles

    def at_most_500(ctx: PolicyContext, args: CreateDraft) -> Decision:
        ok = 0 < args.amount_cents <= 50_000
        return Decision.allow() if ok else Decision.deny("outside the self-service limit")

    async def get_order(args: GetOrder, ctx: ToolContext) -> dict[str, Any]:
        order = pay.orders.get(args.order_id)
        if order is None or order["tenant"] != ctx.auth.tenant:
            return {"found": False}
        return {"order_id": args.order_id, "item": order["item"], "total": order["total_cents"]}

    async def create_draft(args: CreateDraft, ctx: ToolContext) -> dict[str, Any]:
        draft_id = f"DR-{args.order_id}-{len(pay.drafts) + 1}"
        pay.drafts[draft_id] = {"order_id": args.order_id, "amount_cents": args.amount_cents}
        return {"draft_id": draft_id, "status": "draft"}

    async def submit_refund(args: SubmitRefund, ctx: ToolContext) -> dict[str, Any]:
        draft = pay.drafts[args.draft_id]
        refund = {"refund_id": f"RF-{len(pay.refunds) + 1:04d}", **draft}
        # Pass the idempotency key downstream: it is how a retry finds this refund.
        pay.refunds[ctx.idempotency_key] = refund
        return refund

    async def find_refund(key: str, args: SubmitRefund) -> dict[str, Any] | None:
        return pay.refunds.get(key)

    return Registry(
        [
            ToolSpec(
                name="get_order",
                description="Look up an order by number.",
                args_type=GetOrder,
                handler=get_order,
                authorize=support_only,
            ),
            ToolSpec(
                name="create_refund_draft",
                description="Draft a refund (pays nothing).",
                args_type=CreateDraft,
                handler=create_draft,
                risk=RiskClass.WRITE,
                authorize=support_only,
                policy=at_most_500,
            ),
            ToolSpec(
                name="submit_refund",
                description="Pay out a refund draft. A person approves it first.",
                args_type=SubmitRefund,
                handler=submit_refund,
                risk=RiskClass.IRREVERSIBLE,  # irreversible: approval required by default
                authorize=support_only,
                reconcile=find_refund,
            ),
        ]
    )


# --- the service your HTTP handlers call --------------------------------------------------------


class RefundService:
    """Holds configuration only. An operation's state lives in the store, so ``decide``
    may run in another process or on another machine than ``request_refund``."""

    def __init__(
        self,
        *,
        store: Store,
        registry: Registry,
        provider: str,
        model: str,
        endpoint: ProviderEndpoint,
        audit: JsonlAuditSink,
    ) -> None:
        self.store = store
        self._runner = Runner(
            provider=provider,
            model=model,
            registry=registry,
            endpoint=endpoint,
            store=store,
            system="You are a support assistant. Refunds need a person's approval.",
            audit=audit.write,
        )

    async def request_refund(self, text: str, *, tenant: str, agent: str) -> OperationResult:
        return await self._runner.start(text, tenant=tenant, subject=agent, roles=["support"])

    async def decide(
        self, approval_id: str, *, approve: bool, approver: str, reason: str | None = None
    ) -> OperationResult:
        approval = await self.store.decide_approval(
            approval_id, approve, approver, reason, now=time.time()
        )
        return await self._runner.resume(approval.operation_id)


# --- a run from the command line ----------------------------------------------------------------


async def main(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="refund-service-"))
    model = args.model or "gpt-4.1-mini"
    async with contextlib.AsyncExitStack() as stack:
        if args.live:
            endpoint = ProviderEndpoint.from_env(args.provider)
        else:  # the demo's scripted refund conversation, in the provider's wire format
            turns = render_script(SCENARIOS["refund"], args.provider, model=model)
            server = await stack.enter_async_context(ReplayServer(turns))
            endpoint = ProviderEndpoint(base_url=server.base_url, api_key="unused")
        store = await stack.enter_async_context(open_store(f"sqlite:///{workdir}/callgate.db"))
        audit = await stack.enter_async_context(JsonlAuditSink(workdir / "audit.jsonl"))
        pay = Payments()
        service = RefundService(
            store=store,
            registry=build_registry(pay),
            provider=args.provider,
            model=model,
            endpoint=endpoint,
            audit=audit,
        )
        result = await service.request_refund(
            "Order 4815 arrived damaged. Please refund it in full.", tenant="acme", agent="dana"
        )
        print(f"operation {result.operation_id}: {result.state.value}")
        while result.pending_approvals:
            for approval_id in result.pending_approvals:
                print(f"  approving {approval_id} (in a real service: a person, later)")
                result = await service.decide(approval_id, approve=True, approver="alice")
        print(f"operation {result.operation_id}: {result.state.value}")
        print(f"  {result.text}")
        print(f"  refunds paid: {len(pay.refunds)}; audit: {workdir / 'audit.jsonl'}")
    return 0 if result.state.value == "completed" else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", default="openai_responses")
    parser.add_argument("--model", default=None)
    parser.add_argument("--live", action="store_true", help="call the real provider API")
    parser.add_argument("--workdir", default=None)
    return parser.parse_args(argv)


if __name__ == "__main__":
    try:
        sys.exit(anyio.run(main, parse_args()))
    except CallgateError as exc:  # e.g. --live without an API key
        sys.exit(f"refund_service: {exc}")
