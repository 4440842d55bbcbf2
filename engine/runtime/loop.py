"""The run loop: one tool-calling operation from the first model request to an explicit
terminal state, with approval pauses persisted in the store (no coroutine waits on a
human) and resumable by any worker.

Per model turn: request → classified outcome → validation (in the order of
``core.validation``) → approval pause, or bounded dispatch → binding and verification of
every result → the provider's result shape → next request. Every phase change goes
through the transition table (``core.states``); every terminal state carries the
provider's raw reason and callgate's own. Exhausting a budget ends in ESCALATED with the
partial results kept, never with an exception.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeGuard

import httpx
import msgspec

from callgate.engine.core.adapter import EncodeSide, load_adapter
from callgate.engine.core.audit import AuditChain, AuditRecord
from callgate.engine.core.errors import ConfigError, StoreError
from callgate.engine.core.guards import Budgets, BudgetTracker
from callgate.engine.core.ids import new_operation_id
from callgate.engine.core.limits import DEFAULT_LIMITS, Limits
from callgate.engine.core.registry import Registry, RiskClass, ToolSpec
from callgate.engine.core.states import (
    TERMINAL,
    OpInput,
    OpState,
)
from callgate.engine.core.validation import (
    ApprovalDecision,
)
from callgate.engine.store.base import OperationRecord, Store

from .backends import failure_name, is_cancellation
from .decisions import collect_decisions
from .operation import (
    CallSummary,
    DriveMarks,
    OperationResult,
    OperationSnapshot,
    RunSettings,
    decode_snapshot,
)
from .progress import (
    OperationEnded,
    ProgressEvent,
)
from .recovery import drive_failed, mark_past_pause, release, settle_stuck
from .slots import LoopLimiters
from .steps import OperationDrive
from .transport import ProviderEndpoint, RetryPolicy, TransportTimeouts

AuditWriter = Callable[[AuditRecord], Awaitable[None]]


__all__ = ["CallSummary", "OperationResult", "Runner", "sendable_model"]


def sendable_model(model: object) -> TypeGuard[str]:
    """Whether ``model`` can name the model of a request: a non-empty printable name, not
    padded with spaces. (A request field, and a URL path segment for Gemini: a control
    character would only fail in the HTTP library, after the operation was stored.)"""
    return isinstance(model, str) and bool(model) and model == model.strip() and model.isprintable()


class Runner:
    """Drives operations for one provider/model/registry. Reusable and concurrency-safe
    across operations; each ``start``/``resume`` call drives one operation.

    ``budgets``, ``system``, ``max_tokens`` and ``approval_ttl`` are the operation's from
    its ``start``: kept with it (``RunSettings``), they hold whichever runner resumes it.

    ``claim_stale_after`` (seconds, default None): lets ``resume`` take over an operation
    still claimed by a worker that has not written it for that long — one that died
    mid-resume before asking the model again (a failure that raises releases its claim
    itself, see ``resume``) is resumed from its pause; one that died mid-start, or
    mid-resume after asking the model, is ended ``escalated`` (nothing can replay it
    without asking the model again). None keeps claims exclusive until their owner
    releases them. A worker writes the operation when it claims it, when a resumed drive
    first asks the model, and when its drive ends, so the value must exceed the longest drive (the
    ``deadline_seconds`` budget, handler deadlines included) plus clock skew between
    workers: a live drive taken over is fenced at its final write, and the idempotency
    ledger keeps its side effects single, but its model requests are repeated.

    ``audit_secret`` (bytes, default None): keys the audit chain (HMAC-SHA256 instead of
    SHA-256), so a trail edited and re-chained without it fails ``callgate audit verify
    --secret-env VAR``; it also keys the digests written for tools with sensitive paths
    (without it they are left out). Keep it constant for an operation's lifetime (a
    resumed drive continues the same chain) and apart from ``binding_secret``.

    ``client`` (default None: one per drive): an ``httpx.AsyncClient`` of the host's for
    the model requests, for its transport, proxies, TLS and connection limits. Its own
    ``auth`` is never used (the provider key is the endpoint's) and redirects are never
    followed; its default headers and cookies go with every request, as with any httpx
    request, so give callgate a client of its own rather than one that carries the host's
    internal credentials.

    ``clock`` (default ``time.time``) must be wall time in epoch seconds, shared by every
    worker: it dates the operation's rows and its approvals' ``expires_at``, which the
    people deciding (and ``callgate approvals``) compare with their own wall clock. A
    monotonic clock would make approvals look expired at once, or never.
    """

    def __init__(
        self,
        *,
        provider: str,
        model: str,
        registry: Registry,
        endpoint: ProviderEndpoint | None = None,
        client: httpx.AsyncClient | None = None,
        store: Store | None = None,
        budgets: Budgets | None = None,
        limits: Limits = DEFAULT_LIMITS,
        retry: RetryPolicy | None = None,
        timeouts: TransportTimeouts | None = None,
        system: str | None = None,
        max_tokens: int | None = None,
        binding_secret: bytes | None = None,
        audit: AuditWriter | None = None,
        audit_secret: bytes | None = None,
        progress: Callable[[ProgressEvent], Awaitable[None]] | None = None,
        worker_id: str | None = None,
        approval_ttl: float = 3600.0,
        claim_stale_after: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        adapter = load_adapter(provider)
        if not isinstance(adapter, EncodeSide):
            raise ConfigError(f"adapter {provider!r} has no encode side")
        if not sendable_model(model):
            raise ConfigError(
                f"model must be a non-empty printable name, not padded with spaces: {model!r}"
            )
        if claim_stale_after is not None and not (
            math.isfinite(claim_stale_after) and claim_stale_after > 0
        ):
            # 0 would let every resume steal a live claim; inf or NaN would never take over.
            raise ConfigError(f"claim_stale_after must be > 0 seconds, not {claim_stale_after!r}")
        if (
            not isinstance(approval_ttl, int | float)
            or isinstance(approval_ttl, bool)
            or not (math.isfinite(approval_ttl) and approval_ttl > 0)
        ):
            # Checked here, not at the first pause (after a paid model turn): an infinite
            # or NaN expiry has no JSON form, and approvals must expire.
            raise ConfigError(f"approval_ttl must be > 0 seconds, not {approval_ttl!r}")
        if store is None:
            # A pause must persist: without a store, a tool that always needs a person
            # could only fail at its first call, after a paid model turn. (A rule that
            # decides per call is checked when the call comes.)
            always = [t.name for t in registry if t.approval is True or _irreversible(t)]
            if always:
                raise ConfigError(
                    f"tools {', '.join(always)} need a person's approval, and an approval "
                    "pause persists in a store: pass store=open_store(...)"
                )
        self.provider = provider
        self.model = model
        self.registry = registry
        self._adapter: Any = adapter
        self._endpoint = endpoint or ProviderEndpoint.from_env(provider)
        self._client = client
        self.store = store
        self.budgets = budgets or Budgets()
        self._limits = limits
        self._retry = retry
        self._timeouts = timeouts
        self._system = system
        self._max_tokens = max_tokens
        if audit_secret is not None and not audit_secret:
            raise ConfigError("the audit secret must not be empty")
        if binding_secret is not None and not binding_secret:
            # (Refused here, not at the first result: binding runs as each handler
            # returns, and a failure there would cut the turn's other calls short.)
            raise ConfigError("the binding secret must not be empty")
        self._secret = binding_secret
        self._audit = audit
        self._audit_secret = audit_secret
        self._progress = progress
        self.worker_id = worker_id or "w_" + secrets.token_hex(6)
        self._approval_ttl = approval_ttl
        self._claim_stale_after = claim_stale_after
        self._clock = clock
        # Per-tool concurrency limits hold across every operation this runner drives (on
        # one event loop: see LoopLimiters).
        self._tool_limiters = LoopLimiters()

    # --- public entry points -------------------------------------------------------------

    async def start(
        self,
        prompt: str,
        *,
        tenant: str = "default",
        subject: str = "anonymous",
        roles: Sequence[str] = (),
        operation_id: str | None = None,
    ) -> OperationResult:
        """Begin an operation and drive it until it ends or waits for a human. Every text
        given must be valid UTF-8 (a ``ConfigError`` before anything is persisted or
        sent: a lone surrogate, valid in JSON escapes, can be neither)."""
        _check_texts(
            prompt=prompt,
            tenant=tenant,
            subject=subject,
            operation_id=operation_id or "",
            roles="".join(roles),
        )
        now = self._clock()
        snap = OperationSnapshot(
            operation_id=operation_id or new_operation_id(),
            tenant=tenant,
            subject=subject,
            roles=sorted(roles),
            provider=self.provider,
            model=self.model,
            state=OpState.MODEL_REQUESTED,
            messages=list(self._adapter.initial_messages(prompt)),
            tracker=BudgetTracker(self.budgets, now=now).snapshot(now),
            settings=self._settings(),
        )
        if self.store is None:
            return await self._drive(snap, None)
        record = await self.store.create_operation(
            OperationRecord(
                operation_id=snap.operation_id,
                tenant=tenant,
                subject=subject,
                state=snap.state.value,
                snapshot=msgspec.json.encode(snap),
                created_at=now,
                updated_at=now,
                owner=self.worker_id,
                fencing_token=1,
            )
        )
        marks = DriveMarks()
        async with self._released_on_failure(
            snap.operation_id, record.fencing_token, escalate=True, marks=marks
        ):
            return await self._drive(snap, (record.version, record.fencing_token), marks=marks)

    async def resume(self, operation_id: str) -> OperationResult:
        """Continue an operation paused for approval, from any worker and process. Exactly
        one concurrent caller wins the claim; the others get the state as it stands.

        If this resume raises (or is cancelled), its claim is released before the error
        propagates. A failure before the resumed drive sent its first model request leaves
        the pause as last persisted, so the next resume by any worker replays the approved
        calls (consumed approvals still count until they no longer hold, then it
        escalates; the idempotency ledger answers calls that already ran). Once the drive
        has asked the model again, an exception ends the operation ``escalated``
        (``DRIVE_FAILED``), as a failed start does: a replay would ask the model again, and
        a call reworded under a new idempotency key would repeat its side effect. The same
        holds for a cancelled resume, and for a worker that dies: before its first model
        request the drive persists the operation as past its pause (``model_requested``),
        so a later ``resume`` settles it ``escalated`` (once its claim is stale) instead of
        replaying it. An operation started on another provider than this runner's raises
        ``ConfigError`` and stays paused."""
        store = self._need_store()
        now = self._clock()
        token = await store.claim_operation(
            operation_id,
            self.worker_id,
            now=now,
            from_states=[OpState.WAITING_APPROVAL.value],
            stale_after=self._claim_stale_after,
        )
        if token is None:  # not claimable (another worker holds it, or not paused)
            return await settle_stuck(self, operation_id, now)
        # This drive's own marks (the runner may drive others meanwhile); the first model
        # request is made durable first (see the docstring).
        marks = DriveMarks()
        marks.before_first_ask = lambda: mark_past_pause(self, operation_id, token, marks)
        async with self._released_on_failure(operation_id, token, marks=marks):
            record = await store.get_operation(operation_id)
            if record is None:
                raise StoreError(f"no operation {operation_id}")
            snap = decode_snapshot(record.snapshot, operation_id)
            if record.owner != self.worker_id or record.fencing_token != token:
                return self._result(snap, busy=True)  # taken over since our claim
            if snap.provider != self.provider:
                # Its conversation and response ids are that provider's: bound and sent
                # under another, the results would name the wrong family (and a real API
                # would reject the mixed request only after the approved calls ran).
                raise ConfigError(
                    f"operation {operation_id} runs on provider {snap.provider!r}, "
                    f"not {self.provider!r}: resume it with a runner for {snap.provider!r}"
                )
            lease = (record.version, token)
            decisions, waiting = await collect_decisions(self.registry, snap, store, now)
            if decisions is None:  # someone has not decided yet: stay paused, release
                await self._persist(snap, lease, release=True)
                return self._result(snap, pending=waiting)
            return await self._drive(snap, lease, decisions=decisions, marks=marks)

    # --- the loop ------------------------------------------------------------------------

    async def _drive(
        self,
        snap: OperationSnapshot,
        lease: tuple[int, int] | None,
        *,
        decisions: dict[str, ApprovalDecision] | None = None,
        marks: DriveMarks | None = None,
    ) -> OperationResult:
        now = self._clock()
        settings = snap.settings or self._settings()
        tracker = BudgetTracker.restore(settings.budgets, snap.tracker, now=now)
        audit = AuditChain(
            secret=self._audit_secret, start_seq=snap.audit_seq, prev_digest=snap.audit_head
        )
        async with contextlib.AsyncExitStack() as stack:
            run = OperationDrive(
                self, snap, tracker, audit, stack, settings=settings, marks=marks or DriveMarks()
            )
            if decisions is not None:
                await run.to(OpInput.RESUMED)
                await run.validate(decisions)
            while snap.state not in TERMINAL and snap.state is not OpState.WAITING_APPROVAL:
                if snap.state is OpState.MODEL_REQUESTED:
                    await run.model_turn()
                elif snap.state is OpState.VALIDATING:
                    await run.validate(None)
                else:  # pragma: no cover - every other state is handled inside the steps
                    raise ConfigError(f"run loop reached {snap.state} outside a step")
        if snap.state is OpState.WAITING_APPROVAL:
            await run.request_approvals()
        snap.tracker = tracker.snapshot(self._clock())
        snap.audit_seq, snap.audit_head = audit.next_seq, audit.head
        if lease is not None:
            await self._persist(snap, lease, release=True)
        if snap.state in TERMINAL and self._progress is not None and snap.stop is not None:
            await self._progress(
                OperationEnded(
                    operation_id=snap.operation_id,
                    state=snap.state.value,
                    raw_reason=snap.stop.provider_reason,
                    stop_reason=snap.stop.reason,
                )
            )
        return self._result(snap)

    @contextlib.asynccontextmanager
    async def _released_on_failure(
        self,
        operation_id: str,
        token: int,
        *,
        escalate: bool = False,
        marks: DriveMarks | None = None,
    ) -> AsyncIterator[None]:
        """Release the claim held under ``token`` if the body raises or is cancelled.

        A body that raised or was cancelled ends the operation ``escalated`` instead when
        nothing could replay it safely: always with ``escalate`` (a start: replaying it
        means asking the model again), and for a resume once its drive's ``marks`` say it
        sent a model request (before that, replaying the approved calls from the pause is
        safe). A cancellation is no safer than an error here: the host's request timing
        out after a side effect ran leaves the same replay behind.
        """
        try:
            yield
        except BaseException as exc:
            asked = marks is not None and marks.asked_model
            if escalate or asked:
                # (The type only: an exception's text may quote arguments or credentials;
                # a cancellation is worded alike on every backend, see backends.py.)
                how = "was cancelled" if is_cancellation(exc) else f"raised {failure_name(exc)}"
                what = f"the drive {how}"
                if not escalate:
                    what = f"the resumed drive {how} after asking the model"
                stop = drive_failed(what)
                await release(self, operation_id, token, exc, stop=stop, marks=marks)
            else:
                await release(self, operation_id, token, exc)
            raise

    async def _load(self, operation_id: str) -> OperationSnapshot:
        record = await self._need_store().get_operation(operation_id)
        if record is None:
            raise StoreError(f"no operation {operation_id}")
        return decode_snapshot(record.snapshot, operation_id)

    async def _persist(
        self, snap: OperationSnapshot, lease: tuple[int, int], *, release: bool
    ) -> None:
        store = self._need_store()
        version, token = lease
        record = await store.get_operation(snap.operation_id)
        if record is None:
            raise StoreError(f"no operation {snap.operation_id}")
        await store.save_operation(
            msgspec.structs.replace(
                record,
                state=snap.state.value,
                snapshot=msgspec.json.encode(snap),
                owner=None if release else self.worker_id,
                updated_at=self._clock(),
            ),
            expected_version=record.version if record.fencing_token == token else version,
            fencing_token=token,
        )

    def _settings(self) -> RunSettings:
        return RunSettings(
            budgets=self.budgets,
            system=self._system,
            max_tokens=self._max_tokens,
            approval_ttl=self._approval_ttl,
        )

    def _need_store(self) -> Store:
        if self.store is None:
            raise ConfigError("this needs a store (approvals and resume are persisted)")
        return self.store

    @staticmethod
    def _result(
        snap: OperationSnapshot, pending: tuple[str, ...] | None = None, *, busy: bool = False
    ) -> OperationResult:
        if snap.state is not OpState.WAITING_APPROVAL or (busy and pending is None):
            pending = ()  # (busy: only what the caller found undecided is listed)
        elif pending is None:  # as requested at the pause (a resume read the store since)
            pending = tuple(snap.approvals.values() if snap.pending is None else snap.pending)
        return OperationResult(
            operation_id=snap.operation_id,
            state=snap.state,
            stop=snap.stop,
            text=snap.text,
            calls=tuple(snap.calls),
            pending_approvals=pending,
            busy=busy and snap.state not in TERMINAL,
        )


def _irreversible(spec: ToolSpec) -> bool:
    return spec.approval is None and spec.risk is RiskClass.IRREVERSIBLE


def _check_texts(**texts: str) -> None:
    for what, text in texts.items():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(
                f"the {what} is not valid UTF-8 text (it holds a lone surrogate); "
                "nothing was started"
            ) from None
