"""The operation state machine: one transition table, in this one file.

An *operation* is one business task driven through model turns, validation, approvals and
tool execution. Every phase change of an operation goes through ``transition``; the run
loop never assigns a state any other way. This module owns the states, the inputs, the
table and the README diagram generated from it. It never performs I/O and never decides
*which* input happened: the run loop observes the world and feeds the input.

Rules of the table (read these before adding a row):

* Only a pair listed in ``TRANSITIONS`` is legal; anything else raises
  ``IllegalTransition``. Terminal states (``TERMINAL``) accept no input at all.
* Only an explicit completion reason is success: ``FINAL_TEXT`` is the one way into
  ``COMPLETED``. Refusal, truncation (max tokens, a cut stream) and failures each have
  their own terminal state; none of them is success.
* Anthropic ``pause_turn`` (``PAUSED``) continues the same model turn:
  ``MODEL_REQUESTED`` → ``MODEL_REQUESTED``.
* A transient provider failure (429, 5xx, overloaded) goes to ``RETRY``; the backoff
  ends in ``RETRY_READY`` (ask again) or ``RETRY_EXHAUSTED`` (``FAILED``).
* A rejected call is a result, not a failure: a turn whose calls were all rejected goes
  ``VALIDATING`` → ``RESULTS_READY`` with error envelopes, and back to the model.
* Approval resumes through revalidation: once the pending decisions are in,
  ``WAITING_APPROVAL`` + ``RESUMED`` goes back to ``VALIDATING`` (the spec requires
  re-checking schema, authorization and policy after the pause; denied or expired calls
  become error envelopes there, and an approval given for other arguments, another tool
  contract or policy revision counts as denied). That is the only way callgate's run
  loop resumes. ``DENIED`` / ``EXPIRED`` (straight to ``RESULTS_READY`` with envelopes,
  for a turn in which nothing can run any more) are shortcuts for a host that drives
  the table itself.
* Safe stops for a human end in ``ESCALATED``, never in a silent success:
  ``BUDGET_EXHAUSTED`` and ``DEADLINE`` from every non-terminal state (the driver may
  observe a spent budget or the clock anywhere); ``NO_PROGRESS`` where the no-progress
  counter is evaluated (``VALIDATING``, ``RESULTS_READY``);
  ``OUTCOME_UNKNOWN_UNRECONCILABLE`` where a side effect may have happened
  (``EXECUTING``; ``VALIDATING``, when an approval an unfinished resume consumed has
  expired before its call was answered) and where a model turn ends while one's outcome
  is still unknown (``MODEL_REQUESTED``, whatever ended the turn); ``DRIVE_FAILED`` from every
  non-terminal state, when a drive raised (or its worker stopped) before a verdict and
  nothing can safely replay it.
* A result that does not provably belong to its call (``BINDING_MISMATCH``) ends in
  ``FAILED`` wherever results are bound: ``EXECUTING``, ``RESULTS_READY``. The row from
  ``WAITING_APPROVAL`` is for a host that binds approvals itself; callgate's run loop
  revalidates a foreign approval as denied instead.

Every terminal state is recorded with a ``StopInfo``: the provider's raw reason (when a
provider said anything) and callgate's own reason for stopping.
"""

from __future__ import annotations

import enum

import msgspec

from .errors import ConfigError, IllegalTransition
from .outcome import OutcomeKind, TurnOutcome

__all__ = [
    "INITIAL",
    "TERMINAL",
    "TRANSITIONS",
    "OpInput",
    "OpState",
    "StopInfo",
    "allowed_inputs",
    "input_for_outcome",
    "mermaid_diagram",
    "transition",
]


class OpState(enum.StrEnum):
    """Where an operation is; the terminal ones (``TERMINAL``) are completed, refused,
    incomplete, failed and escalated. Moves only through ``transition``."""

    MODEL_REQUESTED = "model_requested"
    VALIDATING = "validating"
    WAITING_APPROVAL = "waiting_approval"
    EXECUTING = "executing"
    RESULTS_READY = "results_ready"
    RETRY = "retry"
    COMPLETED = "completed"
    REFUSED = "refused"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    ESCALATED = "escalated"


class OpInput(enum.StrEnum):
    # What one model turn ended with (see ``input_for_outcome``).
    FINAL_TEXT = "final_text"  # explicit completion, no calls
    TOOL_PROPOSALS = "tool_proposals"  # explicit completion with complete calls
    REFUSAL = "refusal"
    TRUNCATED = "truncated"  # max tokens, a stream cut off
    PAUSED = "paused"  # Anthropic pause_turn: continue the same turn
    API_FAILURE = "api_failure"  # not worth retrying
    TRANSIENT_FAILURE = "transient_failure"  # 429 / 5xx / overloaded
    # The retry backoff.
    RETRY_READY = "retry_ready"
    RETRY_EXHAUSTED = "retry_exhausted"
    # What validation of one turn's calls decided.
    APPROVAL_NEEDED = "approval_needed"  # at least one call waits for a human
    EXECUTABLE = "executable"  # at least one call runs, none waits
    ALL_REJECTED = "all_rejected"  # every call became an error envelope
    # A human decision on the pending approvals.
    RESUMED = "resumed"  # decisions are in: revalidate, then run what was approved
    DENIED = "denied"  # every pending call denied and nothing else to run
    EXPIRED = "expired"  # the approval request expired and nothing else to run
    # Execution and the way back to the model.
    RESULTS_DONE = "results_done"  # every dispatched call has a result
    RESULTS_SENT = "results_sent"  # the results went into the next model request
    # Safe stops.
    BUDGET_EXHAUSTED = "budget_exhausted"
    DEADLINE = "deadline"
    NO_PROGRESS = "no_progress"
    OUTCOME_UNKNOWN_UNRECONCILABLE = "outcome_unknown_unreconcilable"
    BINDING_MISMATCH = "binding_mismatch"
    # A drive raised, or its worker stopped, before the operation reached a verdict; what
    # it did (calls that ran) is in the ledger and the audit trail, for a human to read.
    DRIVE_FAILED = "drive_failed"


S = OpState
I = OpInput  # noqa: E741 - a one-letter alias keeps the table readable

INITIAL = S.MODEL_REQUESTED
TERMINAL: frozenset[OpState] = frozenset(
    {S.COMPLETED, S.REFUSED, S.INCOMPLETE, S.FAILED, S.ESCALATED}
)

_NON_TERMINAL = [s for s in OpState if s not in TERMINAL]

TRANSITIONS: dict[tuple[OpState, OpInput], OpState] = {
    # A model turn ends.
    (S.MODEL_REQUESTED, I.FINAL_TEXT): S.COMPLETED,
    (S.MODEL_REQUESTED, I.TOOL_PROPOSALS): S.VALIDATING,
    (S.MODEL_REQUESTED, I.REFUSAL): S.REFUSED,
    (S.MODEL_REQUESTED, I.TRUNCATED): S.INCOMPLETE,
    (S.MODEL_REQUESTED, I.PAUSED): S.MODEL_REQUESTED,
    (S.MODEL_REQUESTED, I.API_FAILURE): S.FAILED,
    (S.MODEL_REQUESTED, I.TRANSIENT_FAILURE): S.RETRY,
    # The model answered while a side effect's outcome is still unknown: not a success.
    (S.MODEL_REQUESTED, I.OUTCOME_UNKNOWN_UNRECONCILABLE): S.ESCALATED,
    # Bounded retry with backoff.
    (S.RETRY, I.RETRY_READY): S.MODEL_REQUESTED,
    (S.RETRY, I.RETRY_EXHAUSTED): S.FAILED,
    # The calls of one turn were validated.
    (S.VALIDATING, I.APPROVAL_NEEDED): S.WAITING_APPROVAL,
    (S.VALIDATING, I.EXECUTABLE): S.EXECUTING,
    (S.VALIDATING, I.ALL_REJECTED): S.RESULTS_READY,
    (S.VALIDATING, I.NO_PROGRESS): S.ESCALATED,
    # Revalidating after a resume: an approval spent by an unfinished resume has expired,
    # and that resume may have run the call.
    (S.VALIDATING, I.OUTCOME_UNKNOWN_UNRECONCILABLE): S.ESCALATED,
    # A human decided (or nobody did in time).
    (S.WAITING_APPROVAL, I.RESUMED): S.VALIDATING,
    (S.WAITING_APPROVAL, I.DENIED): S.RESULTS_READY,
    (S.WAITING_APPROVAL, I.EXPIRED): S.RESULTS_READY,
    (S.WAITING_APPROVAL, I.BINDING_MISMATCH): S.FAILED,
    # Handlers ran.
    (S.EXECUTING, I.RESULTS_DONE): S.RESULTS_READY,
    (S.EXECUTING, I.OUTCOME_UNKNOWN_UNRECONCILABLE): S.ESCALATED,
    (S.EXECUTING, I.BINDING_MISMATCH): S.FAILED,
    # Results go back to the model.
    (S.RESULTS_READY, I.RESULTS_SENT): S.MODEL_REQUESTED,
    (S.RESULTS_READY, I.NO_PROGRESS): S.ESCALATED,
    (S.RESULTS_READY, I.BINDING_MISMATCH): S.FAILED,
    # Budgets and the operation deadline can be found spent anywhere before the end.
    **{(s, I.BUDGET_EXHAUSTED): S.ESCALATED for s in _NON_TERMINAL},
    **{(s, I.DEADLINE): S.ESCALATED for s in _NON_TERMINAL},
    **{(s, I.DRIVE_FAILED): S.ESCALATED for s in _NON_TERMINAL},
}

del S, I


def transition(state: OpState, event: OpInput) -> OpState:
    """The state after ``event`` in ``state``; raises ``IllegalTransition`` for any pair
    the table does not list (terminal states accept nothing)."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        if state in TERMINAL:
            raise IllegalTransition(
                f"{state.name} is terminal; it accepts no input ({event.name})"
            ) from None
        raise IllegalTransition(f"no transition from {state.name} on {event.name}") from None


def allowed_inputs(state: OpState) -> frozenset[OpInput]:
    """Every input ``state`` accepts (empty for a terminal state)."""
    return frozenset(i for (s, i) in TRANSITIONS if s is state)


_OUTCOME_INPUT: dict[OutcomeKind, OpInput] = {
    OutcomeKind.FINAL_TEXT: OpInput.FINAL_TEXT,
    OutcomeKind.TOOL_PROPOSALS: OpInput.TOOL_PROPOSALS,
    OutcomeKind.REFUSAL: OpInput.REFUSAL,
    OutcomeKind.TRUNCATED: OpInput.TRUNCATED,
    OutcomeKind.PAUSED: OpInput.PAUSED,
    OutcomeKind.FAILED: OpInput.API_FAILURE,
}


def input_for_outcome(outcome: TurnOutcome) -> OpInput:
    """The input a decoded model turn feeds into ``MODEL_REQUESTED``. A failed turn is
    ``TRANSIENT_FAILURE`` when the provider marked its error retryable, else
    ``API_FAILURE``; the transport maps HTTP status codes itself."""
    if outcome.kind is OutcomeKind.FAILED and outcome.error is not None and outcome.error.retryable:
        return OpInput.TRANSIENT_FAILURE
    return _OUTCOME_INPUT[outcome.kind]


class StopInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Why an operation stopped. ``state`` must be terminal.

    ``provider_reason`` is the provider's raw stop/finish reason or error code exactly as
    received (None when the stop had no provider cause, e.g. a spent budget);
    ``reason`` is callgate's own reason, in its words (always set). ``input`` is the input
    that made the final transition."""

    state: OpState
    input: OpInput
    provider_reason: str | None
    reason: str

    def __post_init__(self) -> None:
        if self.state not in TERMINAL:
            raise ConfigError(f"StopInfo needs a terminal state, got {self.state.name}")
        if not self.reason:
            raise ConfigError("StopInfo needs callgate's reason for stopping")


def mermaid_diagram() -> str:
    """A Mermaid ``stateDiagram-v2`` of ``TRANSITIONS`` (the README embeds it verbatim;
    ``callgate states`` prints it).

    Edges between the same two states are merged into one arrow whose label lists the
    inputs in enum order; states and edges appear in enum order too, so the output is stable.
    """
    edges: dict[tuple[OpState, OpState], list[OpInput]] = {}
    for state in OpState:
        for event in OpInput:
            target = TRANSITIONS.get((state, event))
            if target is not None:
                edges.setdefault((state, target), []).append(event)
    lines = ["stateDiagram-v2", f"    [*] --> {INITIAL.name}"]
    for (src, dst), events in edges.items():
        lines.append(f"    {src.name} --> {dst.name}: {', '.join(e.name for e in events)}")
    lines.extend(f"    {s.name} --> [*]" for s in OpState if s in TERMINAL)
    return "\n".join(lines) + "\n"
