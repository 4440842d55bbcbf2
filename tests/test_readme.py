"""The README's quick start and embedding example are executed, so the docs cannot rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from callgate.adapters.render import RenderCall, render_turn
from callgate.engine import OpState, open_store
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = README.index(f"## {title}")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def test_quick_start_names_the_two_commands() -> None:
    block = re.search(r"```sh\n(.*?)```", _section("Quick start"), re.DOTALL)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block[1].splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    make = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert make.returncode == 0 and "pytest" in make.stdout
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_make_demo_runs_the_refund_flow_to_completed(tmp_path: Path) -> None:
    res = subprocess.run(
        ["make", "demo", f"PYTHON={sys.executable}"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "COMPLETED" in res.stdout
    assert "hash chain verified ok" in res.stdout


@pytest.mark.anyio
async def test_embedding_example_runs_against_the_loopback_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    embedding = _section("Embedding it in an async service")
    code = re.search(r"```python\n(.*?)```", embedding, re.DOTALL)
    assert code is not None
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(code[1], "README.md", "exec"), namespace)
    turns = [
        ReplayTurn(
            body=render_turn(
                "openai_responses",
                calls=[RenderCall("call_1", "get_order", '{"order_id":"4815"}')],
                response_id="resp_1",
            )
        ),
        ReplayTurn(body=render_turn("openai_responses", text="Order 4815 has shipped.")),
    ]
    async with ReplayServer(turns) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-readme")
        async with open_store(f"sqlite:///{tmp_path / 'callgate.db'}") as store:
            service = namespace["Service"](store)
            state, text, pending = await service.handle(
                "Where is order 4815?", "tenant-a", "user-1"
            )
        sent = server.requests[1].json()
    assert state is OpState.COMPLETED
    assert text == "Order 4815 has shipped."
    assert pending == ()
    outputs = [item for item in sent["input"] if item.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == ["call_1"]
    assert '"shipped"' in outputs[0]["output"]
