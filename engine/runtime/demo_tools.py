"""The demo's business side: a fake order/refund system and the registry of tools over it.

``Downstream`` is the system the tools talk to — orders, refund drafts and submitted
refunds — kept in a small SQLite file in the demo's working directory, so the processes
of one demo run (the one that starts the operation, the approver, the fresh process that
resumes it) all see the same world. It is deliberately naive about retries: submitting
the same draft twice creates two refunds. Exactly-once is callgate's job (the idempotency
ledger and the ``reconcile`` hook), and the demo shows that it does it.

``build_registry`` declares the three tools of the specification's practice exercise:
``get_order`` (read), ``create_refund_draft`` (write) and ``submit_refund``
(irreversible: a human approves it, and a timed-out submission is reconciled by its
idempotency key). Faults (a slow acknowledgement after the refund committed) are
configured in the downstream file, so every process injects the same ones.

This module never talks to a model, never decides a call's fate (the registry's
authorization, policy and approval rules are declarations the validator applies) and
never holds state in memory between calls: the file is the state.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import anyio.to_thread
import msgspec

from callgate.engine.core.registry import (
    AuthContext,
    Decision,
    PolicyContext,
    Registry,
    Revisions,
    RiskClass,
    ToolContext,
    ToolSpec,
)

__all__ = [
    "DEMO_ROLES",
    "DEMO_SUBJECT",
    "DEMO_TENANT",
    "REFUND_LIMIT_CENTS",
    "Downstream",
    "GetOrderArgs",
    "RefundDraftArgs",
    "RefundView",
    "SubmitRefundArgs",
    "build_registry",
]

DEMO_TENANT = "acme"
DEMO_SUBJECT = "agent:dana"
DEMO_ROLES = ("support",)
# Refunds above this need a different process (a supervisor): the draft policy denies them.
REFUND_LIMIT_CENTS = 50_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    order_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, customer TEXT NOT NULL,
    item TEXT NOT NULL, status TEXT NOT NULL, total_cents INTEGER NOT NULL,
    currency TEXT NOT NULL, delivered_on TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS drafts (
    draft_id TEXT PRIMARY KEY, order_id TEXT NOT NULL, amount_cents INTEGER NOT NULL,
    reason TEXT NOT NULL, client_reference TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS refunds (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, refund_id TEXT NOT NULL, draft_id TEXT NOT NULL,
    order_id TEXT NOT NULL, amount_cents INTEGER NOT NULL, currency TEXT NOT NULL,
    client_reference TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS faults (name TEXT PRIMARY KEY, value REAL NOT NULL,
    remaining INTEGER NOT NULL);
"""

_SEED_ORDERS = (
    (
        "4815",
        DEMO_TENANT,
        "Ada Lovelace",
        "Blender Pro 500",
        "delivered",
        8999,
        "USD",
        "2026-07-14",
    ),
    ("1623", DEMO_TENANT, "Alan Turing", "Kettle Mini", "shipped", 2950, "USD", "-"),
    ("4242", "globex", "Grace Hopper", "Desk Lamp", "delivered", 4500, "USD", "2026-07-02"),
)


# --- argument and result types (what the model is shown and the handlers receive) -------------


class GetOrderArgs(msgspec.Struct, forbid_unknown_fields=True):
    order_id: Annotated[str, msgspec.Meta(pattern=r"^[0-9]{3,12}$", description="Order number")]


class RefundDraftArgs(msgspec.Struct, forbid_unknown_fields=True):
    order_id: Annotated[str, msgspec.Meta(pattern=r"^[0-9]{3,12}$")]
    amount_cents: Annotated[int, msgspec.Meta(gt=0, le=10_000_000, description="In cents")]
    reason: Literal["damaged", "not_received", "wrong_item", "other"]


class SubmitRefundArgs(msgspec.Struct, forbid_unknown_fields=True):
    draft_id: Annotated[str, msgspec.Meta(pattern=r"^DR-[0-9]+-[0-9]+$")]


class RefundView(msgspec.Struct, frozen=True, kw_only=True):
    """A submitted refund as the downstream system reports it."""

    refund_id: str
    draft_id: str
    order_id: str
    amount_cents: int
    currency: str
    status: str = "submitted"


# --- the downstream system -------------------------------------------------------------------


class Downstream:
    """The fake order and payment system, in one SQLite file shared by every process.

    Methods are synchronous (the tools run them in a worker thread). Each write is one
    ``BEGIN IMMEDIATE`` transaction, so concurrent processes serialize on the file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            # A fake system: no fsync per write, so the tools stay far inside their deadlines.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    def reset(self, *, ack_delay_s: float = 0.0, slow_acks: int = 0) -> None:
        """A fresh world: the seed orders, no drafts or refunds, and the injected fault
        (the first ``slow_acks`` submissions commit, then acknowledge after
        ``ack_delay_s`` seconds)."""
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
        finally:
            conn.close()
        with self._tx() as conn:
            conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?, ?)", _SEED_ORDERS)
            conn.execute(
                "INSERT INTO faults VALUES ('slow_ack', ?, ?)", (float(ack_delay_s), slow_acks)
            )

    def get_order(self, tenant: str, order_id: str) -> dict[str, Any] | None:
        with self._tx() as conn:
            row = conn.execute(
                "SELECT order_id, customer, item, status, total_cents, currency, delivered_on"
                " FROM orders WHERE order_id = ? AND tenant = ?",
                (order_id, tenant),
            ).fetchone()
            if row is None:
                return None
            refunded = conn.execute(
                "SELECT COALESCE(SUM(amount_cents), 0) FROM refunds WHERE order_id = ?",
                (order_id,),
            ).fetchone()[0]
        keys = ("order_id", "customer", "item", "status", "total_cents", "currency")
        order = dict(zip(keys, row[:6], strict=True))
        order["delivered_on"] = row[6] if row[6] != "-" else None
        order["refundable_cents"] = row[4] - refunded
        return order

    def create_draft(self, tenant: str, args: RefundDraftArgs, reference: str) -> dict[str, Any]:
        with self._tx() as conn:
            row = conn.execute(
                "SELECT total_cents, currency FROM orders WHERE order_id = ? AND tenant = ?",
                (args.order_id, tenant),
            ).fetchone()
            if row is None:
                return {"accepted": False, "reason": "no such order"}
            if args.amount_cents > row[0]:
                return {"accepted": False, "reason": "amount exceeds the order total"}
            n = conn.execute(
                "SELECT COUNT(*) FROM drafts WHERE order_id = ?", (args.order_id,)
            ).fetchone()[0]
            draft_id = f"DR-{args.order_id}-{n + 1}"
            conn.execute(
                "INSERT INTO drafts VALUES (?, ?, ?, ?, ?)",
                (draft_id, args.order_id, args.amount_cents, args.reason, reference),
            )
        return {
            "accepted": True,
            "draft_id": draft_id,
            "order_id": args.order_id,
            "amount_cents": args.amount_cents,
            "currency": row[1],
            "status": "draft",
        }

    def submit(self, draft_id: str, reference: str) -> tuple[RefundView | None, float]:
        """Commit a refund for the draft (no deduplication: a naive downstream) and say
        how long its acknowledgement takes (the injected fault, consumed here)."""
        with self._tx() as conn:
            draft = conn.execute(
                "SELECT d.order_id, d.amount_cents, o.currency FROM drafts d"
                " JOIN orders o ON o.order_id = d.order_id WHERE d.draft_id = ?",
                (draft_id,),
            ).fetchone()
            if draft is None:
                return None, 0.0
            seq = conn.execute(
                "INSERT INTO refunds (refund_id, draft_id, order_id, amount_cents, currency,"
                " client_reference) VALUES ('', ?, ?, ?, ?, ?)",
                (draft_id, draft[0], draft[1], draft[2], reference),
            ).lastrowid
            refund_id = f"RF-{seq:04d}"
            conn.execute("UPDATE refunds SET refund_id = ? WHERE seq = ?", (refund_id, seq))
            delay = 0.0
            fault = conn.execute(
                "SELECT value, remaining FROM faults WHERE name = 'slow_ack'"
            ).fetchone()
            if fault is not None and fault[1] > 0:
                delay = float(fault[0])
                conn.execute("UPDATE faults SET remaining = remaining - 1 WHERE name = 'slow_ack'")
        view = RefundView(
            refund_id=refund_id,
            draft_id=draft_id,
            order_id=draft[0],
            amount_cents=draft[1],
            currency=draft[2],
        )
        return view, delay

    def find_refund(self, reference: str) -> RefundView | None:
        """The refund submitted with ``reference`` (callgate's idempotency key), if any."""
        with self._tx() as conn:
            row = conn.execute(
                "SELECT refund_id, draft_id, order_id, amount_cents, currency FROM refunds"
                " WHERE client_reference = ? ORDER BY seq LIMIT 1",
                (reference,),
            ).fetchone()
        if row is None:
            return None
        return RefundView(
            refund_id=row[0], draft_id=row[1], order_id=row[2], amount_cents=row[3], currency=row[4]
        )

    def refunds(self) -> list[RefundView]:
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT refund_id, draft_id, order_id, amount_cents, currency FROM refunds"
                " ORDER BY seq"
            ).fetchall()
        return [
            RefundView(
                refund_id=r[0], draft_id=r[1], order_id=r[2], amount_cents=r[3], currency=r[4]
            )
            for r in rows
        ]

    def drafts(self) -> list[str]:
        with self._tx() as conn:
            rows = conn.execute("SELECT draft_id FROM drafts ORDER BY draft_id").fetchall()
        return [r[0] for r in rows]


# --- the registry ----------------------------------------------------------------------------


def _support_only(auth: AuthContext, args: Any) -> Decision:
    if "support" in auth.roles:
        return Decision.allow()
    return Decision.deny("refund tools are for the support role")


def _within_refund_limit(ctx: PolicyContext, args: RefundDraftArgs) -> Decision:
    if args.amount_cents <= REFUND_LIMIT_CENTS:
        return Decision.allow()
    return Decision.deny(f"refunds above {REFUND_LIMIT_CENTS} cents need a supervisor")


def build_registry(downstream: Downstream, *, submit_timeout: float = 2.0) -> Registry:
    """The refund workflow's allowlist. Every process of a demo run builds the same one
    (the same schema versions and policy revisions), which is what lets a fresh process
    revalidate an approved call after the pause."""

    async def get_order(args: GetOrderArgs, ctx: ToolContext) -> dict[str, Any]:
        order = await anyio.to_thread.run_sync(downstream.get_order, ctx.auth.tenant, args.order_id)
        # Another tenant's order is indistinguishable from a missing one.
        return order if order is not None else {"found": False, "order_id": args.order_id}

    async def create_refund_draft(args: RefundDraftArgs, ctx: ToolContext) -> dict[str, Any]:
        return await anyio.to_thread.run_sync(
            downstream.create_draft, ctx.auth.tenant, args, ctx.idempotency_key
        )

    async def submit_refund(args: SubmitRefundArgs, ctx: ToolContext) -> Any:
        # The idempotency key travels as the downstream's client reference: it is how a
        # later attempt finds out whether this one took effect.
        refund, ack_delay = await anyio.to_thread.run_sync(
            downstream.submit, args.draft_id, ctx.idempotency_key
        )
        if refund is None:
            return {"submitted": False, "reason": "no such draft"}
        if ack_delay:
            # The refund is committed downstream; the acknowledgement is late, so the
            # tool's deadline passes and the caller cannot know it succeeded.
            await anyio.sleep(ack_delay)
        return refund

    async def reconcile_refund(key: str, args: SubmitRefundArgs) -> RefundView | None:
        return await anyio.to_thread.run_sync(downstream.find_refund, key)

    refund_revisions = Revisions(policy="refund-policy-3", handler="demo-1", effect="refund-1")
    return Registry(
        [
            ToolSpec(
                name="get_order",
                description="Look up an order by its number: item, status, totals, refundable.",
                args_type=GetOrderArgs,
                handler=get_order,
                risk=RiskClass.READ,
                schema_version="get-order-v1",
                timeout=5.0,
                authorize=_support_only,
            ),
            ToolSpec(
                name="create_refund_draft",
                description=(
                    "Create a refund draft for an order (nothing is paid out). Returns the "
                    "draft id to submit."
                ),
                args_type=RefundDraftArgs,
                handler=create_refund_draft,
                risk=RiskClass.WRITE,
                schema_version="refund-draft-v1",
                timeout=5.0,
                authorize=_support_only,
                policy=_within_refund_limit,
                revisions=refund_revisions,
                # The business intent: this amount back for this order (not the wording).
                idempotency_fields=lambda a: {"order_id": a.order_id, "amount": a.amount_cents},
            ),
            ToolSpec(
                name="submit_refund",
                description=(
                    "Submit a refund draft for payout. Irreversible: a person approves it first."
                ),
                args_type=SubmitRefundArgs,
                handler=submit_refund,
                risk=RiskClass.IRREVERSIBLE,
                schema_version="submit-refund-v1",
                timeout=submit_timeout,
                approval=True,
                authorize=_support_only,
                revisions=refund_revisions,
                reconcile=reconcile_refund,
            ),
        ]
    )
