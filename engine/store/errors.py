"""The durable store's typed errors, all below ``callgate.engine.core.errors.StoreError``.

Every refusal the store makes on purpose is one of these; driver exceptions (sqlite3,
asyncpg, OS errors) are mapped to them at the backend seam, never leaked. Each class
carries a stable ``code`` the run loop and the CLI can show or put in an error envelope.

    StoreError (core)
    ├── StaleWriteError (core)      version / fencing token no longer current
    │   └── LedgerOwnershipLost     a ledger write by an owner that no longer holds the key
    ├── RecordNotFound              no row with that id / key
    ├── DuplicateRecord             a create with an id that already exists
    ├── StoreBusy                   SQLite stayed locked past the bounded busy-retry
    ├── StoreUnavailable            the database could not be reached or failed
    ├── SchemaTooNew                the database was migrated by a newer callgate
    └── ApprovalError               an approval is not in a state that allows the request
        ├── ApprovalAlreadyDecided  a second decision (the first one wins)
        ├── ApprovalExpired         decided / consumed at or after ``expires_at``
        ├── ApprovalNotApproved     consume of a pending or denied approval
        └── ApprovalAlreadyConsumed consume of an approval that was already used
"""

from __future__ import annotations

from typing import ClassVar

from callgate.engine.core.errors import StaleWriteError, StoreError

__all__ = [
    "ApprovalAlreadyConsumed",
    "ApprovalAlreadyDecided",
    "ApprovalError",
    "ApprovalExpired",
    "ApprovalNotApproved",
    "DuplicateRecord",
    "LedgerOwnershipLost",
    "RecordNotFound",
    "SchemaTooNew",
    "StoreBusy",
    "StoreUnavailable",
]


class RecordNotFound(StoreError):
    code: ClassVar[str] = "not_found"


class DuplicateRecord(StoreError):
    code: ClassVar[str] = "duplicate_record"


class StoreBusy(StoreError):
    """SQLite reported SQLITE_BUSY/LOCKED on every attempt of the bounded retry."""

    code: ClassVar[str] = "store_busy"


class StoreUnavailable(StoreError):
    code: ClassVar[str] = "store_unavailable"


class SchemaTooNew(StoreError):
    """Refuse to run against a schema this code does not know: a newer release migrated
    the database, and writing with an older row shape could corrupt it."""

    code: ClassVar[str] = "schema_too_new"


class LedgerOwnershipLost(StaleWriteError):
    """``ledger_finish``/``mark_unknown``/``resolve_unknown`` by an owner that does not
    (or no longer) hold the key in the state the call requires."""

    code: ClassVar[str] = "ledger_ownership_lost"


class ApprovalError(StoreError):
    code: ClassVar[str] = "approval_error"

    def __init__(self, approval_id: str, status: str, detail: str = "") -> None:
        self.approval_id = approval_id
        self.status = status
        msg = f"approval {approval_id!r} is {status}"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class ApprovalAlreadyDecided(ApprovalError):
    code: ClassVar[str] = "approval_already_decided"


class ApprovalExpired(ApprovalError):
    code: ClassVar[str] = "approval_expired"


class ApprovalNotApproved(ApprovalError):
    code: ClassVar[str] = "approval_not_approved"


class ApprovalAlreadyConsumed(ApprovalError):
    code: ClassVar[str] = "approval_already_consumed"
