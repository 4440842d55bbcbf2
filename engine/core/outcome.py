"""The result of decoding one model turn: an explicit, classified ``TurnOutcome``.

Only an explicit completion signal from the provider yields ``final_text`` or
``tool_proposals``. Everything else (a cut stream, max tokens, a filter, an error)
is named for what it is, with the provider's raw reason kept beside it.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

__all__ = [
    "MAX_ERROR_CODE",
    "MAX_ERROR_MESSAGE",
    "ContinuationItem",
    "IncompleteCall",
    "OutcomeKind",
    "ProposedCall",
    "ProviderDetail",
    "ProviderErrorInfo",
    "TurnOutcome",
    "Usage",
    "token_sum",
]


class OutcomeKind(enum.StrEnum):
    """How one model turn ended. Only ``FINAL_TEXT`` and ``TOOL_PROPOSALS`` are explicit
    successes; each adapter maps its raw reasons here (its ``FINISH_REASONS``)."""

    FINAL_TEXT = "final_text"
    TOOL_PROPOSALS = "tool_proposals"
    REFUSAL = "refusal"
    TRUNCATED = "truncated"
    PAUSED = "paused"
    FAILED = "failed"


class Usage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Token counts as billed, the same meaning for every family (the budgets count the
    first two): ``input_tokens`` every prompt token, cached ones included;
    ``output_tokens`` every generated token, reasoning/thinking included.
    ``reasoning_tokens`` and ``cached_input_tokens`` are the parts of those (for
    information). Adapters add up what a provider reports apart (Anthropic's cache reads
    and writes, Gemini's thought tokens)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_input_tokens: int | None = None

    def merge(self, newer: Usage) -> Usage:
        """Fields the newer report sets win; the rest are kept."""
        return Usage(
            input_tokens=_pick(newer.input_tokens, self.input_tokens),
            output_tokens=_pick(newer.output_tokens, self.output_tokens),
            reasoning_tokens=_pick(newer.reasoning_tokens, self.reasoning_tokens),
            cached_input_tokens=_pick(newer.cached_input_tokens, self.cached_input_tokens),
        )

    def plus(self, other: Usage) -> Usage:
        """Both reports' counts added (a count neither has stays None)."""
        return Usage(
            input_tokens=_add(self.input_tokens, other.input_tokens),
            output_tokens=_add(self.output_tokens, other.output_tokens),
            reasoning_tokens=_add(self.reasoning_tokens, other.reasoning_tokens),
            cached_input_tokens=_add(self.cached_input_tokens, other.cached_input_tokens),
        )


def _pick(new: int | None, old: int | None) -> int | None:
    return old if new is None else new


def _add(a: int | None, b: int | None) -> int | None:
    return token_sum(a, b)


def token_sum(*counts: int | None) -> int | None:
    """The counts a provider reports apart, added up; None when it reported none. A
    negative count (bad provider input) adds 0: it must not cancel the others (the
    budgets would let a turn of a million input tokens through as none)."""
    present = [c if c > 0 else 0 for c in counts if c is not None]
    return sum(present) if present else None


# Provider error texts are kept (and persisted) for diagnostics only: bounded so that an
# endpoint cannot fill a snapshot, a log line or an audit record with megabytes of text.
MAX_ERROR_MESSAGE = 1000
MAX_ERROR_CODE = 100


class ProviderErrorInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A provider-reported error. ``message`` is diagnostic text from the provider:
    never shown to the model as a business status, never trusted. Longer texts than
    ``MAX_ERROR_MESSAGE`` (message) and ``MAX_ERROR_CODE`` (code) characters are cut,
    however the error was made (an adapter, the transport, a stored snapshot)."""

    code: str | None = None
    message: str | None = None
    status: int | None = None
    retryable: bool = False

    def __post_init__(self) -> None:
        if self.message is not None and len(self.message) > MAX_ERROR_MESSAGE:
            msgspec.structs.force_setattr(self, "message", self.message[:MAX_ERROR_MESSAGE])
        if self.code is not None and len(self.code) > MAX_ERROR_CODE:
            msgspec.structs.force_setattr(self, "code", self.code[:MAX_ERROR_CODE])


class ContinuationItem(msgspec.Struct, frozen=True, tag="continuation"):
    """Something the provider needs back verbatim on the next request: a Responses
    reasoning item, an Anthropic thinking block with its signature, a Gemini
    thought signature. ``index`` is its output position (or the part it belongs to)."""

    kind: str
    index: int
    item: dict[str, Any]


class ProviderDetail(msgspec.Struct, frozen=True, tag="provider_detail"):
    """Anything the vocabulary has no field for (server tools, unknown block types)."""

    kind: str
    data: dict[str, Any]


class ProposedCall(msgspec.Struct, frozen=True, kw_only=True):
    """A call whose done signal arrived. ``arguments`` is None (and ``error`` says why)
    when the argument text was rejected; such a call is never executed.
    ``raw_arguments`` is the joined argument text exactly as received (UTF-8)."""

    index: int
    call_id: str
    name: str
    arguments: dict[str, Any] | None
    raw_arguments: bytes
    error: str | None = None
    item_id: str | None = None
    call_id_derived: bool = False


class IncompleteCall(msgspec.Struct, frozen=True, kw_only=True):
    """A call that started but never got its done signal. Diagnostics only."""

    index: int
    call_id: str | None
    name: str
    received_bytes: int
    reason: str


class TurnOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """One decoded turn: its kind, the provider's raw reason beside callgate's own
    ``stop_reason``, the text, the complete ``calls`` (a rejected one has ``arguments``
    None and an ``error``; it never runs), ``incomplete_calls`` (diagnostics only), usage,
    the ``continuation`` items the next request must echo, and any provider error."""

    kind: OutcomeKind
    raw_reason: str | None
    # Why callgate classified the turn this way, in its own words.
    stop_reason: str
    response_id: str | None = None
    model: str | None = None
    text: str = ""
    refusal: str = ""
    calls: tuple[ProposedCall, ...] = ()
    incomplete_calls: tuple[IncompleteCall, ...] = ()
    usage: Usage = Usage()
    continuation: tuple[ContinuationItem, ...] = ()
    error: ProviderErrorInfo | None = None
    provider_details: tuple[ProviderDetail, ...] = ()

    @property
    def complete(self) -> bool:
        """True only for an explicit, successful completion of the turn."""
        return self.kind in (OutcomeKind.FINAL_TEXT, OutcomeKind.TOOL_PROPOSALS)
