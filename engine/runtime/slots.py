"""The limiter slots one executing call holds, and who gives them back.

A call holds its tool's slot (``ToolSpec.max_concurrency``) and one of the batch's
(``max_parallelism``) from before its ledger entry until it is answered. A sync handler
also needs one of anyio's worker threads (its default thread limiter, 40 unless the host
resized it); that token is taken before the handler's deadline starts, so a call queued
behind busy threads is not answered "timeout" (or, for a side effect, ``outcome_unknown``
and an escalation) without ever having run: the wait counts against the operation's
deadline only. The thread token is held only while the handler may run, never across a
store call (a host's store on the same thread pool would otherwise deadlock).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import threading
import weakref
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread

__all__ = ["LoopLimiters", "Slots"]


class Slots:
    """The slots of one call (see the module docstring).

    Normally the call's task releases them when the call is answered. A sync handler
    cannot be stopped: at its deadline the call is answered while its thread runs on, so
    its slots pass to that thread, which releases them when the handler really returns
    (otherwise ``max_concurrency`` and ``max_parallelism`` would not bound the handlers
    actually running). A handler whose thread had not started by then never runs.
    """

    __slots__ = (
        "_behind",
        "_handed_over",
        "_held",
        "_limiters",
        "_lock",
        "_queued",
        "_schedule",
        "_skip",
        "_started",
        "_thread",
        "_unclaimed",
    )

    def __init__(self, *limiters: anyio.CapacityLimiter) -> None:
        self._limiters = limiters  # acquired in this order, released in reverse
        self._held: list[anyio.CapacityLimiter] = []
        self._thread: anyio.CapacityLimiter | None = None  # the worker-thread token
        self._lock = threading.Lock()  # the thread and the task both read the flags
        self._started = False
        self._skip = False
        self._handed_over = False
        self._schedule: Callable[[Callable[[], None]], object] | None = None
        self._unclaimed = False  # taken by try_acquire, no task has claimed them yet
        # The call queued before this one for a one-slot limiter (queue_behind), and the
        # event that lets the call behind this one queue (set once this one holds all).
        self._behind: Slots | None = None
        self._queued: anyio.Event | None = None

    @property
    def limiters(self) -> tuple[anyio.CapacityLimiter, ...]:
        """The limiters this call takes a slot of, in the order it takes them."""
        return self._limiters

    def queue_behind(self, earlier: Slots) -> None:
        """Start waiting for slots only once ``earlier`` (a call proposed before this
        one, also waiting, that shares a one-slot limiter with it) holds all of its own:
        each task would otherwise queue when the backend first runs it (trio shuffles new
        tasks on purpose), and a tool limited to one call at a time, or a batch of one,
        would run a turn's calls out of their proposed order. (Waiting for the first
        slot alone is not enough: a call that took its tool's slot still queues for the
        batch's, and the call behind it could get there first.) Nothing is held while
        waiting, so the chain cannot deadlock."""
        self._behind = earlier
        if earlier._queued is None:
            earlier._queued = anyio.Event()

    async def acquire(self) -> None:
        try:
            behind = self._behind
            if behind is not None and behind._queued is not None:
                await behind._queued.wait()
            for limiter in self._limiters:
                await limiter.acquire_on_behalf_of(self)
                self._held.append(limiter)
            self._let_next_queue()
        except BaseException:
            self.release()
            raise

    def try_acquire(self) -> bool:
        """Take every slot now if all are free (nothing held otherwise): how a batch hands
        out its free slots in proposal order, whatever order its tasks first run in. The
        call's task then ``claim``s them; ``release_unclaimed`` gives back what no task
        claimed (one cancelled before its first step)."""
        try:
            for limiter in self._limiters:
                limiter.acquire_on_behalf_of_nowait(self)
                self._held.append(limiter)
        except anyio.WouldBlock:
            self.release()
            return False
        self._unclaimed = True
        return True

    def claim(self) -> bool:
        """The call's task takes over the slots ``try_acquire`` took: whether it had."""
        taken, self._unclaimed = self._unclaimed, False
        return taken

    def release_unclaimed(self) -> None:
        if self._unclaimed:
            self._unclaimed = False
            self.release()

    async def acquire_thread(self) -> anyio.CapacityLimiter:
        """Wait for a worker thread (a token of anyio's default thread limiter); returns
        the limiter to pass to ``run_sync``, which then starts the thread at once."""
        limiter = anyio.to_thread.current_default_thread_limiter()
        await limiter.acquire_on_behalf_of(self)
        self._thread = limiter
        # run_sync takes a token of the limiter it is given: one of its own, always free
        # (the bound is the default limiter's token this call now holds).
        return anyio.CapacityLimiter(1)

    def release(self) -> None:
        """The call is answered: give the slots back, unless its thread holds them now."""
        self._let_next_queue()  # (one cut before its slots must not hold up the next)
        if self._handed_over:
            return
        self._give_thread()
        held, self._held = self._held, []
        for limiter in reversed(held):
            limiter.release_on_behalf_of(self)

    def guard(self, handler: Callable[[], Any]) -> Callable[[], Any]:
        """``handler`` wrapped for the worker thread (see the class docstring). Called on
        the event loop, which it captures for the release."""
        self._schedule = _loop_scheduler()

        def run() -> Any:
            with self._lock:
                if self._skip:
                    return None  # answered before the thread started: do not run it now
                self._started = True
            try:
                return handler()
            finally:
                with self._lock:
                    self._started = False
                    handed_over = self._handed_over
                if handed_over:
                    self._release_from_thread()

        return run

    def returned(self) -> None:
        """The handler's thread returned to the task: its worker-thread token goes back
        now, before the call's store writes."""
        self._give_thread()

    def abandon(self) -> None:
        """The task stopped waiting for the thread (deadline, cancellation)."""
        with self._lock:
            if self._started:
                self._handed_over = True  # the thread gives the slots back
            else:
                self._skip = True  # not started (or already done): the task releases
        if not self._handed_over:
            self._give_thread()

    def _let_next_queue(self) -> None:
        """The call behind this one may now queue for its slots."""
        queued = self._queued
        if queued is not None:
            self._queued = None
            queued.set()

    def _give_thread(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.release_on_behalf_of(self)

    def _release_from_thread(self) -> None:
        thread, self._thread = self._thread, None
        held, self._held = self._held, []
        if thread is not None:
            held.append(thread)  # the last acquired: released first

        def give_back() -> None:
            for limiter in reversed(held):
                limiter.release_on_behalf_of(self)

        # Limiters belong to the event loop: release there, without waiting for it (a loop
        # that stopped but is not closed yet would never run a blocking call, and this
        # thread would never end). A loop that has ended took its limiters with it.
        schedule = self._schedule
        if schedule is not None:
            with contextlib.suppress(RuntimeError):
                schedule(give_back)


class LoopLimiters:
    """A runner's per-tool limiters, one set per event loop.

    A limiter belongs to the loop it was made on, and a thread that outlived its loop
    gives its slot back on that loop or not at all: one set shared across loops (a sync
    host calling ``anyio.run(runner.start, ...)`` per request with one runner) lost the
    tool's slot for good, and every later call of the tool waited out its operation's
    deadline. A set goes with its loop.

    The sets live in an anyio ``RunVar`` (scoped to the running event loop on every
    backend): keyed by the asyncio loop, trio's runs all shared one fallback set and
    lost slots the same way. Within a loop they are keyed weakly by the runner's
    ``LoopLimiters``, so a runner dropped while its loop runs on takes its set along."""

    __slots__ = ("__weakref__",)

    def here(self) -> dict[str, anyio.CapacityLimiter]:
        """The running loop's set (created empty on first use)."""
        sets = _LOOP_SETS.get()
        if sets is None:
            sets = weakref.WeakKeyDictionary()
            _LOOP_SETS.set(sets)
        limiters = sets.get(self)
        if limiters is None:
            limiters = sets[self] = {}
        return limiters


_LOOP_SETS: anyio.lowlevel.RunVar[
    weakref.WeakKeyDictionary[LoopLimiters, dict[str, anyio.CapacityLimiter]] | None
] = anyio.lowlevel.RunVar("callgate_tool_limiters", None)


def _loop_scheduler() -> Callable[[Callable[[], None]], object] | None:
    """A thread-safe, non-blocking "run this on the current event loop soon"."""
    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:
        pass  # not asyncio: trio (anyio's other backend)
    try:
        trio = importlib.import_module("trio")
        scheduler: Callable[[Callable[[], None]], object] = (
            trio.lowlevel.current_trio_token().run_sync_soon
        )
    except (ImportError, RuntimeError):
        return None
    return scheduler
