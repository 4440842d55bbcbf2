"""Texts a host passes in (a prompt, a tenant, an id taken from a web request's JSON
body) may hold a lone surrogate: valid as a JSON escape, not UTF-8. They get a typed
error, never a bare UnicodeEncodeError: ``Runner.start`` refuses them before anything is
persisted or sent, and the SQLite store refuses them as PostgreSQL does (StoreError)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from callgate.engine import ConfigError, StoreError
from callgate.engine.runtime.replay import ReplayServer
from callgate.engine.store.sqlite import SQLiteStore

from .loop_helpers import chat_runner, refund_and_lookup, turn

pytestmark = pytest.mark.anyio
LONE = json.loads('"x\\ud800"')  # what a web framework hands over for {"id": "x\ud800"}


@pytest.mark.parametrize("field", ["prompt", "tenant", "subject", "operation_id", "roles"])
async def test_a_lone_surrogate_in_what_start_is_given_is_refused_before_anything_runs(
    tmp_path: Path, field: str
) -> None:
    kwargs: dict[str, object] = {"prompt": "Where is o1?"}
    kwargs[field] = [LONE] if field == "roles" else LONE
    async with (
        ReplayServer([turn("openai_chat", text="hi")]) as server,
        SQLiteStore(tmp_path / "db") as store,
    ):
        runner = chat_runner(server.base_url, refund_and_lookup([]), store)
        prompt = str(kwargs.pop("prompt"))
        with pytest.raises(ConfigError, match=f"the {field} is not valid UTF-8"):
            await runner.start(prompt, **kwargs)  # type: ignore[arg-type]
        assert server.requests == []
        assert await store.list_operations() == []


async def test_a_lone_surrogate_in_an_id_is_a_store_error_on_sqlite(tmp_path: Path) -> None:
    async with ReplayServer([]) as server, SQLiteStore(tmp_path / "db") as store:
        with pytest.raises(StoreError, match="not valid UTF-8"):
            await store.get_operation(LONE)
        with pytest.raises(StoreError, match="not valid UTF-8"):
            await store.decide_approval(LONE, True, "alice", "ok", now=time.time())
        with pytest.raises(StoreError):
            await chat_runner(server.base_url, refund_and_lookup([]), store).resume(LONE)
        assert await store.list_operations() == []  # the store still answers
