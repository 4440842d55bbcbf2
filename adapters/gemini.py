"""Gemini ``generateContent`` adapter (``:streamGenerateContent?alt=sse``): chunks in,
engine events out; engine values in, ``contents`` shapes out. The decode side reads the
Gemini API's and Vertex AI's streams alike (Vertex ``partialArgs`` included); the request
side speaks the Gemini API (its ``/v1beta/models/...`` path and ``x-goog-api-key``): a
Vertex endpoint, its project/location path and OAuth token are not built here.

Owns the reading of whole-response chunks (``candidates[0].content.parts``), the Vertex
streamed-call lifecycle (its ``partialArgs`` are assembled by ``_vertex_args``; the wire
views the chunks are read through live in ``_gemini_wire``), the
thought-signature bookkeeping, and the writing of the ``model`` echo, ``functionResponse``
parts and the request body (tool schemas as ``parametersJsonSchema``). Never does HTTP,
never parses tool arguments (the assembler does), never trusts provider text as a status.

Gemini has no end-of-stream marker and no per-call "done" event: a ``functionCall`` part
with ``args`` is complete on arrival (``CallStarted``, then ``CallDone`` carrying the exact
``args`` bytes; a Vertex streamed call's done carries the object built from its pieces),
and the ``Completion`` is emitted from ``end()`` only when a
``finishReason`` was seen, because an unframed JSON error body may still follow a STOP chunk.
Thought text and signatures are kept as ``ContinuationItem``s so the echo can put each
signature back on the same kind of part: ``thought`` (merged consecutive thought text),
``thought_signature`` (index = the call's index) and ``text_signature``. When the parts came
in any other order than thoughts, one text, calls (text between calls, or several signed
text parts), one ``ProviderDetail("gemini_part_order")`` lists them as they came, so that
the echo repeats that order and each text part's own signature: ``["thought", pos]``,
``["text", start, end]`` (code-point offsets into the turn's text, plus the signature when
the part had one), ``["call", index]``. It is callgate's bookkeeping, not a provider item,
so it is a detail: it never counts against ``max_continuation_items`` (a detail past that
cap is dropped, and the echo then uses the usual order).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, cast
from urllib.parse import quote

import msgspec

from callgate.engine.core.adapter import (
    JSON,
    HttpRequestSpec,
    ModelResult,
    ToolDeclaration,
    unsendable_call,
)
from callgate.engine.core.errors import LimitExceeded, StreamProtocolError
from callgate.engine.core.events import (
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
)
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import (
    OutcomeKind,
    ProposedCall,
    ProviderErrorInfo,
    TurnOutcome,
    Usage,
    token_sum,
)
from callgate.engine.core.pieces import TextPieces
from callgate.engine.core.sse import SSEEvent

from ._gemini_echo import default_order, echo_parts
from ._gemini_unframed import UnframedText
from ._gemini_wire import (
    DECODER,
    JSON_DECODER,
    NO_USAGE,
    Chunk,
    Error,
    FunctionCall,
    Part,
    continuation,
    other_part,
)
from ._utf8 import is_utf8, utf8_len
from ._vertex_args import StreamedArguments

__all__ = ["ADAPTER", "FINISH_REASONS", "GeminiAdapter", "GeminiStream"]

_F = OutcomeKind.FAILED
_R = OutcomeKind.REFUSAL

# finishReason -> outcome kind (genai-py types.FinishReason). Function-call turns end with
# STOP too; the assembler turns FINAL_TEXT with complete calls into TOOL_PROPOSALS.
FINISH_REASONS: dict[str, OutcomeKind] = {
    "STOP": OutcomeKind.FINAL_TEXT,
    "MAX_TOKENS": OutcomeKind.TRUNCATED,
    "SAFETY": _R,
    "RECITATION": _R,
    "BLOCKLIST": _R,
    "PROHIBITED_CONTENT": _R,
    "SPII": _R,
    "IMAGE_SAFETY": _R,
    "IMAGE_PROHIBITED_CONTENT": _R,
    "IMAGE_RECITATION": _R,
    "MALFORMED_FUNCTION_CALL": _F,
    "UNEXPECTED_TOOL_CALL": _F,
    "TOO_MANY_TOOL_CALLS": _F,
    "NO_IMAGE": _F,
    "IMAGE_OTHER": _F,
    "LANGUAGE": _F,
    "OTHER": _F,
    "FINISH_REASON_UNSPECIFIED": _F,
}

# Error codes/statuses where a retry can succeed: overload, quota, transient server faults.
_RETRYABLE: Final = frozenset({429, 500, 503, "UNAVAILABLE", "RESOURCE_EXHAUSTED"})


def _provider_error(error: Error) -> ProviderError:
    code, status = error.code, error.status
    return ProviderError(
        ProviderErrorInfo(
            code=status if status is not None else (str(code) if code is not None else None),
            message=error.message,
            status=code,
            retryable=code in _RETRYABLE or status in _RETRYABLE,
        )
    )


class GeminiStream:
    """Decoding state of one ``streamGenerateContent`` response."""

    __slots__ = (
        "_blocked",
        "_calls",
        "_finish",
        "_id_known",
        "_items",
        "_junk",
        "_limits",
        "_meta_sent",
        "_order",
        "_part_pos",
        "_run_start",
        "_text_chars",
        "_thought",
        "_thought_bytes",
        "_thought_pos",
        "_usage",
        "_vertex",
    )

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._calls = 0
        self._part_pos = 0
        self._items = 0
        self._meta_sent = False
        self._id_known = False  # a responseId was reported (it may come after the model)
        self._usage: tuple[int | None, ...] = NO_USAGE
        self._finish: str | None = None
        self._blocked: str | None = None
        self._vertex: StreamedArguments | None = None
        self._thought = TextPieces()
        self._thought_pos = -1
        self._thought_bytes = 0
        # The parts in arrival order (see the module docstring), and the text run being
        # received: its start in the turn's text (-1: none open) and the text's length.
        self._order: list[list[Any]] = []
        self._run_start = -1
        self._text_chars = 0
        self._junk = UnframedText(limits.max_event_bytes)

    def decode(self, event: SSEEvent) -> list[EngineEvent]:
        out: list[BatchEvent] = []
        self.decode_batch([event], out)
        return cast("list[EngineEvent]", out)  # this adapter never makes runs

    def decode_batch(self, events: list[SSEEvent], out: list[BatchEvent]) -> None:
        """Translate a chunk's events in order. A Vertex chunk that only continues the
        streamed call's arguments (nearly every chunk of a long call) is applied right
        here, when ``_chunk`` would do nothing else for it (the ids known, no text run
        or thought open); every other chunk goes through ``_chunk``, whole or not at all.
        Both decode the chunk through the same view."""
        decode = DECODER.decode
        try:
            for event in events:
                if event.unframed:
                    out += [_provider_error(e) for e in self._junk.add(event.data)]
                    continue
                try:
                    chunk = decode(event.data)
                except msgspec.DecodeError as exc:
                    raise StreamProtocolError(f"gemini: undecodable chunk: {exc}") from None
                vertex = self._vertex
                if (
                    vertex is not None
                    and self._id_known
                    and self._thought_pos < 0
                    and self._run_start < 0
                    and self._finish is None
                ):
                    fc = continuation(chunk, self._usage)
                    if fc is not None:
                        # What ``_part`` and ``_function_call`` do for this part.
                        self._part_pos += 1
                        if fc.partial_args:
                            vertex.add(fc.partial_args)
                        continue
                out += self._chunk(chunk)
        except RecursionError:
            # msgspec's own guard against nesting (even in a field no view reads).
            raise StreamProtocolError("gemini: an event nests too deeply to decode") from None

    def _chunk(self, chunk: Chunk) -> list[EngineEvent]:
        if chunk.error is not None:
            return [_provider_error(chunk.error)]
        out: list[EngineEvent] = []
        rid = chunk.response_id or None  # an empty id is no id: a later one still counts
        if not self._meta_sent and (rid or chunk.model_version):
            self._meta_sent = True
            self._id_known = rid is not None
            out.append(ResponseMeta(rid, chunk.model_version or None))
        elif not self._id_known and rid:
            # The id came after the model version: derived call ids must use it.
            self._id_known = True
            out.append(ResponseMeta(rid, None))
        candidates = chunk.candidates
        cand = candidates[0] if candidates else None
        if cand is not None and cand.index != 0:
            # Another candidate (never asked for) is not this turn.
            cand = next((c for c in candidates or () if c.index == 0), None)
        if cand is not None:
            content = cand.content
            if content is not None and content.parts:
                for part in content.parts:
                    self._part(part, out)
            if cand.finish_reason is not None and self._finish is None:
                # Remembered, not emitted: an unframed error body may still follow. The
                # first one counts: a later STOP cannot undo MAX_TOKENS or SAFETY.
                self._finish = cand.finish_reason
        feedback = chunk.prompt_feedback
        if (
            feedback is not None
            and feedback.block_reason
            # "Default value. This value is unused." (genai types.BlockedReason)
            and feedback.block_reason != "BLOCK_REASON_UNSPECIFIED"
            and self._blocked is None
        ):
            # A blocked prompt: the turn is a refusal whatever candidates say (end()).
            self._blocked = feedback.block_reason
        meta = chunk.usage_metadata
        if meta is not None:
            counts = (
                meta.prompt_token_count,
                meta.candidates_token_count,
                meta.thoughts_token_count,
                meta.cached_content_token_count,
                meta.tool_use_prompt_token_count,
            )
            # Every chunk repeats the running usage; report only changes.
            if counts not in (self._usage, NO_USAGE):
                self._usage = counts
                prompt, tool = counts[0], counts[4]
                out.append(
                    UsageReport(
                        Usage(
                            # The tool-use prompt tokens are billed prompt tokens too.
                            input_tokens=prompt if tool is None else token_sum(prompt, tool),
                            # candidatesTokenCount leaves the (billed) thoughts out.
                            output_tokens=token_sum(counts[1], counts[2]),
                            reasoning_tokens=counts[2],
                            cached_input_tokens=counts[3],
                        )
                    )
                )
        return out

    def end(self) -> list[EngineEvent]:
        out: list[EngineEvent] = []
        self._flush_thought(out)
        self._close_text()
        if not default_order(self._order):
            out.append(ProviderDetail("gemini_part_order", {"parts": self._order}))
        out += [_provider_error(e) for e in self._junk.finish()]
        if self._blocked is not None:
            out.append(Completion(_R, self._blocked))
        elif self._finish is not None:
            out.append(Completion(FINISH_REASONS.get(self._finish, _F), self._finish))
        return out

    # --- parts -----------------------------------------------------------------------

    def _part(self, part: Part, out: list[EngineEvent]) -> None:
        pos = self._part_pos
        self._part_pos = pos + 1
        fc = part.function_call
        if fc is not None:
            if self._finish is not None:
                # The candidate finished: a call now (a new one, or more of a streamed
                # one) is not part of the turn its finishReason ended (as in Chat).
                raise StreamProtocolError(
                    f"gemini: functionCall part after finishReason {self._finish!r}"
                )
            self._flush_thought(out)
            self._close_text()
            index = self._function_call(fc, out)
            if fc.name is not None:  # a call opens here (not a Vertex continuation)
                self._order.append(["call", index])
            if part.thought_signature:
                self._item(
                    out, "thought_signature", index, {"thoughtSignature": part.thought_signature}
                )
            return
        if part.thought:
            if part.text or part.thought_signature:
                self._close_text()
            self._add_thought(pos, part.text, part.thought_signature, out)
            return
        if self._thought_pos >= 0:
            self._flush_thought(out)
        text = part.text
        if text:
            if self._run_start < 0:
                self._run_start = self._text_chars
            self._text_chars += len(text)
            out.append(TextDelta(text))
        sig = part.thought_signature
        if sig:
            # A signature outside a thought or call belongs on a text part of the echo;
            # it closes the text run it came with (an empty part's: a run of its own).
            self._item(out, "text_signature", pos, {"thoughtSignature": sig})
            if self._run_start < 0:
                self._run_start = self._text_chars
            self._close_text(sig)
        elif text is None:
            other = other_part(part)
            if other is not None:
                out.append(ProviderDetail("gemini_part", other))

    def _add_thought(
        self, pos: int, text: str | None, sig: str | None, out: list[EngineEvent]
    ) -> None:
        if not text and not sig:
            return
        if self._thought_pos < 0:
            self._thought_pos = pos
        if text:
            self._thought_bytes += utf8_len(text)
            if self._thought_bytes > self._limits.max_call_argument_bytes:
                raise LimitExceeded(
                    "max_call_argument_bytes",
                    self._limits.max_call_argument_bytes,
                    "gemini thought",
                )
            self._thought.add(text)
        if sig:
            # The signature closes the merged thought: it belongs on that part.
            self._flush_thought(out, sig)

    def _flush_thought(self, out: list[EngineEvent], sig: str | None = None) -> None:
        if self._thought_pos < 0:
            return
        item: dict[str, Any] = {"text": self._thought.joined(), "thought": True}
        if sig:
            item["thoughtSignature"] = sig
        pos = self._thought_pos
        self._thought = TextPieces()
        self._thought_pos = -1
        self._thought_bytes = 0
        self._item(out, "thought", pos, item)
        self._order.append(["thought", pos])

    def _close_text(self, sig: str | None = None) -> None:
        start = self._run_start
        if start < 0:
            return
        self._run_start = -1
        entry: list[Any] = ["text", start, self._text_chars]
        if sig:
            entry.append(sig)
        self._order.append(entry)

    def _item(self, out: list[EngineEvent], kind: str, index: int, item: dict[str, Any]) -> None:
        self._items += 1
        if self._items > self._limits.max_continuation_items:
            raise LimitExceeded(
                "max_continuation_items", self._limits.max_continuation_items, "gemini"
            )
        out.append(ContinuationItem(kind, index, item))

    # --- function calls --------------------------------------------------------------

    def _function_call(self, fc: FunctionCall, out: list[EngineEvent]) -> int:
        """Translate one functionCall part; returns the index of the call it belongs to."""
        vertex = self._vertex
        if fc.name is not None:
            if vertex is not None:
                raise StreamProtocolError(
                    f"gemini: functionCall {fc.name!r} opened while call {vertex.index} streams"
                )
            index = self._calls
            self._calls = index + 1
            out.append(CallStarted(index, fc.name, call_id=fc.id or None))
            if fc.will_continue:
                if fc.args:
                    raise StreamProtocolError("gemini: streamed functionCall also carries args")
                self._vertex = vertex = StreamedArguments(index, self._limits)
                if fc.partial_args:
                    vertex.add(fc.partial_args)
                return index
            if fc.partial_args:
                raise StreamProtocolError(
                    "gemini: partialArgs on a functionCall that does not continue"
                )
            raw = bytes(fc.args)
            # The exact argument bytes, parsed as received (a JSON object is required,
            # the assembler checks). msgspec skips them unread, so the UTF-8 check of the
            # rest of the chunk is done here: invalid bytes make the chunk undecodable.
            if not raw.isascii() and not is_utf8(raw):
                raise StreamProtocolError(
                    f"gemini: functionCall {fc.name!r} args are not valid UTF-8"
                )
            out.append(CallDone(index, raw=raw) if raw else CallDone(index))
            return index
        if vertex is None:
            raise StreamProtocolError(
                "gemini: functionCall without a name and no streamed call open"
            )
        if fc.args:
            raise StreamProtocolError("gemini: args on a streamed functionCall continuation")
        if fc.partial_args:
            vertex.add(fc.partial_args)
        if not fc.will_continue:
            # The terminating piece (an empty functionCall): build the object and close.
            self._vertex = None
            arguments = vertex.build()  # None when a per-call cap refused it (error)
            refused = vertex.nbytes if vertex.error is not None else 0
            out.append(
                CallDone(vertex.index, raw=arguments, error=vertex.error, refused_bytes=refused)
            )
        return vertex.index


# --- encode side ---------------------------------------------------------------------------


def _json_or_text(content: str) -> Any:
    """A result's content as a JSON value when it is JSON text, else the text itself."""
    try:
        return JSON_DECODER.decode(content)
    except msgspec.DecodeError:
        return content


# What Gemini's function names may be in a conversation the next request carries (the API refuses
# anything else, after the turn's calls would have run).
_ECHO_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


class GeminiAdapter:
    """The Gemini ``generateContent`` adapter (decode and encode side)."""

    name = "gemini"
    family = "gemini_generate_content"
    revision = "gemini/1"

    # Gemini was seen appending a raw JSON error body after the last SSE frame.
    sse_unframed = True
    finish_reasons: Mapping[str, OutcomeKind] = FINISH_REASONS

    def new_stream(self, limits: Limits) -> GeminiStream:
        return GeminiStream(limits)

    def initial_messages(self, user_text: str) -> list[JSON]:
        return [{"role": "user", "parts": [{"text": user_text}]}]

    def assistant_echo(self, outcome: TurnOutcome) -> list[JSON]:
        """The ``model`` content: its parts in the order they came (see ``_gemini_echo``),
        each signature on the part it came on."""
        parts = echo_parts(outcome)
        return [{"role": "model", "parts": parts}] if parts else []

    def encode_results(self, outcome: TurnOutcome, results: list[ModelResult]) -> list[JSON]:
        """One ``user`` content with a ``functionResponse`` part per result, in order. The
        ``id`` is sent only when the provider gave the call one (Gemini 3); ``response``
        must be an object, so the value goes under ``output`` (or ``error``)."""
        if not results:
            return []
        provider_ids = {c.call_id for c in outcome.calls if not c.call_id_derived}
        parts: list[JSON] = []
        for result in results:
            value = _json_or_text(result.content)
            # callgate's model_result is {"result": X} or {"error": {...}}; Gemini names
            # the two cases itself, so unwrap instead of nesting {"error": {"error": ...}}.
            key = "error" if result.is_error else "result"
            if isinstance(value, dict) and len(value) == 1 and key in value:
                value = value[key]
            response = {"error": value} if result.is_error else {"output": value}
            fr: JSON = {"name": result.name}
            if result.call_id in provider_ids:
                fr["id"] = result.call_id
            fr["response"] = response
            parts.append({"functionResponse": fr})
        return [{"role": "user", "parts": parts}]

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
        """The streaming request. Each tool's schema goes in ``parametersJsonSchema``
        (full JSON Schema), not ``parameters``: that one is Gemini's OpenAPI-subset
        ``Schema`` and rejects keys such as ``additionalProperties``, ``const`` or
        ``$defs`` (400 "Unknown name ..."). The two fields are mutually exclusive."""
        body: JSON = {"contents": messages}
        if tools:
            body["tools"] = [
                {
                    "functionDeclarations": [
                        {
                            "name": t.name,
                            "description": t.description,
                            "parametersJsonSchema": t.parameters,
                        }
                        for t in tools
                    ]
                }
            ]
        if system is not None:
            body["systemInstruction"] = {"parts": [{"text": system}]}
        if max_tokens is not None:
            body["generationConfig"] = {"maxOutputTokens": max_tokens}
        # The model is one path segment: quoted, a "#", "?" or "/" in it cannot call
        # another endpoint (the API answers 404 for a name it does not know).
        name = quote(model, safe="")
        return HttpRequestSpec(
            path=f"/v1beta/models/{name}:streamGenerateContent?alt=sse", body=body
        )

    def unsendable(self, call: ProposedCall) -> str | None:
        return unsendable_call(call, _ECHO_NAME)

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-goog-api-key": api_key}


ADAPTER: Final = GeminiAdapter()
