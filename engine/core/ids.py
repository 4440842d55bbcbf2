"""The five ids of a tool call, and how callgate makes the three it owns.

| id                        | made by                  | here                        |
|---------------------------|--------------------------|-----------------------------|
| provider response/item id | the provider             | carried, never invented     |
| call id                   | the provider, or derived | ``derive_call_id``          |
| operation id              | callgate (random)        | ``new_operation_id``        |
| idempotency key           | callgate (derived)       | ``idempotency_key``         |
| approval id               | callgate (random)        | ``new_approval_id``         |

Random ids carry 128 bits from ``secrets``. Derived ids are digests of canonical JSON
arrays (see ``canonical``), each with its own domain tag so that an id of one kind can
never equal an id of another kind computed over the same fields.

This module never reads a clock or does I/O; it never derives an id from model text
alone where the id must be unguessable (operation, approval).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import Any

from .canonical import digest_fields

__all__ = [
    "APPROVAL_PREFIX",
    "CALL_PREFIX",
    "IDEMPOTENCY_PREFIX",
    "OPERATION_PREFIX",
    "KeyFields",
    "derive_call_id",
    "idempotency_key",
    "new_approval_id",
    "new_operation_id",
    "select_fields",
]

OPERATION_PREFIX = "op_"
APPROVAL_PREFIX = "apr_"
CALL_PREFIX = "cgcall_"
IDEMPOTENCY_PREFIX = "idk_"

# 16 bytes = 128 bits: unguessable and collision-free for any realistic number of ids.
_RANDOM_BYTES = 16
# 24 hex digits = 96 bits of the digest: unique per (response, index) for all practical
# purposes, short enough to fit every provider's call-id field.
_CALL_ID_HEX = 24

KeyFields = Callable[[Mapping[str, Any]], Any]
"""A per-tool function choosing the *business* part of a call's arguments (what makes
two calls the same intent); its return value must have a canonical JSON form."""


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


def idempotency_key(
    operation_id: str,
    tool: str,
    business_arguments: Mapping[str, Any],
    key_fields: KeyFields | None = None,
) -> str:
    """The idempotency key of a business intent.

    Derived from the operation id, the tool name and the canonical form of the business
    arguments that ``key_fields`` selects (default: all of them). The call id is not an
    input: a model that retries the same refund under a new call id gets the same key, so
    the ledger refuses to repeat the side effect. Raises ``ConfigError`` when the
    selection has no canonical JSON form.
    """
    selected = business_arguments if key_fields is None else key_fields(business_arguments)
    return IDEMPOTENCY_PREFIX + digest_fields("idempotency-key", operation_id, tool, selected)


def select_fields(*names: str) -> KeyFields:
    """A ``KeyFields`` that keeps only the named top-level arguments.

    A named field that is absent stays absent (it is not bound as null), so "no amount"
    and ``"amount": null`` remain different intents.
    """
    chosen = tuple(names)

    def pick(arguments: Mapping[str, Any]) -> dict[str, Any]:
        return {name: arguments[name] for name in chosen if name in arguments}

    return pick
