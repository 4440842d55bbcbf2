# Invariant: decode() never completes a turn with an open call, never raises, ignores chunking.
#   (anthropic) Every outcome size (and a sampled memory peak) is within
#   the limits; accepted arguments are exactly the parser's reading of the raw bytes.
"""Fuzz target: the full ``decode()`` pipeline for Anthropic Messages streams (SSE decoder,
adapter, turn assembler, strict argument parser). See ``fuzz.stream_checks.check_decode``."""

from __future__ import annotations

from fuzz.harness import fuzz_main
from fuzz.mutators import atheris_mutator
from fuzz.stream_checks import check_decode

__all__ = ["PROVIDER", "check"]

PROVIDER = "anthropic"


def check(data: bytes) -> None:
    check_decode(PROVIDER, data)


custom_mutator = atheris_mutator(PROVIDER)

if __name__ == "__main__":
    fuzz_main(check, custom_mutator)
