"""What an HTTP error answer says, read defensively: the code and message of its JSON
body (any shape, any depth: never an exception), the wait its ``retry-after`` headers ask
for, and the API key masked out of every provider text callgate keeps (endpoints echo a
rejected key). Pure functions over bytes, headers and values; the transport calls them."""

from __future__ import annotations

import datetime
import email.utils
import math
from collections.abc import Mapping

import msgspec

from callgate.engine.core.outcome import ProviderErrorInfo, TurnOutcome

__all__ = ["error_fields", "masked", "retry_after_seconds", "without_key"]


def error_fields(body: bytes) -> tuple[str | None, str | None]:
    """(code, message) from the usual JSON error shapes: ``{"error": {...}}`` with a string
    ``code``/``status``/``type`` and a ``message``. Anything else gives (None, None)."""
    try:
        data = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):  # (a body of nested brackets, too)
        return None, None
    if isinstance(data, list) and len(data) == 1:
        data = data[0]  # Gemini without alt=sse wraps every body in an array
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return None, None
    code = next(
        (error[k] for k in ("code", "status", "type") if isinstance(error.get(k), str)), None
    )
    message = error.get("message")
    return code, message if isinstance(message, str) else None  # (bounded by the Struct)


_KEY_PREFIX = 8  # the shortest key (or key start) masked: fewer would star out words


def without_key(outcome: TurnOutcome, api_key: str) -> TurnOutcome:
    """``outcome`` with the API key masked in its error (see ``masked``)."""
    error = outcome.error
    if error is None:
        return outcome
    kept = masked(error, api_key)
    return outcome if kept is error else msgspec.structs.replace(outcome, error=kept)


def masked(error: ProviderErrorInfo, api_key: str) -> ProviderErrorInfo:
    """``error`` with the API key masked in its message and code: endpoints echo a
    rejected key ("Incorrect API key provided: sk-..."), and the texts are kept and
    persisted. A text cut short (kept texts are capped) may end in the key's first
    characters: those are masked too."""
    if len(api_key) < _KEY_PREFIX:
        return error
    message, code = _mask(error.message, api_key), _mask(error.code, api_key)
    if message == error.message and code == error.code:
        return error
    return msgspec.structs.replace(error, message=message, code=code)


def _mask(text: str | None, api_key: str) -> str | None:
    if text is None:
        return None
    out = text.replace(api_key, "***")
    for size in range(min(len(api_key) - 1, len(out)), _KEY_PREFIX - 1, -1):
        if out.endswith(api_key[:size]):
            return out[:-size] + "***"
    return out


def retry_after_seconds(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds the provider asked us to wait: ``retry-after-ms``, or ``retry-after`` as
    delta-seconds or an HTTP-date (relative to ``now``, a Unix time). None when absent or
    unreadable; never negative."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        seconds = _non_negative(millis)
        if seconds is not None:
            return seconds / 1000.0
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _non_negative(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):  # (a day or zone past range)
        return None
    if when.tzinfo is None:  # "-0000" dates parse naive; HTTP-dates are always UTC
        when = when.replace(tzinfo=datetime.UTC)
    return max(when.timestamp() - now, 0.0)


def _non_negative(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None
