"""What the two OpenAI adapters (Chat Completions and Responses) share: the in-stream
error object and its reading as a ``ProviderErrorInfo``.

Owns only pure translation helpers; never does HTTP, never trusts the provider's
message text for anything but diagnostics.
"""

from __future__ import annotations

import msgspec

from callgate.engine.core.outcome import ProviderErrorInfo

__all__ = ["ErrorView", "error_info"]

# Error types/codes that name a transient condition on the provider's side: a retry of
# the same request may succeed. Quota, auth and request errors are not transient.
_RETRYABLE_CODES = frozenset(
    {
        "internal_error",
        "internal_server_error",
        "overloaded",
        "overloaded_error",
        "rate_limit_error",
        "rate_limit_exceeded",
        "server_error",
        "service_unavailable",
        "timeout",
    }
)
# HTTP-like numeric codes (OpenRouter and other compatible endpoints put them in
# ``error.code``) that are transient.
_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504, 529})
_NOT_RETRYABLE_CODES = frozenset({"insufficient_quota"})


class ErrorView(msgspec.Struct, frozen=True, gc=False):
    """The fields of an OpenAI error object that callgate reads."""

    type: str | None = None
    code: str | int | None = None
    message: str | None = None


def error_info(view: ErrorView | str) -> ProviderErrorInfo:
    """Map an error object (or a bare error string, as some compatible endpoints send)
    to ``ProviderErrorInfo``; ``retryable`` only for transient provider conditions."""
    if isinstance(view, str):
        return ProviderErrorInfo(message=view)
    raw_code = view.code
    status: int | None = None
    if isinstance(raw_code, int):
        status = raw_code if 100 <= raw_code <= 599 else None
        code: str | None = str(raw_code)
    else:
        code = raw_code or None
    kind = view.type
    if code is None:
        code = kind or None
    retryable = (
        code not in _NOT_RETRYABLE_CODES
        and kind not in _NOT_RETRYABLE_CODES
        and (
            code in _RETRYABLE_CODES
            or kind in _RETRYABLE_CODES
            or (status is not None and status in _RETRYABLE_STATUS)
        )
    )
    return ProviderErrorInfo(code=code, message=view.message, status=status, retryable=retryable)
