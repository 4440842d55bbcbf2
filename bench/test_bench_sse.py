"""Question: how fast is callgate's bounded SSE decoder next to httpx-sse and the floor?

Three decoders on the same seeded bodies, fed the same chunks:
- ``callgate``: ``SSEDecoder.feed`` per chunk, then ``close``.
- ``httpx_sse``: what ``EventSource.aiter_sse`` does, run synchronously: httpx's
  incremental ``TextDecoder`` (bytes to str), httpx-sse's ``SSELineDecoder`` (line
  splitting), then its ``SSEDecoder`` per line.
- ``floor``: ``body.split(b"\\n\\n")`` and strip the ``data: `` prefix, nothing else (no
  chunking, no caps, no spec rules): the cost of touching each event once.

Bodies: ~4 MB of small OpenAI-chat-like ``data:`` events, fed in 64 KiB chunks and in
network-sized chunks (random 64-512 bytes, roughly one event per read), and one event
whose single data line is 1 MiB, fed in 64 KiB chunks. The ``+orjson`` group adds
``orjson.loads`` of every event, which is what an adapter does next.

Run: ``pytest bench/test_bench_sse.py --benchmark-only``. Throughput (MB/s of body) is
stored in each result's ``extra_info`` and printed by ``-s``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from httpx._decoders import TextDecoder
from httpx_sse._decoders import SSEDecoder as HttpxSSEDecoder
from httpx_sse._decoders import SSELineDecoder

from bench.harness import timed_median
from callgate.engine.core.sse import SSEDecoder

MiB = 1024 * 1024
CHUNK = 64 * 1024
WORDS = ["the", " weather", " in", " Paris", " is", " sunny", ",", " 21", "°C", " today", "."]


def small_events_body(seed: int = 7, target: int = 4_000_000) -> bytes:
    rng = random.Random(seed)
    parts: list[bytes] = []
    size = 0
    n = 0
    while size < target:
        chunk = {
            "id": "chatcmpl-" + "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=29)),
            "object": "chat.completion.chunk",
            "created": 1_720_000_000 + n // 50,
            "model": "gpt-4o-2024-08-06",
            "system_fingerprint": f"fp_{rng.getrandbits(40):010x}",
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "".join(rng.choices(WORDS, k=rng.randint(1, 4)))},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        part = b"data: " + orjson.dumps(chunk) + b"\n\n"
        parts.append(part)
        size += len(part)
        n += 1
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def one_big_line_body(seed: int = 11) -> bytes:
    rng = random.Random(seed)
    arguments = "".join(rng.choices("abcdefghij klmnopqrstuvwxyz", k=MiB))
    payload = orjson.dumps({"type": "function_call", "arguments": arguments})
    return b"data: " + payload + b"\n\n"


def fixed_chunks(body: bytes, size: int = CHUNK) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


def network_chunks(body: bytes, seed: int = 3) -> list[bytes]:
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(body):
        n = rng.randint(64, 512)
        out.append(body[i : i + n])
        i += n
    return out


SMALL = small_events_body()
SMALL_CHUNKS = fixed_chunks(SMALL)
SMALL_NET_CHUNKS = network_chunks(SMALL)
SMALL_EVENTS = SMALL.count(b"\n\n")
BIG = one_big_line_body()
BIG_CHUNKS = fixed_chunks(BIG)


def callgate_decode(chunks: list[bytes]) -> list[bytes]:
    decoder = SSEDecoder()
    out = []
    for chunk in chunks:
        out += [e.data for e in decoder.feed(chunk)]
    out += [e.data for e in decoder.close()]
    return out


def httpx_sse_decode(chunks: list[bytes]) -> list[str]:
    text = TextDecoder("utf-8")
    lines = SSELineDecoder()
    decoder = HttpxSSEDecoder()
    out = []
    for chunk in chunks:
        piece = text.decode(chunk)
        if piece:
            for line in lines.decode(piece):
                sse = decoder.decode(line.rstrip("\n"))
                if sse is not None:
                    out.append(sse.data)
    rest = text.flush()
    tail = lines.decode(rest) if rest else []
    for line in tail + lines.flush():
        sse = decoder.decode(line.rstrip("\n"))
        if sse is not None:
            out.append(sse.data)
    return out


def floor_decode(body: bytes) -> list[bytes]:
    return [block[6:] for block in body.split(b"\n\n") if block]


def _measure(benchmark: Any, fn: Callable[[], list[Any]], size: int, events: int) -> None:
    result = benchmark(fn)
    assert len(result) == events
    median = timed_median(benchmark)
    if median is None:
        return
    mb_s = size / median / 1e6
    benchmark.extra_info["MB/s"] = round(mb_s, 1)
    print(f"\n{benchmark.group} / {benchmark.name}: {mb_s:,.0f} MB/s")


@pytest.mark.benchmark(group="sse: 4 MB small events, 64 KiB chunks")
def test_small_events_callgate(benchmark: Any) -> None:
    _measure(benchmark, lambda: callgate_decode(SMALL_CHUNKS), len(SMALL), SMALL_EVENTS)


@pytest.mark.benchmark(group="sse: 4 MB small events, 64 KiB chunks")
def test_small_events_httpx_sse(benchmark: Any) -> None:
    _measure(benchmark, lambda: httpx_sse_decode(SMALL_CHUNKS), len(SMALL), SMALL_EVENTS)


@pytest.mark.benchmark(group="sse: 4 MB small events, 64 KiB chunks")
def test_small_events_floor(benchmark: Any) -> None:
    _measure(benchmark, lambda: floor_decode(SMALL), len(SMALL), SMALL_EVENTS)


@pytest.mark.benchmark(group="sse: 4 MB small events, 64-512 byte chunks")
def test_small_events_net_chunks_callgate(benchmark: Any) -> None:
    _measure(benchmark, lambda: callgate_decode(SMALL_NET_CHUNKS), len(SMALL), SMALL_EVENTS)


@pytest.mark.benchmark(group="sse: 4 MB small events, 64-512 byte chunks")
def test_small_events_net_chunks_httpx_sse(benchmark: Any) -> None:
    _measure(benchmark, lambda: httpx_sse_decode(SMALL_NET_CHUNKS), len(SMALL), SMALL_EVENTS)


def _loads_all(items: list[Any]) -> list[Any]:
    loads = orjson.loads
    return [loads(x) for x in items[:-1]]  # the last event is the [DONE] sentinel


@pytest.mark.benchmark(group="sse+orjson: 4 MB small events, 64 KiB chunks")
def test_small_events_orjson_callgate(benchmark: Any) -> None:
    _measure(
        benchmark, lambda: _loads_all(callgate_decode(SMALL_CHUNKS)), len(SMALL), SMALL_EVENTS - 1
    )


@pytest.mark.benchmark(group="sse+orjson: 4 MB small events, 64 KiB chunks")
def test_small_events_orjson_httpx_sse(benchmark: Any) -> None:
    _measure(
        benchmark, lambda: _loads_all(httpx_sse_decode(SMALL_CHUNKS)), len(SMALL), SMALL_EVENTS - 1
    )


@pytest.mark.benchmark(group="sse+orjson: 4 MB small events, 64 KiB chunks")
def test_small_events_orjson_floor(benchmark: Any) -> None:
    _measure(benchmark, lambda: _loads_all(floor_decode(SMALL)), len(SMALL), SMALL_EVENTS - 1)


@pytest.mark.benchmark(group="sse: one 1 MiB line, 64 KiB chunks")
def test_big_line_callgate(benchmark: Any) -> None:
    _measure(benchmark, lambda: callgate_decode(BIG_CHUNKS), len(BIG), 1)


@pytest.mark.benchmark(group="sse: one 1 MiB line, 64 KiB chunks")
def test_big_line_httpx_sse(benchmark: Any) -> None:
    _measure(benchmark, lambda: httpx_sse_decode(BIG_CHUNKS), len(BIG), 1)


@pytest.mark.benchmark(group="sse: one 1 MiB line, 64 KiB chunks")
def test_big_line_floor(benchmark: Any) -> None:
    _measure(benchmark, lambda: floor_decode(BIG), len(BIG), 1)


def test_all_decoders_agree_on_the_bodies() -> None:
    for chunks, body in ((SMALL_CHUNKS, SMALL), (SMALL_NET_CHUNKS, SMALL), (BIG_CHUNKS, BIG)):
        ours = callgate_decode(chunks)
        assert ours == floor_decode(body)
        assert [bytes(x).decode() for x in ours] == httpx_sse_decode(chunks)
