"""What the command line writes, run as real subprocesses (``python -m callgate.engine.cli``):
an answer that cannot be written (``/dev/full``, a reader that went away) is told apart
from a store error, and a recorded decision says it was recorded; outside text (stored ids
and reasons, an engine message quoting them, a file name, a typed argument) never reaches
the terminal with its control, separator or bidi characters; every ``--help`` reads as
written.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import msgspec
import pytest

from callgate.engine.cli_output import terminal_text
from callgate.engine.store import ApprovalRecord, OperationRecord, open_store

from .cli_helpers import CLI, ROOT, cli_env, run_all

NOSPACE = (
    "cannot write the answer to standard output (No space left on device); nothing was changed"
)
HOSTILE = "\x1b[2J\u202e"  # clear the screen, then reverse what follows
SHOWN = "\\x1b[2J\\u202e"
OP = f"op_{HOSTILE}x"


def _record(operation_id: str, state: str = "waiting_approval", **kw: str) -> OperationRecord:
    now = time.time()
    fields = {"tenant": "acme", "subject": "bob", **kw}
    return OperationRecord(
        operation_id=operation_id,
        state=state,
        snapshot=b"{}",
        created_at=now,
        updated_at=now,
        **fields,
    )


def _approval(approval_id: str, operation_id: str, tool: str = "refund") -> ApprovalRecord:
    now = time.time()
    return ApprovalRecord(
        approval_id=approval_id,
        operation_id=operation_id,
        call_id="call_1",
        tool=tool,
        schema_version="1",
        args_digest="ef" * 32,
        policy_revision="p1",
        tenant="acme",
        subject="bob",
        created_at=now - 60,
        expires_at=now + 3600,
    )


def make_store(path: Path, operations: int = 1) -> str:
    """A callgate SQLite store: ``operations`` plain operations, one with hostile id,
    tenant and subject, and approvals apr_1/apr_2 (apr_2's tool name is hostile, and it
    is denied with a hostile reason)."""
    url = f"sqlite:///{path}"

    async def main() -> None:
        async with open_store(url) as store:
            for i in range(operations):
                await store.create_operation(_record(f"op_{i:05}"))
            await store.create_operation(
                _record(OP, tenant=f"acme{HOSTILE}", subject=f"bob{HOSTILE}")
            )
            await store.create_approval(_approval("apr_1", "op_00000"))
            await store.create_approval(_approval("apr_2", OP, tool=f"refund{HOSTILE}"))
            await store.decide_approval(
                "apr_2", False, f"ann{HOSTILE}", f"too big{HOSTILE}", now=time.time()
            )

    anyio.run(main)
    return url


def _run(argv: Sequence[str], stdout: int, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = subprocess.run(
        [*CLI, *argv],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env or cli_env(),
        timeout=120,
        check=False,
    )
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stderr


def into_full(*argv: str) -> tuple[int, str]:
    with open("/dev/full", "wb") as full:
        return _run(argv, full.fileno())


def into_closed_pipe(*argv: str) -> tuple[int, str]:
    """stdout a pipe whose reader has already gone: every write is EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        return _run(argv, write)
    finally:
        os.close(write)


# --- 1. an answer that cannot be written ---------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "decision"),
    [
        (["approve", "apr_1", "--approver", "ann"], "approved apr_1 by ann"),
        (["deny", "apr_1", "--approver", "bob", "--reason", "no", "--json"], "denied apr_1 by bob"),
    ],
)
def test_a_decision_whose_answer_cannot_be_written_says_it_was_recorded(
    tmp_path: Path, argv: list[str], decision: str
) -> None:
    url = make_store(tmp_path / "x.db")
    status, err = into_full("approvals", *argv, "--store", url)
    assert (status, err) == (
        4,
        f"callgate approvals {argv[0]}: the decision ({decision}) was recorded, but its "
        "answer could not be written to standard output (No space left on device)\n",
    )
    assert "store" not in err
    (shown,) = run_all(["approvals", "show", "apr_1", "--json", "--store", url])
    assert json.loads(shown.stdout)["status"] == decision.split(maxsplit=1)[0]


def test_a_decision_into_a_reader_that_went_away_says_it_was_recorded(tmp_path: Path) -> None:
    # Not the quiet end of a listing: the decision stands, and its answer is lost.
    url = make_store(tmp_path / "x.db")
    status, err = into_closed_pipe(
        "approvals", "approve", "apr_1", "--approver", "x", "--store", url
    )
    assert status == 4 and "the decision (approved apr_1 by x) was recorded" in err
    assert "(Broken pipe)" in err and "store" not in err


def test_a_command_that_changed_nothing_and_cannot_write_exits_2(tmp_path: Path) -> None:
    url = make_store(tmp_path / "x.db")
    trail = tmp_path / "t.jsonl"
    trail.write_text("")
    for argv, prog in [
        (["operations", "list", "--store", url], "callgate operations list"),
        (["operations", "list", "--json", "--store", url], "callgate operations list"),
        (["approvals", "show", "apr_1", "--store", url], "callgate approvals show"),
        (["operations", "show", "op_00000", "--store", url], "callgate operations show"),
        (["audit", "verify", str(trail)], "callgate audit verify"),
        (["states"], "callgate states"),
        (["decode", "--provider", "openai_chat", "/dev/null"], "callgate decode"),
        (["--help"], "callgate"),
    ]:
        status, err = into_full(*argv)
        assert (status, err) == (2, f"{prog}: {NOSPACE}\n"), argv


def test_a_reader_that_went_away_ends_quietly(tmp_path: Path) -> None:
    url = make_store(tmp_path / "x.db")
    for argv in (
        ["operations", "list", "--store", url],
        ["operations", "list", "--json", "--store", url],
        ["approvals", "list", "--store", url],
        ["operations", "show", OP, "--store", url],
        ["fixtures"],
        ["states"],
        ["operations", "--help"],
    ):
        assert into_closed_pipe(*argv) == (141, ""), argv


def test_operations_list_into_head_prints_no_store_error(tmp_path: Path) -> None:
    # Many rows (far past a pipe's buffer) into `| head -1`: it was "store …: [Errno 32]
    # Broken pipe", exit 1.
    url = make_store(tmp_path / "x.db", operations=3000)
    proc = subprocess.run(
        f"{' '.join(CLI)} operations list --limit 5000 --store {url} | head -1; "
        'exit "${PIPESTATUS[0]}"',
        shell=True, cwd=ROOT, capture_output=True, text=True, check=False,
        executable="/bin/bash", env=cli_env(),
    )  # fmt: skip
    assert proc.stdout.startswith("OPERATION") and proc.stdout.count("\n") == 1
    assert proc.stderr == "" and proc.returncode in (0, 141)


# --- 2. outside text on the terminal -------------------------------------------------------


def test_terminal_text_spells_out_every_unsafe_character() -> None:
    unsafe = [
        *map(chr, range(0x20)), "\x7f", *map(chr, range(0x80, 0xA0)),
        "\u2028", "\u2029", *map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A)),
        "\udcff",
    ]  # fmt: skip
    for char in unsafe:
        out = terminal_text(f"a{char}b")
        assert out.startswith("a\\") and out.endswith("b") and char not in out, repr(char)
    assert terminal_text("\x1b[2J") == "\\x1b[2J" and terminal_text("\u202e") == "\\u202e"
    # Ordinary text (and an existing escape: backslashes are not doubled) is left alone.
    for text in ("plain – “quoted” 日本 ✓", "already \\x1b escaped", "a\\b"):
        assert terminal_text(text) == text


def test_terminal_text_spells_each_unsafe_character_in_its_own_width() -> None:
    # Below U+0100 (C0, DEL, C1) a character is spelled \xNN, above it \uNNNN: the
    # spelling is what an operator copies back (an id with a C1 control), so it is exact.
    assert terminal_text("a\x85b\x9fc\x7f") == "a\\x85b\\x9fc\\x7f"
    assert terminal_text("\u2028\u2066\udcff") == "\\u2028\\u2066\\udcff"


def test_stored_text_shows_escaped_in_every_view(tmp_path: Path) -> None:
    url = make_store(tmp_path / "x.db")
    store = ("--store", url)
    procs = run_all(
        ["operations", "list", *store],
        ["operations", "show", OP, *store],
        ["approvals", "list", *store],
        ["approvals", "show", "apr_2", *store],
    )
    for proc in procs:
        assert proc.returncode == 0, proc.stderr
        assert "\x1b" not in proc.stdout and "\u202e" not in proc.stdout, proc.args
        assert f"op_{SHOWN}x" in proc.stdout, proc.args
    ops_list, op_show, apr_list, apr_show = (p.stdout for p in procs)
    assert f"acme{SHOWN}" in ops_list and f"bob{SHOWN}" in op_show
    assert f"refund{SHOWN}" in apr_list and f"by ann{SHOWN}: too big{SHOWN}" in apr_show


def test_an_approval_decided_in_time_never_shows_as_expired(tmp_path: Path) -> None:
    # "pending (expired)" tells an operator that a pending approval can no longer be
    # decided; one decided before its expiry stays "approved" in every view afterwards.
    url = f"sqlite:///{tmp_path / 'd.db'}"
    now = time.time()

    async def main() -> None:
        async with open_store(url) as store:
            record = _approval("apr_1", "op_1")
            await store.create_approval(
                msgspec.structs.replace(record, created_at=now - 120, expires_at=now - 60)
            )
            await store.decide_approval("apr_1", True, "ann", None, now=now - 90)

    anyio.run(main)
    listed, shown = run_all(
        ["approvals", "list", "--store", url], ["approvals", "show", "apr_1", "--store", url]
    )
    assert listed.returncode == shown.returncode == 0
    assert listed.stdout.splitlines()[1].split()[:2] == ["apr_1", "approved"]
    assert "status     approved\n" in shown.stdout
    assert "expired" not in listed.stdout + shown.stdout


def test_operations_show_of_an_ended_operation(tmp_path: Path) -> None:
    # What `operations show` prints of an operation that has ended: a final text of exactly
    # the preview length in full (one character more is cut, with "…"), every approval of
    # the operation, and no "paused turn" (its proposed calls are only a pause's).
    url = f"sqlite:///{tmp_path / 's.db'}"
    snapshot = {
        "outcome": {"calls": [{"call_id": "c_9", "name": "refund"}]},
        # Read without trusting its shape: only string approval ids are approvals.
        "approvals": {"c_9": "apr_a", "c_8": 7, "c_7": {"id": "apr_b"}},
    }

    async def main() -> None:
        async with open_store(url) as store:
            for op_id, text in (("op_200", "x" * 200), ("op_201", "y" * 201)):
                await store.create_operation(
                    msgspec.structs.replace(
                        _record(op_id, state="completed"),
                        snapshot=json.dumps(snapshot | {"text": text}).encode(),
                    )
                )
            await store.create_approval(_approval("apr_a", "op_200"))
            await store.create_approval(_approval("apr_b", "op_200"))

    anyio.run(main)
    full, cut, as_json = run_all(
        ["operations", "show", "op_200", "--store", url],
        ["operations", "show", "op_201", "--store", url],
        ["operations", "show", "op_200", "--json", "--store", url],
    )
    assert full.returncode == cut.returncode == as_json.returncode == 0, full.stderr + cut.stderr
    assert json.loads(as_json.stdout)["snapshot"]["waiting_on"] == {"c_9": "apr_a"}
    assert f"text       {'x' * 200}\n" in full.stdout and "…" not in full.stdout
    assert f"text       {'y' * 200}…\n" in cut.stdout
    rows = full.stdout.split("approvals\n", 1)[1].splitlines()
    assert [r.split()[0] for r in rows[1:3]] == ["apr_a", "apr_b"]
    assert "paused turn" not in full.stdout and "c_9" not in full.stdout


def test_a_backslash_in_a_stored_id_is_doubled_so_it_reads_apart_from_an_escape(
    tmp_path: Path,
) -> None:
    # An id holding the four characters \x1b must not look like one holding ESC (shown
    # \x1b): text views double a stored backslash.
    url = f"sqlite:///{tmp_path / 'b.db'}"

    async def main() -> None:
        async with open_store(url) as store:
            await store.create_operation(_record("op_\\x1b", state="completed"))
            await store.create_operation(_record("op_\x1b", state="completed"))

    anyio.run(main)
    (listed,) = run_all(["operations", "list", "--store", url])
    ids = sorted(line.split()[0] for line in listed.stdout.splitlines()[1:])
    assert ids == ["op_\\\\x1b", "op_\\x1b"]


def test_error_lines_show_outside_text_escaped(tmp_path: Path) -> None:
    url = make_store(tmp_path / "x.db")
    odd = tmp_path / f"trail{HOSTILE}.jsonl"
    resume_env = cli_env(OPENAI_API_KEY="sk-test", OPENAI_BASE_URL="http://127.0.0.1:9")
    missing, unreadable, typed, verify, decode = run_all(
        ["operations", "show", f"nope{HOSTILE}", "--store", url],
        # The engine's own message quotes the id: "operation …: its stored snapshot is …".
        ["operations", "resume", OP, "--registry", "tests.cli_tools:REGISTRY",
         "--provider", "openai_chat", "--model", "m", "--store", url],
        ["states", HOSTILE],
        ["audit", "verify", str(odd)],
        ["decode", "--provider", "openai_chat", str(odd)],
        env=resume_env,
    )  # fmt: skip
    assert missing.returncode == 1 and f"no operation 'nope{SHOWN}'" in missing.stderr
    assert unreadable.returncode == 1 and f"operation op_{SHOWN}x: its stored" in unreadable.stderr
    assert typed.returncode == 2 and f"unrecognized arguments: {SHOWN}" in typed.stderr
    for proc in (verify, decode):
        assert proc.returncode == 2 and f"cannot read {tmp_path}/trail{SHOWN}.jsonl" in proc.stderr
    for proc in (missing, unreadable, typed, verify, decode):
        assert "\x1b" not in proc.stderr and "\u202e" not in proc.stderr, proc.args


def test_text_the_output_encoding_cannot_hold_is_escaped_not_a_traceback(tmp_path: Path) -> None:
    # An ASCII (or cp1252) stdout and a tenant "café": a UnicodeEncodeError traceback.
    url = f"sqlite:///{tmp_path / 'e.db'}"

    async def main() -> None:
        async with open_store(url) as store:
            await store.create_operation(_record("op_cafe", state="completed", tenant="caf\u00e9"))

    anyio.run(main)
    proc = subprocess.run(
        [*CLI, "operations", "list", "--store", url],
        capture_output=True,
        cwd=ROOT,
        env={**cli_env(), "PYTHONIOENCODING": "ascii"},
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
    assert b"caf\\xe9" in proc.stdout


def test_audit_verify_refuses_an_operation_id_that_is_not_utf8(tmp_path: Path) -> None:
    # A lone surrogate (bytes that are not UTF-8) reached the JSON report: a traceback.
    trail = tmp_path / "trail.jsonl"
    trail.write_text("\n")
    proc = subprocess.run(
        [*CLI, "audit", "verify", str(trail), "--operation", "op_\udcff", "--json"],
        capture_output=True,
        cwd=ROOT,
        env=cli_env(),
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2 and b"Traceback" not in proc.stderr, proc.stderr
    assert b"argument --operation is not valid UTF-8 text" in proc.stderr


# --- 5. help texts read as written -----------------------------------------------------------


def test_every_help_reads_as_written() -> None:
    top, operations, approvals, audit, resume, verify, decide = run_all(
        ["--help"],
        ["operations", "--help"],
        ["approvals", "--help"],
        ["audit", "--help"],
        ["operations", "resume", "--help"],
        ["audit", "verify", "--help"],
        ["approvals", "approve", "--help"],
    )
    for proc in (top, operations, approvals, audit, resume, verify, decide):
        assert proc.returncode == 0 and proc.stderr == "", proc.args
    # The top-level description was the docstring's first line, cut mid-sentence.
    assert "wires the engine to\nthe adapters" not in top.stdout
    assert "``" not in top.stdout
    assert "  approvals list|show|approve|deny   decide the calls paused for a human\n" in (
        top.stdout
    )
    assert "\n  4    something was recorded" in top.stdout
    # Group commands had no description at all.
    assert "List and show the operations in the store" in operations.stdout
    assert "List, show and decide the approvals" in approvals.stdout
    assert "Verify a tamper-evident audit trail" in audit.stdout
    # Exit statuses are a list, laid out as written (not re-wrapped into one paragraph).
    for line in (
        "exit status:",
        "  3  another worker holds its claim: nothing was resumed",
        "  5  it still waits on an approval nobody has decided: nothing ran",
    ):
        assert f"\n{line}\n" in resume.stdout, line
    assert "\n  1  broken, or no records\n" in verify.stdout
    assert "\n  4  the decision was recorded, but its answer could not be written to\n" in (
        decide.stdout
    )
