"""Shrink a failing fuzz input while it keeps failing the same way.

Works on any target's ``check``: first whole SSE events are removed (delta debugging),
then single lines, then byte ranges of halving size. "The same way" means the same
exception type and the same message with digits and quoted values blanked, so the
reproducer shows the original finding and not a different one met on the way. Pure
Python, no atheris: ``fuzz/run.py`` calls it on every crash artifact.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from .mutators import split_events

__all__ = ["failure_signature", "minimize"]

_NOISE = re.compile(r"\d+|'[^']*'|\"[^\"]*\"|b'[^']*'")


def failure_signature(check: Callable[[bytes], None], data: bytes) -> str | None:
    """``"<ExceptionType>: <message shape>"`` for a failing input, None if it passes."""
    try:
        check(data)
    except Exception as exc:
        return f"{type(exc).__name__}: {_NOISE.sub('_', str(exc))[:80]}"
    return None


def _shrink(
    pieces: list[bytes], still_fails: Callable[[bytes], bool], deadline: float
) -> list[bytes]:
    """Delta debugging over ``pieces``: drop chunks of them while the join still fails."""
    n = 2
    while len(pieces) >= 2 and time.monotonic() < deadline:
        size = max(1, len(pieces) // n)
        removed = False
        for start in range(0, len(pieces), size):
            candidate = pieces[:start] + pieces[start + size :]
            if candidate and still_fails(b"".join(candidate)):
                pieces = candidate
                n = max(n - 1, 2)
                removed = True
                break
        if not removed:
            if size == 1:
                break
            n = min(n * 2, len(pieces))
    return pieces


def minimize(check: Callable[[bytes], None], data: bytes, seconds: float = 30.0) -> bytes:
    """The smallest input found within ``seconds`` that fails ``check`` like ``data``."""
    signature = failure_signature(check, data)
    if signature is None:
        return data
    deadline = time.monotonic() + seconds

    def still_fails(candidate: bytes) -> bool:
        return failure_signature(check, candidate) == signature

    data = b"".join(_shrink(split_events(data), still_fails, deadline))
    data = b"".join(_shrink(data.splitlines(keepends=True), still_fails, deadline))
    step = max(1, len(data) // 8)
    while step >= 1 and time.monotonic() < deadline:
        data = b"".join(
            _shrink([data[i : i + step] for i in range(0, len(data), step)], still_fails, deadline)
        )
        step //= 2
    return data
