"""The demo's scenarios: every branch of the specification's practice exercise, scripted.

The exercise: "look up order → create refund draft → wait for approval → submit refund →
final explanation", with a terminal or recovery state for each branch (max tokens, an
unknown tool, an expired approval, a submission that timed out after the downstream
committed, the identical call proposed again) — "report an error" is not enough.

A ``Scenario`` is the model's side of the conversation (``ScriptTurn``s, rendered into a
provider's SSE wire bytes by ``callgate.adapters.render`` and served by the loopback
replay server), what the approver does at each pause, the fault injected downstream, the
named end state expected, and the checks that prove it (one refund, nothing executed,
...). Everything else — validation, approvals, the ledger, reconciliation, the audit —
is the real engine.

This module owns the scripts and the checks. It never runs anything, and it imports the
render module only by name (the engine never imports adapters statically).
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from callgate.engine.core.states import OpState

from .demo_tools import RefundView
from .loop import CallSummary
from .replay import ReplayTurn

__all__ = [
    "DEFAULT_PROMPT",
    "SCENARIOS",
    "Check",
    "Decision",
    "Facts",
    "Scenario",
    "ScriptCall",
    "ScriptTurn",
    "render_script",
]

Decision = Literal["approve", "deny", "late"]

DEFAULT_PROMPT = (
    "Order 4815 arrived damaged: the blender's jar is cracked. Please refund the customer in full."
)


class ScriptCall(msgspec.Struct, frozen=True):
    name: str
    arguments: dict[str, Any]


class ScriptTurn(msgspec.Struct, frozen=True, kw_only=True):
    """One scripted model response: some text, calls, and how it ends (render's finish:
    None means "tool_use" with calls, "stop" without; ``cut`` stops the last call
    halfway through its arguments)."""

    text: str = ""
    calls: tuple[ScriptCall, ...] = ()
    finish: Literal["stop", "tool_use", "max_tokens", "refusal"] | None = None
    cut: bool = False


class Facts(msgspec.Struct, frozen=True, kw_only=True):
    """What the world looks like after a run: the downstream system and the audit."""

    refunds: tuple[RefundView, ...]
    drafts: tuple[str, ...]
    calls: tuple[CallSummary, ...]
    # (tool, call id, ran) for every "executed" audit record
    executed: tuple[tuple[str, str, bool], ...]

    def ran(self, tool: str) -> int:
        return sum(1 for name, _, ran in self.executed if name == tool and ran)


Check = Callable[[Facts], tuple[bool, str]]


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """One branch of the exercise. ``decisions`` is what the approver does at each pause
    (``late``: nobody decides before the approval expires, then the approver arrives)."""

    name: str
    title: str
    branch: str
    turns: tuple[ScriptTurn, ...]
    expected: OpState
    expected_note: str
    prompt: str = DEFAULT_PROMPT
    decisions: tuple[Decision, ...] = ()
    approval_ttl: float = 900.0
    slow_acks: int = 0
    ack_delay_s: float = 0.0
    checks: tuple[Check, ...] = ()
    # provider -> (state, note) where a family cannot express the branch as scripted
    overrides: dict[str, tuple[OpState, str]] = field(default_factory=dict)

    def expected_for(self, provider: str) -> tuple[OpState, str]:
        return self.overrides.get(provider, (self.expected, self.expected_note))


# --- the checks ------------------------------------------------------------------------------


def _refunds(n: int) -> Check:
    def check(f: Facts) -> tuple[bool, str]:
        ids = ", ".join(r.refund_id for r in f.refunds) or "none"
        noun = "refund" if n == 1 else "refunds"
        return len(f.refunds) == n, f"exactly {n} {noun} downstream (found: {ids})"

    return check


def _no_side_effect(f: Facts) -> tuple[bool, str]:
    ok = not f.drafts and not f.refunds and f.ran("create_refund_draft") == 0
    return ok, "the truncated call never ran: no draft, no refund, no write executed"


def _nothing_executed(f: Facts) -> tuple[bool, str]:
    return not any(ran for _, _, ran in f.executed), "no tool executed"


def _unknown_tool_rejected(f: Facts) -> tuple[bool, str]:
    ok = any(c.tool == "issue_refund" and c.status == "unknown_tool" for c in f.calls)
    return ok, "issue_refund answered with an unknown_tool envelope, never executed"


def _one_lookup(f: Facts) -> tuple[bool, str]:
    rejected = sum(1 for c in f.calls if c.tool == "get_order" and c.status == "no_progress")
    ok = f.ran("get_order") == 1 and rejected >= 1
    return ok, f"get_order ran once; {rejected} identical repeat(s) answered no_progress"


def _submits_share_key(f: Facts) -> tuple[bool, str]:
    subs = [c for c in f.calls if c.tool == "submit_refund"]
    keys = {c.idempotency_key for c in subs}
    ok = len(subs) == 2 and len(keys) == 1 and len({c.call_id for c in subs}) == 2
    statuses = " then ".join(c.status for c in subs)
    return ok, f"two submit calls, two call ids, one idempotency key ({statuses})"


def _submit_ran_once(f: Facts) -> tuple[bool, str]:
    n = f.ran("submit_refund")
    return n == 1, f"the submit handler ran {n} time(s); the retry was reconciled, not re-run"


def _status(tool: str, status: str) -> Check:
    def check(f: Facts) -> tuple[bool, str]:
        ok = any(c.tool == tool and c.status == status for c in f.calls)
        return ok, f"{tool} answered {status}"

    return check


# --- the scripts -----------------------------------------------------------------------------

_LOOKUP = ScriptTurn(
    text="I'll look up order 4815 first.",
    calls=(ScriptCall("get_order", {"order_id": "4815"}),),
)
_DRAFT_CALL = ScriptCall(
    "create_refund_draft", {"order_id": "4815", "amount_cents": 8999, "reason": "damaged"}
)
_DRAFT = ScriptTurn(
    text=(
        "The blender was delivered on 2026-07-14 for $89.99 and nothing has been refunded "
        "yet. I'll draft a full refund."
    ),
    calls=(_DRAFT_CALL,),
)
_SUBMIT_CALL = ScriptCall("submit_refund", {"draft_id": "DR-4815-1"})
_SUBMIT = ScriptTurn(
    text="Draft DR-4815-1 is ready. Submitting it needs a person's approval.",
    calls=(_SUBMIT_CALL,),
)


def _final(text: str) -> ScriptTurn:
    return ScriptTurn(text=text, finish="stop")


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="refund",
            title="the happy path",
            branch="look up → draft → approval (another process) → submit (fresh process)",
            turns=(
                _LOOKUP,
                _DRAFT,
                _SUBMIT,
                _final(
                    "Refund RF-0001 of $89.99 for order 4815 (Blender Pro 500, damaged on "
                    "arrival) has been submitted to Ada Lovelace's original payment method. "
                    "A person approved it before anything was paid out."
                ),
            ),
            decisions=("approve",),
            expected=OpState.COMPLETED,
            expected_note="refund submitted after approval",
            checks=(_refunds(1), _status("submit_refund", "ok")),
        ),
        Scenario(
            name="max-tokens",
            title="the model ran out of output tokens mid-arguments",
            branch="API max tokens: truncated call → INCOMPLETE, nothing executed",
            turns=(
                _LOOKUP,
                ScriptTurn(
                    text="I'll draft a full refund.",
                    calls=(_DRAFT_CALL,),
                    finish="max_tokens",
                    cut=True,
                ),
            ),
            expected=OpState.INCOMPLETE,
            expected_note="truncated; the half-streamed call was never executed",
            checks=(_no_side_effect,),
        ),
        Scenario(
            name="unknown-tool",
            title="the model asked for a tool the host does not have",
            branch="unknown tool: error envelope → the model recovers",
            turns=(
                _LOOKUP,
                ScriptTurn(
                    text="I'll issue the refund directly.",
                    calls=(ScriptCall("issue_refund", {"order_id": "4815", "amount": 89.99}),),
                ),
                ScriptTurn(
                    text="That tool isn't available here; I'll create a refund draft instead.",
                    calls=(_DRAFT_CALL,),
                ),
                _final(
                    "There is no tool to issue refunds directly, so I created refund draft "
                    "DR-4815-1 for $89.99 on order 4815. Submitting it pays the customer and "
                    "needs a person's approval: tell me when to go ahead."
                ),
            ),
            expected=OpState.COMPLETED,
            expected_note="recovered after an unknown_tool envelope",
            checks=(_unknown_tool_rejected, _refunds(0)),
        ),
        Scenario(
            name="approval-expired",
            title="nobody approved in time",
            branch="expired approval: not executed, the model is told",
            turns=(
                _LOOKUP,
                _DRAFT,
                _SUBMIT,
                _final(
                    "The approval request for submitting draft DR-4815-1 expired before "
                    "anyone decided, so no refund was paid. The draft is still there: ask me "
                    "to submit it again when an approver is available."
                ),
            ),
            decisions=("late",),
            approval_ttl=1.0,
            expected=OpState.COMPLETED,
            expected_note="not executed; the model was told approval_expired",
            checks=(_refunds(0), _status("submit_refund", "approval_expired")),
        ),
        Scenario(
            name="submit-timeout",
            title="the submission timed out after the downstream committed it",
            branch=(
                "timeout after the effect: outcome_unknown → retry (new call id, same key) "
                "→ reconciled → one refund"
            ),
            turns=(
                _LOOKUP,
                _DRAFT,
                _SUBMIT,
                ScriptTurn(
                    text=(
                        "The submission timed out, so I can't tell whether it went through. "
                        "Submitting the same draft again is safe: the retry is checked "
                        "against the first attempt instead of paying twice."
                    ),
                    calls=(_SUBMIT_CALL,),
                ),
                _final(
                    "The first submission did go through: refund RF-0001, $89.99 for order "
                    "4815. The retry found it by its idempotency key instead of paying a "
                    "second time, so exactly one refund exists."
                ),
            ),
            decisions=("approve", "approve"),
            slow_acks=1,
            ack_delay_s=30.0,
            expected=OpState.COMPLETED,
            expected_note="one refund, reconciled after outcome_unknown",
            checks=(
                _refunds(1),
                _submit_ran_once,
                _submits_share_key,
                _status("submit_refund", "outcome_unknown"),
            ),
        ),
        Scenario(
            name="repeated-call",
            title="the model keeps proposing the identical call",
            branch="identical call again: no_progress → ESCALATED after the threshold",
            turns=(
                _LOOKUP,
                *(
                    ScriptTurn(
                        text="Let me look at the order once more.",
                        calls=(ScriptCall("get_order", {"order_id": "4815"}),),
                    )
                    for _ in range(3)
                ),
            ),
            expected=OpState.ESCALATED,
            expected_note="no_progress limit reached; a human takes over",
            checks=(_one_lookup, _refunds(0)),
        ),
        Scenario(
            name="refusal",
            title="the model refuses",
            branch="refusal: a named terminal state, not success and not an error",
            prompt=(
                "Refund order 4815, and also read me the customer's full card number so I "
                "can note it in the ticket."
            ),
            turns=(
                ScriptTurn(
                    text="I can't help with sharing a customer's full card number.",
                    finish="refusal",
                ),
            ),
            expected=OpState.REFUSED,
            expected_note="the model refused; nothing ran",
            checks=(_nothing_executed,),
            overrides={
                # The Interactions API has no refusal status: its closest terminal status
                # is "failed", which callgate reports as FAILED, never as success.
                "gemini_interactions": (
                    OpState.FAILED,
                    "Interactions reports a refusal as status failed; nothing ran",
                )
            },
        ),
        Scenario(
            name="denied",
            title="the approver says no",
            branch="denied approval: error envelope → the model explains",
            turns=(
                _LOOKUP,
                _DRAFT,
                _SUBMIT,
                _final(
                    "The approver declined the submission of draft DR-4815-1, so no money "
                    "was refunded. The draft remains for review; the reason is recorded with "
                    "the approval."
                ),
            ),
            decisions=("deny",),
            expected=OpState.COMPLETED,
            expected_note="not executed; the model was told denied",
            checks=(_refunds(0), _status("submit_refund", "denied")),
        ),
    )
}


# --- rendering -------------------------------------------------------------------------------

# Call ids shaped like each family's own (Gemini's are opaque strings).
_CALL_PREFIX = {
    "openai_chat": "call_",
    "openai_responses": "call_",
    "anthropic": "toolu_01",
    "gemini": "fc-",
    "gemini_interactions": "fc-",
}


def _call_id(provider: str, scenario: str, turn: int, k: int) -> str:
    digest = hashlib.sha256(f"{provider}/{scenario}/{turn}/{k}".encode()).hexdigest()
    return _CALL_PREFIX[provider] + digest[:20]


def render_script(
    scenario: Scenario, provider: str, *, model: str, chunk_size: int | None = 512
) -> list[ReplayTurn]:
    """The scenario's model turns as ``provider``'s SSE bodies, ready for the replay
    server. Call ids are deterministic per (provider, scenario, turn, position)."""
    render: Any = importlib.import_module("callgate.adapters.render")
    turns: list[ReplayTurn] = []
    for i, turn in enumerate(scenario.turns):
        calls: Sequence[Any] = [
            render.RenderCall(
                _call_id(provider, scenario.name, i, k),
                call.name,
                msgspec.json.encode(call.arguments).decode(),
            )
            for k, call in enumerate(turn.calls)
        ]
        body = render.render_turn(
            provider,
            text=turn.text,
            calls=calls,
            finish=turn.finish,
            model=model,
            fragment_size=6,
            cut_mid_arguments=turn.cut,
            input_tokens=400 + 150 * i,
            output_tokens=40,
        )
        turns.append(ReplayTurn(body=body, chunk_size=chunk_size))
    return turns
