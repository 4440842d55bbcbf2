"""The five ids of a tool call, and how callgate makes the three it owns.

| id                        | made by                  | here                        |
|---------------------------|--------------------------|-----------------------------|
| provider response/item id | the provider             | carried, never invented     |
| call id                   | the provider, or derived | ``derive_call_id``          |
| operation id              | callgate (random)        | ``new_operation_id``        |
| idempotency key           | callgate (derived)       | ``ToolSpec.idempotency_key``|
| approval id               | callgate (random)        | ``new_approval_id``         |

Random ids carry 128 bits from ``secrets``. Derived ids are digests of canonical JSON
arrays (see ``canonical``), each with its own domain tag so that an id of one kind can
never equal an id of another kind computed over the same fields.

This module never reads a clock or does I/O; it never derives an id from model text
alone where the id must be unguessable (operation, approval).
"""

from __future__ import annotations

import secrets

from .canonical import digest_fields

__all__ = [
    "APPROVAL_PREFIX",
    "CALL_PREFIX",
    "OPERATION_PREFIX",
    "derive_call_id",
    "new_approval_id",
    "new_operation_id",
]

OPERATION_PREFIX = "op_"
APPROVAL_PREFIX = "apr_"
CALL_PREFIX = "cgcall_"

# 16 bytes = 128 bits: unguessable and collision-free for any realistic number of ids.
_RANDOM_BYTES = 16
# 24 hex digits = 96 bits of the digest: unique per (response, index) for all practical
# purposes, short enough to fit every provider's call-id field.
_CALL_ID_HEX = 24


def new_operation_id() -> str:
    """A fresh operation id: the business task across turns, services and approvals."""
    return OPERATION_PREFIX + secrets.token_hex(_RANDOM_BYTES)


def new_approval_id() -> str:
    """A fresh approval id: one human decision."""
    return APPROVAL_PREFIX + secrets.token_hex(_RANDOM_BYTES)


def derive_call_id(response_id: str | None, index: int) -> str:
    """The call id for a provider that omits one: deterministic in the response id and the
    call's output index, so a replayed stream yields the same id (never random)."""
    return CALL_PREFIX + digest_fields("call-id", response_id, index)[:_CALL_ID_HEX]
