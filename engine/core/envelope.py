"""Error envelopes: the structured, safe result a rejected or failed call returns to the model.

A call that cannot run (unknown tool, bad arguments, denied, ...) or that failed while
running is not an exception: it becomes an ``ErrorEnvelope`` that goes back to the model
as that call's result. The message is fixed text chosen by ``ErrorCode``, optionally
followed by a *safe detail* (a schema path and the kind of mismatch, never a value).

This module must never put into a message: a stack trace, an exception's text, a secret,
an argument value, or a provider's error text. ``safe_validation_detail`` is the one place
that turns msgspec's validation text into something safe to show.
"""

from __future__ import annotations

import enum
import re

import msgspec

__all__ = [
    "RAN_TOO_LARGE",
    "RAN_WITHOUT_RESULT",
    "ErrorCode",
    "ErrorEnvelope",
    "safe_validation_detail",
]


class ErrorCode(enum.StrEnum):
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGUMENTS = "invalid_arguments"
    UNAUTHORIZED = "unauthorized"
    DENIED = "denied"
    DUPLICATE_CALL = "duplicate_call"
    NO_PROGRESS = "no_progress"
    TIMEOUT = "timeout"
    HANDLER_ERROR = "handler_error"
    RESULT_TOO_LARGE = "result_too_large"
    BUDGET_EXHAUSTED = "budget_exhausted"
    OUTCOME_UNKNOWN = "outcome_unknown"
    APPROVAL_EXPIRED = "approval_expired"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"


# The model reads these; they say what happened and what (not) to do next, nothing more.
_MESSAGES: dict[ErrorCode, str] = {
    ErrorCode.UNKNOWN_TOOL: "No tool with this name is available.",
    ErrorCode.INVALID_ARGUMENTS: "The arguments do not match the tool's schema.",
    ErrorCode.UNAUTHORIZED: "The caller is not authorized to use this tool for this request.",
    ErrorCode.DENIED: "Policy denied this call.",
    ErrorCode.DUPLICATE_CALL: (
        "This call id already appeared in this response; only its first occurrence is handled."
    ),
    ErrorCode.NO_PROGRESS: (
        "An identical call already ran and nothing has changed since, so it was not run again. "
        "Use the earlier result, try something different, or answer with what you have."
    ),
    ErrorCode.TIMEOUT: "The tool did not finish within its time limit.",
    ErrorCode.HANDLER_ERROR: "The tool failed while running.",
    ErrorCode.RESULT_TOO_LARGE: "The tool's result exceeded the size limit.",
    ErrorCode.BUDGET_EXHAUSTED: "The operation's budget is exhausted; this call was not run.",
    ErrorCode.OUTCOME_UNKNOWN: (
        "The tool's outcome is unknown: it may or may not have taken effect. "
        "It will not be retried automatically."
    ),
    # Said of both cases: nobody decided in time, or an approval lapsed before its use.
    ErrorCode.APPROVAL_EXPIRED: "The approval expired before the call could run; it did not run.",
    ErrorCode.IDEMPOTENCY_CONFLICT: (
        "A call with the same business intent already ran with different arguments."
    ),
}

# The detail of an ``outcome_unknown`` for a side-effecting tool whose handler returned a
# value that cannot be sent back (not JSON data): the effect ran, its result is lost.
RAN_WITHOUT_RESULT = (
    "The tool ran, but its result could not be returned; do not call it again to find out."
)
# The detail of a ``result_too_large`` for a side-effecting tool: its effect happened, so a
# call made again to see a smaller result would repeat it.
RAN_TOO_LARGE = "The tool ran (its effect happened); do not call it again to see its result."

# Whether proposing the call again (possibly corrected) may succeed. A hint for the model,
# never for the engine: outcome_unknown is False because a blind retry may repeat a side
# effect; invalid_arguments is True because a corrected call may pass.
_RETRYABLE: frozenset[ErrorCode] = frozenset(
    {
        ErrorCode.INVALID_ARGUMENTS,
        ErrorCode.TIMEOUT,
        ErrorCode.HANDLER_ERROR,
        ErrorCode.APPROVAL_EXPIRED,
    }
)

# Details are short: a path plus a mismatch kind. Longer text is cut, not trusted.
_MAX_DETAIL_CHARS = 240


class ErrorEnvelope(msgspec.Struct, frozen=True, kw_only=True):
    """One call's error result. Build it with ``ErrorEnvelope.of(code, detail)``.

    ``message`` is the fixed text for ``code``, plus ``": " + detail`` when a safe detail
    was given; ``retryable`` is a hint that a corrected re-proposal may succeed.
    """

    code: ErrorCode
    message: str
    retryable: bool = False

    @classmethod
    def of(cls, code: ErrorCode, detail: str | None = None) -> ErrorEnvelope:
        """The envelope for ``code``. ``detail`` must already be safe (see
        ``safe_validation_detail``); it is cut to a bounded length."""
        message = _MESSAGES[code]
        if detail:
            message = f"{message} {detail[:_MAX_DETAIL_CHARS]}"
        return cls(code=code, message=message, retryable=code in _RETRYABLE)

    def to_model_result(self) -> dict[str, object]:
        """The model-facing projection: ``{"error": {"code": ..., "message": ...}}``."""
        return {"error": {"code": self.code.value, "message": self.message}}


# msgspec validation errors read "<what> - at `<path>`" (no suffix at the root).
_AT_PATH = re.compile(r"^(?P<head>.*) - at `(?P<path>\$[^`]*)`$", re.DOTALL)
# Heads whose text names only types, schema fields or the schema's own constraints.
_SAFE_HEADS = (
    re.compile(r"^Expected `[^`]+`.*$", re.DOTALL),  # types and constraints, never values
    re.compile(r"^Object missing required field `[^`]+`$"),  # a field the schema declares
    re.compile(r"^Invalid [A-Za-z0-9 ]+$"),  # "Invalid UUID", "Invalid RFC3339 ... datetime"
)
# Heads that would echo model-supplied text; they keep their kind and lose the value.
_REDACTED_HEADS = (
    ("Object contains unknown field", "Object contains an unknown field"),
    ("Invalid enum value", "Invalid enum value"),
)


def safe_validation_detail(error_text: str) -> str:
    """Reduce a msgspec ``ValidationError`` text to a safe detail: the kind of mismatch
    and the JSON path (``at `$.x```), never the offending value or an unknown key."""
    match = _AT_PATH.match(error_text)
    head, path = (match["head"], match["path"]) if match else (error_text, "$")
    # Redactions first: "Invalid enum value 5" would otherwise pass as a safe head.
    for prefix, replacement in _REDACTED_HEADS:
        if head.startswith(prefix):
            safe_head = replacement
            break
    else:
        safe_head = head if any(p.match(head) for p in _SAFE_HEADS) else "Invalid value"
    return f"{safe_head} - at `{path}`"
