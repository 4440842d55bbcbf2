"""What differs between anyio's backends on purpose: the PostgreSQL store (asyncpg) runs
on asyncio and uvloop only, and is refused at open on trio. (The conftest runs every
async test on asyncio, uvloop and trio.)"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.anyio


# Pinned to trio: the refusal is what trio gets (on asyncio the store connects).
@pytest.mark.parametrize("anyio_backend", [("trio", {})], ids=["trio"])
async def test_the_postgresql_store_is_refused_at_open_on_trio() -> None:
    # asyncpg runs on asyncio only: opened on trio, it failed deep in its pool with a bare
    # "no running event loop" RuntimeError. Now a typed refusal, before any connection
    # is tried (this port has no server: a connection attempt would be StoreUnavailable).
    from callgate.engine.core.errors import ConfigError
    from callgate.engine.store import open_store

    store = open_store("postgresql://callgate:pw-never-shown@127.0.0.1:1/callgate")
    with pytest.raises(ConfigError, match="needs anyio's asyncio backend") as raised:
        async with store:
            pass
    assert "pw-never-shown" not in str(raised.value)
