# Invariant: adapter emits at most one Completion, no call event after it, no empty fragment.
#   (openai_responses) Only StreamProtocolError/LimitExceeded escape; at most
#   max_continuation_items continuation items.
"""Fuzz target: the OpenAI Responses adapter's decode path (SSE events →
``ADAPTER.new_stream(limits).decode`` / ``end``). See ``fuzz.stream_checks.check_adapter``."""

from __future__ import annotations

from fuzz.harness import fuzz_main
from fuzz.mutators import atheris_mutator
from fuzz.stream_checks import check_adapter

__all__ = ["PROVIDER", "check"]

PROVIDER = "openai_responses"


def check(data: bytes) -> None:
    check_adapter(PROVIDER, data)


custom_mutator = atheris_mutator(PROVIDER)

if __name__ == "__main__":
    fuzz_main(check, custom_mutator)
