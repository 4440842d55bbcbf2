"""Execution of validated calls: bounded parallelism, per-tool deadlines, the idempotency
ledger, and a result for every call — including a cancelled one.

Structured concurrency only: one anyio task group per batch, a global
``CapacityLimiter`` plus one per tool (held through ``slots.Slots``), ``fail_after`` per
call and ``move_on_after`` for the operation's remaining time. A handler's exception
never escapes: it becomes an error envelope with fixed, safe text (the exception's text
stays in the audit, redacted).

Side-effecting tools (risk ``write``/``irreversible``) go through the ledger keyed by
``(tenant, idempotency key)``: a finished key replays its stored result without running
the handler; a key whose earlier attempt may have had its effect (a timeout, a crash) is
first reconciled through the tool's ``reconcile`` hook and never retried blindly; a key
an earlier attempt still holds in flight (within its lease: a killed worker, a failed
``ledger_finish``) is ``outcome_unknown`` and stops the operation for a human.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import operator
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import msgspec

from callgate.engine.core.binding import BoundResult
from callgate.engine.core.canonical import canonical_json
from callgate.engine.core.envelope import (
    RAN_TOO_LARGE,
    RAN_WITHOUT_RESULT,
    ErrorCode,
    ErrorEnvelope,
)
from callgate.engine.core.errors import StoreError
from callgate.engine.core.outcome import ProposedCall
from callgate.engine.core.registry import AuthContext, ToolContext, ToolSpec
from callgate.engine.core.validation import Executable
from callgate.engine.store.base import (
    Began,
    Conflict,
    InFlight,
    LedgerState,
    Replay,
    Store,
    Unknown,
)

from .progress import CallFinished, ProgressEvent
from .slots import Slots
from .telemetry import tool_span

__all__ = ["CallResult", "DispatchContext", "execute_calls"]


class CallResult(msgspec.Struct, frozen=True, kw_only=True):
    """One call's result as the dispatcher produced it (before binding).

    ``status`` is "ok", "replayed" or an error code. ``ran`` says whether the handler was
    invoked in this attempt. ``unresolved`` marks an unknown outcome that reconciliation
    could not settle (the operation must stop for a human). ``detail`` is audit-only."""

    call: ProposedCall
    tool: str
    args_digest: str
    model_result: dict[str, Any]
    is_error: bool
    status: str
    duration_ms: float
    ran: bool
    idempotency_key: str | None = None
    unresolved: bool = False
    detail: str = ""
    bound: BoundResult | None = None  # sealed when produced (``DispatchContext.seal``)


class DispatchContext:
    """What a batch of calls runs under. ``max_parallelism`` bounds the calls running at
    once, through ``limiter`` when given (pass the same one to every batch of a drive, so
    that a sync handler still running past its deadline keeps counting against the next
    turn's calls), else a limiter of this batch's own. Per-tool limits
    (``ToolSpec.max_concurrency``) live in ``tool_limiters``: pass the same dict to every
    context (the ``Runner`` does, for all its operations) so that a tool's limit holds
    across concurrent operations, not just within one batch."""

    def __init__(
        self,
        *,
        auth: AuthContext,
        store: Store | None,
        worker_id: str,
        max_parallelism: int,
        max_result_bytes: int,
        clock: Callable[[], float],
        progress: Callable[[ProgressEvent], Awaitable[None]] | None = None,
        provider: str | None = None,
        model: str | None = None,
        tool_limiters: dict[str, anyio.CapacityLimiter] | None = None,
        limiter: anyio.CapacityLimiter | None = None,
        seal: Callable[[Executable, CallResult], CallResult] | None = None,
    ) -> None:
        self.auth = auth
        self.store = store
        self.worker_id = worker_id
        self.limiter = limiter or anyio.CapacityLimiter(max_parallelism)
        self.max_result_bytes = max_result_bytes
        self.clock = clock
        self.progress = progress
        self.provider = provider
        self.model = model
        self._tool_limiters = tool_limiters if tool_limiters is not None else {}
        self.seal = seal  # binds each result to its item as it is produced

    def tool_limiter(self, spec: ToolSpec) -> anyio.CapacityLimiter | None:
        if spec.max_concurrency is None:
            return None
        limiter = self._tool_limiters.get(spec.name)
        if limiter is None:
            limiter = self._tool_limiters[spec.name] = anyio.CapacityLimiter(spec.max_concurrency)
        return limiter


def _envelope(code: ErrorCode) -> dict[str, Any]:
    return ErrorEnvelope.of(code).to_model_result()


def _ok(value: Any) -> dict[str, Any]:
    return {"result": msgspec.to_builtins(value, order="sorted")}


async def execute_calls(
    items: Sequence[Executable], ctx: DispatchContext, *, remaining_seconds: float
) -> list[CallResult]:
    """Run ``items`` concurrently within the limits; return one result per item, in the
    given (proposal) order. Calls still running when ``remaining_seconds`` (the
    operation's deadline) passes are cancelled and answered ``timeout`` (or
    ``outcome_unknown`` for side effects)."""
    results: list[CallResult | None] = [None] * len(items)
    # By position; None until the call got its limiter slots and began.
    started: list[_Began | None] = [None] * len(items)
    budget = remaining_seconds if math.isfinite(remaining_seconds) else None
    # Each call's slots. Those free right now are taken here, in proposal order: a task
    # taking its own would get them in the order the backend first runs the tasks (trio
    # shuffles new tasks on purpose), and a later slow call could take the slot an
    # earlier fast one was proposed for. Calls that must wait queue in their tasks. A
    # call that needs a limiter of one slot (a tool that runs one call at a time, a batch
    # of one) queues behind the last call proposed before it that waits for one of the
    # same (Slots.queue_behind), so they run in proposal order on every backend. (Not
    # for wider limiters: there the next in line would queue only once the one before it
    # holds its slots, one scheduling round later, and slots freed together would sit
    # idle meanwhile: 1,000 short calls never filled 16.)
    slots = [_slots_of(item, ctx) for item in items]
    # id(one-slot limiter) -> (position, the last call queued for it)
    last_queued: dict[int, tuple[int, Slots]] = {}
    for position, call_slots in enumerate(slots):
        if call_slots.try_acquire():
            continue
        singles = [id(lim) for lim in call_slots.limiters if lim.total_tokens == 1]
        ahead = [last_queued[single] for single in singles if single in last_queued]
        if ahead:
            call_slots.queue_behind(max(ahead, key=operator.itemgetter(0))[1])
        for single in singles:
            last_queued[single] = (position, call_slots)
    try:
        with anyio.move_on_after(budget):
            async with anyio.create_task_group() as tg:
                for i, item in enumerate(items):
                    run = functools.partial(_run_one, slots=slots[i])
                    tg.start_soon(run, i, item, ctx, results, started)
    except BaseExceptionGroup as group:
        # A call that raised (a store error, a host's progress sink) reaches the host as
        # itself, so ``except StoreUnavailable`` works and an escalated stop names the
        # real type; several at once stay a group.
        sole = _sole_failure(group)
        if sole is None:
            raise
        raise sole from group
    finally:
        # A task that never began (it can be cancelled before its first step) has not
        # given back the slots taken for it here; every task that began released its own.
        for call_slots in slots:
            call_slots.release_unclaimed()
    out: list[CallResult] = []
    for i, item in enumerate(items):
        result = results[i]
        if result is None:  # cancelled by the operation deadline: still a result
            began = started[i]
            elapsed = (ctx.clock() - began.start) * 1000 if began is not None else 0.0
            ran = began is not None and began.invoked
            key = began.key if began is not None else _key_of(item, ctx)[0]  # (none ran)
            unknown = item.spec.is_side_effect and ran
            code = ErrorCode.OUTCOME_UNKNOWN if unknown else ErrorCode.TIMEOUT
            result = CallResult(
                call=item.call,
                tool=item.spec.name,
                args_digest=item.args_digest,
                model_result=_envelope(code),
                is_error=True,
                status=code.value,
                duration_ms=elapsed,
                ran=ran,
                idempotency_key=key,  # the key the call held, if any
                detail="cancelled by the operation deadline",
            )
            if ctx.seal is not None:
                result = ctx.seal(item, result)
        out.append(result)
    return out


def _slots_of(item: Executable, ctx: DispatchContext) -> Slots:
    tool_limiter = ctx.tool_limiter(item.spec)
    # The tool's own slot first: a call queued behind its tool must not hold one of the
    # batch's slots meanwhile (calls of a slow, limited tool would otherwise starve every
    # other tool). Always tool -> batch, so no lock-order deadlock.
    return Slots(ctx.limiter) if tool_limiter is None else Slots(tool_limiter, ctx.limiter)


class _Began:
    """A call that got its slots: when, under which idempotency key (the one taken before
    the handler ran: a handler may change its arguments in place, and a key computed again
    after would disown it), and whether its handler may have started (a call cancelled
    before that, queued for a worker thread, provably had no effect)."""

    __slots__ = ("invoked", "key", "start")

    def __init__(self, start: float, key: str | None) -> None:
        self.start = start
        self.key = key
        self.invoked = False


def _key_of(item: Executable, ctx: DispatchContext) -> tuple[str | None, str]:
    """A side effect's idempotency key (None for a read), or why none computes: host code
    (``idempotency_fields``) failed, or the business arguments have no canonical form."""
    if not item.spec.is_side_effect:
        return None, ""
    try:
        return item.spec.idempotency_key(ctx.auth.operation_id, item.args), ""
    except Exception as exc:
        return None, type(exc).__name__


def _sole_failure(group: BaseExceptionGroup[BaseException]) -> Exception | None:
    """The one exception of ``group`` (nested groups flattened) that is not a
    cancellation, or None when there are several or none, or when it is no ``Exception``.
    Several store errors count as one, the first (the others named in its notes): a
    store that is down fails every parallel call, and the host's ``except StoreError``
    must still see it.

    A ``BaseException`` (SystemExit, KeyboardInterrupt) stays in its group: raised bare
    out of a coroutine, asyncio re-raises it straight out of the event loop, which then
    skips its shutdown (anyio's worker threads are never stopped: the process hangs at
    exit), while a group unwinds the loop normally."""
    cancelled = anyio.get_cancelled_exc_class()
    found: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop(0)  # (in the group's order: the first failure is named first)
        if isinstance(exc, BaseExceptionGroup):
            pending[:0] = exc.exceptions
        elif not isinstance(exc, cancelled):
            found.append(exc)
    if len(found) == 1 and isinstance(found[0], Exception):
        return found[0]
    if len(found) > 1 and all(isinstance(e, StoreError) for e in found):
        first = found[0]
        assert isinstance(first, StoreError)
        others = ", ".join(type(e).__name__ for e in found[1:])
        first.add_note(f"callgate: {len(found) - 1} more call(s) failed on the store ({others})")
        return first
    return None


async def _run_one(
    i: int,
    item: Executable,
    ctx: DispatchContext,
    results: list[CallResult | None],
    started: list[_Began | None],
    *,
    slots: Slots,
) -> None:
    try:
        if slots.claim():  # taken for this call by execute_calls
            # What acquire() checks first: a batch past its deadline runs no call.
            await anyio.lowlevel.checkpoint_if_cancelled()
        else:
            await slots.acquire()
        result = await _run_limited(i, item, ctx, started, slots)
    finally:
        slots.release()
    if ctx.seal is not None:
        result = ctx.seal(item, result)
    results[i] = result
    if ctx.progress is not None:
        await ctx.progress(
            CallFinished(
                operation_id=ctx.auth.operation_id,
                call_id=item.call.call_id,
                name=item.spec.name,
                status=result.status,
                duration_ms=result.duration_ms,
            )
        )


async def _run_limited(
    i: int,
    item: Executable,
    ctx: DispatchContext,
    started: list[_Began | None],
    slots: Slots,
) -> CallResult:
    spec = item.spec
    start = ctx.clock()
    key, key_error = _key_of(item, ctx)
    began = started[i] = _Began(start, key)

    def done(
        model_result: dict[str, Any],
        status: str,
        *,
        ran: bool,
        unresolved: bool = False,
        detail: str = "",
    ) -> CallResult:
        return CallResult(
            call=item.call,
            tool=spec.name,
            args_digest=item.args_digest,
            model_result=model_result,
            is_error="error" in model_result and status != "ok",
            status=status,
            duration_ms=(ctx.clock() - start) * 1000,
            ran=ran,
            idempotency_key=key,
            unresolved=unresolved,
            detail=detail,
        )

    if key_error:
        # No key, no ledger: a side effect must not run unprotected (fails closed).
        detail = f"idempotency key not computable: {key_error}"
        return done(_envelope(ErrorCode.HANDLER_ERROR), "handler_error", ran=False, detail=detail)
    owner = f"{ctx.worker_id}/{ctx.auth.operation_id}/{item.call.call_id}"
    store = ctx.store if key is not None else None
    if store is not None and key is not None:
        tenant = ctx.auth.tenant
        decision = await store.ledger_begin(tenant, key, item.args_digest, owner, now=ctx.clock())
        if isinstance(decision, Replay):
            stored = msgspec.json.decode(decision.result) if decision.result else None
            if isinstance(stored, dict):
                # A replayed "outcome unknown" (the handler ran, its value could not go
                # back) tells nothing new about the effect: it stays unknown, never a
                # replay that would settle it.
                unknown = _code_of(stored) == ErrorCode.OUTCOME_UNKNOWN.value
                status = ErrorCode.OUTCOME_UNKNOWN.value if unknown else "replayed"
                return done(stored, status, ran=False, detail="idempotency replay")
            return done(_envelope(ErrorCode.HANDLER_ERROR), "handler_error", ran=False)
        if isinstance(decision, Conflict):
            code = ErrorCode.IDEMPOTENCY_CONFLICT
            return done(_envelope(code), code.value, ran=False, detail="Conflict")
        if isinstance(decision, InFlight):
            # An earlier attempt of this same call (same key, same arguments) still holds
            # the key within its lease: a worker killed mid-handler, a handler that raised
            # past the engine (SystemExit, KeyboardInterrupt), a ledger_finish that failed.
            # Its effect may have happened; nothing here can tell, so stop for a human.
            code = ErrorCode.OUTCOME_UNKNOWN
            detail = (
                f"a previous attempt of this call is still in flight (ledger "
                f"{decision.state.value}, held by {decision.owner}, since {decision.since:.3f})"
            )
            return done(_envelope(code), code.value, ran=False, unresolved=True, detail=detail)
        if isinstance(decision, Unknown):
            return await _reconcile(item, key, owner, store, ctx, done)
        assert isinstance(decision, Began)

    tool_ctx = ToolContext(
        auth=ctx.auth, tool=spec.name, call_id=item.call.call_id, idempotency_key=key or ""
    )
    with tool_span(
        tool=spec.name,
        call_id=item.call.call_id,
        operation_id=ctx.auth.operation_id,
        provider=ctx.provider,
        model=ctx.model,
    ) as span:
        try:
            # A sync handler's wait for a worker thread is outside its deadline (slots.py).
            thread = None if spec.is_async else await slots.acquire_thread()
            began.invoked = True
            with anyio.fail_after(spec.timeout):
                value = await _invoke(spec, item.args, tool_ctx, slots, thread)
        except TimeoutError:
            span.set_outcome("timeout", error=True)
            if not spec.is_side_effect:
                code = ErrorCode.TIMEOUT
                return done(_envelope(code), code.value, ran=True, detail="tool deadline passed")
            # The effect may have happened: never a "timeout" that invites a blind retry.
            code = ErrorCode.OUTCOME_UNKNOWN
            if store is not None and key is not None:
                with anyio.CancelScope(shield=True):
                    await store.ledger_mark_unknown(ctx.auth.tenant, key, owner, now=ctx.clock())
                # A retry under the same key is reconciled through the ledger.
                return done(_envelope(code), code.value, ran=True, detail="tool deadline passed")
            # No store, no ledger: nothing could reconcile a retry, so stop for a human.
            detail = "tool deadline passed; no store to reconcile the effect"
            return done(_envelope(code), code.value, ran=True, unresolved=True, detail=detail)
        except anyio.get_cancelled_exc_class() as exc:
            if _cancel_requested():
                if store is not None and key is not None and not began.invoked:
                    # Cancelled while queued for a thread: this attempt ended unrun.
                    code = ErrorCode.TIMEOUT
                    with anyio.CancelScope(shield=True), contextlib.suppress(StoreError):
                        await store.ledger_finish(
                            ctx.auth.tenant,
                            key,
                            owner,
                            LedgerState.FAILED,
                            canonical_json(_envelope(code)),
                            now=ctx.clock(),
                        )
                elif store is not None and key is not None:
                    with anyio.CancelScope(shield=True):
                        await store.ledger_mark_unknown(
                            ctx.auth.tenant, key, owner, now=ctx.clock()
                        )
                raise
            # Nobody cancelled this call: the handler raised a cancellation of its own (it
            # awaited a task someone else cancelled). Host code failing, answered as such;
            # let through, it would cancel the sibling calls mid-run.
            failure: BaseException | None = exc
        except asyncio.CancelledError as exc:
            # Reached only off asyncio (there the clause above took it): on trio, asyncio's
            # CancelledError out of a handler (a library running its own asyncio loop in
            # a sync handler) is no cancellation of this loop, just the handler failing,
            # answered as on asyncio instead of ending the batch as a BaseExceptionGroup.
            failure = exc
        except Exception as exc:  # the handler is host code; its failure is a result
            failure = exc
        else:
            failure = None
        if failure is not None:
            span.set_outcome("handler_error", error=True)
            result = _envelope(ErrorCode.HANDLER_ERROR)
            if store is not None and key is not None:
                await store.ledger_finish(
                    ctx.auth.tenant,
                    key,
                    owner,
                    LedgerState.FAILED,
                    canonical_json(result),
                    now=ctx.clock(),
                )
            return done(result, "handler_error", ran=True, detail=type(failure).__name__)
        span.set_outcome("ok")

    model_result, status, detail = _shape(value, spec, ctx)
    if store is not None and key is not None:
        # The handler returned, so the call is finished whatever its value: a retry
        # under this key replays this answer instead of running the effect again.
        await store.ledger_finish(
            ctx.auth.tenant,
            key,
            owner,
            LedgerState.SUCCEEDED,
            canonical_json(model_result),
            now=ctx.clock(),
        )
    return done(model_result, status, ran=True, detail=detail)


def _code_of(model_result: dict[str, Any]) -> object:
    error = model_result.get("error")
    return error.get("code") if isinstance(error, dict) and len(model_result) == 1 else None


def _cancel_requested() -> bool:
    """Whether a cancellation reaching this task was asked for (a scope or the operation
    deadline cancelled it), not merely raised by the code it awaited. On asyncio that is
    the task's pending cancel requests; other backends let no code raise theirs."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no asyncio loop (trio)
        return True
    return task is None or task.cancelling() > 0


def _shape(value: Any, spec: ToolSpec, ctx: DispatchContext) -> tuple[dict[str, Any], str, str]:
    """The model-facing result of a handler's return value, within the size limit, with
    its status and an audit-only detail."""
    try:
        model_result = _ok(value)
        size = len(canonical_json(model_result))
    except Exception as exc:  # not JSON data: a host bug, answered safely
        detail = f"the handler's value is not JSON data ({type(exc).__name__})"
        if spec.is_side_effect:
            # The handler returned: its effect happened, only its value cannot go back.
            # "The tool failed" would invite a retry (reworded, under a new key) that
            # repeats the effect; say it ran and must not be retried blindly.
            code = ErrorCode.OUTCOME_UNKNOWN
            envelope = ErrorEnvelope.of(code, RAN_WITHOUT_RESULT).to_model_result()
            return envelope, code.value, detail
        return _envelope(ErrorCode.HANDLER_ERROR), ErrorCode.HANDLER_ERROR.value, detail
    limit = spec.max_result_bytes or ctx.max_result_bytes
    if size > min(limit, ctx.max_result_bytes):
        code = ErrorCode.RESULT_TOO_LARGE
        ran = RAN_TOO_LARGE if spec.is_side_effect else None  # a retry would repeat it
        return ErrorEnvelope.of(code, ran).to_model_result(), code.value, ""
    return model_result, "ok", ""


async def _invoke(
    spec: ToolSpec,
    args: Any,
    tool_ctx: ToolContext,
    slots: Slots,
    thread: anyio.CapacityLimiter | None,
) -> Any:
    if spec.is_async:
        return await spec.handler(args, tool_ctx)
    run = slots.guard(functools.partial(spec.handler, args, tool_ctx))
    try:
        value = await anyio.to_thread.run_sync(run, abandon_on_cancel=True, limiter=thread)
    except BaseException:
        # Timed out or cancelled (or the handler raised): the caller stops waiting, the
        # thread may run on.
        slots.abandon()
        raise
    slots.returned()
    return value


async def _reconcile(  # noqa: PLR0917 - internal helper, called once
    item: Executable,
    key: str,
    owner: str,
    store: Store,
    ctx: DispatchContext,
    done: Callable[..., CallResult],
) -> CallResult:
    """An earlier attempt under this key may have had its effect: look it up downstream
    by key. Found → record and replay it. Not found, or no hook → the outcome stays
    unknown and the operation must stop for a human; never a blind retry."""
    spec = item.spec
    found: Any = None
    if spec.reconcile is not None:
        try:
            with anyio.fail_after(spec.timeout):
                found = await spec.reconcile(key, item.args)
        except Exception:
            found = None
    if found is None:
        # Give the key back (still unknown, no owner): a later attempt may reconcile at
        # once instead of finding it in flight until its lease runs out.
        # The answer is outcome_unknown either way: a key taken over meanwhile (or a store
        # error) must not turn it into a crash of the batch.
        with anyio.CancelScope(shield=True), contextlib.suppress(StoreError):
            await store.ledger_mark_unknown(ctx.auth.tenant, key, owner, now=ctx.clock())
        code = ErrorCode.OUTCOME_UNKNOWN
        result: CallResult = done(
            _envelope(code),
            code.value,
            ran=False,
            unresolved=True,
            detail="reconcile found no record of the earlier attempt",
        )
        return result
    model_result, status, shaped = _shape(found, spec, ctx)
    await store.ledger_resolve_unknown(
        ctx.auth.tenant,
        key,
        owner,
        LedgerState.SUCCEEDED,
        canonical_json(model_result),
        now=ctx.clock(),
    )
    result = done(
        model_result,
        "replayed" if status == "ok" else status,
        ran=False,
        detail="; ".join(filter(None, ("reconciled by idempotency key", shaped))),
    )
    return result
