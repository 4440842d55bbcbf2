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

It never measures time and never imports callgate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpx2
import orjson
from httpx._decoders import TextDecoder
from httpx_sse._decoders import SSEDecoder as HttpxSSEDecoder
from httpx_sse._decoders import SSELineDecoder

__all__ = [
    "ACCUMULATE",
    "SDK_PEERS",
    "Call",
    "floor",
    "httpx_sse",
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
