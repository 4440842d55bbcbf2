"""Question: how fast is callgate's decode next to the floor, httpx-sse, SDKs, pydantic-ai?

For every stream kind (5 families, plus Gemini's Vertex ``partialArgs`` variant) and size
(S: 1 call, ~60 B arguments in 4 B fragments; M: 8 interleaved calls of 2 KiB in 8 B
fragments; L: 1 call of 1 MiB in 8 B fragments; see ``bench/streams.py``), one group
holds these rows, all fed the same seeded bytes (64 KiB chunks) and all checked to
return the same complete calls:

- ``callgate``: ``callgate.engine.decode(provider, chunks)`` (SSE decode, adapter,
  accumulation, strict parse on the done signal, classification);
- ``floor``: split on blank lines, ``orjson.loads`` each event, join, parse once;
- ``httpx_sse``: httpx-sse's line and event decoders plus the floor's accumulation;
- ``sdk``: the official SDK's stream helper (Chat Completions, Responses, Anthropic only).
  The SDKs re-copy (and Anthropic re-parses) the growing arguments on every fragment, so
  on L they would take minutes: their L row runs on an L-shaped stream with 64 KiB of
  arguments (1/16) and is compared per event, which flatters the SDK (its cost per event
  grows with the arguments). ``CALLGATE_BENCH_HUGE=1`` runs them on the full L stream.
- ``pydantic_ai``: pydantic-ai's own model (``OpenAIChatModel``, ``OpenAIResponsesModel``,
  ``AnthropicModel``) streaming over a mock transport that serves the same chunks
  (``Model.request_stream``, its ``StreamedResponse`` and parts manager, the final
  ``ModelResponse``; see ``bench/peers.py``), for the same three kinds, with the ``sdk``
  rows' budget and stream choice: its cost per event stays flat as the arguments grow
  (it buffers the fragments), so its per-event L ratio is fair, but one call on the full
  L stream takes about 5-20 s. Skipped when pydantic-ai is not installed (the ``bench`` extra).

Targets (issue 2): callgate at least as fast as the floor in events/s on every kind and
size, at least 50x the SDKs. Run ``pytest bench/test_bench_decode.py`` (or ``make bench``);
the per-group ratios print at the end, ``make bench-report`` writes ``bench/RESULTS.md``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest

from bench import peers
from bench.harness import record, run_budgeted
from bench.streams import KINDS, SIZES, Shape, SyntheticStream, make_stream
from callgate.engine.core.decode import decode
from callgate.engine.core.outcome import OutcomeKind

HUGE = os.environ.get("CALLGATE_BENCH_HUGE") == "1"
IMPLS = ("callgate", "floor", "httpx_sse", "sdk", "pydantic_ai")
# Peers that run on ``sdk_stream`` with the SDK budget (see the module docstring).
SLOW = ("sdk", "pydantic_ai")
HAS_PAI = importlib.util.find_spec("pydantic_ai") is not None
# The SDK's L row: same shape as L, 1/16 of the arguments (see the module docstring).
SDK_L = Shape(calls=1, arg_bytes=SIZES["L"].arg_bytes // 16, fragment=SIZES["L"].fragment)


@cache
def stream(kind: str, size: str) -> SyntheticStream:
    return make_stream(kind, size)


@cache
def sdk_stream(kind: str, size: str) -> SyntheticStream:
    if size == "L" and not HUGE:
        return make_stream(kind, SDK_L)
    return stream(kind, size)


def _calls_of_callgate(s: SyntheticStream) -> list[peers.Call]:
    outcome = decode(s.provider, s.chunks)
    assert outcome.kind is OutcomeKind.TOOL_PROPOSALS, outcome.stop_reason
    return [(c.call_id, c.name, c.arguments or {}) for c in outcome.calls]


def _expected(s: SyntheticStream) -> list[tuple[str | None, str, dict[str, Any]]]:
    return [(c.call_id, c.name, c.arguments) for c in s.calls]


def _check(s: SyntheticStream, got: list[peers.Call], impl: str) -> None:
    want = _expected(s)
    if impl == "callgate" and s.kind == "gemini_vertex":
        # No call id on the wire: callgate derives one, the expectation has None.
        got = [(None, name, args) for _, name, args in got]
    assert got == want, f"{impl} disagrees on {s.kind}"


def _runner(impl: str, s: SyntheticStream) -> Callable[[], Any]:
    if impl == "callgate":
        provider, chunks = s.provider, s.chunks
        return lambda: decode(provider, chunks)
    if impl == "floor":
        kind, body = s.kind, s.body
        return lambda: peers.floor(kind, body)
    if impl == "httpx_sse":
        kind, chunks = s.kind, s.chunks
        return lambda: peers.httpx_sse(kind, chunks)
    peer = (peers.PAI_PEERS if impl == "pydantic_ai" else peers.SDK_PEERS)[s.kind]
    chunks = s.chunks
    return lambda: peer(chunks)


def _budget(impl: str, size: str) -> dict[str, Any]:
    if impl in SLOW:
        return {"budget": 1.0, "min_rounds": 1 if size == "L" else 3}
    if size == "L":
        return {"budget": 1.5, "min_rounds": 3}
    return {"budget": 0.5, "min_rounds": 5}


_SKIP_PAI = pytest.mark.skipif(not HAS_PAI, reason="pydantic-ai not installed (the bench extra)")
_PEERS_OF = {"sdk": peers.SDK_PEERS, "pydantic_ai": peers.PAI_PEERS}
PARAMS = [
    pytest.param(
        kind,
        size,
        impl,
        id=f"{kind}-{size}-{impl}",
        marks=[_SKIP_PAI] if impl == "pydantic_ai" else [],
    )
    for kind in KINDS
    for size in SIZES
    for impl in IMPLS
    if impl not in _PEERS_OF or kind in _PEERS_OF[impl]
]


@pytest.mark.parametrize(("kind", "size", "impl"), PARAMS)
def test_decode(benchmark: Any, kind: str, size: str, impl: str) -> None:
    s = sdk_stream(kind, size) if impl in SLOW else stream(kind, size)
    benchmark.group = f"decode {kind} {size}"
    fn = _runner(impl, s)
    result = run_budgeted(benchmark, fn, **_budget(impl, size))
    got = _calls_of_callgate(s) if impl == "callgate" else result
    _check(s, got, impl)
    note = ""
    if s is not stream(kind, size):
        note = f"{s.arg_bytes // 1024} KiB-argument stream of the same shape, per-event ratio"
    record(
        benchmark,
        events=s.events,
        body_bytes=len(s.body),
        arg_bytes=s.arg_bytes,
        baseline=impl == "callgate",
        note=note,
        impl=impl,
        kind=kind,
        size=size,
    )
