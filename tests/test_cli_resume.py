"""``callgate operations resume``'s exit statuses, run as real subprocesses against a real
paused run (SQLite file, loopback replay server): a script reads 0 only when the operation
completed or moved on; 5 when it still waits on an undecided approval (nothing ran); 1 when
it ended refused/incomplete/failed/escalated (now or before), or the store holds an ended
operation whose snapshot cannot be read; 4 when it was resumed but the answer could not be
written. (3, a claim held by another worker, is in tests/test_cli_admin.py.)
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from callgate.engine.runtime.loop import Runner
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn
from callgate.engine.runtime.transport import ProviderEndpoint
from callgate.engine.store import OperationRecord, open_store

from .cli_helpers import CLI, ROOT, cli_env
from .cli_tools import REGISTRY
from .conftest import FIXTURES

pytestmark = pytest.mark.anyio

WEATHER_CALL = FIXTURES / "openai_chat" / "single_tool_call_get_weather.sse"
REFUSAL = FIXTURES / "openai_chat" / "refusal_deltas_finish_stop.sse"
FINAL = Path(__file__).parent / "streams" / "openai_chat_final_text.sse"
REJECTED = ReplayTurn(
    status=400,
    body=b'{"error":{"message":"bad request","type":"invalid_request_error"}}',
    content_type="application/json",
)


async def _cli(
    *args: str, env: dict[str, str], stdout: Any = subprocess.PIPE
) -> subprocess.CompletedProcess[bytes]:
    proc = await anyio.run_process([*CLI, *args], cwd=ROOT, env=env, check=False, stdout=stdout)
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()
    return proc


async def _paused(url: str, base_url: str) -> tuple[str, str]:
    async with open_store(url) as store:
        paused = await Runner(
            provider="openai_chat",
            model="gpt-4o",
            registry=REGISTRY,
            endpoint=ProviderEndpoint(base_url=base_url, api_key="sk-test"),
            store=store,
        ).start("Weather?", tenant="acme")
    (approval_id,) = paused.pending_approvals
    return paused.operation_id, approval_id


def _env(url: str, base_url: str, tmp_path: Path) -> dict[str, str]:
    return cli_env(
        CALLGATE_STORE=url,
        OPENAI_BASE_URL=base_url,
        OPENAI_API_KEY="sk-test",
        CALLGATE_TEST_EFFECTS=str(tmp_path / "effects.log"),
    )


async def _resume_after_approval(
    tmp_path: Path, second: ReplayTurn, *extra: str, stdout: Any = subprocess.PIPE
) -> tuple[subprocess.CompletedProcess[bytes], str]:
    """Pause on the weather call, approve it, resume with ``second`` as the model's next
    turn; the resume's process and the operation id."""
    url = f"sqlite:///{tmp_path / 'callgate.db'}"
    async with ReplayServer([ReplayTurn.from_file(WEATHER_CALL), second]) as server:
        op, approval_id = await _paused(url, server.base_url)
        env = _env(url, server.base_url, tmp_path)
        approved = await _cli("approvals", "approve", approval_id, "--approver", "ops", env=env)
        assert approved.returncode == 0
        resume = ["operations", "resume", op, "--registry", "tests.cli_tools:REGISTRY", *extra]
        return await _cli(*resume, env=env, stdout=stdout), op


async def test_resume_that_completes_exits_0(tmp_path: Path) -> None:
    done, _ = await _resume_after_approval(tmp_path, ReplayTurn.from_file(FINAL), "--json")
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout)["state"] == "completed"


async def test_resume_while_an_approval_is_undecided_exits_5_and_runs_nothing(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'callgate.db'}"
    async with ReplayServer([ReplayTurn.from_file(WEATHER_CALL)]) as server:
        op, approval_id = await _paused(url, server.base_url)
        early = await _cli(
            "operations", "resume", op, "--registry", "tests.cli_tools:REGISTRY",
            env=_env(url, server.base_url, tmp_path),
        )  # fmt: skip
        assert len(server.requests) == 1  # the model was not asked again
    assert early.returncode == 5, early.stderr.decode()
    assert f"still waiting for approval: {approval_id}; nothing ran".encode() in early.stderr
    assert b"state      waiting_approval" in early.stdout
    assert not (tmp_path / "effects.log").exists()


async def test_resume_that_ran_nothing_and_cannot_write_its_answer_exits_2(
    tmp_path: Path,
) -> None:
    # A resume that found its approval undecided changed nothing: a failed write of its
    # answer is a read-only command's (2, "nothing was changed"), never ANSWER_LOST (4,
    # "do not resume again").
    url = f"sqlite:///{tmp_path / 'callgate.db'}"
    async with ReplayServer([ReplayTurn.from_file(WEATHER_CALL)]) as server:
        op, _ = await _paused(url, server.base_url)
        with open("/dev/full", "wb") as full:  # noqa: ASYNC230 - a device, opened once
            early = await _cli(
                "operations", "resume", op, "--registry", "tests.cli_tools:REGISTRY",
                env=_env(url, server.base_url, tmp_path), stdout=full,
            )  # fmt: skip
    assert early.returncode == 2, early.stderr.decode()
    assert early.stderr.decode().endswith(
        "callgate operations resume: cannot write the answer to standard output (No space "
        "left on device); nothing was changed\n"
    )


async def test_resume_that_moves_on_to_a_new_pause_exits_0(tmp_path: Path) -> None:
    # The approved call ran, and the model proposed another call (its own id and
    # arguments) that needs approval.
    again = (
        WEATHER_CALL.read_bytes()
        .replace(b"call_4XzlGBLtUe9dy3GVNV4jhq7h", b"call_again")
        .replace(b"chatcmpl-ABfwERreu9s99xXsVuOWtIB2UOx62", b"chatcmpl-again")
        .replace(b'"New"', b'"Oslo"')
        .replace(b'" York"', b'""')
        .replace(b'" City"', b'""')
    )
    moved, op = await _resume_after_approval(tmp_path, ReplayTurn(body=again))
    assert moved.returncode == 0, moved.stderr.decode()
    assert b"ran its decided calls and waits for approval again: apr_" in moved.stderr
    assert b"state      waiting_approval" in moved.stdout
    assert (tmp_path / "effects.log").read_text().count(op) == 1


@pytest.mark.parametrize(
    ("second", "state"),
    [(ReplayTurn.from_file(REFUSAL), "refused"), (REJECTED, "failed")],
    ids=["refused", "failed"],
)
async def test_resume_that_ends_badly_exits_1(
    tmp_path: Path, second: ReplayTurn, state: str
) -> None:
    ended, op = await _resume_after_approval(tmp_path, second)
    assert ended.returncode == 1, ended.stderr.decode()
    assert f"operation {op} ended {state}".encode() in ended.stderr
    assert f"state      {state}".encode() in ended.stdout
    # ...and resumed again, it is still a failure to report, not "fine".
    url = f"sqlite:///{tmp_path / 'callgate.db'}"
    again = await _cli(
        "operations", "resume", op, "--registry", "tests.cli_tools:REGISTRY",
        env=cli_env(CALLGATE_STORE=url),
    )  # fmt: skip
    assert again.returncode == 1 and b"nothing to resume" in again.stderr


async def test_resume_whose_answer_cannot_be_written_says_it_was_resumed(
    tmp_path: Path,
) -> None:
    with open("/dev/full", "wb") as full:  # noqa: ASYNC230 - a device, opened once
        lost, op = await _resume_after_approval(tmp_path, ReplayTurn.from_file(FINAL), stdout=full)
    assert lost.returncode == 4, lost.stderr.decode()
    assert lost.stderr.decode() == (
        f"callgate operations resume: the resume of operation {op} (now completed) was "
        "recorded, but its answer could not be written to standard output (No space left "
        "on device)\n"
    )
    url = f"sqlite:///{tmp_path / 'callgate.db'}"
    shown = await _cli("operations", "show", op, "--json", env=cli_env(CALLGATE_STORE=url))
    assert json.loads(shown.stdout)["state"] == "completed"


def _ended(operation_id: str, state: str, snapshot: bytes) -> OperationRecord:
    now = time.time()
    return OperationRecord(
        operation_id=operation_id,
        tenant="acme",
        subject="bob",
        state=state,
        snapshot=snapshot,
        created_at=now,
        updated_at=now,
    )


async def test_resume_of_an_operation_that_had_ended(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'callgate.db'}"
    readable = msgspec.json.encode({"provider": "openai_chat", "model": "m", "state": "x"})
    async with open_store(url) as store:
        await store.create_operation(_ended("op_done", "completed", readable))
        await store.create_operation(_ended("op_failed", "escalated", readable))
        await store.create_operation(_ended("op_garbled", "completed", b"\xff not json"))
    keyless = {k: v for k, v in cli_env(CALLGATE_STORE=url).items() if "_API_KEY" not in k}
    resume = ["operations", "resume", "--registry", "tests.cli_tools:REGISTRY"]
    done, failed, garbled = [
        await _cli(*resume, op, env=keyless) for op in ("op_done", "op_failed", "op_garbled")
    ]
    assert done.returncode == 0 and b"is completed, not waiting" in done.stderr
    assert failed.returncode == 1 and b"is escalated, not waiting" in failed.stderr
    assert b"state      escalated" in failed.stdout
    # An ended operation's snapshot that cannot be read is the store's refusal (1), not a
    # usage error ("pass --provider" would not make it readable).
    assert (garbled.returncode, garbled.stdout) == (1, b""), garbled.stderr
    assert b"snapshot is not readable (10 bytes)" in garbled.stderr
    assert b"--provider" not in garbled.stderr


async def test_an_audit_file_that_cannot_be_written_is_named_not_the_store(
    tmp_path: Path,
) -> None:
    # /dev/full opens for appending; every write fails (ENOSPC). That failure was reported
    # as the store's ("store sqlite:///...: [Errno 28]"), although the database was fine.
    failed, _ = await _resume_after_approval(
        tmp_path, ReplayTurn.from_file(FINAL), "--audit-file", "/dev/full"
    )
    assert failed.returncode == 1
    assert b"--audit-file: cannot write to it (No space left on device)" in failed.stderr
    assert b"store " not in failed.stderr
