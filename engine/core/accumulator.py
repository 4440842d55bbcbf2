"""Per-call argument accumulation for one response.

Fragments are keyed by the provider's output index, appended to a list and joined
once; the joined text is parsed only when the provider's explicit done signal for that
call arrives. Every buffer is capped: bytes per call, bytes per response, calls per
response. A call that never receives its done signal is never a complete call.

Protocol violations (a reused index, a fragment for a call that never started or that
is already done) raise ``StreamProtocolError``; exceeding the per-response caps raises
``LimitExceeded``. Exceeding the per-call cap only spoils that call: it is reported with
``arguments=None`` and an error (and later answered with ``invalid_arguments``), while
its fragments stop being stored, so memory stays bounded.
"""

from __future__ import annotations

from typing import Any

from .arguments import ArgumentsRejected, parse_arguments
from .canonical import digest_fields
from .errors import LimitExceeded, StreamProtocolError
from .limits import Limits
from .outcome import IncompleteCall, ProposedCall

__all__ = ["CallAccumulator", "derive_call_id"]


def derive_call_id(response_id: str | None, index: int) -> str:
    """A deterministic call id for providers that omit one (Gemini 2.x): the same
    response and index always give the same id, never a random one."""
    return "cgcall_" + digest_fields("call-id", response_id, index)[:24]


class _Call:
    __slots__ = (
        "arguments",
        "call_id",
        "done",
        "error",
        "index",
        "item_id",
        "name",
        "parts",
        "raw",
        "size",
    )

    def __init__(self, index: int, name: str, call_id: str | None, item_id: str | None) -> None:
        self.index = index
        self.name = name
        self.call_id = call_id
        self.item_id = item_id
        self.parts: list[str] = []
        self.size = 0
        self.done = False
        self.error: str | None = None
        self.arguments: dict[str, Any] | None = None
        self.raw = b""


class CallAccumulator:
    """Collects the calls of one response. Not thread-safe; one per response."""

    __slots__ = ("_by_item", "_calls", "_limits", "_total")

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._calls: dict[int, _Call] = {}
        self._by_item: dict[str, int] = {}
        self._total = 0

    def start(self, index: int, name: str, call_id: str | None, item_id: str | None) -> None:
        if index in self._calls:
            raise StreamProtocolError(f"call index {index} started twice")
        if len(self._calls) >= self._limits.max_calls_per_response:
            raise LimitExceeded("max_calls_per_response", self._limits.max_calls_per_response)
        self._calls[index] = _Call(index, name, call_id, item_id)
        if item_id is not None:
            self._by_item[item_id] = index

    def index_of(self, item_id: str) -> int | None:
        return self._by_item.get(item_id)

    def fragment(self, index: int, text: str) -> None:
        call = self._calls.get(index)
        if call is None:
            raise StreamProtocolError(
                f"argument fragment for call index {index} that never started"
            )
        if call.done:
            raise StreamProtocolError(
                f"argument fragment for call index {index} after its done signal"
            )
        if call.error is not None or not text:
            # Over its cap: the call is spoiled anyway. Empty: nothing to keep, and an
            # empty piece would hold a list slot that no cap counts.
            return
        n = len(text)  # code points: a cheap lower bound of the UTF-8 size, exact check on join
        self._total += n
        if self._total > self._limits.max_response_argument_bytes:
            raise LimitExceeded(
                "max_response_argument_bytes", self._limits.max_response_argument_bytes
            )
        call.size += n
        if call.size > self._limits.max_call_argument_bytes:
            call.error = (
                f"arguments exceed max_call_argument_bytes ({self._limits.max_call_argument_bytes})"
            )
            call.parts = []
            return
        call.parts.append(text)

    def done(self, index: int, arguments: str | None) -> None:
        call = self._calls.get(index)
        if call is None:
            raise StreamProtocolError(f"done signal for call index {index} that never started")
        if call.done:
            # A repeated done (Responses sends arguments.done and output_item.done) is a
            # no-op when it agrees; a disagreeing one spoils the call.
            # surrogatepass: a lone surrogate must disagree, not raise (raw is valid UTF-8).
            repeated = None if arguments is None else arguments.encode("utf-8", "surrogatepass")
            if repeated is not None and call.error is None and repeated != call.raw:
                call.error = "done events disagree about the arguments"
                call.arguments = None
            return
        call.done = True
        if call.error is not None:
            return
        joined = "".join(call.parts)
        call.parts = []
        if arguments is not None:
            if not joined:
                joined = arguments
                if not self._admit_whole(call, len(arguments)):
                    return
            elif arguments != joined:
                call.error = "arguments in the done event differ from the streamed fragments"
                return
        self._parse(call, joined)

    def _admit_whole(self, call: _Call, n: int) -> bool:
        """Count arguments that arrived whole in a done event; False spoils the call."""
        self._total += n
        if self._total > self._limits.max_response_argument_bytes:
            raise LimitExceeded(
                "max_response_argument_bytes", self._limits.max_response_argument_bytes
            )
        if n > self._limits.max_call_argument_bytes:
            call.error = (
                f"arguments exceed max_call_argument_bytes ({self._limits.max_call_argument_bytes})"
            )
            return False
        return True

    def _parse(self, call: _Call, joined: str) -> None:
        try:
            raw = joined.encode("utf-8")
        except UnicodeEncodeError:
            call.error = "arguments contain a lone surrogate"
            return
        call.raw = raw
        if len(raw) > self._limits.max_call_argument_bytes:
            call.error = (
                f"arguments exceed max_call_argument_bytes ({self._limits.max_call_argument_bytes})"
            )
            return
        try:
            call.arguments = parse_arguments(raw, self._limits.max_json_depth)
        except ArgumentsRejected as exc:
            call.error = exc.reason

    @property
    def open_count(self) -> int:
        return sum(1 for c in self._calls.values() if not c.done)

    def complete(self, response_id: str | None) -> tuple[ProposedCall, ...]:
        """Calls whose done signal arrived, in output order."""
        out = []
        for index in sorted(self._calls):
            call = self._calls[index]
            if not call.done:
                continue
            derived = call.call_id is None or call.call_id == ""
            out.append(
                ProposedCall(
                    index=index,
                    call_id=derive_call_id(response_id, index) if derived else str(call.call_id),
                    name=call.name,
                    arguments=call.arguments if call.error is None else None,
                    raw_arguments=call.raw,
                    error=call.error,
                    item_id=call.item_id,
                    call_id_derived=derived,
                )
            )
        return tuple(out)

    def incomplete(self, reason: str) -> tuple[IncompleteCall, ...]:
        return tuple(
            IncompleteCall(
                index=c.index,
                call_id=c.call_id,
                name=c.name,
                received_bytes=c.size,
                reason=reason,
            )
            for i, c in sorted(self._calls.items())
            if not c.done
        )
