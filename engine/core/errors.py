"""The exception hierarchy of callgate.

Exceptions are for the host's own bugs, misconfiguration and hard limits on
untrusted input. A *model's* bad output never surfaces as an exception to the
host: the stream decoder turns it into an explicit ``TurnOutcome`` and the run
loop into an error envelope.

    CallgateError
    ├── ConfigError            misuse of the API by the host (unknown provider, bad limit)
    ├── IllegalTransition      a state change the transition table does not allow
    ├── LimitExceeded          a configured cap was hit (carries the limit's name and value)
    │   ├── SSELineTooLong
    │   └── SSEEventTooLarge
    ├── StreamProtocolError    the byte stream or its events break the wire protocol
    ├── BindingError           a result does not provably belong to its call
    └── StoreError             the durable store refused or failed an operation
        └── StaleWriteError    a fencing token no longer holds (another worker took over)
"""

from __future__ import annotations

__all__ = [
    "BindingError",
    "CallgateError",
    "ConfigError",
    "IllegalTransition",
    "LimitExceeded",
    "SSEEventTooLarge",
    "SSELineTooLong",
    "StaleWriteError",
    "StoreError",
    "StreamProtocolError",
]


class CallgateError(Exception):
    """Root of every exception callgate raises on purpose."""


class ConfigError(CallgateError):
    """The host asked for something that cannot work (a programming error)."""


class IllegalTransition(CallgateError):
    """An operation state change that the transition table does not list."""


class LimitExceeded(CallgateError):
    """A configured cap was exceeded; ``limit`` names it, ``value`` is the cap."""

    def __init__(self, limit: str, value: int, detail: str = "") -> None:
        self.limit = limit
        self.value = value
        self.detail = detail
        msg = f"limit {limit}={value} exceeded"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class SSELineTooLong(LimitExceeded):
    """One SSE line grew past ``Limits.max_line_bytes`` without a line end."""


class SSEEventTooLarge(LimitExceeded):
    """One SSE event's data grew past ``Limits.max_event_bytes``."""


class StreamProtocolError(CallgateError):
    """The stream is not what its provider's protocol allows (bad UTF-8, bad JSON event,
    a fragment for a call that never started, an index reused, ...)."""


class BindingError(CallgateError):
    """A result's binding digest, identity or membership in its turn's set is wrong."""


class StoreError(CallgateError):
    """The durable store refused or failed an operation."""


class StaleWriteError(StoreError):
    """A write carried a fencing token that is no longer current."""
