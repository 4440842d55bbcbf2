"""The CA bundle is loaded once per process, off the event loop: a service that makes
Runners freely (or runs many operations, each drive opening its own client) must not
stall every operation in flight for the tens of milliseconds a load takes."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from callgate.engine.runtime import transport
from callgate.engine.runtime.replay import ReplayServer

from .loop_helpers import chat_runner, refund_and_lookup, turn

pytestmark = pytest.mark.anyio


async def test_the_ca_bundle_is_loaded_once_per_process_in_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads: list[threading.Thread] = []
    real = httpx.create_ssl_context

    def counted(*args: Any, **kwargs: Any) -> Any:
        loads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(httpx, "create_ssl_context", counted)
    monkeypatch.setattr(transport, "_TLS", [])
    loop_thread = threading.current_thread()
    turns = [turn("openai_chat", text=f"answer {n}") for n in range(3)]
    async with ReplayServer(turns) as server:
        for n in range(3):  # three Runners, three drives, each opening its own client
            reads = refund_and_lookup([]).narrow(["get_order"])
            runner = chat_runner(server.base_url, reads, None)
            result = await runner.start(f"question {n}")
            assert result.text == f"answer {n}"
    assert len(loads) == 1
    assert loads[0] is not loop_thread
