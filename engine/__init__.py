"""callgate.engine: the provider-neutral tool-calling engine.

The model proposes; the host decides. The short public API:

- ``decode(provider, chunks)`` — replay a captured SSE body into a classified ``TurnOutcome``;
- ``Runner`` — drive a whole operation (model turns, validation, approvals, dispatch)
  against a ``ProviderEndpoint``, ending in an explicit ``OpState`` (an
  ``OperationResult`` with its ``StopInfo`` and ``CallSummary`` rows);
- ``Registry`` / ``ToolSpec`` / ``RiskClass`` — the fixed allowlist of tools, with the
  ``AuthContext`` / ``PolicyContext`` / ``Decision`` its authorize and policy hooks see;
- ``open_store(url)`` / ``Store`` — where pauses, approvals and the ledger persist
  (``callgate.engine.store`` has the backends and their typed errors);
- ``Limits`` (stream caps) and ``Budgets`` (operation budgets);
- ``CallgateError`` and its kinds (``ConfigError``, ``StoreError``, ...).
"""

from .core.decode import StreamDecoder, decode
from .core.errors import (
    CallgateError,
    ConfigError,
    LimitExceeded,
    StoreError,
    StreamProtocolError,
)
from .core.guards import Budgets
from .core.limits import DEFAULT_LIMITS, Limits
from .core.outcome import OutcomeKind, ProposedCall, TurnOutcome
from .core.registry import (
    AuthContext,
    Decision,
    PolicyContext,
    Registry,
    RiskClass,
    ToolContext,
    ToolSpec,
)
from .core.states import OpState, StopInfo
from .runtime.loop import OperationResult, Runner
from .runtime.operation import CallSummary
from .runtime.transport import ProviderEndpoint
from .store import Store, open_store

__all__ = [
    "DEFAULT_LIMITS",
    "AuthContext",
    "Budgets",
    "CallSummary",
    "CallgateError",
    "ConfigError",
    "Decision",
    "LimitExceeded",
    "Limits",
    "OpState",
    "OperationResult",
    "OutcomeKind",
    "PolicyContext",
    "ProposedCall",
    "ProviderEndpoint",
    "Registry",
    "RiskClass",
    "Runner",
    "StopInfo",
    "Store",
    "StoreError",
    "StreamDecoder",
    "StreamProtocolError",
    "ToolContext",
    "ToolSpec",
    "TurnOutcome",
    "decode",
    "open_store",
]
