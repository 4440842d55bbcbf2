"""Progress events of an operation, for a UI: what the engine is doing right now.

"Preparing to call X" (``CallPreparing``) is emitted while a call's arguments are still
streaming and means exactly that: nothing has run. Only ``CallFinished`` reports a
handler that ran (or a call that was answered with an error envelope instead).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import msgspec
from anyio.streams.memory import MemoryObjectReceiveStream

__all__ = [
    "ApprovalRequested",
    "CallFinished",
    "CallPreparing",
    "CallRejected",
    "OperationEnded",
    "ProgressEvent",
    "ProgressSink",
    "StateChanged",
    "TextChunk",
    "TurnRetried",
    "progress_channel",
]


class StateChanged(msgspec.Struct, frozen=True, tag="state"):
    operation_id: str
    old: str
    new: str
    input: str


class CallPreparing(msgspec.Struct, frozen=True, tag="preparing"):
    """The model is preparing to call ``name``: arguments are streaming, nothing ran."""

    operation_id: str
    name: str
    call_id: str | None


class TextChunk(msgspec.Struct, frozen=True, tag="text"):
    operation_id: str
    text: str


class TurnRetried(msgspec.Struct, frozen=True, tag="retry"):
    """The model turn is being requested again (a cut stream, a retryable error): the
    text and calls shown since the failed attempt began are to be discarded."""

    operation_id: str
    attempt: int
    reason: str


class CallRejected(msgspec.Struct, frozen=True, tag="rejected"):
    operation_id: str
    call_id: str
    name: str
    code: str


class ApprovalRequested(msgspec.Struct, frozen=True, tag="approval"):
    operation_id: str
    approval_id: str
    call_id: str
    name: str
    expires_at: float


class CallFinished(msgspec.Struct, frozen=True, tag="executed"):
    """A call got its result: ``status`` is "ok" or an error code."""

    operation_id: str
    call_id: str
    name: str
    status: str
    duration_ms: float


class OperationEnded(msgspec.Struct, frozen=True, tag="ended"):
    operation_id: str
    state: str
    raw_reason: str | None
    stop_reason: str


ProgressEvent = (
    StateChanged
    | CallPreparing
    | TextChunk
    | TurnRetried
    | CallRejected
    | ApprovalRequested
    | CallFinished
    | OperationEnded
)
ProgressSink = Callable[[ProgressEvent], Awaitable[None]]


@asynccontextmanager
async def progress_channel(
    buffer: int = 256,
) -> AsyncIterator[tuple[ProgressSink, MemoryObjectReceiveStream[ProgressEvent]]]:
    """A sink to hand to the runner and the async iterator a UI reads from. The buffer
    is bounded: a slow reader slows the operation down instead of growing memory."""
    send, receive = anyio.create_memory_object_stream[ProgressEvent](buffer)

    async def sink(event: ProgressEvent) -> None:
        await send.send(event)

    async with send, receive:
        yield sink, receive
