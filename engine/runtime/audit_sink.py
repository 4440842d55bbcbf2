"""Where audit records go: a pluggable async sink, a JSON-lines file sink, a memory sink.

A sink receives records that ``core.audit.AuditChain`` already redacted, escaped and
chained; it only persists them, in the order given, one JSON object per line. It never
edits, drops or reorders a record (that would break the chain it is meant to keep) and
never logs record contents anywhere else.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import IO, Protocol, Self, runtime_checkable

import anyio
import anyio.to_thread

from callgate.engine.core.audit import AuditRecord, encode_line

__all__ = ["AuditSink", "JsonlAuditSink", "MemoryAuditSink", "encode_record"]


def encode_record(record: AuditRecord) -> bytes:
    """One JSON line (with its newline) for ``record``; ``verify_trail`` reads it back."""
    return encode_line(record) + b"\n"


@runtime_checkable
class AuditSink(Protocol):
    """Anything that can persist audit records in order."""

    async def write(self, record: AuditRecord) -> None: ...


class MemoryAuditSink:
    """Keeps records (and their encoded lines) in memory: tests and short-lived hosts."""

    def __init__(self) -> None:
        self.records: list[AuditRecord] = []
        self.lines: list[bytes] = []

    async def write(self, record: AuditRecord) -> None:
        self.records.append(record)
        self.lines.append(encode_record(record))


class JsonlAuditSink:
    """Appends one JSON line per record to ``path``.

    The file is opened lazily in append mode and written from a worker thread, so the
    event loop never blocks on disk. A lock keeps concurrent writers' lines whole and in
    call order. ``fsync=True`` makes every record durable before ``write`` returns (at the
    cost of one disk flush per record).
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self._fsync = fsync
        self._file: IO[bytes] | None = None
        self._lock = anyio.Lock()

    async def write(self, record: AuditRecord) -> None:
        line = encode_record(record)
        async with self._lock:
            await anyio.to_thread.run_sync(self._write_line, line)

    def _write_line(self, line: bytes) -> None:
        if self._file is None:
            self._file = self.path.open("ab")
        self._file.write(line)
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())

    async def aclose(self) -> None:
        # Shielded: a cancelled owner must still release the file handle.
        with anyio.CancelScope(shield=True):
            async with self._lock:
                handle, self._file = self._file, None
                if handle is not None:
                    await anyio.to_thread.run_sync(handle.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
