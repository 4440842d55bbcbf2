"""The examples stay runnable: each imports, answers --help, and does what its docstring
says (the refund service completes with one refund; the SSE endpoint streams a paused
then resumed operation; exactly one of many workers resumes an approved operation, on
SQLite and on PostgreSQL)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType

import anyio
import pytest

from .store_helpers import drop_schema, require_postgres, with_schema

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NAMES = ["refund_service", "sse_progress_endpoint", "multi_worker_postgres"]


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_is_covered() -> None:
    assert sorted(p.stem for p in EXAMPLES.glob("*.py")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_example_imports_and_answers_help(name: str) -> None:
    module = load(name)
    assert module.__doc__ and len(module.__doc__.splitlines()) > 3
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage:")


def test_refund_service_completes_with_one_refund(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "refund_service.py"), "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ": waiting_approval" in proc.stdout and ": completed" in proc.stdout
    assert "refunds paid: 1" in proc.stdout
    assert (tmp_path / "audit.jsonl").stat().st_size > 0


def test_sse_endpoint_streams_the_pause_and_the_resume(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = load("sse_progress_endpoint").main(["--selftest"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "--- GET /events -> 200" in out and "--- GET /resume -> 200" in out
    assert "event: preparing" in out and "event: approval" in out
    assert '"state":"waiting_approval"' in out and "final state: completed" in out


def test_sse_frame_is_one_event_with_single_line_data() -> None:
    frame = load("sse_progress_endpoint").frame("state", b'{"a":1}')
    assert frame == b'event: state\ndata: {"a":1}\n\n'


def _race(url: str, capsys: pytest.CaptureFixture[str]) -> str:
    module = load("multi_worker_postgres")
    code = anyio.run(module.main, module.parse_args(["--store", url, "--workers", "6"]))
    out: str = capsys.readouterr().out
    assert code == 0, out
    return out


def test_exactly_one_worker_resumes_on_sqlite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _race(f"sqlite:///{tmp_path / 'workers.db'}", capsys)
    assert "winners: 1; refunds paid: 1" in out
    assert out.count("won the claim") == 1 and out.count("found it taken") == 5
    # A loser is told the operation is busy (or sees it ended), never a pause to decide.
    assert "(saw waiting_approval)" not in out


def test_exactly_one_worker_resumes_on_postgres(capsys: pytest.CaptureFixture[str]) -> None:
    url = require_postgres()
    schema = f"example_{uuid.uuid4().hex[:12]}"
    try:
        out = _race(with_schema(url, schema), capsys)
    finally:
        anyio.run(drop_schema, schema)
    assert "winners: 1; refunds paid: 1" in out
    assert out.count("won the claim") == 1


def test_multi_worker_without_a_store_says_how_to_configure_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CALLGATE_PG_URL", raising=False)
    module = load("multi_worker_postgres")
    with pytest.raises(SystemExit) as exc:
        module.parse_args([])
    assert exc.value.code == 2
    assert "CALLGATE_PG_URL" in capsys.readouterr().err
