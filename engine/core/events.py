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
    "ArgumentsRun",
    "BatchEvent",
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
    "append_fragments",
]


class ResponseMeta(msgspec.Struct, frozen=True, gc=False, tag="response_meta"):
    """The provider's response (or interaction) id and model, when first known."""

    response_id: str | None = None
    model: str | None = None


class TextDelta(msgspec.Struct, frozen=True, gc=False, tag="text_delta"):
    text: str


class RefusalDelta(msgspec.Struct, frozen=True, gc=False, tag="refusal_delta"):
    text: str


class CallStarted(msgspec.Struct, frozen=True, gc=False, tag="call_started"):
    """A tool call opened at output ``index`` (the provider's fragment key).

    ``item_id`` is the provider's item id where it keys fragments by one (Responses
    ``fc_…``); ``call_id`` is what a result must reference (None where the provider
    omits it: the assembler derives one deterministically).
    """

    index: int
    name: str
    call_id: str | None = None
    item_id: str | None = None


class ArgumentsDelta(msgspec.Struct, frozen=True, gc=False, tag="arguments_delta"):
    """One fragment of the JSON argument text of the call at ``index``."""

    index: int
    fragment: str


class ArgumentsRun(msgspec.Struct, frozen=True, gc=False, tag="arguments_run"):
    """Consecutive argument fragments as one event: ``pieces[k]`` belongs to the call at
    ``indexes[k]`` (one call, or several interleaved). An adapter's ``decode_batch``
    emits it for a run of fragment events, so that a long stream costs one engine event
    per chunk rather than per 8-byte fragment. No piece is empty. The pipeline applies
    it exactly as the fragments one by one (a cap crossed inside the run fails or
    spoils at the same fragment), and ``StreamDecoder.feed`` hands it to its callers
    as ``ArgumentsDelta`` events, one per call, of that call's joined pieces."""

    indexes: list[int]
    pieces: list[str]

    def deltas(self) -> list[ArgumentsDelta]:
        indexes, pieces = self.indexes, self.pieces
        first = indexes[0]
        if indexes.count(first) == len(indexes):
            return [ArgumentsDelta(first, "".join(pieces))]
        joined: dict[int, list[str]] = {}
        for index, piece in zip(indexes, pieces, strict=True):
            joined.setdefault(index, []).append(piece)
        return [ArgumentsDelta(index, "".join(parts)) for index, parts in joined.items()]


class CallDone(msgspec.Struct, frozen=True, gc=False, tag="call_done"):
    """The provider's explicit "arguments complete" signal for the call at ``index``.

    ``arguments`` is the full argument text when the done event repeats it
    (Responses ``function_call_arguments.done``); it must equal the joined fragments.
    ``literal`` carries the same text as the JSON string literal it arrived in (escapes
    included, a view of the event's bytes), so that a long repeated text is compared a
    slice at a time instead of being decoded whole. ``raw`` is the exact argument bytes
    of a call that arrives whole, without fragments (a Gemini ``functionCall`` part):
    they are parsed as received, never re-encoded. ``error`` says why the adapter refused
    arguments it assembled itself (a Vertex streamed call past a per-call cap): the call
    is done and refused, and carries no text; ``refused_bytes`` is how many bytes it had
    (they count against the response's cap, as a refused call's fragments do).
    """

    index: int
    arguments: str | None = None
    raw: bytes | None = None
    literal: msgspec.Raw | None = None
    error: str | None = None
    refused_bytes: int = 0


class UsageReport(msgspec.Struct, frozen=True, gc=False, tag="usage"):
    """Token usage; fields left None keep the previous value (providers report in parts)."""

    usage: Usage


class Completion(msgspec.Struct, frozen=True, gc=False, tag="completion"):
    """The provider's explicit terminal signal, mapped through the adapter's table.

    ``kind`` is the adapter's reading of ``raw_reason`` alone; the assembler refines
    it with what the turn held (a ``final_text`` turn with complete calls is
    ``tool_proposals``, one with refusal text is ``refusal``).
    """

    kind: OutcomeKind
    raw_reason: str | None


class ProviderError(msgspec.Struct, frozen=True, gc=False, tag="provider_error"):
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

BatchEvent = EngineEvent | ArgumentsRun
"""What ``decode_batch`` may emit: an engine event or a run of argument fragments."""


def append_fragments(out: list[BatchEvent], indexes: list[int], pieces: list[str]) -> None:
    """Emit the fragments an adapter's ``decode_batch`` collected: one ``ArgumentsDelta``,
    or an ``ArgumentsRun`` (which takes ownership of both lists) for several."""
    if len(pieces) == 1:
        out.append(ArgumentsDelta(indexes[0], pieces[0]))
    elif pieces:
        out.append(ArgumentsRun(indexes, pieces))
