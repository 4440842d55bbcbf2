"""Result binding: the dual projection of a result and the digests that tie it to its call.

A result has two projections. ``model_result`` is all the model ever sees.
``protected_audit`` is never sent to a provider and never logged unredacted: it names
the call (provider, API family, response id, call id), the business task (operation id,
idempotency key), who it ran for (tenant and subject refs), which code and policy shaped
it (adapter, input, output, effect, handler, producer and policy revisions), and three
digests:

- ``request_sha256``  = SHA-256(canonical ``[tool, arguments]``)
- ``result_sha256``   = SHA-256(canonical ``model_result``)
- ``binding_sha256``  = SHA-256, or HMAC-SHA256 under the host secret, of the canonical
  array ``["callgate-binding-v1", <every BindingContext field in BINDING_FIELDS order>,
  request_sha256, result_sha256, is_error]``.

Every field is a separate element of one canonical JSON array, so the encoding is
length-safe: no two different field tuples hash the same bytes. ``is_error`` is bound
too, because flipping it changes what the model is told.

A ``TrustedCall`` is callgate's own record of a proposed call; verification
(``correlation``) recomputes bindings from it and never trusts digests carried on a result.
This module never compares digests (that is ``correlation``'s job, with
``hmac.compare_digest``) and never does I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import msgspec

from .adapter import ModelResult
from .canonical import canonical_json, digest_fields, hmac_fields, sha256_hex
from .errors import ConfigError

__all__ = [
    "BINDING_FIELDS",
    "BINDING_VERSION",
    "BindingContext",
    "BoundResult",
    "ProtectedAudit",
    "TrustedCall",
    "bind",
    "binding_digest",
    "make_protected_audit",
    "request_digest",
    "result_digest",
    "to_model_result",
]

BINDING_VERSION = "callgate-binding-v1"


class BindingContext(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a result is bound to besides the tool, its arguments and its body.

    ``None`` is bound as JSON null, which is distinct from the empty string: a host that
    has no tenants says so explicitly rather than colliding with a tenant named ``""``.
    """

    provider: str
    api_family: str
    response_id: str | None
    call_id: str
    operation_id: str
    idempotency_key: str
    adapter_revision: str
    tenant_ref: str | None = None
    subject_ref: str | None = None
    input_revision: str | None = None
    output_revision: str | None = None
    effect_revision: str | None = None
    handler_revision: str | None = None
    producer_revision: str | None = None
    policy_revision: str | None = None

    @property
    def key(self) -> tuple[str | None, str]:
        """The correlation key of the call: ``(response_id, call_id)``."""
        return (self.response_id, self.call_id)


# The binding's field order is part of its wire format: never reorder, only append under a
# new BINDING_VERSION. (A test checks it names exactly BindingContext's fields.)
BINDING_FIELDS: tuple[str, ...] = (
    "provider",
    "api_family",
    "response_id",
    "call_id",
    "operation_id",
    "idempotency_key",
    "adapter_revision",
    "tenant_ref",
    "subject_ref",
    "input_revision",
    "output_revision",
    "effect_revision",
    "handler_revision",
    "producer_revision",
    "policy_revision",
)


class ProtectedAudit(msgspec.Struct, frozen=True, kw_only=True):
    """The half of a result that never reaches a provider: identity, revisions, digests.

    ``tool`` is carried for the audit trail (it is covered by ``request_sha256``);
    ``hmac`` says whether ``binding_sha256`` is an HMAC under the host secret.
    """

    provider: str
    api_family: str
    response_id: str | None
    call_id: str
    operation_id: str
    idempotency_key: str
    adapter_revision: str
    tenant_ref: str | None
    subject_ref: str | None
    input_revision: str | None
    output_revision: str | None
    effect_revision: str | None
    handler_revision: str | None
    producer_revision: str | None
    policy_revision: str | None
    tool: str
    request_sha256: str
    result_sha256: str
    binding_sha256: str
    hmac: bool


class BoundResult(msgspec.Struct, frozen=True, kw_only=True):
    """One call's result in both projections. Only ``model_result`` (and ``is_error``)
    may go to the model; ``protected_audit`` stays with the host."""

    model_result: dict[str, Any]
    protected_audit: ProtectedAudit
    is_error: bool = False


class TrustedCall(msgspec.Struct, frozen=True, kw_only=True):
    """callgate's own record of a proposed call, made when the call was accepted.

    ``arguments`` is the canonical JSON of the call's arguments (bytes, so the record
    cannot drift if a handler mutates the dict it was given).
    """

    ctx: BindingContext
    tool: str
    arguments: bytes

    @classmethod
    def record(cls, ctx: BindingContext, tool: str, arguments: Mapping[str, Any]) -> TrustedCall:
        """Record a call; raises ``ConfigError`` if the arguments have no canonical form."""
        return cls(ctx=ctx, tool=tool, arguments=canonical_json(arguments))

    @property
    def key(self) -> tuple[str | None, str]:
        return self.ctx.key

    def request_sha256(self) -> str:
        """``request_digest(tool, arguments)`` without decoding or re-encoding the
        arguments: the canonical array ``[tool,args]`` is exactly these bytes in a row."""
        h = hashlib.sha256(b"[")
        h.update(canonical_json(self.tool))
        h.update(b",")
        h.update(self.arguments)
        h.update(b"]")
        return h.hexdigest()


def request_digest(tool: str, arguments: Mapping[str, Any]) -> str:
    """SHA-256 (hex) over the canonical ``[tool, arguments]``."""
    return digest_fields(tool, arguments)


def result_digest(model_result: Mapping[str, Any]) -> str:
    """SHA-256 (hex) over the canonical ``model_result``."""
    return sha256_hex(canonical_json(model_result))


def binding_digest(
    ctx: BindingContext,
    request_sha: str,
    result_sha: str,
    secret: bytes | None,
    *,
    is_error: bool = False,
) -> str:
    """The call-binding digest: SHA-256, or HMAC-SHA256 when ``secret`` is given, over the
    canonical array of the version tag, every context field, both digests and ``is_error``.
    An empty secret is refused (it would look keyed without being so)."""
    fields = _binding_fields(ctx, request_sha, result_sha, is_error)
    if secret is None:
        return digest_fields(*fields)
    if not secret:
        raise ConfigError("the binding secret must not be empty")
    return hmac_fields(secret, *fields)


def _binding_fields(
    ctx: BindingContext, request_sha: str, result_sha: str, is_error: bool
) -> list[Any]:
    fields: list[Any] = [BINDING_VERSION]
    fields.extend(getattr(ctx, name) for name in BINDING_FIELDS)
    fields.extend((request_sha, result_sha, is_error))
    return fields


def make_protected_audit(
    ctx: BindingContext,
    tool: str,
    *,
    request_sha: str,
    result_sha: str,
    binding_sha: str,
    keyed: bool,
) -> ProtectedAudit:
    """Assemble the protected projection (shared by ``bind`` and verification)."""
    return ProtectedAudit(
        provider=ctx.provider,
        api_family=ctx.api_family,
        response_id=ctx.response_id,
        call_id=ctx.call_id,
        operation_id=ctx.operation_id,
        idempotency_key=ctx.idempotency_key,
        adapter_revision=ctx.adapter_revision,
        tenant_ref=ctx.tenant_ref,
        subject_ref=ctx.subject_ref,
        input_revision=ctx.input_revision,
        output_revision=ctx.output_revision,
        effect_revision=ctx.effect_revision,
        handler_revision=ctx.handler_revision,
        producer_revision=ctx.producer_revision,
        policy_revision=ctx.policy_revision,
        tool=tool,
        request_sha256=request_sha,
        result_sha256=result_sha,
        binding_sha256=binding_sha,
        hmac=keyed,
    )


def bind(  # noqa: PLR0917 - the documented positional form
    ctx: BindingContext,
    tool: str,
    arguments: Mapping[str, Any],
    model_result: dict[str, Any],
    is_error: bool,
    secret: bytes | None,
) -> BoundResult:
    """Produce a result in both projections, bound to its call.

    Raises ``ConfigError`` when the arguments or ``model_result`` have no canonical JSON
    form (the dispatcher builds model_result, so that is a host bug, not model input).
    """
    if not isinstance(model_result, dict):
        raise ConfigError("model_result must be a JSON object (dict)")
    request_sha = request_digest(tool, arguments)
    result_sha = result_digest(model_result)
    binding_sha = binding_digest(ctx, request_sha, result_sha, secret, is_error=is_error)
    audit = make_protected_audit(
        ctx,
        tool,
        request_sha=request_sha,
        result_sha=result_sha,
        binding_sha=binding_sha,
        keyed=secret is not None,
    )
    return BoundResult(model_result=model_result, protected_audit=audit, is_error=is_error)


def to_model_result(result: BoundResult) -> ModelResult:
    """The wire projection an adapter encodes: call id, tool name, the canonical JSON text
    of ``model_result`` and the error flag. Call only on results that passed
    ``verify_result_set``; nothing from ``protected_audit`` but the call id and tool name
    (both already known to the model) leaves the host."""
    audit = result.protected_audit
    return ModelResult(
        call_id=audit.call_id,
        name=audit.tool,
        content=canonical_json(result.model_result).decode("utf-8"),
        is_error=result.is_error,
    )
