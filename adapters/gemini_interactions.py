"""Gemini Interactions adapter (``POST /v1beta/interactions`` with ``"stream": true``): SSE
events in, engine events out; engine values in, Interactions request shapes out.

Owns the reading of both event formats — the current "steps" format (``interaction.created``,
``step.start/delta/stop``, ``interaction.completed``) and the legacy one
(``interaction.start``, ``content.start/delta/stop``, ``interaction.complete``) — and the
writing of ``function_result`` input items and the request body. Never does HTTP, never
parses tool arguments (the assembler does), never trusts provider text as a status.

Decoding: a ``function_call`` step opens a call at its step ``index`` (the ``arguments: {}``
placeholder is ignored), ``arguments_delta`` text is forwarded as fragments and
``step.stop`` is the done signal. A legacy ``function_call`` arrives whole in one
``content.delta``; its arguments object (like non-empty ``arguments`` in a step.start)
goes to the assembler as its exact wire bytes, and no argument delta may follow it.
Output text is text whether streamed (``text`` deltas) or whole in a ``model_output``
step.start (``content`` text items; its other items become a ``ProviderDetail``, as
unknown steps do). Thought steps (signature, summary) and function-call signatures are
kept as ``ContinuationItem``s; of a step's payload nothing else is held. The terminal
status maps through ``FINISH_REASONS``; the first status that ends the interaction short
of success (failed, cancelled, incomplete) stands, whatever a later one says. A call's
result can only go back as the continuation of its interaction, named by the id the
server gave the call: a call without an id, or calls in an interaction without an id,
fail the stream (before anything runs).

Continuation is **stateful** (``previous_interaction_id``; the server keeps the model's
turn, thought signatures included). So that the run loop's plain rule "messages = initial
+ echo + results + echo + …" still works, ``assistant_echo`` returns one *marker* item
``{"type": "callgate.interaction", "interaction_id": <id>}`` instead of the model's output.
``build_request`` never sends markers: it sends only the items after the last marker as
``input`` and uses the marker's id (or ``previous.response_id`` when given) as
``previous_interaction_id``. Markers are plain JSON, so a persisted message list resumes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, cast

import msgspec

from callgate.engine.core.adapter import (
    JSON,
    HttpRequestSpec,
    ModelResult,
    ToolDeclaration,
    unsendable_call,
)
from callgate.engine.core.errors import ConfigError, LimitExceeded, StreamProtocolError
from callgate.engine.core.events import (
    ArgumentsDelta,
    BatchEvent,
    CallDone,
    CallStarted,
    Completion,
    ContinuationItem,
    EngineEvent,
    ProviderDetail,
    ProviderError,
    ResponseMeta,
    TextDelta,
    UsageReport,
    append_fragments,
)
from callgate.engine.core.footprint import footprint
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import OutcomeKind, ProposedCall, TurnOutcome
from callgate.engine.core.pieces import TextPieces
from callgate.engine.core.sse import SSEEvent

from . import _interactions_wire as wire
from ._interactions_steps import CALL, KINDS, OTHER, OUTPUT, THOUGHT, Step
from ._interactions_wire import (
    DELTA_NAMES,
    OP_COMPLETED,
    OP_CREATED,
    OP_DELTA,
    OP_ERROR,
    OP_START,
    OP_STOP,
    OPS,
)
from ._utf8 import utf8_len

__all__ = [
    "ADAPTER",
    "FINISH_REASONS",
    "TURN_MARKER",
    "GeminiInteractionsAdapter",
    "GeminiInteractionsStream",
]

# Interaction status -> outcome kind (genai-py interaction status; vercel's mapping).
FINISH_REASONS: dict[str, OutcomeKind] = {
    "requires_action": OutcomeKind.TOOL_PROPOSALS,
    "completed": OutcomeKind.FINAL_TEXT,
    "incomplete": OutcomeKind.TRUNCATED,
    "failed": OutcomeKind.FAILED,
    "cancelled": OutcomeKind.FAILED,
}

# Statuses that end an interaction even when no interaction.completed follows.
_FAILED_STATUSES: Final = frozenset({"failed", "cancelled"})
# Statuses that end it short of success: the first one reported stands, so a later
# status (an interaction.completed saying requires_action) cannot turn it into one.
_ENDING_STATUSES: Final = _FAILED_STATUSES | {"incomplete"}

# The ``type`` of the echo marker item; never sent to the provider.
TURN_MARKER: Final = "callgate.interaction"


class GeminiInteractionsStream:
    """Decoding state of one streamed interaction."""

    __slots__ = (
        "_called",
        "_calls",
        "_done",
        "_held",
        "_id",
        "_items",
        "_limits",
        "_meta_sent",
        "_status",
        "_steps",
    )

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._steps: dict[int, Step] = {}
        # Indexes of the function_call steps whose call is open (argument fragments).
        self._calls: set[int] = set()
        self._items = 0
        self._held = 0  # bytes of the open non-call steps (see _hold)
        self._status: str | None = None
        self._meta_sent = False
        self._done = False
        # Whether the interaction has an id and a call was proposed: a call's result can
        # only be sent as the continuation of the interaction (previous_interaction_id).
        self._id = False
        self._called = False

    def decode(self, event: SSEEvent) -> list[EngineEvent]:
        out: list[BatchEvent] = []
        self.decode_batch([event], out)
        return cast("list[EngineEvent]", out)  # one event never makes a run

    def decode_batch(self, events: list[SSEEvent], out: list[BatchEvent]) -> None:
        """Translate a chunk's events in order. Argument deltas of open calls (nearly
        every event of a long call) are read through a lean view and collected into one
        ``ArgumentsRun``; every other event is decoded whole and goes through ``_event``.
        Events before an error are in ``out`` when it is raised."""
        hot = wire.HOT_DECODER.decode
        calls = self._calls
        indexes: list[int] = []
        pieces: list[str] = []
        try:
            for event in events:
                # Only while a call is open can a delta be a fragment: text deltas are
                # decoded once, whole.
                if calls and event.event in DELTA_NAMES and not self._done:
                    try:
                        lean = hot(event.data)
                    except msgspec.DecodeError:
                        lean = None  # the full decode below names the problem
                    if lean is not None and lean.index in calls:
                        delta = lean.delta
                        if (
                            delta is not None
                            and delta.type == "arguments_delta"
                            and not delta.signature
                            and type(fragment := delta.arguments) is str
                            and (lean.event_type or event.event) in DELTA_NAMES
                        ):
                            if fragment:
                                indexes.append(lean.index)
                                pieces.append(fragment)
                            continue
                append_fragments(out, indexes, pieces)
                indexes, pieces = [], []
                self._event(event, out)
        except RecursionError:
            # msgspec's own guard against nesting (even in a field no view reads).
            raise StreamProtocolError("interactions: an event nests too deeply to decode") from None
        finally:
            append_fragments(out, indexes, pieces)

    def _event(self, event: SSEEvent, out: list[BatchEvent]) -> None:
        try:
            ev = wire.DECODER.decode(event.data)
        except msgspec.DecodeError as exc:
            raise StreamProtocolError(
                f"interactions: undecodable {event.event!r} event: {exc}"
            ) from None
        etype = ev.event_type or event.event
        op = OPS.get(etype)
        if op == OP_DELTA:
            out += self._delta(ev)
            return
        if op == OP_ERROR:
            out.append(ProviderError(wire.error_info(ev.error)))
            return
        if op is None:
            return  # keep-alives and event types newer than this adapter
        if self._done:
            raise StreamProtocolError(f"interactions: {etype!r} after the interaction completed")
        if op == OP_START:
            out += self._start(ev)
        elif op == OP_STOP:
            out += self._stop(ev.index)
        elif op == OP_CREATED:
            out += self._created(ev.interaction)
        elif op == OP_COMPLETED:
            out += self._completed(ev.interaction)
        # interaction.status_update and its per-status variants
        elif ev.status is not None:
            self._report(ev.status)
        elif etype == "interaction.requires_action":
            self._report("requires_action")

    def end(self) -> list[EngineEvent]:
        # The Completion was emitted with interaction.completed; without it the turn
        # stays without one (truncated) — unless the last status the server reported was
        # failed or cancelled: that is the provider's own ending, not a cut.
        if not self._done and self._status in _FAILED_STATUSES:
            return [Completion(OutcomeKind.FAILED, self._status)]
        return []

    # --- interaction level -------------------------------------------------------------

    def _report(self, status: str) -> None:
        """A status the server reported: the first that ends the interaction short of
        success (failed, cancelled, incomplete) stands."""
        if self._status not in _ENDING_STATUSES:
            self._status = status

    def _meta(self, interaction: wire.Interaction) -> list[EngineEvent]:
        # An unstored interaction (store:false) has id "": nothing to continue from. The
        # first id given counts (the assembler keeps the first non-empty one too).
        if interaction.id and not self._id:
            self._id = True
            self._meta_sent = True
            return [ResponseMeta(interaction.id, interaction.model)]
        if not self._meta_sent and interaction.model:
            self._meta_sent = True
            return [ResponseMeta(None, interaction.model)]
        return []

    def _created(self, interaction: wire.Interaction | None) -> list[EngineEvent]:
        if self._meta_sent:
            raise StreamProtocolError("interactions: interaction created twice")
        self._meta_sent = True
        if interaction is None:
            raise StreamProtocolError("interactions: interaction.created without an interaction")
        if interaction.status is not None:
            self._report(interaction.status)
        # An unstored interaction (store:false) has id "": nothing to continue from.
        self._id = bool(interaction.id)
        return [ResponseMeta(interaction.id or None, interaction.model)]

    def _completed(self, interaction: wire.Interaction | None) -> list[EngineEvent]:
        self._done = True
        out: list[EngineEvent] = []
        if interaction is not None:
            out += self._meta(interaction)
            if interaction.status is not None:
                self._report(interaction.status)
            if interaction.usage is not None:
                out.append(UsageReport(wire.usage(interaction.usage)))
        status = self._status
        if status is None:
            raise StreamProtocolError("interactions: interaction completed without a status")
        if self._called and not self._id:
            # The results of its calls could never be sent back: the next request
            # continues the interaction by its id. Failed now, before any call runs.
            raise StreamProtocolError(
                "interactions: function calls in an interaction without an id"
            )
        out.append(Completion(FINISH_REASONS.get(status, OutcomeKind.FAILED), status))
        return out

    # --- steps ---------------------------------------------------------------------------

    def _start(self, ev: wire.Event) -> list[EngineEvent]:
        index = ev.index
        raw = ev.step if wire.given(ev.step) else ev.content
        if index < 0 or not wire.given(raw):
            raise StreamProtocolError("interactions: step start without index or step")
        try:
            data = wire.STEP_DECODER.decode(raw)
        except msgspec.DecodeError as exc:
            raise StreamProtocolError(f"interactions: undecodable step {index}: {exc}") from None
        if index in self._steps:
            raise StreamProtocolError(f"interactions: step {index} started twice")
        stype = data.type
        kind = KINDS.get(stype, OTHER) if isinstance(stype, str) else OTHER
        if kind != CALL:
            # Every non-call step is kept (as an item or a detail) or at least tracked.
            self._count_item()
        elif (
            len(self._steps)
            >= self._limits.max_continuation_items + self._limits.max_calls_per_response
        ):
            # Call steps are bounded by the assembler once they open, but a legacy call
            # step opens only at its delta: bound the tracked steps here as well.
            raise LimitExceeded(
                "max_calls_per_response", self._limits.max_calls_per_response, "interactions steps"
            )
        step = self._steps[index] = Step(kind)
        if isinstance(data.signature, str) and data.signature:
            step.signature = data.signature
        if kind == CALL:
            return self._open_call(index, step, data)
        if kind == THOUGHT:
            if isinstance(data.summary, list):
                for entry in data.summary:
                    if isinstance(entry, dict) and isinstance(entry.get("text"), str):
                        self._buffer(step, entry["text"])
        elif kind == OUTPUT:
            # Output that came whole: its text (ModelOutputStep.content's text items) is
            # text; other content items (image, audio, …) are kept as unknown steps are:
            # the step, with just those items, becomes a ProviderDetail at its stop.
            texts, others = wire.output(data)
            if others:
                step.detail = {**wire.value(raw, f"step {index}"), "content": others}
                self._hold_value(step, step.detail, len(raw))  # held until its stop
            return [TextDelta(text) for text in texts]
        else:
            # The whole step becomes a ProviderDetail at its stop (one continuation
            # item, like every adapter's opaque parts): kept, and counted, as that.
            step.detail = wire.value(raw, f"step {index}")
            self._hold_value(step, step.detail, len(raw))
        return []

    def _open_call(self, index: int, step: Step, data: wire.Step) -> list[EngineEvent]:
        name, args = data.name, data.arguments
        call_id = data.id if isinstance(data.id, str) and data.id else None
        if name is None:
            # Legacy: the whole call, with its arguments, follows in one content.delta.
            if not wire.placeholder(args):
                raise StreamProtocolError(f"interactions: nameless call step {index} has arguments")
            step.call_id = call_id
            return []
        if not isinstance(name, str):
            raise StreamProtocolError(f"interactions: function_call step {index} has no name")
        step.call_open = True
        out: list[EngineEvent] = [self._call_started(index, name, call_id)]
        if wire.is_string(args):
            # Argument text in a JSON string, as the legacy content.delta may carry it: an
            # empty one is the placeholder; any other is the whole text, as below.
            text = wire.string(args, f"function_call {index} arguments") or ""
            if not text:
                self._calls.add(index)
            else:
                step.whole = True
                out.append(ArgumentsDelta(index, text))
        elif wire.placeholder(args):
            self._calls.add(index)  # `arguments: {}` (documented): the deltas carry them
        else:
            # Real arguments in step.start (PROVIDERS.md defines none) are never dropped.
            # Alone they are the call's arguments: exact bytes, parsed strictly and capped
            # by the assembler. An argument delta after them would be a second source;
            # joining or picking one would be a guess, so it fails the stream (`_delta`:
            # the call is kept out of `_calls`, so all its deltas take that path).
            out.append(self._whole(index, step, args))
        return out

    def _call_started(self, index: int, name: str, call_id: str | None) -> CallStarted:
        if call_id is None:
            # Its result must name the call by the id the server gave it (call_id): one
            # callgate derived would answer a call the server does not know.
            raise StreamProtocolError(f"interactions: function_call {index} has no id")
        self._called = True
        return CallStarted(index, name, call_id=call_id)

    @staticmethod
    def _whole(index: int, step: Step, args: msgspec.Raw) -> ArgumentsDelta:
        """Whole arguments as one fragment: their exact wire text (UTF-8 checked)."""
        step.whole = True
        return ArgumentsDelta(index, wire.text(args, f"function_call {index} arguments"))

    def _delta(self, ev: wire.Event) -> list[EngineEvent]:
        if self._done:
            raise StreamProtocolError("interactions: delta after the interaction completed")
        index = ev.index
        step = self._steps.get(index)
        if step is None or not step.open:
            state = "stopped" if step is not None else "unknown"
            raise StreamProtocolError(f"interactions: delta for {state} step {index}")
        delta = ev.delta
        if delta is None:
            raise StreamProtocolError(f"interactions: step {index} delta without content")
        dtype = delta.type
        kind = step.kind
        if dtype == "text":
            if kind in (CALL, THOUGHT):
                raise StreamProtocolError(f"interactions: text delta in non-output step {index}")
            return [TextDelta(delta.text)] if delta.text else []
        if kind == CALL:
            if dtype == "arguments_delta":
                if not step.call_open:
                    raise StreamProtocolError(f"interactions: arguments for unopened call {index}")
                if delta.signature:
                    step.signature = delta.signature
                fragment = wire.string(delta.arguments, f"arguments_delta {index}")
                if not fragment:
                    return []
                if step.whole:
                    raise StreamProtocolError(
                        f"interactions: argument delta for call {index}: its arguments came whole"
                    )
                return [ArgumentsDelta(index, fragment)]
            if dtype == "function_call":
                return self._legacy_call(index, step, delta)
            return []
        if kind == THOUGHT:
            if dtype == "thought_signature" and delta.signature is not None:
                step.signature = delta.signature
            elif dtype == "thought_summary" and isinstance(delta.content, dict):
                text = delta.content.get("text")
                if isinstance(text, str):
                    self._buffer(step, text)
        # Image, annotation and built-in tool deltas carry nothing the turn acts on.
        return []

    def _legacy_call(self, index: int, step: Step, delta: wire.Delta) -> list[EngineEvent]:
        if step.call_open:
            raise StreamProtocolError(f"interactions: call {index} delivered twice")
        if not delta.name:
            raise StreamProtocolError(f"interactions: function_call {index} has no name")
        step.call_open = True
        if delta.signature:
            step.signature = delta.signature
        out: list[EngineEvent] = [
            self._call_started(index, delta.name, delta.id or step.call_id or None)
        ]
        args = delta.arguments
        if wire.given(args) and not wire.is_string(args):
            # Legacy calls carry the arguments as an object: its exact bytes go to the
            # assembler (a duplicate key is rejected there, `1E2` stays `1E2`).
            out.append(self._whole(index, step, args))
            return out
        self._calls.add(index)
        fragment = wire.string(args, f"function_call {index} arguments")
        if fragment:
            out.append(ArgumentsDelta(index, fragment))
        return out

    def _stop(self, index: int) -> list[EngineEvent]:
        step = self._steps.get(index)
        if step is None or not step.open:
            state = "stopped" if step is not None else "unknown"
            raise StreamProtocolError(f"interactions: stop for {state} step {index}")
        step.open = False
        self._held -= step.held  # handed on: the assembler counts what it keeps
        self._calls.discard(index)
        kind = step.kind
        if kind == CALL:
            if not step.call_open:
                raise StreamProtocolError(
                    f"interactions: function_call step {index} carried no call"
                )
            out: list[EngineEvent] = [CallDone(index)]
            if step.signature:
                self._count_item()
                out.append(
                    ContinuationItem(
                        "function_call_signature", index, {"signature": step.signature}
                    )
                )
            return out
        if kind == THOUGHT:
            item: dict[str, Any] = {"type": "thought"}
            if step.signature:
                item["signature"] = step.signature
            if step.summary:
                item["summary"] = [{"type": "text", "text": step.summary.joined()}]
            step.summary = TextPieces()
            return [ContinuationItem("thought", index, item)]
        if kind == OTHER or step.detail is not None:
            detail, step.detail = step.detail, None
            return [ProviderDetail("interactions_step", detail or {})]
        return []

    def _count_item(self) -> None:
        self._items += 1
        if self._items > self._limits.max_continuation_items:
            raise LimitExceeded(
                "max_continuation_items", self._limits.max_continuation_items, "interactions steps"
            )

    def _hold_value(self, step: Step, value: object, size: int) -> None:
        """Hold a decoded step: charged as kept values are (see core.footprint)."""
        budget = self._limits.max_continuation_bytes - self._held
        self._hold(step, footprint(value, size, budget))

    def _hold(self, step: Step, size: int) -> None:
        step.held += size
        self._held += size
        if self._held > self._limits.max_continuation_bytes:
            raise LimitExceeded(
                "max_continuation_bytes", self._limits.max_continuation_bytes, "open steps"
            )

    def _buffer(self, step: Step, text: str) -> None:
        self._hold(step, utf8_len(text))
        step.nbytes += utf8_len(text)
        if step.nbytes > self._limits.max_call_argument_bytes:
            raise LimitExceeded(
                "max_call_argument_bytes",
                self._limits.max_call_argument_bytes,
                "interactions thought summary",
            )
        step.summary.add(text)


# --- encode side ---------------------------------------------------------------------------


# What Gemini's function names may be in a conversation the next request carries (the API refuses
# anything else, after the turn's calls would have run).
_ECHO_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


class GeminiInteractionsAdapter:
    """The Gemini Interactions adapter (decode and encode side; stateful continuation)."""

    name = "gemini_interactions"
    family = "gemini_interactions"
    revision = "gemini_interactions/1"

    sse_unframed = False
    finish_reasons: Mapping[str, OutcomeKind] = FINISH_REASONS

    def new_stream(self, limits: Limits) -> GeminiInteractionsStream:
        return GeminiInteractionsStream(limits)

    def initial_messages(self, user_text: str) -> list[JSON]:
        return [{"type": "text", "text": user_text}]

    def assistant_echo(self, outcome: TurnOutcome) -> list[JSON]:
        """A marker, not the model's output: the server already holds the turn. The
        marker carries the interaction id so ``build_request`` can continue from it."""
        return [{"type": TURN_MARKER, "interaction_id": outcome.response_id}]

    def encode_results(self, outcome: TurnOutcome, results: list[ModelResult]) -> list[JSON]:
        """One top-level ``function_result`` input item per result, in the given order."""
        items: list[JSON] = []
        for result in results:
            item: JSON = {
                "type": "function_result",
                "call_id": result.call_id,
                "name": result.name,
                "result": result.content,
            }
            if result.is_error:
                item["is_error"] = True
            items.append(item)
        return items

    def build_request(
        self,
        *,
        model: str,
        messages: list[JSON],
        tools: list[ToolDeclaration],
        system: str | None = None,
        max_tokens: int | None = None,
        previous: TurnOutcome | None = None,
    ) -> HttpRequestSpec:
        """``input`` is the items after the last echo marker; ``previous_interaction_id``
        is ``previous.response_id`` when given, else the last marker's id."""
        marker_at = -1
        marker_id: object = None
        for i in range(len(messages) - 1, -1, -1):
            if messages[i].get("type") == TURN_MARKER:
                marker_at, marker_id = i, messages[i].get("interaction_id")
                break
        previous_id = previous.response_id if previous is not None else None
        if not previous_id and isinstance(marker_id, str):
            previous_id = marker_id
        if marker_at >= 0 and not previous_id:
            raise ConfigError(
                "interactions: continuing a turn needs the previous interaction id "
                "(the provider returned none: was the interaction stored?)"
            )
        body: JSON = {"model": model, "input": messages[marker_at + 1 :], "stream": True}
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                }
                for t in tools
            ]
        if previous_id:
            body["previous_interaction_id"] = previous_id
        if system is not None:
            body["system_instruction"] = system
        if max_tokens is not None:
            body["generation_config"] = {"max_output_tokens": max_tokens}
        return HttpRequestSpec(path="/v1beta/interactions", body=body)

    def unsendable(self, call: ProposedCall) -> str | None:
        return unsendable_call(call, _ECHO_NAME)

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-goog-api-key": api_key}


ADAPTER: Final = GeminiInteractionsAdapter()
