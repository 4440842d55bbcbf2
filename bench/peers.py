"""The peers callgate's decode is measured against, each fed the same bytes.

Owns three kinds of peer, all returning the complete calls as ``(call_id, name,
arguments)`` tuples in output order so a benchmark can check that every peer computed
the same thing before its time counts:

- ``floor(kind, body)``: the naive floor. Split the whole body on blank lines, take the
  ``data:`` payload, ``orjson.loads`` it, join argument fragments per index, parse each
  call's arguments once. No caps, no chunking, no done signals, no classification.
- ``httpx_sse(kind, chunks)``: what ``httpx_sse.EventSource.iter_sse`` does on a live
  response, run offline: httpx's incremental UTF-8 ``TextDecoder``, httpx-sse's
  ``SSELineDecoder`` and its ``SSEDecoder`` per line; then the floor's accumulation.
- ``sdk_openai_chat`` / ``sdk_openai_responses`` / ``sdk_anthropic(chunks)``: the official
  SDKs' own streaming helpers (``ChatCompletionStream``, ``ResponseStream``,
  ``MessageStream``) over the SDK's ``Stream`` reading an in-memory ``httpx2.Response``
  (the HTTP client both SDKs use), i.e. the SDK's SSE decoder, its event models and its
  accumulator, without building a request. The final message/completion/response is
  read with the SDK's ``get_final_*`` helper.
- ``pai_openai_chat`` / ``pai_openai_responses`` / ``pai_anthropic(chunks)``: pydantic-ai
  (``pydantic-ai-slim``, the ``bench`` extra) where it runs offline: its own models
  (``OpenAIChatModel``, ``OpenAIResponsesModel``, ``AnthropicModel``) through
  ``Model.request_stream``, their provider's SDK client sending over an
  ``httpx2.MockTransport`` that answers every request with a 200 ``text/event-stream``
  response yielding exactly ``chunks``. So it is the whole of pydantic-ai's streamed
  response handling on those bytes: the SDK's ``AsyncStream`` (SSE decoder, event
  models), the model's ``StreamedResponse`` mapping, its ``ModelResponsePartsManager``
  (which buffers the argument fragments per part and joins them when the part is read:
  no parse per fragment), the final ``ModelResponse`` from ``StreamedResponse.get()`` and
  ``ToolCallPart.args_as_dict`` (one ``pydantic_core.from_json`` per call). It also
  includes what driving pydantic-ai offline costs: building and serializing a one-message
  request through the SDK client's request path (a real caller pays that too), and a
  fresh ``asyncio.run`` event loop per call, as its streaming is async only (about
  0.1 ms; a caller already in an event loop would not pay it). One model instance per
  kind per process. No Gemini peer: pydantic-ai's ``GoogleModel`` imports ``google-genai``
  when its module loads and reads the stream through that SDK's client, and the ``bench``
  extra does not install it.

It never measures time and never imports callgate.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import httpx2
import orjson
from httpx._decoders import TextDecoder
from httpx_sse._decoders import SSEDecoder as HttpxSSEDecoder
from httpx_sse._decoders import SSELineDecoder

__all__ = [
    "ACCUMULATE",
    "PAI_PEERS",
    "SDK_PEERS",
    "Call",
    "floor",
    "httpx_sse",
    "pai_anthropic",
    "pai_openai_chat",
    "pai_openai_responses",
    "sdk_anthropic",
    "sdk_openai_chat",
    "sdk_openai_responses",
]

Call = tuple[str | None, str, dict[str, Any]]
_loads = orjson.loads


# --- accumulation shared by the floor and the httpx-sse peer --------------------------------


def _finish(calls: dict[int, list[Any]]) -> list[Call]:
    out: list[Call] = []
    for index in sorted(calls):
        call_id, name, parts = calls[index]
        text = "".join(parts)
        out.append((call_id, name, _loads(text) if text else {}))
    return out


def _acc_openai_chat(datas: Iterable[bytes | str]) -> list[Call]:
    calls: dict[int, list[Any]] = {}
    for data in datas:
        obj = _loads(data)
        for choice in obj["choices"]:
            tool_calls = choice["delta"].get("tool_calls")
            if not tool_calls:
                continue
            for tc in tool_calls:
                fn = tc.get("function") or {}
                call = calls.get(tc["index"])
                if call is None:
                    call = calls[tc["index"]] = [tc.get("id"), fn.get("name"), []]
                piece = fn.get("arguments")
                if piece:
                    call[2].append(piece)
    return _finish(calls)


def _acc_openai_responses(datas: Iterable[bytes | str]) -> list[Call]:
    calls: dict[int, list[Any]] = {}
    for data in datas:
        obj = _loads(data)
        kind = obj["type"]
        if kind == "response.function_call_arguments.delta":
            calls[obj["output_index"]][2].append(obj["delta"])
        elif kind == "response.output_item.added":
            item = obj["item"]
            if item["type"] == "function_call":
                calls[obj["output_index"]] = [item["call_id"], item["name"], []]
    return _finish(calls)


def _acc_anthropic(datas: Iterable[bytes | str]) -> list[Call]:
    calls: dict[int, list[Any]] = {}
    for data in datas:
        obj = _loads(data)
        kind = obj["type"]
        if kind == "content_block_delta":
            delta = obj["delta"]
            if delta["type"] == "input_json_delta":
                calls[obj["index"]][2].append(delta["partial_json"])
        elif kind == "content_block_start":
            block = obj["content_block"]
            if block["type"] == "tool_use":
                calls[obj["index"]] = [block["id"], block["name"], []]
    return _finish(calls)


def _acc_gemini(datas: Iterable[bytes | str]) -> list[Call]:
    """Whole ``functionCall`` parts, and Vertex ``partialArgs`` string pieces per path."""
    out: list[Call] = []
    streaming: list[Any] | None = None  # [id, name, {path: [pieces]}]
    for data in datas:
        obj = _loads(data)
        for cand in obj.get("candidates") or ():
            for part in (cand.get("content") or {}).get("parts") or ():
                fc = part.get("functionCall")
                if fc is None:
                    continue
                name = fc.get("name")
                if name is not None:
                    if fc.get("willContinue"):
                        streaming = [fc.get("id"), name, {}]
                    else:
                        out.append((fc.get("id"), name, fc.get("args") or {}))
                    continue
                if streaming is None:
                    continue
                for piece in fc.get("partialArgs") or ():
                    streaming[2].setdefault(piece["jsonPath"], []).append(piece["stringValue"])
                if not fc.get("willContinue"):
                    args = {path[2:]: "".join(p) for path, p in streaming[2].items()}
                    out.append((streaming[0], streaming[1], args))
                    streaming = None
    return out


def _acc_gemini_interactions(datas: Iterable[bytes | str]) -> list[Call]:
    calls: dict[int, list[Any]] = {}
    for data in datas:
        obj = _loads(data)
        kind = obj["event_type"]
        if kind == "step.delta":
            delta = obj["delta"]
            if delta.get("type") == "arguments_delta":
                calls[obj["index"]][2].append(delta["arguments"])
        elif kind == "step.start":
            step = obj["step"]
            if step["type"] == "function_call":
                calls[obj["index"]] = [step["id"], step["name"], []]
    return _finish(calls)


ACCUMULATE: dict[str, Callable[[Iterable[bytes | str]], list[Call]]] = {
    "openai_chat": _acc_openai_chat,
    "openai_responses": _acc_openai_responses,
    "anthropic": _acc_anthropic,
    "gemini": _acc_gemini,
    "gemini_vertex": _acc_gemini,
    "gemini_interactions": _acc_gemini_interactions,
}


# --- the floor ------------------------------------------------------------------------------


def _floor_datas(body: bytes, sep: bytes) -> Iterator[bytes]:
    for block in body.split(sep):
        at = block.find(b"data:")
        if at < 0:
            continue
        data = block[at + 5 :]
        if data[:7] == b" [DONE]":
            continue
        yield data


def floor(kind: str, body: bytes) -> list[Call]:
    sep = b"\r\n\r\n" if kind in ("gemini", "gemini_vertex") else b"\n\n"
    return ACCUMULATE[kind](_floor_datas(body, sep))


# --- httpx-sse ------------------------------------------------------------------------------


def _httpx_sse_datas(chunks: Iterable[bytes]) -> Iterator[str]:
    text = TextDecoder("utf-8")
    lines = SSELineDecoder()
    decoder = HttpxSSEDecoder()
    for chunk in chunks:
        piece = text.decode(chunk)
        if not piece:
            continue
        for line in lines.decode(piece):
            sse = decoder.decode(line.rstrip("\n"))
            if sse is not None and sse.data != "[DONE]":
                yield sse.data
    rest = text.flush()
    for line in [*(lines.decode(rest) if rest else []), *lines.flush()]:
        sse = decoder.decode(line.rstrip("\n"))
        if sse is not None and sse.data != "[DONE]":
            yield sse.data


def httpx_sse(kind: str, chunks: Iterable[bytes]) -> list[Call]:
    return ACCUMULATE[kind](_httpx_sse_datas(chunks))


# --- official SDKs --------------------------------------------------------------------------

_clients: dict[str, Any] = {}


def _client(name: str) -> Any:
    """One SDK client per process (never used for a request: it supplies the SDK's SSE
    decoder and response-model construction to ``Stream``)."""
    client = _clients.get(name)
    if client is None:
        if name == "openai":
            import openai

            client = openai.OpenAI(api_key="sk-offline", base_url="http://sdk.invalid/v1")
        else:
            import anthropic

            client = anthropic.Anthropic(api_key="sk-offline", base_url="http://sdk.invalid")
        _clients[name] = client
    return client


def _response(chunks: Iterable[bytes]) -> httpx2.Response:
    return httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content=iter(list(chunks))
    )


def sdk_openai_chat(chunks: Iterable[bytes]) -> list[Call]:
    import openai
    from openai.lib.streaming.chat import ChatCompletionStream
    from openai.types.chat import ChatCompletionChunk

    raw = openai.Stream(
        cast_to=ChatCompletionChunk, response=_response(chunks), client=_client("openai")
    )
    stream = ChatCompletionStream(
        raw_stream=raw, response_format=openai.omit, input_tools=openai.omit
    )
    completion = stream.get_final_completion()
    message = completion.choices[0].message
    return [
        (tc.id, tc.function.name, _loads(tc.function.arguments) if tc.function.arguments else {})
        for tc in message.tool_calls or ()
    ]


def sdk_openai_responses(chunks: Iterable[bytes]) -> list[Call]:
    import openai
    from openai.lib.streaming.responses import ResponseStream
    from openai.types.responses import ResponseStreamEvent

    raw: openai.Stream[Any] = openai.Stream(
        cast_to=ResponseStreamEvent,  # type: ignore[arg-type]
        response=_response(chunks),
        client=_client("openai"),
    )
    stream = ResponseStream(
        raw_stream=raw, text_format=openai.omit, input_tools=openai.omit, starting_after=None
    )
    response = stream.get_final_response()
    return [
        (item.call_id, item.name, _loads(item.arguments) if item.arguments else {})
        for item in response.output
        if item.type == "function_call"
    ]


def sdk_anthropic(chunks: Iterable[bytes]) -> list[Call]:
    import anthropic
    from anthropic.lib.streaming import MessageStream
    from anthropic.types import RawMessageStreamEvent

    raw: anthropic.Stream[Any] = anthropic.Stream(
        cast_to=RawMessageStreamEvent,  # type: ignore[arg-type]
        response=_response(chunks),
        client=_client("anthropic"),
    )
    stream = MessageStream(raw, output_format=anthropic.NOT_GIVEN)
    message = stream.get_final_message()
    return [
        (block.id, block.name, dict(block.input))
        for block in message.content
        if block.type == "tool_use"
    ]


SDK_PEERS: dict[str, Callable[[Iterable[bytes]], list[Call]]] = {
    "openai_chat": sdk_openai_chat,
    "openai_responses": sdk_openai_responses,
    "anthropic": sdk_anthropic,
}


# --- pydantic-ai ----------------------------------------------------------------------------

# The chunks the mock transport answers the current call with (set around each
# ``asyncio.run``; the event loop's task copies the context, so the handler sees them).
_pai_chunks: contextvars.ContextVar[list[bytes]] = contextvars.ContextVar("_pai_chunks")
_pai_models: dict[str, Any] = {}
_PAI_MODEL_NAMES = {
    "openai_chat": "gpt-4o-2024-08-06",
    "openai_responses": "gpt-5-2025-08-07",
    "anthropic": "claude-sonnet-4-20250514",
}


async def _pai_body(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _pai_handler(request: httpx2.Request) -> httpx2.Response:
    return httpx2.Response(
        200,
        headers={"content-type": "text/event-stream"},
        content=_pai_body(_pai_chunks.get()),
    )


def _pai_model(kind: str) -> Any:
    """One pydantic-ai model per kind per process, its SDK client on a mock transport."""
    model = _pai_models.get(kind)
    if model is None:
        http_client = httpx2.AsyncClient(transport=httpx2.MockTransport(_pai_handler))
        name = _PAI_MODEL_NAMES[kind]
        if kind == "anthropic":
            from pydantic_ai.models.anthropic import AnthropicModel
            from pydantic_ai.providers.anthropic import AnthropicProvider

            provider: Any = AnthropicProvider(
                api_key="sk-offline", base_url="http://pai.invalid", http_client=http_client
            )
            model = AnthropicModel(name, provider=provider)
        else:
            from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
            from pydantic_ai.providers.openai import OpenAIProvider

            provider = OpenAIProvider(
                api_key="sk-offline", base_url="http://pai.invalid/v1", http_client=http_client
            )
            cls = OpenAIChatModel if kind == "openai_chat" else OpenAIResponsesModel
            model = cls(name, provider=provider)
        _pai_models[kind] = model
    return model


async def _pai_stream(model: Any) -> Any:
    from pydantic_ai.messages import ModelRequest, UserPromptPart
    from pydantic_ai.models import ModelRequestParameters

    messages = [ModelRequest(parts=[UserPromptPart("offline")])]
    async with model.request_stream(messages, None, ModelRequestParameters()) as streamed:
        async for _ in streamed:
            pass
        return streamed.get()


def _pai_calls(kind: str, chunks: Iterable[bytes]) -> list[Call]:
    from pydantic_ai.messages import ToolCallPart

    model = _pai_model(kind)
    token = _pai_chunks.set(list(chunks))
    try:
        response = asyncio.run(_pai_stream(model))
    finally:
        _pai_chunks.reset(token)
    if response.state != "complete":
        raise RuntimeError(f"pydantic-ai left the {kind} response {response.state}")
    return [
        (part.tool_call_id, part.tool_name, part.args_as_dict(raise_if_invalid=True))
        for part in response.parts
        if isinstance(part, ToolCallPart)
    ]


def pai_openai_chat(chunks: Iterable[bytes]) -> list[Call]:
    return _pai_calls("openai_chat", chunks)


def pai_openai_responses(chunks: Iterable[bytes]) -> list[Call]:
    return _pai_calls("openai_responses", chunks)


def pai_anthropic(chunks: Iterable[bytes]) -> list[Call]:
    return _pai_calls("anthropic", chunks)


PAI_PEERS: dict[str, Callable[[Iterable[bytes]], list[Call]]] = {
    "openai_chat": pai_openai_chat,
    "openai_responses": pai_openai_responses,
    "anthropic": pai_anthropic,
}
