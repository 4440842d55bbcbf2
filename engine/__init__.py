"""callgate.engine: the provider-neutral tool-calling engine.

The model proposes; the host decides. The short public API:

- ``decode(provider, chunks)`` — replay a captured SSE body into a classified ``TurnOutcome``;
- ``Runner`` — drive a whole operation (model turns, validation, approvals, dispatch)
  against a provider endpoint, ending in an explicit ``OpState``;
- ``Registry`` / ``ToolSpec`` / ``RiskClass`` — the fixed allowlist of tools;
- ``Limits`` (stream caps) and ``Budgets`` (operation budgets).
"""

from .core.decode import StreamDecoder, decode
from .core.errors import CallgateError, ConfigError, LimitExceeded, StreamProtocolError
from .core.guards import Budgets
from .core.limits import DEFAULT_LIMITS, Limits
from .core.outcome import OutcomeKind, ProposedCall, TurnOutcome
from .core.registry import Registry, RiskClass, ToolContext, ToolSpec
from .core.states import OpState
from .runtime.loop import OperationResult, Runner

__all__ = [
    "DEFAULT_LIMITS",
    "Budgets",
    "CallgateError",
    "ConfigError",
    "LimitExceeded",
    "Limits",
    "OpState",
    "OperationResult",
    "OutcomeKind",
    "ProposedCall",
    "Registry",
    "RiskClass",
    "Runner",
    "StreamDecoder",
    "StreamProtocolError",
    "ToolContext",
    "ToolSpec",
    "TurnOutcome",
    "decode",
]
