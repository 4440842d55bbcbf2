"""The operator commands run as real subprocesses (``python -m callgate.engine.cli``):
approvals list/show/approve/deny and operations list/show/resume against a store prepared
with the store API and a real paused run (SQLite file, and PostgreSQL when configured —
skipped only when no server URL is set *and* CI is not set), how the store URL is chosen,
and the demo command's wiring. ``audit verify`` is in tests/test_cli_audit.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import msgspec
import pytest

from callgate.engine.core.states import OpState
from callgate.engine.runtime.audit_sink import JsonlAuditSink
from callgate.engine.runtime.loop import Runner
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn
from callgate.engine.runtime.transport import ProviderEndpoint
from callgate.engine.store import ApprovalRecord, OperationRecord, open_store

from .cli_helpers import CLI, ROOT, cli_env, parsed, run_all
from .cli_tools import REGISTRY
from .conftest import FIXTURES
from .store_helpers import drop_schema, require_postgres, with_schema

WEATHER_CALL = FIXTURES / "openai_chat" / "single_tool_call_get_weather.sse"
FINAL = Path(__file__).parent / "streams" / "openai_chat_final_text.sse"
NYC_CALL = "call_4XzlGBLtUe9dy3GVNV4jhq7h"
ESC = "\x1b[2J"


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    (proc,) = run_all(args, env=env, cwd=cwd)
    return proc


def ok_json(*args: str) -> Any:
    return parsed(run_cli(*args, "--json"))


# --- a store with a real paused run and a few hand-made records ------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'callgate.db'}"
        return
    base = require_postgres()
    schema = f"cli_{uuid.uuid4().hex[:12]}"
    yield with_schema(base, schema)
    anyio.run(drop_schema, schema)


class Seed(NamedTuple):
    url: str
    paused_op: str
    paused_approval: str


def runner(base_url: str, store: Any) -> Runner:
    return Runner(
        provider="openai_chat",
        model="gpt-4o",
        registry=REGISTRY,
        endpoint=ProviderEndpoint(base_url=base_url, api_key="sk-test"),
        store=store,
    )


DONE_SNAPSHOT = {
    "operation_id": "op_done",
    "provider": "anthropic",
    "model": "claude-x",
    "state": "completed",
    "messages": [{"role": "user", "content": "PRIVATE-PROMPT-TEXT"}],
    "text": "Refund sent.",
    "stop": {
        "state": "completed",
        "input": "final_text",
        "provider_reason": "end_turn",
        "reason": "the model finished its answer",
    },
    "calls": [
        {
            "turn": 1,
            "response_id": "msg_1",
            "call_id": "toolu_1",
            "tool": "refund",
            "status": "ok",
            "idempotency_key": "idem_refund_1",
            "approval_id": None,
            "binding_sha256": "ab" * 32,
        },
        "not a call",  # an unexpected shape is skipped, not a crash
    ],
    "audit_seq": 7,
    "audit_head": "cd" * 32,
}


def _approval(approval_id: str, operation_id: str, **kw: Any) -> ApprovalRecord:
    now = time.time()
    fields: dict[str, Any] = {
        "call_id": "call_x",
        "tool": "refund",
        "schema_version": "1",
        "args_digest": "ef" * 32,
        "policy_revision": "p1",
        "tenant": "acme",
        "subject": "bob",
        "created_at": now - 60,
        "expires_at": now + 3600,
    }
    fields.update(kw)
    return ApprovalRecord(approval_id=approval_id, operation_id=operation_id, **fields)


async def _seed(url: str) -> Seed:
    async with (
        ReplayServer([ReplayTurn.from_file(WEATHER_CALL)]) as server,
        open_store(url) as store,
    ):
        paused = await runner(server.base_url, store).start(
            "Weather in NYC?", tenant="acme", subject="alice"
        )
        now = time.time()
        for op_id, state, snapshot in [
            ("op_done", "completed", msgspec.json.encode(DONE_SNAPSHOT)),
            ("op_garbled", "failed", b"\xff not json"),
            ("op_other", "waiting_approval", b"{}"),
        ]:
            await store.create_operation(
                OperationRecord(
                    operation_id=op_id,
                    tenant="acme",
                    subject="bob",
                    state=state,
                    snapshot=snapshot,
                    created_at=now,
                    updated_at=now,
                )
            )
        await store.create_approval(_approval("apr_other", "op_other"))
        await store.create_approval(_approval("apr_old", "op_other", expires_at=now - 1))
        await store.create_approval(_approval("apr_esc", "op_other", call_id=f"call{ESC}"))
    assert paused.state is OpState.WAITING_APPROVAL
    (approval_id,) = paused.pending_approvals
    return Seed(url, paused.operation_id, approval_id)


@pytest.fixture
def seed(store_url: str) -> Seed:
    return anyio.run(_seed, store_url)


# --- approvals ----------------------------------------------------------------------------


def test_approvals_list_aligned_text_json_and_filters(seed: Seed) -> None:
    store = ("--store", seed.url)
    text, listed, only, approved = run_all(
        ["approvals", "list", *store],
        ["approvals", "list", *store, "--json"],
        ["approvals", "list", *store, "--json", "--operation", seed.paused_op],
        ["approvals", "list", *store, "--json", "--status", "approved"],
    )
    assert text.returncode == 0, text.stderr
    header, *rows = text.stdout.splitlines()
    assert header.split()[:6] == ["APPROVAL", "STATUS", "OPERATION", "TOOL", "CALL", "EXPIRES"]
    assert header.endswith("DECIDED BY")
    mine = next(r for r in rows if r.startswith(seed.paused_approval))
    # Aligned: every column starts at the same offset on every row.
    assert mine.index("pending") == header.index("STATUS")
    assert mine.index(seed.paused_op) == header.index("OPERATION")
    assert "pending (expired)" in next(r for r in rows if r.startswith("apr_old"))

    assert {a["approval_id"] for a in parsed(listed)} == {
        seed.paused_approval,
        "apr_other",
        "apr_old",
        "apr_esc",
    }
    mine_only = parsed(only)
    assert [(a["approval_id"], a["tool"], a["call_id"]) for a in mine_only] == [
        (seed.paused_approval, "get_weather", NYC_CALL)
    ]
    assert mine_only[0]["past_expiry"] is False
    assert parsed(approved) == []


def test_approve_once_then_every_second_decision_is_rejected(seed: Seed) -> None:
    store = ("--store", seed.url)
    proc = run_cli("approvals", "approve", seed.paused_approval, "--approver", "alice", *store)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"approved {seed.paused_approval} by alice")
    assert f"callgate operations resume {seed.paused_op}" in proc.stdout
    *again, shown = run_all(
        ["approvals", "approve", seed.paused_approval, "--approver", "mallory", *store],
        ["approvals", "deny", seed.paused_approval, "--approver", "bob", "--reason", "no", *store],
        ["approvals", "show", seed.paused_approval, "--json", *store],
    )
    for proc in again:
        assert (proc.returncode, proc.stdout) == (1, "")
        assert "already decided (approved by alice" in proc.stderr
        assert "approval_already_decided" in proc.stderr
    view = parsed(shown)
    assert (view["status"], view["approver"], view["reason"]) == ("approved", "alice", None)


def test_deny_needs_a_reason_and_records_it(seed: Seed) -> None:
    store = ("--store", seed.url)
    for blank in ((), ("--reason", ""), ("--reason", "  ")):
        proc = run_cli("approvals", "deny", "apr_other", "--approver", "bob", *blank, *store)
        assert proc.returncode == 2 and "--reason" in proc.stderr
    denied = parsed(
        run_cli("approvals", "deny", "apr_other", "--approver", "bob", "--reason", "too big",
                "--json", *store)
    )  # fmt: skip
    assert (denied["status"], denied["approver"], denied["reason"]) == ("denied", "bob", "too big")
    text = run_cli("approvals", "show", "apr_other", *store).stdout
    assert "status     denied" in text and "by bob: too big" in text


def test_an_approval_needs_a_named_approver(seed: Seed) -> None:
    store = ("--store", seed.url)
    for blank in ("", " \t"):
        proc = run_cli("approvals", "approve", "apr_other", "--approver", blank, *store)
        assert proc.returncode == 2 and "--approver" in proc.stderr
    shown = parsed(run_cli("approvals", "show", "apr_other", "--json", *store))
    assert shown["status"] == "pending"  # nothing was decided


def test_an_expired_approval_cannot_be_decided(seed: Seed) -> None:
    proc = run_cli("approvals", "approve", "apr_old", "--approver", "alice", "--store", seed.url)
    assert proc.returncode == 1
    assert "expired" in proc.stderr and "approval_expired" in proc.stderr
    assert ok_json("approvals", "show", "apr_old", "--store", seed.url)["status"] == "expired"


def test_unknown_ids_exit_1_with_a_clear_message(seed: Seed) -> None:
    store = ("--store", seed.url)
    *approvals, show_op, resume_op = run_all(
        ["approvals", "show", "apr_nope", *store],
        ["approvals", "approve", "apr_nope", "--approver", "a", *store],
        ["approvals", "deny", "apr_nope", "--approver", "a", "--reason", "r", *store],
        ["operations", "show", "op_nope", *store],
        ["operations", "resume", "op_nope", "--registry", "tests.cli_tools:REGISTRY", *store],
    )
    for proc in approvals:
        assert (proc.returncode, proc.stdout) == (1, ""), proc.args
        assert "no approval 'apr_nope' in this store" in proc.stderr
    for proc in (show_op, resume_op):
        assert (proc.returncode, proc.stdout) == (1, ""), proc.args
        assert "no operation 'op_nope' in this store" in proc.stderr


def test_stored_control_characters_never_reach_the_terminal(seed: Seed) -> None:
    for proc in run_all(
        ["approvals", "list", "--store", seed.url],
        ["approvals", "show", "apr_esc", "--store", seed.url],
    ):
        assert "\x1b" not in proc.stdout and "call\\x1b[2J" in proc.stdout


# --- operations ---------------------------------------------------------------------------


def test_operations_list_text_json_and_state_filter(seed: Seed) -> None:
    text, waiting = run_all(
        ["operations", "list", "--store", seed.url],
        ["operations", "list", "--store", seed.url, "--state", "waiting_approval", "--json"],
    )
    assert text.returncode == 0, text.stderr
    header, *rows = text.stdout.splitlines()
    assert header.split() == ["OPERATION", "STATE", "TENANT", "SUBJECT", "OWNER", "UPDATED"]
    assert {r.split()[0] for r in rows} == {seed.paused_op, "op_done", "op_garbled", "op_other"}
    listed = parsed(waiting)
    assert {o["operation_id"] for o in listed} == {seed.paused_op, "op_other"}
    assert all(o["owner"] is None and o["snapshot_bytes"] > 0 for o in listed)


def test_operations_show_decodes_the_snapshot_defensively(seed: Seed) -> None:
    store = ("--store", seed.url)
    paused, done, done_json, garbled, garbled_json, other = run_all(
        ["operations", "show", seed.paused_op, *store],
        ["operations", "show", "op_done", *store],
        ["operations", "show", "op_done", "--json", *store],
        ["operations", "show", "op_garbled", *store],
        ["operations", "show", "op_garbled", "--json", *store],
        ["operations", "show", "op_other", "--json", *store],
    )
    text = paused.stdout
    assert "state      waiting_approval" in text
    assert "tenant     acme" in text and "subject    alice" in text
    assert "model      openai_chat / gpt-4o" in text
    assert seed.paused_approval in text and "pending" in text
    assert f"{NYC_CALL}  get_weather" in text  # the paused turn's call, no arguments
    assert "New York" not in text

    assert "final_text: the model finished its answer (provider: end_turn)" in done.stdout
    assert "Refund sent." in done.stdout and "7 records, head " + "cd" * 32 in done.stdout
    row = next(line for line in done.stdout.splitlines() if "toolu_1" in line)
    assert row.split() == ["1", "toolu_1", "refund", "ok", "-", "idem_refund_1"]
    assert "PRIVATE-PROMPT-TEXT" not in done.stdout  # the conversation is never printed

    view = parsed(done_json)
    assert view["snapshot"]["calls"][0]["binding_sha256"] == "ab" * 32
    assert len(view["snapshot"]["calls"]) == 1  # the malformed entry is skipped
    assert "PRIVATE-PROMPT-TEXT" not in done_json.stdout

    assert garbled.returncode == 0 and "not readable (10 bytes)" in garbled.stdout
    assert parsed(garbled_json)["snapshot"] is None
    approvals = parsed(other)["approvals"]
    assert {a["approval_id"] for a in approvals} == {"apr_other", "apr_old", "apr_esc"}


async def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    proc = await anyio.run_process([*CLI, *args], cwd=ROOT, env=env, check=False)
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()
    return proc


@pytest.mark.anyio
async def test_resume_in_a_fresh_process_executes_exactly_once(
    store_url: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server:
        async with open_store(store_url) as store:
            paused = await runner(server.base_url, store).start("Weather?", tenant="acme")
        (approval_id,) = paused.pending_approvals
        env = cli_env(
            CALLGATE_STORE=store_url,  # the default store for every command below
            OPENAI_BASE_URL=server.base_url,
            OPENAI_API_KEY="sk-test",
            CALLGATE_TEST_EFFECTS=str(effects),
        )
        resume = ["operations", "resume", paused.operation_id]
        early = await _cli(*resume, "--registry", "tests.cli_tools:REGISTRY", env=env)
        # Nothing could proceed: not 0 ("resumed and fine"), see tests/test_cli_resume.py.
        assert early.returncode == 5 and b"waiting_approval" in early.stdout
        assert f"still waiting for approval: {approval_id}".encode() in early.stderr
        assert not effects.exists()  # nothing runs before a human decides
        assert (
            await _cli("approvals", "approve", approval_id, "--approver", "ops", env=env)
        ).returncode == 0

        audit = tmp_path / "resume.jsonl"
        done = await _cli(
            *resume, "--registry", "tests.cli_tools:make_registry", "--json",
            "--audit-file", str(audit), env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        view = json.loads(done.stdout)
        assert view["state"] == "completed" and view["snapshot"]["text"] == "It is sunny."
        (call,) = view["snapshot"]["calls"]
        assert (call["call_id"], call["status"], call["approval_id"]) == (
            NYC_CALL,
            "ok",
            approval_id,
        )
        assert audit.read_bytes().count(b"\n") > 0

        again = await _cli(*resume, "--registry", "tests.cli_tools:REGISTRY", env=env)
        assert again.returncode == 0 and b"not waiting for approval" in again.stderr
        assert b"state      completed" in again.stdout
        assert len(server.requests) == 2  # the model was asked once after the pause
    assert effects.read_text().splitlines() == [f"{paused.operation_id} {NYC_CALL} New York City"]


@pytest.mark.anyio
async def test_resume_takes_over_a_dead_workers_claim_only_with_claim_stale_after(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'callgate.db'}"
    effects = tmp_path / "effects.log"
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)]
    async with ReplayServer(turns) as server:
        async with open_store(url) as store:
            paused = await runner(server.base_url, store).start("Weather?", tenant="acme")
            (approval_id,) = paused.pending_approvals
            await store.decide_approval(approval_id, True, "ops", None, now=time.time())
            # A worker claimed it to resume, a day ago, and died: the claim is all it wrote.
            a_day_ago = time.time() - 86_400
            claimed = await store.claim_operation(
                paused.operation_id, "w_dead", now=a_day_ago, from_states=["waiting_approval"]
            )
            assert claimed is not None
        env = cli_env(
            CALLGATE_STORE=url,
            OPENAI_BASE_URL=server.base_url,
            OPENAI_API_KEY="sk-test",
            CALLGATE_TEST_EFFECTS=str(effects),
        )
        resume = [
            "operations",
            "resume",
            paused.operation_id,
            "--registry",
            "tests.cli_tools:REGISTRY",
        ]
        held = await _cli(*resume, env=env)
        assert held.returncode == 3 and b"claimed by worker w_dead" in held.stderr
        assert b"--claim-stale-after" in held.stderr and not effects.exists()
        bad = await _cli(*resume, "--claim-stale-after", "0", env=env)
        assert bad.returncode == 2 and b"positive number of seconds" in bad.stderr
        taken = await _cli(*resume, "--claim-stale-after", "3600", "--json", env=env)
        assert taken.returncode == 0, taken.stderr.decode()
        assert json.loads(taken.stdout)["state"] == "completed"
    assert effects.read_text().splitlines() == [f"{paused.operation_id} {NYC_CALL} New York City"]


@pytest.mark.anyio
async def test_resume_continues_a_keyed_audit_chain_only_with_its_secret(tmp_path: Path) -> None:
    # Started in Python with audit_secret; approved and resumed through the CLI. The
    # records the resume appends verify only when it was given the same secret.
    url = f"sqlite:///{tmp_path / 'callgate.db'}"
    turns = [ReplayTurn.from_file(WEATHER_CALL), ReplayTurn.from_file(FINAL)] * 2
    async with ReplayServer(turns) as server:
        env = cli_env(
            CALLGATE_STORE=url,
            OPENAI_BASE_URL=server.base_url,
            OPENAI_API_KEY="sk-test",
            CALLGATE_TEST_EFFECTS=str(tmp_path / "effects.log"),
            AUDIT_KEY="k3y-of-the-trail",
        )
        verdicts = []
        for keyed in (True, False):
            trail = tmp_path / f"trail-{keyed}.jsonl"
            async with open_store(url) as store, JsonlAuditSink(trail) as sink:
                paused = await Runner(
                    provider="openai_chat",
                    model="gpt-4o",
                    registry=REGISTRY,
                    endpoint=ProviderEndpoint(base_url=server.base_url, api_key="sk-test"),
                    store=store,
                    audit=sink.write,
                    audit_secret=b"k3y-of-the-trail",
                ).start("Weather?", tenant="acme")
            (approval_id,) = paused.pending_approvals
            approved = await _cli("approvals", "approve", approval_id, "--approver", "ops", env=env)
            assert approved.returncode == 0
            # The hint names what resume needs, not just the operation id.
            assert b"--registry" in approved.stdout
            key = ["--audit-secret-env", "AUDIT_KEY"] if keyed else []
            done = await _cli(
                "operations", "resume", paused.operation_id, "--registry",
                "tests.cli_tools:REGISTRY", "--audit-file", str(trail), *key, env=env,
            )  # fmt: skip
            assert done.returncode == 0 and b"completed" in done.stdout, done.stderr
            verify = await _cli("audit", "verify", str(trail), "--secret-env", "AUDIT_KEY", env=env)
            verdicts.append((verify.returncode, verify.stdout + verify.stderr))
    (keyed_rc, keyed_out), (plain_rc, plain_out) = verdicts
    assert keyed_rc == 0 and b"ok:" in keyed_out, keyed_out
    assert plain_rc == 1 and b"does not match" in plain_out, plain_out


def test_listings_say_when_they_are_cut(seed: Seed) -> None:
    cut, whole, ops = run_all(
        ["approvals", "list", "--store", seed.url, "--limit", "2", "--json"],
        ["approvals", "list", "--store", seed.url, "--limit", "4", "--json"],
        ["operations", "list", "--store", seed.url, "--limit", "1"],
    )
    assert len(parsed(cut)) == 2 and "more than 2 approvals match" in cut.stderr
    assert len(parsed(whole)) == 4 and whole.stderr == ""
    assert "more than 1 operations match" in ops.stderr
    assert sum(line.startswith("op_") for line in ops.stdout.splitlines()) == 1


def test_resume_refuses_a_registry_it_cannot_load(seed: Seed) -> None:
    cases = [
        ("nonsense", "MODULE:ATTR"),
        ("tests.no_such_module:R", "cannot import"),
        ("tests.cli_tools:NOPE", "has no attribute"),
        ("tests.cli_tools:WeatherArgs", "not a Registry"),
    ]
    procs = run_all(
        *(["operations", "resume", seed.paused_op, "--registry", spec, "--store", seed.url]
          for spec, _ in cases)
    )  # fmt: skip
    for (spec, why), proc in zip(cases, procs, strict=True):
        assert proc.returncode == 2 and why in proc.stderr, spec


def test_resume_of_an_ended_operation_needs_no_provider_key(seed: Seed, tmp_path: Path) -> None:
    keyless = {k: v for k, v in cli_env().items() if not k.endswith(("_API_KEY", "_BASE_URL"))}
    ended, bad_audit = run_all(
        ["operations", "resume", "op_done", "--registry", "tests.cli_tools:REGISTRY",
         "--store", seed.url],
        ["operations", "resume", seed.paused_op, "--registry", "tests.cli_tools:REGISTRY",
         "--store", seed.url, "--audit-file", str(tmp_path / "no" / "such" / "a.jsonl")],
        env=keyless,
    )  # fmt: skip
    assert ended.returncode == 0, ended.stderr
    assert "is completed, not waiting for approval: nothing to resume" in ended.stderr
    assert "API_KEY" not in ended.stderr and "state      completed" in ended.stdout
    assert bad_audit.returncode == 2
    assert bad_audit.stderr.startswith("callgate operations resume: --audit-file: cannot open")
    assert "store" not in bad_audit.stderr  # the store is not to blame


# --- store URL ----------------------------------------------------------------------------


def test_store_url_from_env_else_the_default_file(tmp_path: Path) -> None:
    missing = run_cli("operations", "list", cwd=tmp_path)
    assert missing.returncode == 1 and "no SQLite database at './callgate.db'" in missing.stderr
    assert not (tmp_path / "callgate.db").exists()  # a listing never creates a database

    anyio.run(_empty_store, f"sqlite:///{tmp_path / 'callgate.db'}")
    here = run_cli("operations", "list", cwd=tmp_path)
    assert (here.returncode, here.stdout) == (0, "no operations match\n")

    elsewhere = tmp_path / "sub" / "other.db"
    elsewhere.parent.mkdir()
    anyio.run(_empty_store, f"sqlite:///{elsewhere}")
    env = cli_env(CALLGATE_STORE=f"sqlite:///{elsewhere}")
    assert run_cli("approvals", "list", "--json", env=env, cwd=elsewhere.parent).stdout == "[]\n"


async def _empty_store(url: str) -> None:
    async with open_store(url):
        pass


def test_a_store_password_is_never_printed() -> None:
    url = "postgresql://cg:hunter2@127.0.0.1:1/callgate"
    flagged, from_env, helped, unknown = run_all(
        ["approvals", "list", "--store", url],
        ["approvals", "list"],
        ["approvals", "list", "-h"],
        ["approvals", "list", "--store", "mysql://u:hunter2@h/db"],
        env=cli_env(CALLGATE_STORE=url),
    )
    for proc in (flagged, from_env):
        assert proc.returncode == 1
        assert "postgresql://cg:***@127.0.0.1:1/callgate" in proc.stderr
    assert unknown.returncode == 1 and "unknown store URL scheme 'mysql'" in unknown.stderr
    for proc in (flagged, from_env, helped, unknown):
        assert "hunter2" not in proc.stdout + proc.stderr


# --- demo -----------------------------------------------------------------------------


def test_demo_without_its_module_is_a_clear_error_not_a_traceback() -> None:
    code = (
        "import sys; sys.modules['callgate.engine.runtime.demo'] = None\n"
        "from callgate.engine.cli import main; raise SystemExit(main(['demo']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        "callgate demo: not available (callgate.engine.runtime.demo is not installed)\n"
    )


def test_demo_options_belong_to_the_demo_module() -> None:
    proc = run_cli("demo", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: callgate demo") and "--scenario" in proc.stdout
