"""Loop protection: the operation's budgets and a pure tracker of what has been spent.

``Budgets`` is configuration (every limit has a default and the reason for it).
``BudgetTracker`` counts turns, tool calls, tokens, cost and active time, detects
duplicate calls (same tool + canonical arguments) and futile turns, and answers with
explicit values: ``ExhaustedBudget`` or an ``Admission``. It never raises because a
budget ran out; the run loop turns those values into error envelopes and into the
``ESCALATED`` state, keeping the partial results.

Time comes in as ``now`` (any monotonic clock in seconds). The tracker's state
round-trips through JSON (``snapshot`` / ``restore``) so it survives an approval pause in
another process. This module never reads a clock and never awaits.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

import msgspec

from .canonical import digests_equal
from .envelope import ErrorCode
from .errors import ConfigError
from .outcome import Usage
from .states import OpInput

__all__ = [
    "Admission",
    "AdmissionKind",
    "BudgetTracker",
    "Budgets",
    "ExhaustedBudget",
    "Price",
    "estimated_usage",
]

_MILLION = Decimal(1_000_000)
# No operation runs for a year; anything above (an int past float's range included) is a
# mistake, and inf or NaN have no JSON form to keep with the operation.
_MAX_DEADLINE = 366 * 86_400.0

Price = tuple[Decimal | float | int, Decimal | float | int]
"""(price per 1M input tokens, price per 1M output tokens), in the host's currency."""


class Budgets(msgspec.Struct, frozen=True, kw_only=True):
    """Per-operation limits. Every limit is inclusive: a budget of N allows N units."""

    # Model requests (every response counts, pause_turn continuations included). Real
    # tool tasks finish in a handful of turns; 25 leaves room for multi-step work while
    # a looping model is stopped long before it burns a day's token budget.
    max_turns: int = 25
    # Calls admitted for execution (or approval) across the operation. Four per turn at
    # the default turn budget; rejected calls do not count.
    max_tool_calls: int = 100
    # Active wall time of the operation in seconds. Approval waits are not counted (they
    # have their own expiry): time between snapshot() and restore() is excluded.
    # Ten minutes covers slow tools and provider retries; anything longer is a batch job
    # that should set its own deadline.
    deadline_seconds: float = 600.0
    # Input tokens summed over turns. Each turn resends the conversation, so this grows
    # quadratically with turns; 2M is ~25 turns of an 80k-token context.
    max_input_tokens: int = 2_000_000
    # Output tokens summed over turns (adapters report billed reasoning tokens here).
    # 200k is far above what answers and arguments need.
    max_output_tokens: int = 200_000
    # Spend in the host's currency, priced by ``prices``. None: no cost cap (the token
    # budgets still bound spend); callgate cannot guess a currency or a price.
    max_cost: Decimal | float | int | None = None
    # Model name -> Price. Looked up exactly, then by the longest name followed by a date,
    # a version number or "-latest" (providers return dated names such as
    # "gpt-4o-2024-08-06"; "gpt-4o-mini" is another model). With max_cost set, a turn of
    # an unpriced model exhausts the cost budget: unknown spend is not zero spend.
    prices: dict[str, Price] = {}
    # Handlers of one drive (a start or a resume) running at once, across its turns (a
    # sync handler past its deadline keeps its slot until it returns). Eight keeps a
    # parallel fan-out fast without letting one response monopolise downstream systems.
    max_parallelism: int = 8
    # Bytes of one result's model projection. Results are resent on every later turn, so
    # 64 KiB (≈16k tokens) is already a heavy context; a tool may set a lower limit.
    max_result_bytes: int = 64 * 1024
    # Executions of one identical call (tool + canonical arguments) per operation, even
    # with new information in between (or after a timeout or handler error, which invite
    # a retry). Three allows a retry or two; an identical call with nothing new since its
    # last result is refused before that (no_progress), so a poll should carry a cursor or
    # attempt number in its arguments.
    duplicate_threshold: int = 3
    # Consecutive futile turns (every call a duplicate_call or no_progress, or refused
    # exactly as the same call was in an earlier turn) before the operation is
    # ESCALATED: the model got the same structured refusal twice and still did not
    # change course.
    no_progress_limit: int = 3

    def __post_init__(self) -> None:
        for name in (
            "max_turns",
            "max_tool_calls",
            "max_input_tokens",
            "max_output_tokens",
            "max_parallelism",
            "max_result_bytes",
            "duplicate_threshold",
            "no_progress_limit",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"Budgets.{name} must be a positive int, got {value!r}")
        deadline = self.deadline_seconds
        if (
            not isinstance(deadline, int | float)
            or isinstance(deadline, bool)
            or not (0 < deadline < _MAX_DEADLINE)
        ):
            # Finite: the budgets are kept with the operation as JSON, which has no inf.
            raise ConfigError("Budgets.deadline_seconds must be a finite number > 0")
        if self.max_cost is not None and not (
            _is_amount(self.max_cost) and _dec(self.max_cost) >= 0
        ):
            raise ConfigError("Budgets.max_cost must be >= 0")
        for model, price in self.prices.items():
            if not (
                isinstance(price, tuple | list)
                and len(price) == 2
                and all(_is_amount(p) and _dec(p) >= 0 for p in price)
            ):
                raise ConfigError(f"Budgets.prices[{model!r}] must be two prices >= 0")

    def result_bytes_limit(self, tool_limit: int | None) -> int:
        """The result-size cap for one tool: its own limit, never above the operation's."""
        return (
            self.max_result_bytes if tool_limit is None else min(tool_limit, self.max_result_bytes)
        )

    def price_for(self, model: str | None) -> tuple[Decimal, Decimal] | None:
        """The model's price (exact name, then longest prefix), or None if unpriced."""
        if model is None:
            return None
        price = self.prices.get(model)
        if price is None:
            # Only a dated or versioned name of a priced model takes its price
            # ("gpt-4o-2024-08-06", "claude-x-20250514", "-latest"); another model sharing
            # a prefix ("o1-pro" beside "o1", "gpt-4o-mini" beside "gpt-4o") is unpriced.
            prefixes = [
                name
                for name in self.prices
                if model.startswith(name) and _VERSION_SUFFIX.fullmatch(model, len(name))
            ]
            if not prefixes:
                return None
            price = self.prices[max(prefixes, key=len)]
        return _dec(price[0]), _dec(price[1])


# What may follow a priced model's name: a date ("-2024-08-06", "-20250514", "-05-20"), a
# long version number, "latest", or a preview of it ("-preview", "-preview-05-20").
_VERSION_SUFFIX: Final = re.compile(
    r"-(?:\d{4}-\d{2}-\d{2}|\d{2}-\d{2}|\d{8}|\d{3,}|latest|preview(?:-[\w.-]+)?)"
)


def _is_amount(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, Decimal | float | int):
        return False
    return Decimal(str(value)).is_finite()


def _dec(value: Decimal | float | int) -> Decimal:
    # str() first: Decimal(0.1) would carry binary noise into money arithmetic.
    return value if isinstance(value, Decimal) else Decimal(str(value))


class ExhaustedBudget(msgspec.Struct, frozen=True, kw_only=True):
    """A spent budget. ``input`` is what to feed the state machine (``BUDGET_EXHAUSTED``,
    ``DEADLINE`` or ``NO_PROGRESS``; each ends in ``ESCALATED``)."""

    budget: str  # the Budgets field name, e.g. "max_turns"
    limit: str
    used: str
    input: OpInput = OpInput.BUDGET_EXHAUSTED

    @property
    def reason(self) -> str:
        """callgate's stop reason, for ``StopInfo.reason``."""
        return f"{self.budget} exhausted: used {self.used} of {self.limit}"


class AdmissionKind(enum.StrEnum):
    OK = "ok"
    BUDGET_EXHAUSTED = "budget_exhausted"
    NO_PROGRESS = "no_progress"


class Admission(msgspec.Struct, frozen=True, kw_only=True):
    kind: AdmissionKind
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.kind is AdmissionKind.OK

    @property
    def error_code(self) -> ErrorCode | None:
        """The envelope code for a refused call (None when admitted)."""
        if self.kind is AdmissionKind.OK:
            return None
        return ErrorCode(self.kind.value)


class _Execution(msgspec.Struct, kw_only=True):
    turn: int  # the turn whose results included this call's latest execution
    result_digest: str
    count: int
    # The latest execution failed in a way the model was told to retry (a timeout, a
    # handler error): that answer is no information to act on, so an identical retry is
    # not refused for lack of new information (duplicate_threshold still bounds it).
    failed: bool = False


class _Admitted(msgspec.Struct, frozen=True, kw_only=True):
    tool: str
    args_digest: str
    admission: Admission


# Refusals remembered per operation for ``repeats_rejection`` (bounds the snapshot).
_MAX_REJECTIONS = 512


class _State(msgspec.Struct, kw_only=True):
    version: int = 1
    turns: int = 0
    tool_calls: int = 0
    calls_refused_for_budget: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)
    unpriced_model: str | None = None
    elapsed: float = 0.0
    # tool -> canonical args digest -> latest execution
    executions: dict[str, dict[str, _Execution]] = {}
    # the latest turn in which an *informative* result was recorded (see admit_call)
    last_informative_turn: int = -1
    # admissions of the current turn, by call id (revalidation after approval reuses them)
    turn_admissions: dict[str, _Admitted] = {}
    no_progress_streak: int = 0
    streak_before_turn: int = 0
    streak_turn: int = -1
    # fingerprint of a refused call (tool, arguments, error code) -> turn first refused
    rejections: dict[str, int] = {}


class BudgetTracker:
    """What one operation has spent, checked against its ``Budgets``. Pure: no clock,
    no I/O; every check returns a value.

    Call sequence per model turn::

        check_before_model_turn(now)   -> ExhaustedBudget | None  (None: ask the model)
        record_turn(usage, model)      -> ExhaustedBudget | None  (this turn overran)
        admit_call(tool, digest, call_id=...) per call  (validate_turn does this)
        record_validation(calls, futile)               (validate_turn does this)
        record_result(tool, digest, result_digest) per executed call
    """

    __slots__ = ("_budgets", "_s", "_segment_start", "_turn_ok", "_turn_ok_of")

    def __init__(self, budgets: Budgets, *, now: float) -> None:
        """A fresh tracker whose active-time clock starts at ``now``."""
        self._budgets = budgets
        self._s = _State()
        self._segment_start = now

    @property
    def budgets(self) -> Budgets:
        return self._budgets

    # --- persistence ----------------------------------------------------------------

    def snapshot(self, now: float) -> dict[str, Any]:
        """The tracker's state as JSON-compatible builtins (Decimal as a string), with
        active time counted up to ``now``. Budgets are configuration, not state: pass
        them again to ``restore``."""
        state = msgspec.structs.replace(self._s, elapsed=self.elapsed(now))
        out: dict[str, Any] = msgspec.to_builtins(state, order="sorted")
        return out

    @classmethod
    def restore(cls, budgets: Budgets, snapshot: Mapping[str, Any], *, now: float) -> BudgetTracker:
        """A tracker continuing from ``snapshot``; its clock resumes at ``now`` (the time
        between snapshot and restore is not counted). A malformed snapshot is a
        ``ConfigError``."""
        try:
            state = msgspec.convert(dict(snapshot), _State)
        except (msgspec.ValidationError, TypeError) as exc:
            raise ConfigError(f"invalid budget tracker snapshot: {exc}") from None
        if state.version != 1:
            raise ConfigError(f"unsupported budget tracker snapshot version {state.version}")
        tracker = cls(budgets, now=now)
        tracker._s = state
        return tracker

    # --- time -----------------------------------------------------------------------

    def elapsed(self, now: float) -> float:
        """Active seconds spent by the operation up to ``now``."""
        return self._s.elapsed + max(0.0, now - self._segment_start)

    def remaining_seconds(self, now: float) -> float:
        """Seconds left before the operation deadline (0.0 when past it); the runtime
        passes this to ``fail_after``."""
        return max(0.0, self._budgets.deadline_seconds - self.elapsed(now))

    def check_deadline(self, now: float) -> ExhaustedBudget | None:
        elapsed = self.elapsed(now)
        if elapsed >= self._budgets.deadline_seconds:
            return ExhaustedBudget(
                budget="deadline_seconds",
                limit=_num(self._budgets.deadline_seconds),
                used=f"{elapsed:.3f}",
                input=OpInput.DEADLINE,
            )
        return None

    # --- model turns ----------------------------------------------------------------

    def check_before_model_turn(self, now: float) -> ExhaustedBudget | None:
        """None when another model request is within every budget; else the first spent
        one (deadline, turns, tool calls refused for budget, tokens, cost, progress)."""
        b, s = self._budgets, self._s
        spent = self.check_deadline(now)
        if spent is None and s.turns >= b.max_turns:
            spent = ExhaustedBudget(budget="max_turns", limit=_num(b.max_turns), used=_num(s.turns))
        if spent is None and s.calls_refused_for_budget:
            spent = self._tool_calls_exhausted()
        return spent or self._token_or_cost_spent(at_limit=True) or self.check_progress()

    def record_turn(self, usage: Usage, model: str | None) -> ExhaustedBudget | None:
        """Count one model response and its usage (None fields count as 0). Returns the
        token or cost budget this turn *overran* (used > limit), else None. Starts a new
        turn for duplicate detection: the previous turn's admissions are dropped."""
        s = self._s
        s.turns += 1
        s.turn_admissions = {}
        # A negative count is bad provider input: counted as 0, it can never refund the
        # token and cost budgets spent by earlier turns.
        input_tokens = max(usage.input_tokens or 0, 0)
        output_tokens = max(usage.output_tokens or 0, 0)
        s.input_tokens += input_tokens
        s.output_tokens += output_tokens
        if self._budgets.max_cost is not None:
            price = self._budgets.price_for(model)
            if price is None:
                s.unpriced_model = model or "<unknown model>"
            else:
                s.cost += (input_tokens * price[0] + output_tokens * price[1]) / _MILLION
        return self._token_or_cost_spent(at_limit=False)

    def _token_or_cost_spent(self, *, at_limit: bool) -> ExhaustedBudget | None:
        # Before a turn, a budget used up exactly leaves nothing for the next one
        # (at_limit); after a turn, only an overrun is reported.
        b, s = self._budgets, self._s

        def over(used: Decimal | int, limit: Decimal | int) -> bool:
            return used >= limit if at_limit else used > limit

        if over(s.input_tokens, b.max_input_tokens):
            return ExhaustedBudget(
                budget="max_input_tokens", limit=_num(b.max_input_tokens), used=_num(s.input_tokens)
            )
        if over(s.output_tokens, b.max_output_tokens):
            return ExhaustedBudget(
                budget="max_output_tokens",
                limit=_num(b.max_output_tokens),
                used=_num(s.output_tokens),
            )
        if b.max_cost is not None:
            limit = _dec(b.max_cost)
            if s.unpriced_model is not None:
                return ExhaustedBudget(
                    budget="max_cost", limit=str(limit), used=f"unknown ({s.unpriced_model})"
                )
            if over(s.cost, limit):
                return ExhaustedBudget(budget="max_cost", limit=str(limit), used=str(s.cost))
        return None

    # --- tool calls -----------------------------------------------------------------

    def admit_call(self, tool: str, canonical_args_digest: str, *, call_id: str) -> Admission:
        """May this call run (or wait for approval)? Idempotent per ``call_id`` within a
        turn, so revalidation after an approval pause neither counts it twice nor sees it
        as its own duplicate.

        Refused with ``no_progress`` when the identical call (same tool and canonical
        arguments):
        - is already admitted in this turn under another call id; or
        - has executed ``duplicate_threshold`` times in this operation; or
        - has executed before and no *new information* arrived since. New information
          is an informative result recorded in a turn after the identical call's latest
          execution. A result is informative when its call had never executed before (a
          non-duplicate call executed) or its result digest differs from that call's
          previous result (the world changed). Results of the same turn as the identical
          call do not count: the model saw them together with it.

        Refused with ``budget_exhausted`` when ``max_tool_calls`` calls were already
        admitted; that also makes ``check_before_model_turn`` report the budget."""
        s = self._s
        cached = s.turn_admissions.get(call_id)
        if cached is not None:
            return cached.admission
        admission = self._assess(tool, canonical_args_digest)
        if admission.kind is AdmissionKind.OK:
            s.tool_calls += 1
        elif admission.kind is AdmissionKind.BUDGET_EXHAUSTED:
            s.calls_refused_for_budget += 1
        s.turn_admissions[call_id] = _Admitted(
            tool=tool, args_digest=canonical_args_digest, admission=admission
        )
        if admission.ok:
            self._admitted_ok().add((tool, canonical_args_digest))
        return admission

    def _admitted_ok(self) -> set[tuple[str, str]]:
        """(tool, args digest) of this turn's admitted calls, as an index: a set lookup per
        call keeps validation linear in the number of calls. The digests are callgate's own
        SHA-256 of canonical arguments (not secrets), so hashing them is fine. Rebuilt when
        the turn's admissions are replaced (a new turn, a restore)."""
        admissions = self._s.turn_admissions
        if getattr(self, "_turn_ok_of", None) is not admissions:
            self._turn_ok = {(a.tool, a.args_digest) for a in admissions.values() if a.admission.ok}
            self._turn_ok_of = admissions
        return self._turn_ok

    def _assess(self, tool: str, digest: str) -> Admission:
        s, b = self._s, self._budgets
        if (tool, digest) in self._admitted_ok():
            return Admission(
                kind=AdmissionKind.NO_PROGRESS,
                reason="identical to another call in this response",
            )
        previous = s.executions.get(tool, {}).get(digest)
        if previous is not None:
            if previous.count >= b.duplicate_threshold:
                return Admission(
                    kind=AdmissionKind.NO_PROGRESS,
                    reason=f"identical call already executed {previous.count} times",
                )
            if s.last_informative_turn <= previous.turn and not previous.failed:
                return Admission(
                    kind=AdmissionKind.NO_PROGRESS,
                    reason="identical call already executed; no new information since",
                )
        if s.tool_calls >= b.max_tool_calls:
            return Admission(
                kind=AdmissionKind.BUDGET_EXHAUSTED,
                reason=f"max_tool_calls={b.max_tool_calls} reached",
            )
        return Admission(kind=AdmissionKind.OK)

    def _tool_calls_exhausted(self) -> ExhaustedBudget:
        b, s = self._budgets, self._s
        return ExhaustedBudget(
            budget="max_tool_calls",
            limit=_num(b.max_tool_calls),
            used=f"{s.tool_calls} (+{s.calls_refused_for_budget} refused)",
        )

    def record_result(
        self,
        tool: str,
        canonical_args_digest: str,
        result_digest: str,
        *,
        failed: bool = False,
    ) -> None:
        """Record that an admitted call was executed (whatever its outcome: ok, timeout,
        handler_error, outcome_unknown) and the digest of its result. Rejected calls are
        not recorded: they did not run. ``failed``: the result is an error the model may
        retry (timeout, handler_error); the identical retry is then no ``no_progress``
        for lack of new information, only for ``duplicate_threshold``."""
        s = self._s
        by_digest = s.executions.setdefault(tool, {})
        previous = by_digest.get(canonical_args_digest)
        if previous is None:
            by_digest[canonical_args_digest] = _Execution(
                turn=s.turns, result_digest=result_digest, count=1, failed=failed
            )
            informative = True
        else:
            informative = not digests_equal(previous.result_digest, result_digest)
            previous.turn = s.turns
            previous.result_digest = result_digest
            previous.count += 1
            previous.failed = failed
        if informative:
            s.last_informative_turn = s.turns

    # --- progress -------------------------------------------------------------------

    def repeats_rejection(self, fingerprint: str) -> bool:
        """Whether a refused call repeats one refused the same way in an earlier turn (the
        model already had that answer: the call is futile). Records it otherwise, the
        oldest dropped past ``_MAX_REJECTIONS``. Idempotent per turn."""
        s = self._s
        first = s.rejections.get(fingerprint)
        if first is not None:
            return first < s.turns
        if len(s.rejections) >= _MAX_REJECTIONS:
            del s.rejections[next(iter(s.rejections))]
        s.rejections[fingerprint] = s.turns
        return False

    def record_validation(self, calls: int, futile: int) -> ExhaustedBudget | None:
        """Update the no-progress counter after validating this turn's ``calls``, of which
        ``futile`` were refused as duplicate_call or no_progress, or as in an earlier turn
        (``repeats_rejection``). A turn whose every call
        was futile extends the streak; any other call resets it; zero calls change
        nothing. Idempotent per turn (revalidation recomputes, it does not add). Returns
        the ``NO_PROGRESS`` exhaustion once the streak reaches ``no_progress_limit``."""
        s = self._s
        if s.streak_turn != s.turns:
            s.streak_turn = s.turns
            s.streak_before_turn = s.no_progress_streak
        if calls > 0:
            futile_turn = futile >= calls
            s.no_progress_streak = s.streak_before_turn + 1 if futile_turn else 0
        return self.check_progress()

    def check_progress(self) -> ExhaustedBudget | None:
        """The ``NO_PROGRESS`` exhaustion when the futile-turn streak reached its limit."""
        s, b = self._s, self._budgets
        if s.no_progress_streak >= b.no_progress_limit:
            return ExhaustedBudget(
                budget="no_progress_limit",
                limit=_num(b.no_progress_limit),
                used=_num(s.no_progress_streak),
                input=OpInput.NO_PROGRESS,
            )
        return None

    # --- read-only views ------------------------------------------------------------

    @property
    def turns(self) -> int:
        return self._s.turns

    @property
    def tool_calls(self) -> int:
        return self._s.tool_calls

    @property
    def input_tokens(self) -> int:
        return self._s.input_tokens

    @property
    def output_tokens(self) -> int:
        return self._s.output_tokens

    @property
    def cost(self) -> Decimal:
        return self._s.cost

    @property
    def no_progress_streak(self) -> int:
        return self._s.no_progress_streak


def _num(value: float | int) -> str:
    return str(value)


# Bytes per token of the estimate below: English text and JSON run at about four bytes a
# token in every provider's tokenizer; code and non-Latin text at fewer bytes (more
# tokens), so the estimate is low there, never absent.
_BYTES_PER_TOKEN = 4


def estimated_usage(usage: Usage, *, request_bytes: int, output_bytes: int) -> Usage:
    """``usage`` with the token counts the provider did not report estimated from the
    bytes that went each way (one token per four bytes, at least one): a server that
    reports no usage (a Chat-compatible one ignoring ``include_usage``) must not run
    unbounded by the token and cost budgets. Unknown spend is not zero spend."""

    def tokens(size: int) -> int:
        return max(1, -(-size // _BYTES_PER_TOKEN))

    return msgspec.structs.replace(
        usage,
        input_tokens=tokens(request_bytes) if usage.input_tokens is None else usage.input_tokens,
        output_tokens=tokens(output_bytes) if usage.output_tokens is None else usage.output_tokens,
    )
