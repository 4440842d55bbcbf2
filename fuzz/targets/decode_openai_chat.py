# Invariant: decode("openai_chat", …) never raises, gives the same outcome whole and re-chunked, never reports a complete turn with a started call not done (or any incomplete call), and keeps every outcome size (and a sampled memory peak) within the limits.
"""Fuzz target: the full ``decode()`` pipeline for OpenAI Chat Completions streams (SSE decoder,
adapter, turn assembler, strict argument parser). See ``fuzz.stream_checks.check_decode``."""

from __future__ import annotations

from ..harness import fuzz_main
from ..mutators import atheris_mutator
from ..stream_checks import check_decode

__all__ = ["PROVIDER", "check"]

PROVIDER = "openai_chat"


def check(data: bytes) -> None:
    check_decode(PROVIDER, data)


custom_mutator = atheris_mutator(PROVIDER)

if __name__ == "__main__":
    fuzz_main(check, custom_mutator)
