# Invariant: the gemini adapter stream raises only StreamProtocolError/LimitExceeded, emits at most one Completion and no call event after it, never an empty fragment or unnamed call, and at most max_continuation_items continuation items.
"""Fuzz target: the Gemini generateContent (and Vertex partialArgs) adapter's decode path (SSE events →
``ADAPTER.new_stream(limits).decode`` / ``end``). See ``fuzz.stream_checks.check_adapter``."""

from __future__ import annotations

from ..harness import fuzz_main
from ..mutators import atheris_mutator
from ..stream_checks import check_adapter

__all__ = ["PROVIDER", "check"]

PROVIDER = "gemini"


def check(data: bytes) -> None:
    check_adapter(PROVIDER, data)


custom_mutator = atheris_mutator(PROVIDER)

if __name__ == "__main__":
    fuzz_main(check, custom_mutator)
