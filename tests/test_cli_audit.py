"""``callgate audit verify`` run as a real subprocess: an intact trail verifies, and edited,
deleted and reordered copies are each named at the right record (with a secret, an
expected head, and a file shared by several operations).
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from callgate.engine.core.audit import AuditChain
from callgate.engine.runtime.audit_sink import JsonlAuditSink

from .cli_helpers import cli_env, parsed, run_all

# --- audit verify -------------------------------------------------------------------------


async def _write_trail(path: Path, ops: list[str], n: int, secret: bytes | None) -> list[str]:
    """n records per operation, interleaved in one file; returns each chain's head."""
    chains = {op: AuditChain(secret=secret) for op in ops}
    async with JsonlAuditSink(path) as sink:
        for i in range(n):
            for op in ops:
                data = {"i": i, "arguments": {"password": "hunter2", "city": "Oslo"}}
                await sink.write(
                    chains[op].append("requested", ts=1000.0 + i, operation_id=op, data=data)
                )
    return [chains[op].head for op in ops]


def trail(path: Path, n: int = 60, secret: bytes | None = None) -> str:
    (head,) = anyio.run(_write_trail, path, ["op_a"], n, secret)
    return str(head)


def test_audit_verify_an_intact_trail(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    head = trail(path)
    text, with_head, as_json = run_all(
        ["audit", "verify", str(path)],
        ["audit", "verify", str(path), "--expected-head", head],
        ["audit", "verify", str(path), "--json"],
    )
    assert (text.returncode, text.stdout) == (0, f"ok: 60 records, head {head}\n")
    assert with_head.returncode == 0
    assert parsed(as_json) == {
        "ok": True,
        "records": 60,
        "operation_id": None,
        "head": head,
        "first_broken": None,
        "line": None,
        "reason": "",
    }
    assert b"hunter2" not in path.read_bytes()  # the sink got redacted records


def _edit(lines: list[bytes], k: int) -> list[bytes]:
    return [*lines[:k], lines[k].replace(b'"Oslo"', b'"Bergen"'), *lines[k + 1 :]]


@pytest.mark.parametrize(
    ("tamper", "why"),
    [
        ("edited", "does not match its digest"),
        ("deleted", "has seq 43, expected 42"),
        ("reordered", "has seq 43, expected 42"),
    ],
)
def test_audit_verify_names_the_first_tampered_record(
    tmp_path: Path, tamper: str, why: str
) -> None:
    path = tmp_path / "audit.jsonl"
    trail(path)
    lines = path.read_bytes().splitlines(keepends=True)
    if tamper == "edited":
        lines = _edit(lines, 42)
    elif tamper == "deleted":
        del lines[42]
    else:
        lines[42], lines[43] = lines[43], lines[42]
    bad = tmp_path / f"{tamper}.jsonl"
    bad.write_bytes(b"".join(lines))
    padded = tmp_path / "padded.jsonl"  # blank lines are skipped but still counted
    padded.write_bytes(b"\n\n" + b"".join(lines))
    text, as_json, shifted = run_all(
        ["audit", "verify", str(bad)],
        ["audit", "verify", str(bad), "--json"],
        ["audit", "verify", str(padded)],
    )
    assert text.returncode == 1
    assert text.stdout.startswith("record 42 (line 43): ")
    assert why in text.stdout and "Bergen" not in text.stdout
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert (report["ok"], report["first_broken"], report["line"]) == (False, 42, 43)
    assert shifted.stdout.startswith("record 42 (line 45): ")


def test_a_broken_trail_of_one_operation_gets_no_several_operations_hint(
    tmp_path: Path,
) -> None:
    # The hint to use --operation/--by-operation is for a file whose first record and
    # broken record belong to different operations; one operation's edited trail is just
    # broken, and the hint would send the operator looking for chains that are not there.
    path = tmp_path / "audit.jsonl"
    trail(path, n=5)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"".join(_edit(path.read_bytes().splitlines(keepends=True), 3)))
    (proc,) = run_all(["audit", "verify", str(bad)])
    assert proc.returncode == 1 and proc.stdout.startswith("record 3 (line 4): ")
    assert proc.stderr == ""


def test_audit_verify_with_a_secret_and_an_expected_head(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    head = trail(path, n=10, secret=b"s3cret-key")
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:-1]))
    keyed = ("--secret-env", "AUDIT_KEY")
    good, unkeyed, wrong, unset, short, short_head = run_all(
        ["audit", "verify", str(path), *keyed],
        ["audit", "verify", str(path)],
        ["audit", "verify", str(path), "--secret-env", "OTHER_KEY"],
        ["audit", "verify", str(path), "--secret-env", "NO_SUCH_VAR"],
        ["audit", "verify", str(cut), *keyed],
        ["audit", "verify", str(cut), *keyed, "--expected-head", head],
        env=cli_env(AUDIT_KEY="s3cret-key", OTHER_KEY="other"),
    )
    assert (good.returncode, good.stdout) == (0, f"ok: 10 records, head {head}\n")
    assert unkeyed.returncode == 1 and unkeyed.stdout.startswith("record 0 (line 1): ")
    assert wrong.returncode == 1 and wrong.stdout.startswith("record 0 (line 1): ")
    assert unset.returncode == 2 and "NO_SUCH_VAR is not set" in unset.stderr
    assert short.returncode == 0  # a chain cannot vouch for what follows it...
    assert short_head.returncode == 1  # ...a head kept elsewhere can
    assert short_head.stdout.startswith("record 9 (after line 9): the trail ends after 9 records")
    for proc in (good, unkeyed, wrong, unset, short, short_head):
        assert "s3cret" not in proc.stdout + proc.stderr


def test_audit_verify_a_file_shared_by_several_operations(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    head_a, head_b = anyio.run(_write_trail, path, ["op_a", "op_b"], 5, None)
    lines = path.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"".join(_edit(lines, 7)))  # line 8 is op_b's record 3
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(b"".join(lines) + b"not json\n")
    whole, only_b, every, tampered, unattributed = run_all(
        ["audit", "verify", str(path)],
        ["audit", "verify", str(path), "--operation", "op_b", "--expected-head", head_b],
        ["audit", "verify", str(path), "--by-operation"],
        ["audit", "verify", str(bad), "--by-operation"],
        ["audit", "verify", str(garbage), "--operation", "op_a"],
    )
    assert whole.returncode == 1 and "--by-operation" in whole.stderr
    assert (only_b.returncode, only_b.stdout) == (0, f"ok: 5 records, head {head_b}\n")
    assert every.returncode == 0
    assert every.stdout.splitlines() == [
        "ok: 10 records in 2 operations",
        f"op_a: ok: 5 records, head {head_a}",
        f"op_b: ok: 5 records, head {head_b}",
    ]
    assert tampered.returncode == 1
    assert tampered.stdout.splitlines() == [
        f"op_a: ok: 5 records, head {head_a}",
        "op_b: record 3 (line 8): does not match its digest (edited, or wrong secret)",
    ]
    assert unattributed.returncode == 1
    assert unattributed.stdout.startswith("line 11: is not an audit record")


def test_audit_verify_refuses_unusable_input(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    missing, both, nothing, short, upper = run_all(
        ["audit", "verify", str(tmp_path / "nope.jsonl")],
        ["audit", "verify", str(empty), "--by-operation", "--expected-head", "ab"],
        ["audit", "verify", str(empty)],
        # A shortened or upper-case head would fail an intact trail as cut: refused.
        ["audit", "verify", str(empty), "--expected-head", "0" * 12],
        ["audit", "verify", str(empty), "--expected-head", "A" * 64],
    )
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    assert both.returncode == 2 and "--operation" in both.stderr
    for bad in (short, upper):
        assert bad.returncode == 2 and "64 lowercase hex" in bad.stderr
    assert nothing.returncode == 1 and nothing.stdout.startswith("no records")


def test_a_trail_without_records_proves_nothing(tmp_path: Path) -> None:
    # "ok: 0 records" passed an emptied trail (or the wrong, empty file).
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    blank = tmp_path / "blank.jsonl"
    blank.write_bytes(b"\n  \n\t\r\n\n")  # blank lines only: no record either
    genesis = "0" * 64
    procs = run_all(
        ["audit", "verify", str(empty)],
        ["audit", "verify", str(blank)],
        ["audit", "verify", str(blank), "--by-operation"],
        ["audit", "verify", str(empty), "--json"],
        ["audit", "verify", str(blank), "--by-operation", "--json"],
        # A head kept elsewhere that is the start of a chain says the trail is empty.
        ["audit", "verify", str(empty), "--expected-head", genesis],
    )
    *refused, plain_json, by_op_json, expected_empty = procs
    for proc in refused:
        assert proc.returncode == 1, proc.args
        assert "no records: the file is empty or holds only blank lines" in proc.stdout
    for proc in (plain_json, by_op_json):
        assert proc.returncode == 1
        out = json.loads(proc.stdout)
        assert (out["ok"], out["records"]) == (False, 0)
    assert json.loads(plain_json.stdout)["reason"].startswith("no records")
    assert (expected_empty.returncode, expected_empty.stdout) == (
        0,
        f"ok: 0 records, head {genesis}\n",
    )


def test_an_operation_with_no_record_fails_even_with_a_genesis_head(tmp_path: Path) -> None:
    # A mistyped --operation (or a trail that lost all its records) verifies nothing: an
    # --expected-head of a chain's start must not turn "0 records" into "ok" for it.
    path = tmp_path / "audit.jsonl"
    trail(path, n=3)
    (proc,) = run_all(
        ["audit", "verify", str(path), "--operation", "op_typo", "--expected-head", "0" * 64]
    )
    assert (proc.returncode, proc.stdout) == (
        1,
        "no record in the file belongs to operation 'op_typo'\n",
    )


def test_audit_verify_never_prints_a_line_s_control_characters(tmp_path: Path) -> None:
    # A tampered line's field name and an unverified line's operation id could draw a
    # forged "ok" on a terminal: both are printed escaped.
    forged = "\x1b[2K\rok: 3 records, head " + "f" * 64
    path = tmp_path / "t.jsonl"
    trail(path, n=3)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({forged: 1}) + "\n")
    other = tmp_path / "o.jsonl"
    other.write_text(json.dumps({"operation_id": forged + "\nopA: ok"}) + "\n")
    field, by_op = run_all(
        ["audit", "verify", str(path)], ["audit", "verify", str(other), "--by-operation"]
    )
    for proc in (field, by_op):
        assert proc.returncode == 1
        assert "\x1b" not in proc.stdout + proc.stderr and "\r" not in proc.stdout
        assert "\\x1b[2K" in proc.stdout
    assert len(by_op.stdout.splitlines()) == 1  # the id's newline is no line of its own


def test_by_operation_shows_the_id_that_operation_takes(tmp_path: Path) -> None:
    # A record stores its id escaped (backslashes doubled): shown, it is the real id again.
    path = tmp_path / "t.jsonl"
    anyio.run(_write_trail, path, ["tenant\\job-1", "plain"], 2, None)
    by_op = run_all(["audit", "verify", str(path), "--by-operation"])[0]
    assert by_op.returncode == 0
    shown = [line.split(": ok")[0] for line in by_op.stdout.splitlines()[1:]]
    assert shown == ["tenant\\job-1", "plain"]
    one = run_all(["audit", "verify", str(path), "--operation", shown[0]])[0]
    assert one.returncode == 0 and one.stdout.startswith("ok: 2 records")


def test_a_line_past_the_cap_is_refused_not_read_whole(tmp_path: Path) -> None:
    # /dev/zero (or a FIFO, or a corrupt trail) is one endless line: it was read into
    # memory until the host ran out (a MemoryError traceback at ~1.5 GB under a ulimit).
    from callgate.engine.cli_audit import MAX_LINE_BYTES

    long_line = tmp_path / "long.jsonl"
    long_line.write_bytes(b"\n" + b"x" * (MAX_LINE_BYTES + 1))  # line 1 blank
    endless, cut = run_all(["audit", "verify", "/dev/zero"], ["audit", "verify", str(long_line)])
    assert endless.returncode == 2 and "line 1 is longer than" in endless.stderr
    assert cut.returncode == 2 and "line 2 is longer than" in cut.stderr
