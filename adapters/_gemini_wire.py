"""Gemini ``generateContent`` wire views: the fields of a streamed chunk the adapter reads,
decoded by msgspec (gc=False: decoded JSON has no cycles), and the test that picks out a
chunk doing nothing but continue a Vertex streamed call. Every chunk, that one too, is
decoded through the one ``DECODER`` view: a value of the wrong type fails the chunk
whichever path then handles it (a leaner view would skip fields this one types).

Owns no state and emits no engine event; ``gemini.py`` translates what these views hold.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from ._vertex_args import PartialArg

__all__ = [
    "DECODER",
    "ERROR_DECODER",
    "JSON_DECODER",
    "NO_USAGE",
    "Chunk",
    "Error",
    "FunctionCall",
    "Part",
    "continuation",
    "other_part",
]


_NO_ARGS: Final = msgspec.Raw()
# (prompt, candidates, thoughts, cached, tool-use prompt) before any usage arrived.
NO_USAGE: Final = (None, None, None, None, None)


class FunctionCall(msgspec.Struct, rename="camel", gc=False):
    name: str | None = None
    # Raw keeps the exact argument bytes; they go to the assembler unparsed.
    args: msgspec.Raw = _NO_ARGS
    id: str | None = None
    will_continue: bool = False
    partial_args: list[PartialArg] | None = None


class Part(msgspec.Struct, rename="camel", gc=False):
    text: str | None = None
    thought: bool = False
    thought_signature: str | None = None
    function_call: FunctionCall | None = None
    # Part kinds this adapter does not act on: kept as provider details.
    executable_code: Any = None
    code_execution_result: Any = None
    inline_data: Any = None
    file_data: Any = None


class _Content(msgspec.Struct, gc=False):
    parts: list[Part] | None = None


class _Candidate(msgspec.Struct, rename="camel", gc=False):
    content: _Content | None = None
    finish_reason: str | None = None
    index: int = 0  # only candidate 0 is the turn (callgate never asks for more)


class _UsageMeta(msgspec.Struct, rename="camel", gc=False):
    prompt_token_count: int | None = None
    candidates_token_count: int | None = None
    thoughts_token_count: int | None = None
    cached_content_token_count: int | None = None
    # Tokens of the tool-use prompt(s) (results of tool executions fed to the model):
    # billed prompt tokens that promptTokenCount leaves out.
    tool_use_prompt_token_count: int | None = None


class _PromptFeedback(msgspec.Struct, rename="camel", gc=False):
    block_reason: str | None = None


class Error(msgspec.Struct, gc=False):
    code: int | None = None
    message: str | None = None
    status: str | None = None


class Chunk(msgspec.Struct, rename="camel", gc=False):
    candidates: list[_Candidate] | None = None
    usage_metadata: _UsageMeta | None = None
    model_version: str | None = None
    response_id: str | None = None
    prompt_feedback: _PromptFeedback | None = None
    error: Error | None = None


class _ErrorBody(msgspec.Struct, gc=False):
    error: Error | None = None


DECODER: Final = msgspec.json.Decoder(Chunk)
# The unframed body is an object, or (the non-SSE array format) a list of them.
ERROR_DECODER: Final = msgspec.json.Decoder(_ErrorBody | list[_ErrorBody])
JSON_DECODER: Final = msgspec.json.Decoder()


def continuation(chunk: Chunk, usage: tuple[int | None, ...]) -> FunctionCall | None:
    """The functionCall of a chunk that does nothing but continue a streamed call: no
    error, no prompt feedback, one candidate part, a nameless functionCall that continues,
    no args, no signature, no finish reason, no usage change (``usage`` is the last
    reported). The caller checks what depends on its state (ids known, no text or
    thought open)."""
    candidates = chunk.candidates
    if not candidates or chunk.error is not None or chunk.prompt_feedback is not None:
        return None
    cand = candidates[0]
    content = cand.content
    if cand.finish_reason is not None or content is None or cand.index != 0:
        return None
    parts = content.parts
    if parts is None or len(parts) != 1:
        return None
    part = parts[0]
    fc = part.function_call
    if (
        fc is None
        or fc.name is not None
        or not fc.will_continue
        or fc.args
        or part.thought_signature
    ):
        return None
    meta = chunk.usage_metadata
    if meta is not None and (
        # Vertex continuation chunks carry no counts (only ``trafficType``).
        meta.prompt_token_count is not None
        or meta.candidates_token_count is not None
        or meta.thoughts_token_count is not None
        or meta.cached_content_token_count is not None
        or meta.tool_use_prompt_token_count is not None
    ):
        counts = (
            meta.prompt_token_count,
            meta.candidates_token_count,
            meta.thoughts_token_count,
            meta.cached_content_token_count,
            meta.tool_use_prompt_token_count,
        )
        if counts != usage:
            return None
    return fc


def other_part(part: Part) -> dict[str, Any] | None:
    for key, value in (
        ("executableCode", part.executable_code),
        ("codeExecutionResult", part.code_execution_result),
        ("inlineData", part.inline_data),
        ("fileData", part.file_data),
    ):
        if value is not None:
            return {key: value}
    return None
