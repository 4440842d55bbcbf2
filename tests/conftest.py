"""Shared test fixtures: recorded SSE bodies and the async backends every async test runs on."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
FAMILIES = ("openai_chat", "openai_responses", "anthropic", "gemini", "gemini_interactions")


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


def fixture_files() -> list[tuple[str, Path]]:
    """(provider, path) for every recorded stream, sorted."""
    return [(fam, p) for fam in FAMILIES for p in sorted((FIXTURES / fam).glob("*.sse"))]


def chunkings(body: bytes, seed: int = 0) -> Iterator[tuple[str, list[bytes]]]:
    """The three feeding modes every stream test uses: whole, one byte at a time, and
    seeded random chunk boundaries."""
    yield "whole", [body]
    yield "bytewise", [body[i : i + 1] for i in range(len(body))]
    rng = random.Random(seed)
    chunks, i = [], 0
    while i < len(body):
        n = rng.randint(1, 97)
        chunks.append(body[i : i + n])
        i += n
    yield "random", chunks
