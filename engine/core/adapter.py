"""The seam between the provider-neutral engine and one provider's wire format.

An adapter module in ``callgate.adapters`` exposes ``ADAPTER``, an object satisfying
``Adapter``. The engine never imports adapters statically: it resolves a provider
*name* through ``load_adapter`` (a lazy import by name), so adapters stay plugins.

Adapters are pure translators: SSE events in, engine events out (decode side);
engine values in, provider JSON shapes out (encode side). No HTTP, no clock.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import msgspec

from .errors import ConfigError
from .events import EngineEvent
from .limits import Limits
from .outcome import OutcomeKind, ProposedCall, TurnOutcome
from .sse import SSEEvent

__all__ = [
    "JSON",
    "PROVIDERS",
    "Adapter",
    "AdapterStream",
    "EncodeSide",
    "HttpRequestSpec",
    "ModelResult",
    "ToolDeclaration",
    "echo_arguments",
    "load_adapter",
    "unsendable_call",
]

# Provider name -> module in callgate.adapters. The public names are fixed.
PROVIDERS: tuple[str, ...] = (
    "anthropic",
    "gemini",
    "gemini_interactions",
    "openai_chat",
    "openai_responses",
)


class AdapterStream(Protocol):
    """Per-response decoding state of one adapter (one instance per HTTP response).

    A stream may also offer ``decode_batch(events, out)``: translate a chunk's SSE
    events in order into ``out`` (engine events, or ``ArgumentsRun`` for consecutive
    argument fragments), each event whole or not at all, leaving the events before an
    error in ``out`` when it raises. ``StreamDecoder`` uses it when present (one call per
    chunk instead of per event); ``decode`` must then mean ``decode_batch`` of one
    event. A stream without it is driven event by event."""

    def decode(self, event: SSEEvent) -> list[EngineEvent]:
        """Translate one SSE event. Raises ``StreamProtocolError`` on events the
        provider's protocol does not allow (the caller turns that into ``failed``).
        ``event.data`` is a bytes-like ``SSEData``: ``bytes``, or a read-only
        ``memoryview`` for a line that spanned chunks. Decode it as a buffer (msgspec
        and orjson take either, and ``==`` with bytes compares the bytes); call
        ``bytes(event.data)`` first for ``bytes`` methods such as ``decode`` or
        ``strip``, for ``in`` (on a view it looks for an int), ``+`` or hashing."""
        ...

    def end(self) -> list[EngineEvent]:
        """The byte stream ended. Emit the final ``Completion`` if the protocol's
        terminal signal was seen (and only then)."""
        ...


@runtime_checkable
class Adapter(Protocol):
    name: str
    family: str
    revision: str
    # Collect lines that are not SSE fields (Gemini appends raw JSON error bodies).
    sse_unframed: bool
    # Raw stop/finish reason -> outcome kind (the module-level table, for docs/tests).
    finish_reasons: Mapping[str, OutcomeKind]

    def new_stream(self, limits: Limits) -> AdapterStream:
        """Fresh decoding state for one response; ``limits`` bounds what it may buffer."""
        ...


_cache: dict[str, Adapter] = {}


def load_adapter(provider: str) -> Adapter:
    """Resolve a provider name to its adapter by a lazy import of
    ``callgate.adapters.<name>``. Unknown names are a ``ConfigError``."""
    adapter = _cache.get(provider)
    if adapter is not None:
        return adapter
    if provider not in PROVIDERS:
        raise ConfigError(f"unknown provider {provider!r}; expected one of {', '.join(PROVIDERS)}")
    module = importlib.import_module(f"callgate.adapters.{provider}")
    adapter = module.ADAPTER
    if not isinstance(adapter, Adapter):
        raise ConfigError(f"callgate.adapters.{provider}.ADAPTER does not satisfy Adapter")
    _cache[provider] = adapter
    return adapter


# --- encode side -------------------------------------------------------------------------
# The conversation is kept in the provider's own message shapes (plain JSON dicts owned by
# the adapter), so continuation items travel as the provider sent them and no lossy neutral
# form sits between.

JSON = dict[str, object]


class ToolDeclaration(msgspec.Struct, frozen=True):
    """What the model is told about one tool. ``parameters`` is a JSON Schema object."""

    name: str
    description: str
    parameters: dict[str, object]


class ModelResult(msgspec.Struct, frozen=True):
    """The model-facing projection of one call's result, ready for the wire.

    ``content`` is canonical JSON text of the model_result (or safe error text);
    ``is_error`` marks an error envelope. Nothing else about the result reaches the
    provider."""

    call_id: str
    name: str
    content: str
    is_error: bool = False


class HttpRequestSpec(msgspec.Struct, frozen=True):
    """Where and what to POST; the runtime's transport does the I/O."""

    path: str
    body: dict[str, object]
    headers: dict[str, str] = {}


@runtime_checkable
class EncodeSide(Protocol):
    """The encode half of an adapter (implemented by the same ``ADAPTER`` object)."""

    def initial_messages(self, user_text: str) -> list[JSON]:
        """The first user message(s) of a conversation."""
        ...

    def assistant_echo(self, outcome: TurnOutcome) -> list[JSON]:
        """The model's own turn, as the provider needs it echoed back on the next request
        (reasoning items, thinking blocks with signatures, thought signatures on the
        same part, text, calls), in output order."""
        ...

    def encode_results(self, outcome: TurnOutcome, results: list[ModelResult]) -> list[JSON]:
        """Messages/items that carry ``results`` back, in the provider's required shape and
        order (Anthropic tool_result blocks first, one Chat ``tool`` message per call...)."""
        ...

    def build_request(
        self,
        *,
        model: str,
        messages: list[JSON],
        tools: list[ToolDeclaration],
        system: str | None = None,
        max_tokens: int | None = None,
        previous: TurnOutcome | None = None,
    ) -> HttpRequestSpec:
        """The streaming request for the next model turn. ``previous`` is the last turn's
        outcome (Interactions uses its id as ``previous_interaction_id``)."""
        ...

    def auth_headers(self, api_key: str) -> dict[str, str]:
        """Headers that carry the API key (and API version where one is required)."""
        ...

    def unsendable(self, call: ProposedCall) -> str | None:
        """Why ``call`` could not be sent back in the conversation (a name or an id the
        family's API refuses there), or None. A turn holding one fails before any of its
        calls runs: the next request would be rejected after their effects."""
        ...


def unsendable_call(
    call: ProposedCall, name: re.Pattern[str], call_id: re.Pattern[str] | None = None
) -> str | None:
    """``EncodeSide.unsendable`` for a family whose API takes back only names matching
    ``name`` (and, if given, call ids matching ``call_id``; a derived id is never sent).
    The text names the pattern, and the model's name or id only as an escaped prefix."""
    if not name.fullmatch(call.name):
        return (
            f"the model proposed a call named {call.name[:64]!r}, which the provider "
            f"refuses in a conversation (a name must match {name.pattern}); nothing ran"
        )
    if call_id is not None and not call.call_id_derived and not call_id.fullmatch(call.call_id):
        return (
            f"the model's call id {call.call_id[:64]!r} is one the provider refuses in a "
            f"conversation (an id must match {call_id.pattern}); nothing ran"
        )
    return None


def echo_arguments(call: ProposedCall) -> str:
    """The argument text a call's echo carries (families that take it as a string): the
    bytes as received, or ``"{}"`` for a call that had none or whose arguments were
    rejected. Never the rejected text: servers that parse the history refuse a request
    with it (400), after the turn's valid calls ran; the call's error result tells the
    model what was wrong, and the raw bytes stay in the outcome and the audit trail."""
    if call.arguments is None:
        return "{}"
    return call.raw_arguments.decode("utf-8", "replace") or "{}"
