"""Shared test fixtures: recorded SSE bodies and the async backends every async test runs on."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

FIXTURES = Path(__file__).parent / "fixtures"
FAMILIES = ("openai_chat", "openai_responses", "anthropic", "gemini", "gemini_interactions")


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
        pytest.param(("trio", {}), id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


_TRIO = ("trio", {})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the combinations that cannot exist: a PostgreSQL test on trio. asyncpg runs on
    asyncio only, so the store refuses trio at open, before connecting; that refusal is
    what ``test_backend_parity.py`` tests. Everything else runs on every backend."""
    impossible = [
        item
        for item in items
        if item.get_closest_marker("postgres") is not None
        and getattr(item, "callspec", None) is not None
        and item.callspec.params.get("anyio_backend") == _TRIO  # type: ignore[attr-defined]
    ]
    if impossible:
        config.hook.pytest_deselected(items=impossible)
        dropped = set(map(id, impossible))
        items[:] = [item for item in items if id(item) not in dropped]


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


# --- planted secrets ----------------------------------------------------------------------
# Tests put PLANTED_SECRET into sensitive argument and result fields. Across the whole
# session, no audit record built by callgate and no log record may contain it.
PLANTED_SECRET = "sk-PLANTED-7f3a9c1e-never-log-me"


class _LogCapture(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(level=logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sink.append(record.getMessage())
        except Exception:
            self.sink.append(str(record.msg))


@pytest.fixture(scope="session", autouse=True)
def planted_secret_scan() -> Iterator[list[str]]:
    from callgate.engine.core import audit

    lines: list[str] = []
    original = audit.AuditChain.append

    def append(self: audit.AuditChain, *args: Any, **kwargs: Any) -> audit.AuditRecord:
        record = original(self, *args, **kwargs)
        lines.append(msgspec.json.encode(record).decode())
        return record

    audit.AuditChain.append = append  # type: ignore[method-assign]
    handler = _LogCapture(lines)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield lines
    finally:
        audit.AuditChain.append = original  # type: ignore[method-assign]
        root.removeHandler(handler)
    leaked = [line[:200] for line in lines if PLANTED_SECRET in line]
    assert not leaked, f"a planted secret reached an audit or log line: {leaked[:3]}"


def coalesced(events: list[Any]) -> list[Any]:
    """An engine-event sequence with every stretch of consecutive argument fragments
    replaced by one joined fragment per call (in call-index order). ``StreamDecoder.feed``
    batches the fragments a chunk completed, so fragment granularity depends on the
    chunking; everything else, and each call's argument text, does not."""
    from callgate.engine.core.events import ArgumentsDelta

    out: list[Any] = []
    stretch: dict[int, str] = {}
    for event in [*events, None]:
        if isinstance(event, ArgumentsDelta):
            stretch[event.index] = stretch.get(event.index, "") + event.fragment
            continue
        out += [ArgumentsDelta(index, stretch[index]) for index in sorted(stretch)]
        stretch = {}
        if event is not None:
            out.append(event)
    return out
