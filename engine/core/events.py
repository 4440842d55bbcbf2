"""Engine events: the provider-neutral vocabulary that adapters translate wire events into.

Adapters emit these; the turn assembler consumes them. They are frozen, tagged
msgspec Structs so that they are cheap to build, compare and serialize. A provider
detail without a field here travels in ``ProviderDetail`` rather than being dropped.
"""

from __future__ import annotations

import msgspec

from .outcome import ContinuationItem, OutcomeKind, ProviderDetail, ProviderErrorInfo, Usage

__all__ = [
    "ArgumentsDelta",
    "CallDone",
    "CallStarted",
    "Completion",
    "ContinuationItem",
    "EngineEvent",
    "ProviderDetail",
    "ProviderError",
    "RefusalDelta",
    "ResponseMeta",
    "TextDelta",
    "UsageReport",
]


class ResponseMeta(msgspec.Struct, frozen=True, tag="response_meta"):
    """The provider's response (or interaction) id and model, when first known."""

    response_id: str | None = None
    model: str | None = None


class TextDelta(msgspec.Struct, frozen=True, tag="text_delta"):
    text: str


class RefusalDelta(msgspec.Struct, frozen=True, tag="refusal_delta"):
    text: str


class CallStarted(msgspec.Struct, frozen=True, tag="call_started"):
    """A tool call opened at output ``index`` (the provider's fragment key).

    ``item_id`` is the provider's item id where it keys fragments by one (Responses
    ``fc_…``); ``call_id`` is what a result must reference (None where the provider
    omits it: the assembler derives one deterministically).
    """

    index: int
    name: str
    call_id: str | None = None
    item_id: str | None = None


class ArgumentsDelta(msgspec.Struct, frozen=True, tag="arguments_delta"):
    """One fragment of the JSON argument text of the call at ``index``."""

    index: int
    fragment: str


class CallDone(msgspec.Struct, frozen=True, tag="call_done"):
    """The provider's explicit "arguments complete" signal for the call at ``index``.

    ``arguments`` is the full argument text when the done event repeats it
    (Responses ``function_call_arguments.done``); it must equal the joined fragments.
    """

    index: int
    arguments: str | None = None


class UsageReport(msgspec.Struct, frozen=True, tag="usage"):
    """Token usage; fields left None keep the previous value (providers report in parts)."""

    usage: Usage


class Completion(msgspec.Struct, frozen=True, tag="completion"):
    """The provider's explicit terminal signal, mapped through the adapter's table.

    ``kind`` is the adapter's reading of ``raw_reason`` alone; the assembler refines
    it with what the turn held (a ``final_text`` turn with complete calls is
    ``tool_proposals``, one with refusal text is ``refusal``).
    """

    kind: OutcomeKind
    raw_reason: str | None


class ProviderError(msgspec.Struct, frozen=True, tag="provider_error"):
    """An error reported by the provider inside the stream. The message is kept for
    diagnostics only and never becomes a business status."""

    error: ProviderErrorInfo


EngineEvent = (
    ResponseMeta
    | TextDelta
    | RefusalDelta
    | CallStarted
    | ArgumentsDelta
    | CallDone
    | UsageReport
    | Completion
    | ProviderError
    | ContinuationItem
    | ProviderDetail
)
