"""The seam between the provider-neutral engine and one provider's wire format.

An adapter module in ``callgate.adapters`` exposes ``ADAPTER``, an object satisfying
``Adapter``. The engine never imports adapters statically: it resolves a provider
*name* through ``load_adapter`` (a lazy import by name), so adapters stay plugins.

Adapters are pure translators: SSE events in, engine events out (decode side);
engine values in, provider JSON shapes out (encode side). No HTTP, no clock.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from .errors import ConfigError
from .events import EngineEvent
from .outcome import OutcomeKind
from .sse import SSEEvent

__all__ = ["PROVIDERS", "Adapter", "AdapterStream", "load_adapter"]

# Provider name -> module in callgate.adapters. The public names are fixed.
PROVIDERS: tuple[str, ...] = (
    "anthropic",
    "gemini",
    "gemini_interactions",
    "openai_chat",
    "openai_responses",
)


class AdapterStream(Protocol):
    """Per-response decoding state of one adapter (one instance per HTTP response)."""

    def decode(self, event: SSEEvent) -> list[EngineEvent]:
        """Translate one SSE event. Raises ``StreamProtocolError`` on events the
        provider's protocol does not allow (the caller turns that into ``failed``)."""
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

    def new_stream(self) -> AdapterStream: ...


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
