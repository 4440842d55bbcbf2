"""callgate.engine.store: durable operations, approvals and the idempotency ledger.

``open_store(url)`` gives a ``Store`` (SQLite file by default, PostgreSQL for many
workers); ``base.py`` documents the contract, ``errors.py`` the typed refusals.
``MemoryStore`` is for unit tests only.
"""

from .base import (
    LEDGER_IN_FLIGHT_LEASE,
    LEDGER_RETENTION,
    ApprovalRecord,
    ApprovalStatus,
    Began,
    Conflict,
    InFlight,
    LedgerDecision,
    LedgerRecord,
    LedgerState,
    OperationRecord,
    Replay,
    Store,
    Unknown,
)
from .errors import (
    ApprovalAlreadyConsumed,
    ApprovalAlreadyDecided,
    ApprovalError,
    ApprovalExpired,
    ApprovalNotApproved,
    DuplicateRecord,
    LedgerOwnershipLost,
    RecordNotFound,
    SchemaTooNew,
    StoreBusy,
    StoreUnavailable,
)
from .memory import MemoryStore
from .postgres import PostgresStore
from .sqlite import SQLiteStore
from .url import open_store, redact_url

__all__ = [
    "LEDGER_IN_FLIGHT_LEASE",
    "LEDGER_RETENTION",
    "ApprovalAlreadyConsumed",
    "ApprovalAlreadyDecided",
    "ApprovalError",
    "ApprovalExpired",
    "ApprovalNotApproved",
    "ApprovalRecord",
    "ApprovalStatus",
    "Began",
    "Conflict",
    "DuplicateRecord",
    "InFlight",
    "LedgerDecision",
    "LedgerOwnershipLost",
    "LedgerRecord",
    "LedgerState",
    "MemoryStore",
    "OperationRecord",
    "PostgresStore",
    "RecordNotFound",
    "Replay",
    "SQLiteStore",
    "SchemaTooNew",
    "Store",
    "StoreBusy",
    "StoreUnavailable",
    "Unknown",
    "open_store",
    "redact_url",
]
