"""What every fuzz target shares: the small limits it runs under, the chunk plan derived
from the fuzzer's bytes, the invariant check helper and the atheris entry point.

Targets keep ``check(data)`` free of atheris so the normal test suite can replay the
corpus; only ``fuzz_main`` imports atheris. Invariant violations raise
``InvariantViolation`` (an ``AssertionError`` that survives ``python -O``), which
libFuzzer reports as a crash and saves as an artifact.
"""

from __future__ import annotations

import os
import random
import sys
import types
import zlib
from collections.abc import Callable
from typing import Any

from callgate.engine.core.limits import Limits

__all__ = [
    "ROOMY_LIMITS",
    "TIGHT_LIMITS",
    "InvariantViolation",
    "chunk_plan",
    "expect",
    "fuzz_main",
    "instrument_package",
    "pick_limits",
    "stream_seed",
]

# Large enough for every recorded fixture (longest line 5.3 KB, 25 continuation items),
# small enough that a mutated stream reaches every cap within libFuzzer's input sizes.
ROOMY_LIMITS = Limits(
    max_line_bytes=8192,
    max_event_bytes=8192,
    max_call_argument_bytes=512,
    max_response_argument_bytes=1024,
    max_calls_per_response=8,
    max_json_depth=16,
    max_text_bytes=1024,
    max_continuation_items=32,
    max_continuation_bytes=65536,
)
# Caps that real fixture events already exceed, so every cap path is exercised often.
TIGHT_LIMITS = Limits(
    max_line_bytes=256,
    max_event_bytes=384,
    max_call_argument_bytes=24,
    max_response_argument_bytes=48,
    max_calls_per_response=2,
    max_json_depth=3,
    max_text_bytes=64,
    max_continuation_items=2,
    max_continuation_bytes=512,
    max_response_bytes=4096,  # below most fixtures' whole body
)


class InvariantViolation(AssertionError):
    """A target's invariant does not hold for this input: a finding."""


def expect(condition: object, message: str) -> None:
    """Raise ``InvariantViolation(message)`` unless ``condition`` holds (not an
    ``assert``: ``python -O`` must not switch the fuzz checks off)."""
    if not condition:
        raise InvariantViolation(message)


def stream_seed(data: bytes) -> int:
    """A deterministic seed derived from the input, so a saved input replays exactly."""
    return zlib.crc32(data)


def pick_limits(data: bytes) -> Limits:
    """Roomy limits for three inputs in four, tight ones for the rest (by input hash)."""
    return TIGHT_LIMITS if stream_seed(data) % 4 == 0 else ROOMY_LIMITS


def chunk_plan(data: bytes, max_chunk: int = 64) -> list[bytes]:
    """Split ``data`` at boundaries drawn from its own hash: mostly tiny chunks (so every
    line end, CRLF and multi-byte character gets cut somewhere), sometimes larger ones."""
    rng = random.Random(stream_seed(data) ^ 0x5EED)
    chunks: list[bytes] = []
    i = 0
    while i < len(data):
        n = rng.randint(1, 4) if rng.random() < 0.5 else rng.randint(1, max_chunk)
        chunks.append(data[i : i + n])
        i += n
    return chunks


def instrument_package(prefix: str = "callgate") -> int:
    """Add atheris coverage instrumentation to every function and method of the already
    imported modules under ``prefix``; returns how many were instrumented.

    Instrumenting after import (instead of ``atheris.instrument_imports``) keeps the
    targets importable without atheris and leaves msgspec, orjson and the standard
    library uninstrumented, which keeps executions fast.
    """
    import atheris  # type: ignore[import-untyped]

    count = 0
    for name, module in list(sys.modules.items()):
        if module is None or not (name == prefix or name.startswith(prefix + ".")):
            continue
        for obj in list(vars(module).values()):
            for func in _functions_of(obj, name):
                atheris.instrument_func(func)
                count += 1
    return count


def _functions_of(obj: Any, module: str) -> list[types.FunctionType]:
    if isinstance(obj, types.FunctionType):
        return [obj] if obj.__module__ == module else []
    if not isinstance(obj, type) or obj.__module__ != module:
        return []
    out: list[types.FunctionType] = []
    for attr in vars(obj).values():
        candidates: list[Any] = [attr]
        if isinstance(attr, staticmethod | classmethod):
            candidates = [attr.__func__]
        elif isinstance(attr, property):
            candidates = [attr.fget, attr.fset, attr.fdel]
        out.extend(
            c for c in candidates if isinstance(c, types.FunctionType) and c.__module__ == module
        )
    return out


def fuzz_main(
    check: Callable[[bytes], None],
    custom_mutator: Callable[[bytes, int, int], bytes] | None = None,
) -> None:
    """Run ``check`` under atheris/libFuzzer with ``sys.argv`` as libFuzzer flags."""
    import atheris

    instrument_package("callgate")
    kwargs: dict[str, Any] = {}
    if custom_mutator is not None:
        kwargs["custom_mutator"] = custom_mutator
    argv = list(sys.argv)
    # libFuzzer re-executes argv[0] for -merge/-fork: under ``python -m`` that is the
    # module's file, which cannot run alone; fuzz/run.py passes an executable launcher.
    launcher = os.environ.get("CALLGATE_FUZZ_LAUNCHER")
    if launcher:
        argv[0] = launcher
    atheris.Setup(argv, check, **kwargs)
    atheris.Fuzz()
