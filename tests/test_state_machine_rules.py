"""A Hypothesis state machine over the operation state machine and the call lifecycle.

The rules play the run loop's part with callgate's real pieces: every phase change goes
through ``states.transition``; proposals are judged by ``validation.validate_turn`` (a
small registry: a read tool, a write tool, an irreversible tool that needs approval)
with a real ``BudgetTracker``; approvals live in a ``MemoryStore`` (created, decided late
or in time, consumed once, as the run loop does); side effects go through the store's
idempotency ledger; results are bound with ``binding.bind`` and checked with
``correlation.verify_result_set``. Hypothesis picks proposals (unknown tools, bad
arguments, reused call ids, repeated intents), approvals, expiries, retries, crashes
(the handler's effect lands, then the process dies before ``ledger_finish``; or it dies
before the effect) and duplicated results.

The invariants are checked against facts kept independently of the code under test:
a handler runs only for a registered tool, with valid arguments, on the first use of a
call id in its response and, for the irreversible tool, with a human approval of exactly
those arguments that was consumed in time; no business intent takes effect twice; every
transition taken is in ``TRANSITIONS``; and from wherever a run stops, a plain drain
(deny what waits, recover a crash, answer with final text) reaches a terminal state.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from callgate.engine.core.binding import BindingContext, TrustedCall, bind
from callgate.engine.core.correlation import CorrelationError, verify_result_set
from callgate.engine.core.envelope import ErrorCode, ErrorEnvelope
from callgate.engine.core.errors import IllegalTransition
from callgate.engine.core.guards import Budgets, BudgetTracker
from callgate.engine.core.outcome import (
    OutcomeKind,
    ProposedCall,
    ProviderErrorInfo,
    TurnOutcome,
    Usage,
)
from callgate.engine.core.registry import AuthContext, Registry, RiskClass, ToolSpec, args_digest
from callgate.engine.core.states import (
    TERMINAL,
    TRANSITIONS,
    OpInput,
    OpState,
    input_for_outcome,
    transition,
)
from callgate.engine.core.validation import (
    ApprovalDecision,
    Executable,
    NeedsApproval,
    turn_input,
    validate_turn,
)
from callgate.engine.store import (
    LEDGER_IN_FLIGHT_LEASE,
    ApprovalError,
    ApprovalExpired,
    ApprovalRecord,
    Began,
    InFlight,
    LedgerState,
    MemoryStore,
    Replay,
    Unknown,
)

TENANT = "t1"
OPERATION = "op1"
AUTH = AuthContext(tenant=TENANT, subject="alice", operation_id=OPERATION)
APPROVAL_TTL = 60.0


class Lookup(msgspec.Struct, forbid_unknown_fields=True):
    key: str


class Transfer(msgspec.Struct, forbid_unknown_fields=True):
    amount: int
    to: str


def _unused_handler(args: Any, ctx: Any) -> dict[str, Any]:
    raise AssertionError("the state machine runs handlers itself")


REGISTRY = Registry(
    [
        ToolSpec(name="lookup", description="read", args_type=Lookup, handler=_unused_handler),
        ToolSpec(
            name="transfer",
            description="write",
            args_type=Transfer,
            handler=_unused_handler,
            risk=RiskClass.WRITE,
        ),
        ToolSpec(
            name="pay",
            description="irreversible",
            args_type=Transfer,
            handler=_unused_handler,
            risk=RiskClass.IRREVERSIBLE,
        ),
    ]
)
BUDGETS = Budgets(max_turns=8, max_tool_calls=12, duplicate_threshold=2, no_progress_limit=2)

# One proposal: (tool, argument variant, call id). Few ids and few amounts, so reused
# call ids and repeated business intents are common.
PROPOSAL = st.tuples(
    st.sampled_from(["lookup", "transfer", "pay", "ghost"]),
    st.sampled_from(["ok", "ok", "ok", "wrong_type", "unknown_field", "parser_rejected"]),
    st.sampled_from(["c1", "c2", "c3"]),
    st.integers(1, 2),
)
# Tool turns first (Hypothesis leans towards the first element) and most often.
TURN_END = st.sampled_from(
    ["tools"] * 8 + ["final", "refusal", "truncated", "paused", "failed", "transient"]
)


def _arguments(tool: str, variant: str, amount: int) -> dict[str, Any] | None:
    if variant == "parser_rejected":
        return None
    good: dict[str, Any] = {"key": f"k{amount}"} if tool == "lookup" else {"amount": amount}
    if tool != "lookup":
        good["to"] = "bob"
    if variant == "wrong_type":
        return {k: [v] for k, v in good.items()}
    if variant == "unknown_field":
        return {**good, "extra": 1}
    return good


class OperationMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._portal_cm = start_blocking_portal()
        self.portal: BlockingPortal = self._portal_cm.__enter__()
        self.store = MemoryStore()
        self.clock = 0.0
        self.state = OpState.MODEL_REQUESTED
        self.taken: list[tuple[OpState, OpInput]] = []
        self.guards = BudgetTracker(BUDGETS, now=self.clock)
        self.turn = 0
        self.calls: list[ProposedCall] = []
        self.verdicts: list[Any] = []
        self.pending: list[Executable] = []
        self.results: dict[str, tuple[ProposedCall, str, dict[str, Any], bool, Any]] = {}
        self.approvals: dict[str, str] = {}  # call id -> approval id (this turn)
        self.decisions: dict[str, ApprovalDecision] | None = None
        self.crashed: str | None = None  # "after_effect" / "before_effect"
        # Independent facts for the invariants.
        self.first_use: dict[str, tuple[str, bool, dict[str, Any] | None]] = {}
        self.human_ok: dict[str, str] = {}  # call id -> approved args digest (this turn)
        self.consumed: set[str] = set()  # approval ids consumed in time
        self.handler_runs: list[tuple[int, str, str]] = []
        self.violations: list[str] = []
        self.effects: Counter[str] = Counter()  # downstream system, survives crashes

    # --- plumbing ----------------------------------------------------------------------

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        async def run() -> Any:
            return await fn(*args, **kwargs)

        return self.portal.call(run)

    def _go(self, event: OpInput) -> None:
        self.taken.append((self.state, event))
        self.state = transition(self.state, event)

    def _active(self) -> bool:
        return self.state not in TERMINAL and self.crashed is None

    def _reset_turn(self) -> None:
        self.calls, self.verdicts, self.pending, self.results = [], [], [], {}
        self.approvals, self.decisions, self.first_use, self.human_ok = {}, None, {}, {}

    # --- model turns -------------------------------------------------------------------

    @precondition(lambda self: self._active() and self.state is OpState.MODEL_REQUESTED)
    @rule(end=TURN_END, proposals=st.lists(PROPOSAL, min_size=1, max_size=3))
    def model_turn(self, end: str, proposals: list[tuple[str, str, str, int]]) -> None:
        spent = self.guards.check_before_model_turn(self.clock)
        if spent is not None:
            self._go(spent.input)
            return
        self.turn += 1
        self.clock += 1.0
        self._reset_turn()
        overrun = self.guards.record_turn(Usage(input_tokens=100, output_tokens=10), "m")
        if overrun is not None:
            self._go(overrun.input)
            return
        kinds = {
            "final": OutcomeKind.FINAL_TEXT,
            "refusal": OutcomeKind.REFUSAL,
            "truncated": OutcomeKind.TRUNCATED,
            "paused": OutcomeKind.PAUSED,
        }
        if end != "tools":
            kind = kinds.get(end, OutcomeKind.FAILED)
            error = ProviderErrorInfo(code="x", retryable=end == "transient")
            outcome = TurnOutcome(
                kind=kind,
                raw_reason=end,
                stop_reason=end,
                error=error if kind is OutcomeKind.FAILED else None,
            )
            self._go(input_for_outcome(outcome))
            return
        for index, (tool, variant, call_id, amount) in enumerate(proposals):
            arguments = _arguments(tool, variant, amount)
            self.calls.append(
                ProposedCall(
                    index=index,
                    call_id=call_id,
                    name=tool,
                    arguments=arguments,
                    raw_arguments=msgspec.json.encode(arguments) if arguments else b"{",
                    error=None if arguments is not None else "arguments are not valid JSON",
                )
            )
            if call_id not in self.first_use:
                valid = variant == "ok" and tool != "ghost"
                self.first_use[call_id] = (tool, valid, arguments if valid else None)
        outcome = TurnOutcome(
            kind=OutcomeKind.TOOL_PROPOSALS,
            raw_reason="tool_calls",
            stop_reason="complete",
            response_id=f"resp{self.turn}",
            calls=tuple(self.calls),
        )
        self._go(input_for_outcome(outcome))

    @precondition(lambda self: self._active() and self.state is OpState.RETRY)
    @rule(ready=st.booleans())
    def retry(self, ready: bool) -> None:
        self._go(OpInput.RETRY_READY if ready else OpInput.RETRY_EXHAUSTED)

    # --- validation and approvals ------------------------------------------------------

    @precondition(lambda self: self._active() and self.state is OpState.VALIDATING)
    @rule()
    def validate(self) -> None:
        self.verdicts = validate_turn(
            self.calls, REGISTRY, AUTH, self.guards, approvals=self.decisions
        )
        if self.guards.check_progress() is not None:
            self._go(OpInput.NO_PROGRESS)
            return
        event = turn_input(self.verdicts)
        if event is OpInput.APPROVAL_NEEDED:
            for v in self.verdicts:
                if isinstance(v, NeedsApproval) and v.call.call_id not in self.approvals:
                    approval_id = f"ap{self.turn}-{v.call.call_id}"
                    self._call(
                        self.store.create_approval,
                        ApprovalRecord(
                            approval_id=approval_id,
                            operation_id=OPERATION,
                            call_id=v.call.call_id,
                            tool=v.spec.name,
                            schema_version=v.spec.schema_version,
                            args_digest=v.args_digest,
                            policy_revision=v.spec.policy_revision,
                            tenant=TENANT,
                            subject="alice",
                            created_at=self.clock,
                            expires_at=self.clock + APPROVAL_TTL,
                        ),
                    )
                    self.approvals[v.call.call_id] = approval_id
        elif event is OpInput.EXECUTABLE:
            self.pending = [v for v in self.verdicts if isinstance(v, Executable)]
        self._go(event)

    def _undecided(self) -> list[str]:
        out = []
        for call_id, approval_id in self.approvals.items():
            record = self._call(self.store.get_approval, approval_id)
            if record.status.value == "pending" and call_id not in self.human_ok:
                out.append(call_id)
        return out

    @precondition(lambda self: self._active() and self.state is OpState.WAITING_APPROVAL)
    @rule(
        approve=st.sampled_from([True, True, False]),
        late=st.sampled_from([False, False, False, True]),
        pick=st.integers(0, 2),
    )
    def human_decides(self, approve: bool, late: bool, pick: int) -> None:
        undecided = self._undecided()
        if not undecided:
            self.resume(consume_late=late)
            return
        call_id = undecided[pick % len(undecided)]
        approval_id = self.approvals[call_id]
        if late:
            self.clock += APPROVAL_TTL + 1
        try:
            record = self._call(
                self.store.decide_approval, approval_id, approve, "carol", None, now=self.clock
            )
        except ApprovalExpired:
            return
        if approve:
            self.human_ok[call_id] = record.args_digest

    @precondition(lambda self: self._active() and self.state is OpState.WAITING_APPROVAL)
    @rule(consume_late=st.sampled_from([False, False, False, True]))
    def resume(self, consume_late: bool) -> None:
        """Collect the decisions as the run loop does (consume each approval once, expire
        the undecided ones) and feed RESUMED, or a shortcut when nothing can run."""
        if consume_late:
            self.clock += APPROVAL_TTL + 1
        decisions: dict[str, ApprovalDecision] = {}
        for call_id, approval_id in self.approvals.items():
            record = self._call(self.store.get_approval, approval_id)
            approved = expired = False
            if record.status.value in ("approved", "pending"):
                try:
                    self._call(self.store.consume_approval, approval_id, now=self.clock)
                    approved = True
                    self.consumed.add(approval_id)
                except ApprovalExpired:
                    expired = True
                except ApprovalError:  # still pending and not yet expired: keep waiting
                    return
            else:
                expired = record.status.value == "expired"
            decisions[call_id] = ApprovalDecision(
                approval_id=approval_id,
                call_id=call_id,
                args_digest=record.args_digest,
                approved=approved,
                expired=expired,
            )
        self.decisions = decisions
        others = any(isinstance(v, Executable) for v in self.verdicts)
        if not others and not any(d.approved for d in decisions.values()):
            if all(d.expired for d in decisions.values()):
                self._go(OpInput.EXPIRED)
            elif not any(d.expired for d in decisions.values()):
                self._go(OpInput.DENIED)
            else:
                self._go(OpInput.RESUMED)
        else:
            self._go(OpInput.RESUMED)

    # --- execution ---------------------------------------------------------------------

    def _handler(self, item: Executable, key: str | None) -> dict[str, Any]:
        """The tool itself: records who ran it, checked against the independent facts."""
        call = item.call
        self.handler_runs.append((self.turn, call.call_id, item.spec.name))
        tool, valid, arguments = self.first_use.get(call.call_id, ("?", False, None))
        if call.index != next(c.index for c in self.calls if c.call_id == call.call_id):
            self.violations.append(f"handler ran on a repeated call id {call.call_id}")
        if tool != item.spec.name or not valid or arguments != call.arguments:
            self.violations.append(f"handler ran on an invalid or unknown call {call.call_id}")
        if item.spec.risk is RiskClass.IRREVERSIBLE:
            digest = args_digest(item.spec.name, item.args)
            approval_id = self.approvals.get(call.call_id)
            if self.human_ok.get(call.call_id) != digest or approval_id not in self.consumed:
                self.violations.append(f"handler ran on an unapproved call {call.call_id}")
        if key is not None:
            self.effects[key] += 1
        return {"ok": True, "call": call.call_id}

    @precondition(lambda self: self._active() and self.state is OpState.EXECUTING and self.pending)
    @rule(crash=st.sampled_from([None, None, None, "after_effect", "before_effect"]))
    def execute_next(self, crash: str | None) -> None:
        item = self.pending[0]
        spec = item.spec
        if not spec.is_side_effect:
            self.pending.pop(0)
            self._record(item, self._handler(item, None), False)
            return
        key = spec.idempotency_key(OPERATION, item.args)
        owner = f"w/{item.call.call_id}"
        decision = self._call(
            self.store.ledger_begin, TENANT, key, item.args_digest, owner, now=self.clock
        )
        if isinstance(decision, Replay):
            self.pending.pop(0)
            result = msgspec.json.decode(decision.result or b"{}")
            self._record(item, result, False)
        elif isinstance(decision, Began):
            if crash == "before_effect":
                self.crashed = crash  # the process dies before the handler's effect lands
                return
            result = self._handler(item, key)
            if crash == "after_effect":
                self.crashed = crash  # ... or after it, before ledger_finish
                return
            self._call(
                self.store.ledger_finish,
                TENANT,
                key,
                owner,
                LedgerState.SUCCEEDED,
                msgspec.json.encode(result),
                now=self.clock,
            )
            self.pending.pop(0)
            self._record(item, result, False)
        elif isinstance(decision, Unknown):
            # Reconcile by key downstream; never a blind second attempt.
            if self.effects[key]:
                result = {"ok": True, "reconciled": True}
                self._call(
                    self.store.ledger_resolve_unknown,
                    TENANT,
                    key,
                    owner,
                    LedgerState.SUCCEEDED,
                    msgspec.json.encode(result),
                    now=self.clock,
                )
                self.pending.pop(0)
                self._record(item, result, False)
            else:
                self._go(OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE)
        elif isinstance(decision, InFlight):
            # A previous attempt still holds the row within its lease: its effect may have
            # happened and nothing can tell yet, so a person decides (never a conflict).
            self._go(OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE)
        else:  # Conflict: the same intent already ran with other arguments
            self.pending.pop(0)
            envelope = ErrorEnvelope.of(ErrorCode.IDEMPOTENCY_CONFLICT).to_model_result()
            self._record(item, envelope, True)

    def _record(self, item: Executable, result: dict[str, Any], is_error: bool) -> None:
        self.results[item.call.call_id] = (item.call, item.spec.name, result, is_error, item.args)

    @precondition(lambda self: self.crashed is not None)
    @rule()
    def recover(self) -> None:
        """A new process takes over after the in-flight lease: budgets resume from their
        snapshot (downtime is not counted), the pending call is attempted again."""
        snapshot = self.guards.snapshot(self.clock)
        self.clock += LEDGER_IN_FLIGHT_LEASE + 1
        self.guards = BudgetTracker.restore(BUDGETS, snapshot, now=self.clock)
        self.crashed = None

    @precondition(
        lambda self: self._active() and self.state is OpState.EXECUTING and not self.pending
    )
    @rule(duplicate=st.booleans(), which=st.integers(0, 2))
    def results_back(self, duplicate: bool, which: int) -> None:
        runs_before = len(self.handler_runs)
        trusted, bound = [], []
        response_id = f"resp{self.turn}"
        for call_id, (_call, tool, result, is_error, args) in self.results.items():
            ctx = BindingContext(
                provider="fake",
                api_family="fake",
                response_id=response_id,
                call_id=call_id,
                operation_id=OPERATION,
                idempotency_key=call_id,
                adapter_revision="fake/1",
            )
            arguments = msgspec.to_builtins(args)
            trusted.append(TrustedCall.record(ctx, tool, arguments))
            bound.append(bind(ctx, tool, arguments, result, is_error, None))
        if duplicate and bound:
            bound.append(bound[which % len(bound)])
        try:
            verify_result_set(trusted, bound)
        except CorrelationError as exc:
            assert duplicate and exc.problem == "duplicate"
            assert len(self.handler_runs) == runs_before  # a duplicate runs nothing
            self._go(OpInput.BINDING_MISMATCH)
            return
        assert not duplicate or not bound
        for _call, tool, result, _, args in self.results.values():
            digest = args_digest(tool, args)
            self.guards.record_result(tool, digest, msgspec.json.encode(result).hex())
        self._go(OpInput.RESULTS_DONE)

    @precondition(lambda self: self._active() and self.state is OpState.RESULTS_READY)
    @rule()
    def send_results(self) -> None:
        if self.guards.check_progress() is not None:
            self._go(OpInput.NO_PROGRESS)
        else:
            self._go(OpInput.RESULTS_SENT)

    @precondition(lambda self: self._active() and self.turn >= 3)
    @rule(
        event=st.sampled_from([OpInput.BUDGET_EXHAUSTED, OpInput.DEADLINE]), roll=st.integers(0, 19)
    )
    def safe_stop(self, event: OpInput, roll: int) -> None:
        """The driver finds the budget or the deadline spent, anywhere (rarely, and not
        before some work was done, so that runs get deep)."""
        if roll == 13:  # not an endpoint: Hypothesis favours those
            self._go(event)

    @precondition(lambda self: self.state in TERMINAL)
    @rule(event=st.sampled_from(list(OpInput)))
    def terminal_accepts_nothing(self, event: OpInput) -> None:
        with pytest.raises(IllegalTransition):
            transition(self.state, event)

    # --- invariants --------------------------------------------------------------------

    @invariant()
    def only_table_transitions(self) -> None:
        assert all(pair in TRANSITIONS for pair in self.taken)

    @invariant()
    def handlers_only_on_valid_approved_calls(self) -> None:
        assert not self.violations, self.violations

    @invariant()
    def no_duplicate_side_effect(self) -> None:
        assert all(n <= 1 for n in self.effects.values()), dict(self.effects)

    def teardown(self) -> None:
        try:
            self._drain()
            assert self.state in TERMINAL, self.state
            assert not self.violations, self.violations
            assert all(n <= 1 for n in self.effects.values()), dict(self.effects)
        finally:
            self._portal_cm.__exit__(None, None, None)

    def _drain(self) -> None:
        """From wherever the run stopped, a plain continuation reaches a terminal state:
        recover a crash, let what waits expire, run what is pending, send results, and
        have the model answer with final text."""
        for _ in range(60):
            if self.crashed is not None:
                self.recover()
            state = self.state
            if state in TERMINAL:
                return
            if state is OpState.MODEL_REQUESTED:
                self.model_turn("final", [("lookup", "ok", "c1", 1)])
            elif state is OpState.RETRY:
                self.retry(False)
            elif state is OpState.VALIDATING:
                self.validate()
            elif state is OpState.WAITING_APPROVAL:
                self.resume(consume_late=True)
            elif state is OpState.EXECUTING:
                if self.pending:
                    self.execute_next(None)
                else:
                    self.results_back(False, 0)
            elif state is OpState.RESULTS_READY:
                self.send_results()


OperationMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestOperationMachine = OperationMachine.TestCase


def test_every_state_input_pair_the_machine_can_take_is_in_the_table() -> None:
    # The rules above feed only these inputs; each must be legal from the state the rule
    # requires, so a rule can never be the source of an IllegalTransition.
    feeds = {
        OpState.MODEL_REQUESTED: {
            OpInput.FINAL_TEXT,
            OpInput.TOOL_PROPOSALS,
            OpInput.REFUSAL,
            OpInput.TRUNCATED,
            OpInput.PAUSED,
            OpInput.API_FAILURE,
            OpInput.TRANSIENT_FAILURE,
        },
        OpState.RETRY: {OpInput.RETRY_READY, OpInput.RETRY_EXHAUSTED},
        OpState.VALIDATING: {
            OpInput.APPROVAL_NEEDED,
            OpInput.EXECUTABLE,
            OpInput.ALL_REJECTED,
            OpInput.NO_PROGRESS,
        },
        OpState.WAITING_APPROVAL: {OpInput.RESUMED, OpInput.DENIED, OpInput.EXPIRED},
        OpState.EXECUTING: {
            OpInput.RESULTS_DONE,
            OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE,
            OpInput.BINDING_MISMATCH,
        },
        OpState.RESULTS_READY: {OpInput.RESULTS_SENT, OpInput.NO_PROGRESS},
    }
    for state, inputs in feeds.items():
        for event in inputs | {OpInput.BUDGET_EXHAUSTED, OpInput.DEADLINE}:
            assert (state, event) in TRANSITIONS
