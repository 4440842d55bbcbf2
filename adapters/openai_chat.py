"""OpenAI Chat Completions adapter (``POST /v1/chat/completions``, ``stream:true``).

Owns the translation between Chat Completions wire shapes and engine values: streamed
``chat.completion.chunk`` objects into engine events (decode side) and conversation
messages, tool results and the streaming request body (encode side). It never does
HTTP, never parses argument JSON (the assembler does, on the done signal) and never
decides what a turn means beyond its finish-reason table.

Chat has no per-call "arguments done" event: the first chunk with a non-null
``finish_reason`` closes every started call, and the ``data: [DONE]`` sentinel is the
terminal signal: a stream that ends after the finish chunk but without ``[DONE]`` was cut
and is truncated, like any other cut; a repeated ``[DONE]`` is ignored, any other data
after it is a protocol error. The first finish decides: a repeated one changes
nothing, and a tool-call fragment after it (a new call, or more of a closed one) is a
protocol error, never a call the finish did not cover. A fragment without an index is
keyed by its id: it continues the call that started with that id (with or without an
index), or starts a new one. Only choice 0 is read (``n>1`` is not supported).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import cast

import msgspec

from callgate.engine.core.adapter import (
    JSON,
    HttpRequestSpec,
    ModelResult,
    ToolDeclaration,
    echo_arguments,
    unsendable_call,
)
from callgate.engine.core.errors import LimitExceeded, StreamProtocolError
from callgate.engine.core.events import (
    ArgumentsDelta,
    BatchEvent,
    CallDone,
    CallStarted,
    Completion,
    EngineEvent,
    ProviderDetail,
    ProviderError,
    RefusalDelta,
    ResponseMeta,
    TextDelta,
    UsageReport,
    append_fragments,
)
from callgate.engine.core.limits import Limits
from callgate.engine.core.outcome import OutcomeKind, ProposedCall, TurnOutcome, Usage
from callgate.engine.core.sse import SSEData, SSEEvent

from ._openai_common import ErrorView, error_info

__all__ = ["ADAPTER", "FINISH_REASONS", "OpenAIChatAdapter", "OpenAIChatStream"]

# finish_reason -> outcome kind. A refusal ends with "stop" (the refusal text makes the
# assembler call it a refusal); anything not listed is a failure, never a success.
FINISH_REASONS: dict[str, OutcomeKind] = {
    "stop": OutcomeKind.FINAL_TEXT,
    "tool_calls": OutcomeKind.TOOL_PROPOSALS,
    "function_call": OutcomeKind.TOOL_PROPOSALS,
    "length": OutcomeKind.TRUNCATED,
    "content_filter": OutcomeKind.REFUSAL,
}

_DONE = b"[DONE]"


# --- decode views: only the fields this adapter reads --------------------------------------


class _FunctionView(msgspec.Struct, frozen=True, gc=False):
    name: str | None = None
    arguments: str | None = None


class _ToolCallView(msgspec.Struct, frozen=True, gc=False):
    # Some compatible endpoints omit the index; such fragments are keyed by id instead.
    index: int | None = None
    id: str | None = None
    function: _FunctionView | None = None


class _DeltaView(msgspec.Struct, frozen=True, gc=False):
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCallView] | None = None


class _ChoiceView(msgspec.Struct, frozen=True, gc=False):
    index: int = 0
    delta: _DeltaView | None = None
    finish_reason: str | None = None


class _PromptDetailsView(msgspec.Struct, frozen=True, gc=False):
    cached_tokens: int | None = None


class _CompletionDetailsView(msgspec.Struct, frozen=True, gc=False):
    reasoning_tokens: int | None = None


class _UsageView(msgspec.Struct, frozen=True, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetailsView | None = None
    completion_tokens_details: _CompletionDetailsView | None = None


class _BodyView(msgspec.Struct, frozen=True, gc=False):
    choices: list[_ChoiceView] | None = None
    usage: _UsageView | None = None
    error: ErrorView | str | None = None


class _ChunkView(_BodyView, frozen=True, gc=False):
    id: str | None = None
    model: str | None = None


# Chunks are read with the id/model until a non-empty one of each came (nearly always
# the first chunk); after that the lighter view skips those two strings on every chunk.
_CHUNK = msgspec.json.Decoder(_ChunkView)
_BODY = msgspec.json.Decoder(_BodyView)


def _usage(view: _UsageView) -> Usage:
    prompt = view.prompt_tokens_details
    completion = view.completion_tokens_details
    return Usage(
        input_tokens=view.prompt_tokens,
        output_tokens=view.completion_tokens,
        reasoning_tokens=None if completion is None else completion.reasoning_tokens,
        cached_input_tokens=None if prompt is None else prompt.cached_tokens,
    )


class OpenAIChatStream:
    """Decoding state of one Chat Completions response."""

    __slots__ = (
        "_by_id",
        "_calls",
        "_done",
        "_extra_choice_noted",
        "_fast",
        "_finish",
        "_id_known",
        "_max_calls",
        "_meta_sent",
        "_model_known",
        "_open",
    )

    def __init__(self, limits: Limits) -> None:
        self._max_calls = limits.max_calls_per_response
        # tool_calls[].index -> (call id, name) of every call that started.
        self._calls: dict[int, tuple[str | None, str]] = {}
        # Calls started and not yet closed by a finish chunk (insertion-ordered).
        self._open: dict[int, None] = {}
        # Call id -> index of the call that started with it, for fragments without an
        # index; None when two calls started with the same id (such a fragment names
        # neither).
        self._by_id: dict[str, int | None] = {}
        self._finish: str | None = None
        self._done = False
        # Whether the response id and the model were reported (an empty string is no
        # value), and both were: chunks are read with the id/model view until then.
        self._id_known = False
        self._model_known = False
        self._meta_sent = False
        # The fragment fast path of ``decode_batch``: before the first finish and [DONE]
        # (what follows those takes ``_event``, which checks).
        self._fast = True
        self._extra_choice_noted = False

    def decode(self, event: SSEEvent) -> list[EngineEvent]:
        out: list[BatchEvent] = []
        self.decode_batch([event], out)
        return cast("list[EngineEvent]", out)  # one event never makes a run

    def decode_batch(self, events: list[SSEEvent], out: list[BatchEvent]) -> None:
        """Translate a chunk's events in order. Chunks that carry nothing but one
        argument fragment of a started call (nearly every chunk of a long call) are
        collected into one ``ArgumentsRun``; every other chunk goes through ``_chunk``.
        Events before an error are in ``out`` when it is raised."""
        # Until the id and the model both came, the fast path reads them too (``lean`` is
        # False): a chunk that names one not yet reported takes ``_chunk`` after ``_meta``.
        # Only a chunk that takes ``_chunk`` or ``_event`` can change that.
        lean = self._meta_sent
        decode: Callable[[SSEData], _BodyView] = _BODY.decode if lean else _CHUNK.decode
        calls = self._calls
        indexes: list[int] = []
        pieces: list[str] = []
        try:
            for event in events:
                data = event.data
                if self._fast and data and data != _DONE:
                    try:
                        chunk: _BodyView = decode(data)
                    except msgspec.DecodeError as exc:
                        append_fragments(out, indexes, pieces)
                        indexes, pieces = [], []
                        self._undecodable(data, exc, out)
                        continue
                    # The shape of a pure fragment chunk; anything else (a new call, an
                    # id or name, text, a finish, usage, an error) takes ``_chunk``.
                    choices = chunk.choices
                    if (
                        choices is not None
                        and len(choices) == 1
                        and chunk.usage is None
                        and chunk.error is None
                    ):
                        choice = choices[0]
                        delta = choice.delta
                        if (
                            choice.index == 0
                            and not choice.finish_reason
                            and delta is not None
                            and not delta.content
                            and not delta.refusal
                        ):
                            tool_calls = delta.tool_calls
                            if tool_calls is not None and len(tool_calls) == 1:
                                call = tool_calls[0]
                                function = call.function
                                if (
                                    call.index in calls
                                    and not call.id
                                    and function is not None
                                    and not function.name
                                    and (lean or not self._meta(chunk, None))
                                ):
                                    if function.arguments:
                                        indexes.append(call.index)
                                        pieces.append(function.arguments)
                                    continue
                    append_fragments(out, indexes, pieces)
                    indexes, pieces = [], []
                    mark = len(out)
                    try:
                        if not lean:
                            self._meta(chunk, out)
                        self._chunk(chunk, out)
                    except Exception:
                        del out[mark:]  # an event is translated whole or not at all
                        raise
                    if not lean and self._meta_sent:
                        lean, decode = True, _BODY.decode
                    continue
                append_fragments(out, indexes, pieces)
                indexes, pieces = [], []
                mark = len(out)
                try:
                    self._event(data, out)
                except Exception:
                    del out[mark:]
                    raise
                if not lean and self._meta_sent:
                    lean, decode = True, _BODY.decode
        except RecursionError:
            # msgspec's own guard against nesting (even in a field no view reads).
            raise StreamProtocolError("openai_chat: an event nests too deeply to decode") from None
        finally:
            append_fragments(out, indexes, pieces)

    def _event(self, data: SSEData, out: list[BatchEvent]) -> None:
        if self._done:
            if bytes(data).strip() == _DONE:
                return  # a repeated sentinel (some servers send two) ends nothing more
            raise StreamProtocolError("openai_chat: data after the [DONE] sentinel")
        if data == _DONE:
            self._terminal(out)
            return
        if not data:
            return
        try:
            if self._meta_sent:
                chunk: _BodyView = _BODY.decode(data)
            else:
                chunk = _CHUNK.decode(data)
                self._meta(chunk, out)
        except msgspec.DecodeError as exc:
            self._undecodable(data, exc, out)
            return
        self._chunk(chunk, out)

    def _meta(self, chunk: _BodyView, out: list[BatchEvent] | None) -> bool:
        """Report the id and the model each the first time a chunk (read with the id/model
        view) gives a non-empty one: Azure's first chunk has ``"id":"","model":""``, and
        some servers name the model only after the first chunk. With ``out`` None, only
        whether the chunk has one to report. Once both came, the lighter view reads."""
        head = cast("_ChunkView", chunk)
        rid = None if self._id_known else head.id or None
        model = None if self._model_known else head.model or None
        if rid is None and model is None:
            return False
        if out is not None:
            out.append(ResponseMeta(rid, model))
            self._id_known = self._id_known or rid is not None
            self._model_known = self._model_known or model is not None
            self._meta_sent = self._id_known and self._model_known
        return True

    def _undecodable(self, data: SSEData, exc: msgspec.DecodeError, out: list[BatchEvent]) -> None:
        # bytes() returns bytes as they are and copies a view (once: this error ends
        # the stream).
        if bytes(data).strip() == _DONE:
            self._terminal(out)
            return
        raise StreamProtocolError(f"openai_chat: undecodable chunk: {exc}") from None

    def _chunk(self, chunk: _BodyView, out: list[BatchEvent]) -> None:
        if chunk.error is not None:
            out.append(ProviderError(error_info(chunk.error)))
        choices = chunk.choices
        if choices:
            for choice in choices:
                if choice.index != 0:
                    self._note_extra_choice(choice.index, out)
                    continue
                delta = choice.delta
                if delta is not None:
                    if delta.content:
                        out.append(TextDelta(delta.content))
                    if delta.refusal:
                        out.append(RefusalDelta(delta.refusal))
                    if delta.tool_calls:
                        self._tool_calls(delta.tool_calls, out)
                if choice.finish_reason and self._finish is None:
                    # The first ending counts: a repeated one ("length", then "stop")
                    # cannot turn a cut answer into a complete one, nor close a call
                    # (none can start after the first: ``_tool_calls``).
                    self._finish = choice.finish_reason
                    self._fast = False
                    # Chat's only "arguments done" signal: every open call is complete.
                    out.extend(CallDone(index) for index in self._open)
                    self._open.clear()
        usage = chunk.usage
        if usage is not None:
            out.append(UsageReport(_usage(usage)))

    def end(self) -> list[EngineEvent]:
        # Only "data: [DONE]" ends a Chat stream. A finish_reason without it is a stream
        # cut after the finish chunk (the usage chunk and the terminator were lost), and
        # a cut stream is never a completed turn. Recorded bodies that end without the
        # blank line after [DONE] are therefore truncated, like any other cut.
        return []

    def _terminal(self, out: list[BatchEvent]) -> None:
        self._done = True
        self._fast = False
        reason = self._finish
        if reason is not None:
            out.append(Completion(FINISH_REASONS.get(reason, OutcomeKind.FAILED), reason))

    def _note_extra_choice(self, index: int, out: list[BatchEvent]) -> None:
        if not self._extra_choice_noted:
            self._extra_choice_noted = True
            out.append(
                ProviderDetail(
                    "ignored_choices",
                    {
                        "choice_index": index,
                        "reason": "n>1 is not supported; only choice 0 is read",
                    },
                )
            )

    def _repeats_a_call(self, fragment: _ToolCallView) -> bool:
        function = fragment.function
        if function is not None and function.arguments:
            return False
        index = fragment.index
        if index is None:
            index = self._by_id.get(fragment.id) if fragment.id else None
        known = self._calls.get(index) if index is not None else None
        if known is None:
            return False
        known_id, known_name = known
        name = function.name if function is not None else None
        return (not fragment.id or fragment.id == known_id) and (not name or name == known_name)

    def _tool_calls(self, fragments: list[_ToolCallView], out: list[BatchEvent]) -> None:
        if self._finish is not None:
            # The finish closed every call it found; what follows it is no part of the
            # turn the finish described (a text answer must not become a tool turn). A
            # fragment that only repeats a closed call (its index or id, its name, no
            # argument text) adds nothing and is let through, as some servers send it.
            for fragment in fragments:
                if not self._repeats_a_call(fragment):
                    raise StreamProtocolError(
                        f"openai_chat: tool call fragment after finish_reason {self._finish!r}"
                    )
            return
        for fragment in fragments:
            call_id = fragment.id or None
            function = fragment.function
            name: str | None = None
            arguments: str | None = None
            if function is not None:
                name = function.name or None
                arguments = function.arguments
            index = fragment.index
            if index is None:
                index = self._index_by_id(call_id)
            known = self._calls.get(index)
            if known is None:
                if name is None:
                    raise StreamProtocolError(
                        f"openai_chat: first fragment of tool call index {index} has no name"
                    )
                if len(self._calls) >= self._max_calls:
                    raise LimitExceeded("max_calls_per_response", self._max_calls)
                self._calls[index] = (call_id, name)
                self._open[index] = None
                if call_id is not None:
                    # A second call with the same id makes the id name neither.
                    self._by_id[call_id] = None if call_id in self._by_id else index
                out.append(CallStarted(index, name, call_id))
            else:
                known_id, known_name = known
                if call_id is not None and call_id != known_id:
                    raise StreamProtocolError(
                        f"openai_chat: tool call index {index} changed its id"
                    )
                if name is not None and name != known_name:
                    raise StreamProtocolError(
                        f"openai_chat: tool call index {index} changed its name"
                    )
            if arguments:
                out.append(ArgumentsDelta(index, arguments))

    def _index_by_id(self, call_id: str | None) -> int:
        """The index of the call an index-less fragment names by its id: the call that
        started with that id, whatever index it had; an unknown id starts a new call
        after the highest index."""
        if call_id is None:
            raise StreamProtocolError("openai_chat: tool call fragment with neither index nor id")
        if call_id in self._by_id:
            index = self._by_id[call_id]
            if index is None:
                raise StreamProtocolError(
                    f"openai_chat: tool call fragment without an index names id {call_id!r}, "
                    "which two calls started with"
                )
            return index
        return max(self._calls, default=-1) + 1


# What OpenAI's function names may be in a conversation the next request carries (the API refuses
# anything else, after the turn's calls would have run).
_ECHO_NAME = re.compile(r"[A-Za-z0-9_-]+")


class OpenAIChatAdapter:
    """Chat Completions adapter: decode side (``new_stream``) and encode side."""

    name = "openai_chat"
    family = "openai_chat"
    revision = "openai_chat/1"

    sse_unframed = False
    finish_reasons: Mapping[str, OutcomeKind] = FINISH_REASONS

    def new_stream(self, limits: Limits) -> OpenAIChatStream:
        return OpenAIChatStream(limits)

    # --- encode side ---------------------------------------------------------------------

    def initial_messages(self, user_text: str) -> list[JSON]:
        return [{"role": "user", "content": user_text}]

    def assistant_echo(self, outcome: TurnOutcome) -> list[JSON]:
        message: JSON = {"role": "assistant", "content": outcome.text or None}
        if outcome.calls:
            message["tool_calls"] = [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        # As received ("{}" for none, or for rejected arguments).
                        "arguments": echo_arguments(call),
                    },
                }
                for call in sorted(outcome.calls, key=attrgetter("index"))
            ]
        return [message]

    def encode_results(self, outcome: TurnOutcome, results: list[ModelResult]) -> list[JSON]:
        # One tool message per result; Chat has no error flag, so an error travels as
        # the text in ``content``.
        return [
            {"role": "tool", "tool_call_id": result.call_id, "content": result.content}
            for result in results
        ]

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
        if system is not None:
            messages = [{"role": "system", "content": system}, *messages]
        body: dict[str, object] = {"model": model, "messages": messages}
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
                for tool in tools
            ]
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if max_tokens is not None:
            body["max_completion_tokens"] = max_tokens
        return HttpRequestSpec(path="/v1/chat/completions", body=body)

    def unsendable(self, call: ProposedCall) -> str | None:
        return unsendable_call(call, _ECHO_NAME)

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"}


ADAPTER = OpenAIChatAdapter()
