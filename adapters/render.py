"""Scripted model turns rendered as each provider family's exact SSE wire bytes.

Owns the *writing* side of the stream formats, for the loopback replay server, tests and
the demo: a turn described as text + calls + a finish kind becomes the body a provider
would stream (framing copied from the recorded fixtures: Chat ``data:`` frames ending in
``[DONE]``; Responses and Anthropic ``event:`` + ``data:``; Gemini CRLF ``data:`` frames;
Interactions steps format). It never decodes, never does I/O and never reads a clock:
identical inputs give identical bytes (ids not given are derived from a digest of the
inputs).

Finish kinds and how each family expresses them:

============ =============== ================= ================ ============ ==============
finish       openai_chat     openai_responses  anthropic        gemini       interactions
============ =============== ================= ================ ============ ==============
stop         ``stop``        completed         ``end_turn``     ``STOP``     completed
tool_use     ``tool_calls``  completed + calls ``tool_use``     ``STOP``     requires_action
max_tokens   ``length``      incomplete        ``max_tokens``   MAX_TOKENS   incomplete
refusal      refusal deltas  refusal part      ``refusal``      ``SAFETY``   failed (*)
error        error chunk     error + failed    error event      error chunk  error event
============ =============== ================= ================ ============ ==============

- ``refusal``: Chat and Responses carry ``text`` as the refusal text (it decodes into
  ``TurnOutcome.refusal``); Anthropic, Gemini and Interactions carry it as ordinary text
  before the refusal stop. (*) The Interactions API has no refusal status; ``failed`` is
  the closest terminal status, so such a turn decodes as ``failed``, not ``refusal``.
  Refusal turns carry no calls.
- ``max_tokens`` + ``cut_mid_arguments``: the last call stops halfway through its argument
  text, without its done signal (Anthropic: no ``content_block_stop``; Responses: the item
  ends ``incomplete`` without ``function_call_arguments.done``; Interactions: no
  ``step.stop``; Chat: ``finish_reason:"length"`` after the partial text). The Gemini API
  sends whole ``functionCall`` parts only, so it cannot stop inside arguments: the cut
  call is simply absent.
- ``error``: a mid-stream provider error (retryable "overloaded"/"unavailable" kind)
  after the text and calls, and no terminal signal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import msgspec

from callgate.engine.core.adapter import PROVIDERS

__all__ = ["Finish", "RenderCall", "render_turn"]

Finish = Literal["stop", "tool_use", "max_tokens", "refusal", "error"]
_FINISHES: Final = frozenset({"stop", "tool_use", "max_tokens", "refusal", "error"})

_encode = msgspec.json.encode


class RenderCall(msgspec.Struct, frozen=True):
    """One scripted call. ``arguments`` is the JSON text the model streams."""

    call_id: str
    name: str
    arguments: str


class _Turn(msgspec.Struct, frozen=True, kw_only=True):
    text: str
    calls: tuple[RenderCall, ...]
    finish: Finish
    response_id: str
    model: str
    fragment: int
    cut: bool
    input_tokens: int
    output_tokens: int

    @property
    def whole_calls(self) -> tuple[RenderCall, ...]:
        """Calls sent complete (all but the cut one)."""
        return self.calls[:-1] if self.cut else self.calls


def _j(value: Any) -> str:
    return _encode(value).decode()


def _pieces(text: str, size: int) -> list[str]:
    """Cut by code points, so a piece may end inside an escape, as model output does."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def _half(text: str) -> str:
    # Never the whole text, so a cut object stays invalid JSON; at least one character
    # of two or more. A one-character text (never an object) is cut to nothing.
    return text[: max(1, len(text) // 2)] if len(text) > 1 else ""


def render_turn(
    provider: str,
    *,
    text: str = "",
    calls: Sequence[RenderCall] = (),
    finish: Finish | None = None,
    response_id: str | None = None,
    model: str = "model",
    fragment_size: int = 8,
    cut_mid_arguments: bool = False,
    input_tokens: int = 10,
    output_tokens: int = 5,
) -> bytes:
    """The SSE body of one model turn in ``provider``'s wire format.

    ``finish`` defaults to ``"tool_use"`` when there are calls, else ``"stop"``. Text and
    argument text are streamed in ``fragment_size``-code-point pieces. ``input_tokens`` /
    ``output_tokens`` are the usage the provider reports. Raises ``ValueError`` for an
    unknown provider or finish, for calls on a refusal, for ``cut_mid_arguments`` without
    a call or with a finish other than ``max_tokens``, and (Gemini, which sends argument
    objects whole) for arguments that are not a JSON object.
    """
    if provider not in PROVIDERS:
        raise ValueError(f"unknown provider {provider!r}")
    kind: Finish = finish if finish is not None else ("tool_use" if calls else "stop")
    if kind not in _FINISHES:
        raise ValueError(f"unknown finish {kind!r}")
    if kind == "refusal" and calls:
        raise ValueError("a refusal turn carries no calls")
    if cut_mid_arguments and (kind != "max_tokens" or not calls):
        raise ValueError("cut_mid_arguments needs finish='max_tokens' and at least one call")
    if fragment_size < 1:
        raise ValueError("fragment_size must be >= 1")
    call_tuple = tuple(calls)
    if response_id is None:
        seed = _j([provider, text, [list(msgspec.structs.astuple(c)) for c in call_tuple], kind])
        response_id = _ID_PREFIX[provider] + hashlib.sha256(seed.encode()).hexdigest()[:24]
    turn = _Turn(
        text=text,
        calls=call_tuple,
        finish=kind,
        response_id=response_id,
        model=model,
        fragment=fragment_size,
        cut=cut_mid_arguments,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )
    return "".join(_RENDERERS[provider](turn)).encode()


_ID_PREFIX: Final = {
    "openai_chat": "chatcmpl-",
    "openai_responses": "resp_",
    "anthropic": "msg_",
    "gemini": "",
    "gemini_interactions": "v1_",
}


# --- OpenAI Chat Completions ---------------------------------------------------------------

_CHAT_FINISH: Final = {
    "stop": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "stop",
}


def _chat(t: _Turn) -> list[str]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        body = {
            "id": t.response_id,
            "object": "chat.completion.chunk",
            "created": 1727346182,
            "model": t.model,
            "system_fingerprint": "fp_callgate",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        return f"data: {_j(body)}\n\n"

    refusal = t.finish == "refusal"
    # A refusal opens with "content":null,"refusal":"" (rec: refusal_deltas_finish_stop.sse).
    first = (
        {"role": "assistant", "content": None, "refusal": ""}
        if refusal
        else {"role": "assistant", "content": "", "refusal": None}
    )
    out = [chunk(first)]
    key = "refusal" if refusal else "content"
    out.extend(chunk({key: piece}) for piece in _pieces(t.text, t.fragment))
    for k, call in enumerate(t.calls):
        opening = {
            "index": k,
            "id": call.call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        out.append(chunk({"tool_calls": [opening]}))
        args = _half(call.arguments) if t.cut and k == len(t.calls) - 1 else call.arguments
        for piece in _pieces(args, t.fragment):
            out.append(chunk({"tool_calls": [{"index": k, "function": {"arguments": piece}}]}))
    if t.finish == "error":
        error = {"message": "The server is overloaded.", "type": "server_error", "code": None}
        out.append(f"data: {_j({'error': error})}\n\n")
        return out
    out.append(chunk({}, _CHAT_FINISH[t.finish]))
    usage = {
        "prompt_tokens": t.input_tokens,
        "completion_tokens": t.output_tokens,
        "total_tokens": t.input_tokens + t.output_tokens,
    }
    tail = {
        "id": t.response_id,
        "object": "chat.completion.chunk",
        "created": 1727346182,
        "model": t.model,
        "choices": [],
        "usage": usage,
    }
    out.append(f"data: {_j(tail)}\n\ndata: [DONE]\n\n")
    return out


# --- OpenAI Responses ----------------------------------------------------------------------


def _responses(t: _Turn) -> list[str]:
    seq = 0
    out: list[str] = []

    def ev(kind: str, **fields: Any) -> None:
        nonlocal seq
        out.append(
            f"event: {kind}\ndata: {_j({'type': kind, **fields, 'sequence_number': seq})}\n\n"
        )
        seq += 1

    def response(status: str, output: list[Any], **extra: Any) -> dict[str, Any]:
        usage = None
        if status != "in_progress":
            usage = {
                "input_tokens": t.input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": t.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": t.input_tokens + t.output_tokens,
            }
        return {
            "id": t.response_id,
            "object": "response",
            "created_at": 1743082657,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "model": t.model,
            "output": output,
            "parallel_tool_calls": True,
            "usage": usage,
            **extra,
        }

    ev("response.created", response=response("in_progress", []))
    ev("response.in_progress", response=response("in_progress", []))
    done: list[Any] = []
    cut_text = t.finish == "max_tokens" and not t.calls
    if t.text or t.finish == "refusal":
        done.append(_responses_message(t, len(done), ev, incomplete=cut_text))
    for k, call in enumerate(t.calls):
        index = len(done)
        item_id = f"fc_{t.response_id}_{k}"
        cut = t.cut and k == len(t.calls) - 1
        args = _half(call.arguments) if cut else call.arguments
        item = {
            "id": item_id,
            "type": "function_call",
            "status": "in_progress",
            "arguments": "",
            "call_id": call.call_id,
            "name": call.name,
        }
        ev("response.output_item.added", output_index=index, item=item)
        for piece in _pieces(args, t.fragment):
            ev(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=index,
                delta=piece,
            )
        if not cut:
            ev(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=index,
                arguments=args,
            )
        final = {**item, "status": "incomplete" if cut else "completed", "arguments": args}
        ev("response.output_item.done", output_index=index, item=final)
        done.append(final)
    if t.finish == "error":
        error = {"type": "server_error", "code": "server_error", "message": "overloaded"}
        ev("error", error=error)
        ev("response.failed", response=response("failed", done, error=error))
    elif t.finish == "max_tokens":
        details = {"reason": "max_output_tokens"}
        ev("response.incomplete", response=response("incomplete", done, incomplete_details=details))
    else:
        ev("response.completed", response=response("completed", done))
    return out


def _responses_message(
    t: _Turn, index: int, ev: Callable[..., None], *, incomplete: bool
) -> dict[str, Any]:
    item_id = f"msg_{t.response_id}"
    base = {"id": item_id, "type": "message", "role": "assistant"}
    ev(
        "response.output_item.added",
        output_index=index,
        item={**base, "status": "in_progress", "content": []},
    )
    refusal = t.finish == "refusal"
    kind = "refusal" if refusal else "output_text"
    field = "refusal" if refusal else "text"
    empty: dict[str, Any] = {"type": kind, field: ""}
    if not refusal:
        empty["annotations"] = []
    where = {"item_id": item_id, "output_index": index, "content_index": 0}
    ev("response.content_part.added", **where, part=empty)
    delta_event = "response.refusal.delta" if refusal else "response.output_text.delta"
    for piece in _pieces(t.text, t.fragment):
        ev(delta_event, **where, delta=piece)
    ev(
        "response.refusal.done" if refusal else "response.output_text.done",
        **where,
        **{field: t.text},
    )
    part = {**empty, field: t.text}
    ev("response.content_part.done", **where, part=part)
    status = "incomplete" if incomplete else "completed"
    item = {**base, "status": status, "content": [part]}
    ev("response.output_item.done", output_index=index, item=item)
    return item


# --- Anthropic Messages ----------------------------------------------------------------------

_ANTHROPIC_STOP: Final = {
    "stop": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "refusal": "refusal",
}


def _anthropic(t: _Turn) -> list[str]:
    def ev(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {_j({'type': kind, **fields})}\n\n"

    message: dict[str, Any] = {
        "id": t.response_id,
        "type": "message",
        "role": "assistant",
        "model": t.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": t.input_tokens, "output_tokens": 1},
    }
    out = [ev("message_start", message=message), 'event: ping\ndata: {"type": "ping"}\n\n']
    index = 0
    if t.text:
        out.append(ev("content_block_start", index=0, content_block={"type": "text", "text": ""}))
        for piece in _pieces(t.text, t.fragment):
            delta = {"type": "text_delta", "text": piece}
            out.append(ev("content_block_delta", index=0, delta=delta))
        out.append(ev("content_block_stop", index=0))
        index = 1
    for k, call in enumerate(t.calls):
        cut = t.cut and k == len(t.calls) - 1
        block = {"type": "tool_use", "id": call.call_id, "name": call.name, "input": {}}
        out.append(ev("content_block_start", index=index, content_block=block))
        args = _half(call.arguments) if cut else call.arguments
        for piece in ["", *_pieces(args, t.fragment)]:
            delta = {"type": "input_json_delta", "partial_json": piece}
            out.append(ev("content_block_delta", index=index, delta=delta))
        if not cut:
            out.append(ev("content_block_stop", index=index))
        index += 1
    if t.finish == "error":
        error = {"type": "overloaded_error", "message": "Overloaded"}
        out.append(ev("error", error=error))
        return out
    stop: dict[str, Any] = {"stop_reason": _ANTHROPIC_STOP[t.finish], "stop_sequence": None}
    if t.finish == "refusal":
        stop["stop_details"] = {
            "type": "refusal",
            "category": "policy",
            "explanation": "This request was refused.",
        }
    out.append(ev("message_delta", delta=stop, usage={"output_tokens": t.output_tokens}))
    out.append(ev("message_stop"))
    return out


# --- Gemini generateContent ------------------------------------------------------------------

_GEMINI_FINISH: Final = {
    "stop": "STOP",
    "tool_use": "STOP",
    "max_tokens": "MAX_TOKENS",
    "refusal": "SAFETY",
}


def _gemini(t: _Turn) -> list[str]:
    usage = {
        "promptTokenCount": t.input_tokens,
        "candidatesTokenCount": t.output_tokens,
        "totalTokenCount": t.input_tokens + t.output_tokens,
    }

    def chunk(parts: list[dict[str, Any]], finish: str | None = None) -> str:
        cand: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
        if finish is not None:
            cand["finishReason"] = finish
        cand["index"] = 0
        body = {
            "candidates": [cand],
            "usageMetadata": usage,
            "modelVersion": t.model,
            "responseId": t.response_id,
        }
        return f"data: {_j(body)}\r\n\r\n"

    out = [chunk([{"text": piece}]) for piece in _pieces(t.text, t.fragment)]
    for call in t.whole_calls:
        try:
            args = msgspec.json.decode(call.arguments)
        except msgspec.DecodeError:
            raise ValueError(f"gemini sends arguments whole: {call.name!r} is not JSON") from None
        if not isinstance(args, dict):
            raise ValueError(f"gemini arguments must be a JSON object ({call.name!r})")
        part = {"functionCall": {"name": call.name, "args": args, "id": call.call_id}}
        out.append(chunk([part]))
    if t.finish == "error":
        error = {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}
        out.append(f"data: {_j({'error': error})}\r\n\r\n")
        return out
    out.append(chunk([{"text": ""}], _GEMINI_FINISH[t.finish]))
    return out


# --- Gemini Interactions (steps format) ------------------------------------------------------

_INTERACTION_STATUS: Final = {
    "stop": "completed",
    "tool_use": "requires_action",
    "max_tokens": "incomplete",
    "refusal": "failed",
}


def _interactions(t: _Turn) -> list[str]:
    def ev(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {_j({**fields, 'event_type': kind})}\n\n"

    head = {"id": t.response_id, "status": "in_progress", "object": "interaction", "model": t.model}
    out = [
        ev("interaction.created", interaction=head),
        ev("interaction.status_update", interaction_id=t.response_id, status="in_progress"),
    ]
    index = 0
    if t.text:
        out.append(ev("step.start", index=0, step={"type": "model_output"}))
        for piece in _pieces(t.text, t.fragment):
            out.append(ev("step.delta", index=0, delta={"text": piece, "type": "text"}))
        out.append(ev("step.stop", index=0))
        index = 1
    for k, call in enumerate(t.calls):
        cut = t.cut and k == len(t.calls) - 1
        step = {
            "id": call.call_id,
            "signature": "",
            "type": "function_call",
            "name": call.name,
            "arguments": {},
        }
        out.append(ev("step.start", index=index, step=step))
        args = _half(call.arguments) if cut else call.arguments
        for piece in _pieces(args, t.fragment):
            delta = {"arguments": piece, "type": "arguments_delta"}
            out.append(ev("step.delta", index=index, delta=delta))
        if not cut:
            out.append(ev("step.stop", index=index))
        index += 1
    if t.finish == "error":
        error = {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}
        out.append(ev("error", error=error))
        return out
    usage = {
        "total_tokens": t.input_tokens + t.output_tokens,
        "total_input_tokens": t.input_tokens,
        "total_output_tokens": t.output_tokens,
    }
    final = {**head, "status": _INTERACTION_STATUS[t.finish], "usage": usage}
    out.append(ev("interaction.completed", interaction=final))
    return out


_RENDERERS: Final[dict[str, Callable[[_Turn], list[str]]]] = {
    "anthropic": _anthropic,
    "gemini": _gemini,
    "gemini_interactions": _interactions,
    "openai_chat": _chat,
    "openai_responses": _responses,
}
