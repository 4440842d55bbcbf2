"""The command line under hostile or mistaken input, run as real subprocesses (``python -m
callgate.engine.cli``, as tests/test_cli_admin.py does): integers beyond 64 bits in call
arguments, store URLs whose password sits in the query, malformed URLs, a listing pointed at
a database that is not callgate's, an unreadable snapshot, non-UTF-8 arguments, a closed or
endless standard input, and a few mistaken paths. None may end in a traceback or print a
store password. PostgreSQL cases run only when a server is configured (skipped exactly as
tests/test_cli_admin.py's are; CI requires them)."""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Sequence
from contextlib import redirect_stdout
from pathlib import Path

import anyio
import pytest

from callgate.engine.cli_audit import CliFailure
from callgate.engine.cli_errors import innermost, refuse_undecodable, scrub
from callgate.engine.core.errors import ConfigError, StoreError
from callgate.engine.store import OperationRecord, open_store, redact_url
from callgate.engine.store.url import url_secrets

from .cli_helpers import CLI, ROOT, cli_env, run_all
from .store_helpers import drop_schema, require_postgres, with_schema

SECRET = "s3cretPW"


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    (proc,) = run_all(args, env=env, cwd=cwd)
    assert SECRET not in proc.stdout + proc.stderr
    return proc


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def make_store(path: Path, *operations: OperationRecord) -> str:
    """A real callgate SQLite store at ``path`` (its schema applied), with ``operations``."""
    url = f"sqlite:///{path}"

    async def main() -> None:
        async with open_store(url) as store:
            for op in operations:
                await store.create_operation(op)

    anyio.run(main)
    return url


def operation(operation_id: str, snapshot: bytes) -> OperationRecord:
    now = time.time()
    return OperationRecord(
        operation_id=operation_id,
        tenant="acme",
        subject="bob",
        state="waiting_approval",
        snapshot=snapshot,
        created_at=now,
        updated_at=now,
    )


def sse_with_arguments(arguments: str) -> bytes:
    call = {"index": 0, "id": "call_1", "type": "function"}
    call["function"] = {"name": "f", "arguments": arguments}  # type: ignore[assignment]
    chunks = [
        {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
        {
            "id": "c1",
            "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
        },
    ]
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return body.encode()


# --- 1. decode: integers of any size -------------------------------------------------------


def test_decode_prints_integers_beyond_64_bits(tmp_path: Path) -> None:
    big, small = 2**64, -(2**70) - 1
    body = tmp_path / "big.sse"
    body.write_bytes(sse_with_arguments(json.dumps({"x": big, "y": small, "z": 1})))
    proc = run_cli("decode", "--provider", "openai_chat", str(body))
    assert proc.returncode == 0, proc.stderr
    (call,) = json.loads(proc.stdout)["calls"]
    assert call["arguments"] == {"x": big, "y": small, "z": 1}


# --- 2. passwords in the query string -------------------------------------------------------


def test_redact_url_masks_query_passwords_and_survives_garbage() -> None:
    url = (
        f"postgresql://u:{SECRET}@h:5432/db?sslmode=require&password={SECRET}&passfile=/p/{SECRET}"
    )
    redacted = redact_url(url)
    assert SECRET not in redacted
    assert redacted.startswith("postgresql://u:***@h:5432/db?sslmode=require&password=***")
    assert "passfile=***" in redacted
    assert (
        redact_url(f"postgresql://u@h/db?PassWord={SECRET}") == "postgresql://u@h/db?PassWord=***"
    )
    assert redact_url("sqlite:///x.db?synchronous=FULL") == "sqlite:///x.db?synchronous=FULL"
    assert redact_url(f"postgresql://u:{SECRET}@[::1") == "<unparseable store URL>"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://bob:pa?ss{SECRET}@127.0.0.1:1/db",  # "?" ends urlsplit's authority
        f"postgresql://bob:pa?ss{SECRET}@127.0.0.1/db",
        f"postgresql://bob:p#a{SECRET}@h/db",
        f"postgresql://bob:pa/s{SECRET}@h/db?password={SECRET}",
        f"postgresql://bob:a@b{SECRET}@h/db",
    ],
)
def test_a_password_with_unencoded_delimiters_is_masked_whole(url: str) -> None:
    # urlsplit found no password (or half of one) in these: the URL was printed whole.
    redacted = redact_url(url)
    assert SECRET not in redacted and redacted.startswith("postgresql://bob:***@")
    assert any(SECRET in s for s in url_secrets(url))
    proc = run_cli("approvals", "list", "--store", url)
    assert proc.returncode == 1 and proc.stderr
    password = url.split("bob:", 1)[1].rsplit("@", 1)[0]
    head = password.split(SECRET, 1)[0]  # the part before the secret, as a parser cuts it
    assert SECRET not in proc.stderr and f"'{head}'" not in proc.stderr, proc.stderr


def test_sqlite_options_error_does_not_echo_a_password(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    proc = run_cli("approvals", "list", "--store", f"sqlite:///{db}?password={SECRET}")
    assert proc.returncode == 1
    assert "synchronous" in one_line(proc)


def test_connection_error_does_not_echo_a_query_password() -> None:
    pytest.importorskip("asyncpg")
    url = f"postgresql://u@127.0.0.1:1/db?password={SECRET}&passfile=/tmp/{SECRET}"
    proc = run_cli("approvals", "list", "--store", url)
    assert proc.returncode == 1
    assert "password=***" in one_line(proc)


# --- 3. the interactive demo's instructions -------------------------------------------------


def test_interactive_demo_prints_the_redacted_store_url(tmp_path: Path) -> None:
    from callgate.engine.runtime import demo
    from callgate.engine.runtime.demo_processes import DemoPaths
    from callgate.engine.runtime.demo_scenarios import SCENARIOS

    plan = demo._Plan(
        scenario=SCENARIOS["refund"],
        provider="openai_chat",
        model="m",
        paths=DemoPaths(tmp_path),
        # Nothing listens on port 1: the demo prints its instructions, then fails to connect.
        store_url=f"postgresql://u:{SECRET}@127.0.0.1:1/db?password={SECRET}",
        operation_id="op_1",
        live=False,
        interactive=True,
    )
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises((StoreError, ModuleNotFoundError)):
        anyio.run(demo._wait_for_person, plan, 2, ["apr_1"])
    text = out.getvalue()
    assert "callgate approvals approve apr_1 --store" in text
    assert SECRET not in text
    assert "postgresql://u:***@127.0.0.1:1/db?password=***" in text


# --- 4. malformed store URLs ----------------------------------------------------------------

MALFORMED = [
    "sqlite://[bad",
    f"postgresql://u:{SECRET}@[::1",
    f"postgresql://u:{SECRET}@host:notaport/db",
]


@pytest.mark.parametrize("url", MALFORMED)
def test_malformed_store_url_is_one_line(url: str) -> None:
    proc = run_cli("operations", "list", "--store", url)
    assert proc.returncode == 1
    assert "store URL" in one_line(proc)


@pytest.mark.parametrize("url", MALFORMED)
def test_malformed_store_url_in_the_demo_is_one_line(url: str, tmp_path: Path) -> None:
    proc = run_cli("demo", "--store", url, "--workdir", str(tmp_path))
    assert proc.returncode == 2
    assert "store URL" in one_line(proc)
    assert not proc.stdout


def test_open_store_refuses_malformed_urls_with_config_error() -> None:
    for url in MALFORMED:
        with pytest.raises(ConfigError) as info:
            open_store(url)
        assert SECRET not in str(info.value)


# --- 5. no admin command migrates -------------------------------------------------------------


def test_admin_commands_refuse_a_foreign_sqlite_file_and_leave_it_alone(tmp_path: Path) -> None:
    db = tmp_path / "foreign.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    url = f"sqlite:///{db}"
    for argv in (
        ["approvals", "list"],
        ["approvals", "show", "apr_1"],
        ["operations", "list", "--json"],
        ["operations", "show", "op_1"],
        # Decisions and resume write, but a file without callgate's schema holds nothing
        # to decide or resume: they must not turn it into a callgate store either.
        ["approvals", "approve", "apr_1", "--approver", "ann"],
        ["approvals", "deny", "apr_1", "--approver", "ann", "--reason", "no"],
        ["operations", "resume", "op_1", "--registry", "tests.cli_tools:REGISTRY"],
    ):
        proc = run_cli(*argv, "--store", url)
        assert proc.returncode == 1, argv
        assert "no callgate schema" in one_line(proc)
    conn = sqlite3.connect(db)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    conn.close()
    assert tables == {"notes"}
    assert mode != "wal"


def test_listing_and_deciding_still_work_on_a_callgate_store(tmp_path: Path) -> None:
    url = make_store(tmp_path / "callgate.db", operation("op_1", b"{}"))
    proc = run_cli("operations", "list", "--json", "--store", url)
    assert proc.returncode == 0, proc.stderr
    assert [r["operation_id"] for r in json.loads(proc.stdout)] == ["op_1"]
    proc = run_cli("approvals", "approve", "apr_nope", "--approver", "ann", "--store", url)
    assert proc.returncode == 1
    assert "no approval 'apr_nope'" in one_line(proc)


@pytest.mark.postgres
def test_listing_does_not_create_a_mistyped_postgres_schema() -> None:
    base = require_postgres()
    schema = f"cli_typo_{uuid.uuid4().hex[:12]}"
    try:
        proc = run_cli("approvals", "list", "--store", with_schema(base, schema))
        assert proc.returncode == 1
        assert "no callgate schema" in one_line(proc)

        async def exists() -> bool:
            import asyncpg

            conn = await asyncpg.connect(base)
            try:
                found = await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema)
            finally:
                await conn.close()
            return found is not None

        assert not anyio.run(exists)
    finally:
        anyio.run(drop_schema, schema)


# --- 6. an unreadable snapshot --------------------------------------------------------------


@pytest.mark.parametrize("snapshot", [b"{}", b"not json at all", b'{"provider": 7}'])
def test_resume_of_an_unreadable_snapshot_is_one_line(tmp_path: Path, snapshot: bytes) -> None:
    url = make_store(tmp_path / "callgate.db", operation("op_bad", snapshot))
    proc = run_cli(
        *("operations", "resume", "op_bad", "--registry", "tests.cli_tools:REGISTRY"),
        *("--provider", "openai_chat", "--model", "m", "--store", url),
        # Never reached: the snapshot is read before the model is called.
        env=cli_env(OPENAI_API_KEY="sk-test", OPENAI_BASE_URL="http://127.0.0.1:1"),
    )
    assert proc.returncode == 1
    assert "snapshot" in one_line(proc)


@pytest.mark.parametrize("model", [" gpt-4o", "gpt\x1b[2J", ""])
def test_resume_of_a_snapshot_naming_an_unsendable_model_asks_for_model(
    tmp_path: Path, model: str
) -> None:
    # Usage (exit 2, "pass --model"), as for a snapshot naming none: the operation still
    # waits, and exit 1 would read "ended badly".
    snapshot = json.dumps({"provider": "openai_chat", "model": model}).encode()
    url = make_store(tmp_path / "callgate.db", operation("op_odd", snapshot))
    proc = run_cli(
        *("operations", "resume", "op_odd", "--registry", "tests.cli_tools:REGISTRY"),
        *("--store", url),
        env=cli_env(OPENAI_API_KEY="sk-test", OPENAI_BASE_URL="http://127.0.0.1:1"),
    )
    assert proc.returncode == 2
    line = one_line(proc)
    assert "pass --model" in line and "\x1b" not in line


def test_resume_of_a_snapshot_naming_an_unknown_provider_asks_for_provider(
    tmp_path: Path,
) -> None:
    # A provider name this callgate does not know (another version's, or a garbled one) is
    # a usage error (2, "pass --provider"), like a snapshot naming none: the operation
    # still waits, and exit 1 would read "ended badly".
    snapshot = json.dumps({"provider": "openai_chatt", "model": "gpt-4o"}).encode()
    url = make_store(tmp_path / "callgate.db", operation("op_odd", snapshot))
    proc = run_cli(
        *("operations", "resume", "op_odd", "--registry", "tests.cli_tools:REGISTRY"),
        *("--store", url),
        env=cli_env(OPENAI_API_KEY="sk-test", OPENAI_BASE_URL="http://127.0.0.1:1"),
    )
    assert proc.returncode == 2
    assert "pass --provider (one of anthropic, " in one_line(proc)


# --- 7. non-UTF-8 arguments -----------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["approvals", "show", "apr_\udcff"],
        ["approvals", "list", "--operation", "\udcff"],
        ["approvals", "approve", "apr_1", "--approver", "ann\udcff"],
        ["operations", "show", "op_\udcff"],
    ],
)
def test_non_utf8_arguments_are_refused(tmp_path: Path, argv: list[str]) -> None:
    url = make_store(tmp_path / "callgate.db")
    proc = run_cli(*argv, "--store", url)
    assert proc.returncode == 2
    assert "UTF-8" in one_line(proc)


# --- 8, 9. decode's standard input and endless files ----------------------------------------


def _raw(argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [*CLI, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=cli_env(),
        timeout=120,
        check=False,
        **kwargs,  # type: ignore[arg-type]
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_decode_from_a_closed_stdin_is_a_usage_error() -> None:
    proc = _raw(["decode", "--provider", "openai_chat", "-"], preexec_fn=lambda: os.close(0))
    assert proc.returncode == 2
    assert "standard input" in one_line(proc)


def _limit_memory() -> None:
    cap = 1 << 30  # far above what a streaming decode needs, far below "all of /dev/zero"
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
@pytest.mark.parametrize("chunk", [[], ["--chunk-size", "4096"]])
def test_decode_streams_an_endless_file_into_the_cap(chunk: list[str]) -> None:
    argv = ["decode", "--provider", "openai_chat", *chunk, "/dev/zero"]
    proc = _raw(argv, preexec_fn=_limit_memory)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["kind"] == "failed"
    assert "max_line_bytes" in out["stop_reason"]


def test_decode_in_chunks_matches_decode_whole(tmp_path: Path) -> None:
    body = tmp_path / "b.sse"
    body.write_bytes(sse_with_arguments('{"city": "Paris"}'))
    whole = run_cli("decode", "--provider", "openai_chat", str(body))
    for size in ("1", "7", "65536"):
        part = run_cli("decode", "--provider", "openai_chat", "--chunk-size", size, str(body))
        assert part.returncode == whole.returncode == 0
        assert part.stdout == whole.stdout


@pytest.mark.parametrize("size", ["0", "-3", "67108865", "100000000000", "99999999999999999999"])
def test_decode_refuses_a_chunk_size_out_of_range(size: str) -> None:
    # A read of that size is allocated up front: a huge one must fail at once, in words.
    proc = run_cli("decode", "--provider", "openai_chat", "--chunk-size", size, "/dev/null")
    assert proc.returncode == 2
    assert one_line(proc) == "callgate decode: --chunk-size must be 1 to 67108864"


def test_fixtures_into_a_closed_pipe_ends_quietly() -> None:
    proc = subprocess.run(
        f"{' '.join(CLI)} fixtures | head -1", shell=True, cwd=ROOT, capture_output=True,
        text=True, check=False, executable="/bin/bash",
    )  # fmt: skip
    assert proc.stdout.count("\n") == 1 and proc.stderr == ""


# --- 10. mistaken paths and registries ------------------------------------------------------


def test_demo_workdir_that_is_a_file(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    proc = run_cli("demo", "--workdir", str(afile))
    assert proc.returncode == 2
    assert "--workdir" in one_line(proc)


def test_the_demo_into_a_reader_that_went_away_ends_quietly(tmp_path: Path) -> None:
    # The demo writes with print(), not cli_output: a reader that went away (| head) is a
    # bare BrokenPipeError there, which must end as the shell's SIGPIPE status with
    # nothing on stderr, like every other command's answer, never as a traceback.
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [*CLI, "demo", "--scenario", "refusal", "--workdir", str(tmp_path / "w")],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=cli_env(),
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_registry_callable_that_needs_arguments(tmp_path: Path) -> None:
    url = make_store(tmp_path / "callgate.db", operation("op_1", b"{}"))
    proc = run_cli(
        *("operations", "resume", "op_1", "--registry", "tests.cli_tools:get_weather"),
        *("--store", url),
    )
    assert proc.returncode == 2
    assert "--registry" in one_line(proc)


def test_fixtures_with_a_directory_named_like_a_stream(tmp_path: Path) -> None:
    (tmp_path / "openai_chat" / "odd.sse").mkdir(parents=True)
    proc = run_cli("fixtures", str(tmp_path))
    assert proc.returncode == 2
    assert "odd.sse" in one_line(proc)


def test_fixtures_of_a_directory_that_does_not_exist_is_a_usage_error(tmp_path: Path) -> None:
    # A mistyped directory is unusable input (2), like an unreadable stream in it; 1 would
    # read as "refused" by a store or record.
    proc = run_cli("fixtures", str(tmp_path / "nope"))
    assert (proc.returncode, proc.stdout) == (2, "")
    assert one_line(proc) == f"callgate fixtures: no such directory {tmp_path / 'nope'}"


def test_a_store_path_the_file_system_refuses_is_one_line(tmp_path: Path) -> None:
    # A file name past the file system's limit: checking for the file raises OSError
    # (ENAMETOOLONG) rather than saying "no such file"; it is a refusal (1) naming the
    # store, not a traceback.
    url = f"sqlite:///{tmp_path / ('a' * 300)}.db"
    proc = run_cli("operations", "list", "--store", url)
    assert (proc.returncode, proc.stdout) == (1, "")
    line = one_line(proc)
    assert line.startswith(f"callgate operations list: store {url}: ")
    assert "File name too long" in line


# --- 11. a fragment in a SQLite URL ---------------------------------------------------------


def test_sqlite_url_with_a_fragment_is_refused(tmp_path: Path) -> None:
    make_store(tmp_path / "a")  # what the cut-off path would silently open
    url = f"sqlite:///{tmp_path / 'a#b.db'}"
    with pytest.raises(ConfigError, match="#"):
        open_store(url)
    proc = run_cli("operations", "list", "--store", url)
    assert proc.returncode == 1
    assert "#" in one_line(proc)


def test_a_short_password_is_masked_as_a_credential_without_garbling_the_message() -> None:
    # Masked everywhere, a one-character password would star out that character across
    # the message (the address, the redacted URL itself).
    assert scrub("store postgresql://u:p@127.0.0.1:1/db: peer 127.0.0.1 refused", URL_1) == (
        "store postgresql://u:***@127.0.0.1:1/db: peer 127.0.0.1 refused"
    )
    quoted = "dsn user=u password=1 host=127.0.0.1; also postgresql://u:1@h?password=1"
    assert scrub(quoted, "postgresql://u:1@h?password=1") == (
        "dsn user=u password=*** host=127.0.0.1; also postgresql://u:***@h?password=***"
    )
    assert scrub("conninfo: password='ab' host=h1", "postgresql://u:ab@h1/db") == (
        "conninfo: password='***' host=h1"
    )
    # A longer secret is masked wherever a driver quoted it.
    assert scrub(f"auth failed for {SECRET}", f"postgresql://u:{SECRET}@h/db") == (
        "auth failed for ***"
    )


def test_a_secret_of_exactly_the_short_length_is_masked_wherever_it_appears() -> None:
    # Only secrets shorter than 4 characters are masked just where they stand as a
    # credential; a 4-character password quoted anywhere else by a driver is masked too.
    assert scrub("auth failed for abcd at h", "postgresql://u:abcd@h/db") == (
        "auth failed for *** at h"
    )


def test_only_a_path_argument_may_hold_bytes_that_are_not_utf8() -> None:
    # A path is handed to the file system as it was typed (any bytes it allows); every
    # other argument is stored, compared or printed, so it must be UTF-8 text.
    path = os.fsdecode(b"/tmp/trail-\xff.jsonl")
    refuse_undecodable(argparse.Namespace(audit_file=path, operation_id="op_1"), "sqlite:///x")
    with pytest.raises(CliFailure, match="argument operation-id is not valid UTF-8") as info:
        refuse_undecodable(argparse.Namespace(audit_file=None, operation_id=path), "sqlite:///x")
    assert info.value.status == 2


def test_only_a_group_of_one_failure_is_unwrapped() -> None:
    # A task group wraps a single failure: that failure decides the exit status. A group
    # of several is no single refusal (nor a single failed write) and stays what it is.
    inner = OSError("x")
    assert innermost(ExceptionGroup("g", [ExceptionGroup("h", [inner])])) is inner
    several = ExceptionGroup("g", [inner, ValueError("y")])
    assert innermost(several) is several


URL_1 = "postgresql://u:p@127.0.0.1:1/db"


def test_a_snapshot_nested_past_the_decoder_guard_is_a_refusal_not_a_traceback(
    tmp_path: Path,
) -> None:
    # Valid JSON 100,000 levels deep raised RecursionError out of both snapshot readers.
    deep = b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # a field no view reads
    url = make_store(tmp_path / "x.db", operation("op_deep", deep))
    show = run_cli("operations", "show", "op_deep", "--store", url)
    assert show.returncode == 0 and "not readable" in show.stdout, show.stderr
    resume = run_cli(
        "operations", "resume", "op_deep", "--registry", "tests.cli_tools:REGISTRY",
        "--provider", "openai_chat", "--model", "m", "--store", url,
        env=cli_env(OPENAI_API_KEY="sk-test", OPENAI_BASE_URL="http://127.0.0.1:9"),
    )  # fmt: skip
    assert resume.returncode == 1 and "nests too deeply" in one_line(resume)
    assert "Traceback" not in show.stderr + resume.stderr


def test_a_listing_limit_past_the_ceiling_is_a_usage_error(tmp_path: Path) -> None:
    url = make_store(tmp_path / "x.db")
    for command in ("approvals", "operations"):
        proc = run_cli(command, "list", "--limit", str(2**63 - 1), "--store", url)
        assert proc.returncode == 2 and "from 1 to 1000000" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_a_listing_limit_or_claim_window_below_one_is_a_usage_error(tmp_path: Path) -> None:
    # --limit 0 would list nothing and still say "more than 0 match"; a claim window of 0
    # seconds would take over a live worker's claim at once. Both are refused by argparse.
    url = make_store(tmp_path / "x.db")
    resume = ("operations", "resume", "op_1", "--registry", "tests.cli_tools:REGISTRY")
    *listings, stale = run_all(
        ["approvals", "list", "--limit", "0", "--store", url],
        ["operations", "list", "--limit", "0", "--store", url],
        [*resume, "--claim-stale-after", "0", "--store", url],
    )
    for proc in listings:
        assert proc.returncode == 2 and "from 1 to 1000000, got 0" in proc.stderr, proc.stderr
    assert stale.returncode == 2
    assert "must be a positive number of seconds, not '0'" in stale.stderr


def test_a_closed_stdout_is_refused_before_anything_is_done(tmp_path: Path) -> None:
    # approvals approve --json with stdout closed recorded the decision, then ended in a
    # traceback (its answer had nowhere to go).
    url = make_store(tmp_path / "x.db")
    proc = subprocess.run(
        ["bash", "-c", 'exec "$@" >&-', "bash", *CLI, "operations", "list", "--store", url],
        capture_output=False,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=cli_env(),
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr == "callgate: standard output is closed; nothing was done\n"
