"""What the host sees of a failure is the same on every anyio backend (asyncio, uvloop,
trio).

The backends' cancellation exceptions have different class names (asyncio's
``CancelledError``, trio's ``Cancelled``); a text built from ``type(exc).__name__``
(a stop reason persisted with the operation, a span's ``error.type``) would say which
event loop the worker ran on, and differ between two workers of one deployment. A
cancellation is named ``cancelled`` instead, whichever backend raised it.
"""

from __future__ import annotations

import anyio

__all__ = ["CANCELLED", "failure_name", "is_cancellation"]

CANCELLED = "cancelled"


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` is the running backend's cancellation (False off any event loop:
    nothing there cancels)."""
    try:
        cancelled = anyio.get_cancelled_exc_class()
    except RuntimeError:  # no event loop running in this thread
        return False
    return isinstance(exc, cancelled)


def failure_name(exc: BaseException) -> str:
    """``exc``'s type name for a text, the type only (its message may quote arguments
    or credentials); ``cancelled`` for the running backend's cancellation."""
    return CANCELLED if is_cancellation(exc) else type(exc).__name__
