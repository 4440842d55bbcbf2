"""The audit trail: redaction, escaping, the hash chain, locating tampering, and sinks."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import random
import re
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.engine.core.audit import (
    GENESIS,
    REDACTED,
    AuditChain,
    AuditKind,
    AuditRecord,
    escape_controls,
    parse_path,
    record_digest,
    redact,
    verify_trail,
)
from callgate.engine.core.errors import ConfigError
from callgate.engine.runtime.audit_sink import (
    AuditSink,
    JsonlAuditSink,
    MemoryAuditSink,
    encode_record,
)

N = 10_000
SECRET = b"audit-chain-secret-5be1"
_KINDS = list(AuditKind)
# Every character a log reader (terminal, line splitter, bidi renderer) could be fooled by.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def build_trail(n: int, secret: bytes | None = None) -> list[AuditRecord]:
    chain = AuditChain(secret=secret)
    rng = random.Random(n)
    return [
        chain.append(
            _KINDS[i % len(_KINDS)],
            ts=1_700_000_000.0 + i / 8,
            operation_id=f"op_{i // 50}",
            call_id=f"call_{i // 5}",
            tool=rng.choice(["get_order", "refund", None]),
            data={"i": i, "ok": i % 3 == 0, "note": rng.choice(["", "a", "日本"])},
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def trail() -> list[AuditRecord]:
    return build_trail(N)


POSITIONS = sorted({0, 1, N // 2, N - 2, N - 1, *random.Random(4).sample(range(2, N - 2), 5)})


def test_an_untouched_trail_verifies_and_reports_its_head(trail: list[AuditRecord]) -> None:
    report = verify_trail(trail, expected_head=trail[-1].digest)
    assert (report.ok, report.count, report.first_broken, report.head) == (
        True,
        N,
        None,
        trail[-1].digest,
    )
    assert trail[0].prev_digest == GENESIS and [r.seq for r in trail[:3]] == [0, 1, 2]
    assert all(b.prev_digest == a.digest for a, b in itertools.pairwise(trail))


@pytest.mark.parametrize("k", POSITIONS)
def test_deleting_any_record_is_detected_and_located(trail: list[AuditRecord], k: int) -> None:
    report = verify_trail(trail[:k] + trail[k + 1 :], expected_head=trail[-1].digest)
    assert not report.ok and report.first_broken == k and report.count == k


def test_truncation_is_only_visible_against_a_head_kept_elsewhere(
    trail: list[AuditRecord],
) -> None:
    assert verify_trail(trail[:-3]).ok
    report = verify_trail(trail[:-3], expected_head=trail[-1].digest)
    assert not report.ok and report.first_broken == N - 3 and "expected head" in report.reason


@pytest.mark.parametrize("k", POSITIONS)
def test_reordering_any_record_is_detected_and_located(trail: list[AuditRecord], k: int) -> None:
    j = k + 1 if k < N - 1 else k - 1
    swapped = trail[:]
    swapped[k], swapped[j] = swapped[j], swapped[k]
    report = verify_trail(swapped, expected_head=trail[-1].digest)
    assert not report.ok and report.first_broken == min(j, k)


_EDITS: list[tuple[str, Any]] = [
    ("data", lambda r: {**r.data, "i": r.data["i"] + 1}),
    ("data", lambda r: {**r.data, "extra": True}),
    ("ts", lambda r: r.ts + 0.5),
    ("kind", lambda r: "approval" if r.kind != "approval" else "result"),
    ("operation_id", lambda r: r.operation_id + "x"),
    ("call_id", lambda r: None),
    ("tool", lambda r: "delete_everything"),
    ("seq", lambda r: r.seq + 1),
    ("prev_digest", lambda r: "f" * 64),
    ("digest", lambda r: r.digest[::-1]),
]


@pytest.mark.parametrize("k", POSITIONS)
def test_editing_any_field_of_any_record_is_detected_at_that_record(
    trail: list[AuditRecord], k: int
) -> None:
    for name, change in _EDITS:
        edited = trail[:]
        edited[k] = msgspec.structs.replace(trail[k], **{name: change(trail[k])})
        report = verify_trail(edited, expected_head=trail[-1].digest)
        assert not report.ok and report.first_broken == k, (name, report)


@pytest.mark.parametrize("k", POSITIONS)
def test_inserting_a_record_anywhere_is_detected_and_located(
    trail: list[AuditRecord], k: int
) -> None:
    replayed = trail[(k + 17) % N]  # an authentic record, replayed out of place
    report = verify_trail([*trail[:k], replayed, *trail[k:]], expected_head=trail[-1].digest)
    assert not report.ok and report.first_broken == k


def _forge(prev: AuditRecord | None, seq: int, secret: bytes | None) -> AuditRecord:
    """A record an attacker chains in by hand, with digests they can compute."""
    body = {
        "seq": seq,
        "ts": 1.0,
        "operation_id": "op_x",
        "kind": "approval",
        "call_id": "call_x",
        "tool": "refund",
        "data": {"approved_by": "mallory"},
        "prev_digest": prev.digest if prev else GENESIS,
    }
    return AuditRecord(digest=record_digest(body["prev_digest"], body, secret), **body)  # type: ignore[arg-type]


def test_rewritten_records_are_located_at_the_first_broken_link(
    trail: list[AuditRecord],
) -> None:
    # Plain SHA-256: whoever rewrites a record can recompute its digest, so the break shows
    # at the next record's link (or at the head, for the last record).
    for k in (0, N // 3):
        forged = [*trail[:k], _forge(trail[k - 1] if k else None, k, None), *trail[k + 1 :]]
        assert verify_trail(forged).first_broken == k + 1
        inserted = [*trail[:k], _forge(trail[k - 1] if k else None, k, None), *trail[k:]]
        assert verify_trail(inserted).first_broken == k + 1
    last = [*trail[:-1], _forge(trail[-2], N - 1, None)]
    assert verify_trail(last, expected_head=trail[-1].digest).first_broken == N


def test_a_keyed_chain_locates_forgeries_exactly_and_needs_its_secret() -> None:
    keyed = build_trail(1000, SECRET)
    assert verify_trail(keyed, secret=SECRET).ok
    assert verify_trail(keyed).first_broken == 0
    assert verify_trail(keyed, secret=SECRET[::-1]).first_broken == 0
    for k in (0, 1, 500, 999):
        prev = keyed[k - 1] if k else None
        for forged in (_forge(prev, k, None), _forge(prev, k, b"guessed")):
            report = verify_trail([*keyed[:k], forged, *keyed[k + 1 :]], secret=SECRET)
            assert report.first_broken == k
            report = verify_trail([*keyed[:k], forged, *keyed[k:]], secret=SECRET)
            assert report.first_broken == k


def test_trails_can_continue_from_a_known_head(trail: list[AuditRecord]) -> None:
    chain = AuditChain(start_seq=N, prev_digest=trail[-1].digest)
    more = [chain.append("state", ts=1.0, operation_id="op_9") for _ in range(3)]
    assert verify_trail(trail + more).ok
    report = verify_trail(more, start_seq=N, start_prev=trail[-1].digest)
    assert report.ok and report.head == chain.head == more[-1].digest
    assert verify_trail(more).first_broken == 0


def _by_hand(record: AuditRecord, secret: bytes | None = None) -> str:
    """A record's digest as the module docstring defines it, computed with the standard
    library alone: SHA-256 (or HMAC-SHA256) of the compact, key-sorted JSON array
    ["callgate-audit-v1", prev_digest, body], body being the record without ``digest``."""
    body = {f: getattr(record, f) for f in record.__struct_fields__ if f != "digest"}
    text = json.dumps(
        ["callgate-audit-v1", record.prev_digest, body],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()
    if secret is None:
        return hashlib.sha256(text).hexdigest()
    return hmac.new(secret, text, hashlib.sha256).hexdigest()


def test_an_auditor_recomputes_every_digest_by_hand(trail: list[AuditRecord]) -> None:
    for record in trail[:50]:
        assert record.digest == _by_hand(record)
    for record in build_trail(20, SECRET):
        assert record.digest == _by_hand(record, SECRET)


def test_an_empty_trail_reaches_only_the_start_as_its_head(trail: list[AuditRecord]) -> None:
    assert verify_trail([], expected_head=GENESIS).ok
    report = verify_trail([], expected_head=trail[-1].digest)
    assert (report.ok, report.count, report.first_broken) == (False, 0, 0)
    assert "expected head" in report.reason


def test_a_rewritten_record_is_named_as_such_by_the_record_after_it(
    trail: list[AuditRecord],
) -> None:
    """The record after a rewritten one is intact; the reason says its predecessor was
    replaced, not that it was edited itself."""
    k = N // 3
    report = verify_trail([*trail[:k], _forge(trail[k - 1], k, None), *trail[k + 1 :]])
    assert report.first_broken == k + 1
    assert report.reason.startswith(f"record {k + 1} does not link to record {k} ")


def test_a_chain_numbered_from_elsewhere_is_out_of_sequence() -> None:
    """Each record's own digest and link hold, but its numbering starts at 5 from the
    start of a trail (records 0-4 cut, the rest re-chained from GENESIS by someone who
    recomputed the plain digests): the sequence gives it away."""
    chain = AuditChain(start_seq=5)
    records = [chain.append("state", ts=1.0, operation_id="op_1") for _ in range(3)]
    report = verify_trail(records)
    assert (report.ok, report.first_broken) == (False, 0)
    assert "has seq 5, expected 0" in report.reason
    assert verify_trail(records, start_seq=5).ok


def test_sensitive_key_names_are_found_in_any_case_at_any_depth() -> None:
    chain = AuditChain()
    for value in (
        {"Password": "7351"},
        {"outer": [{"API_KEY": "sk-1"}]},
        [{"a": {"Authorization": "Bearer x"}}],
    ):
        assert chain.redacts_keys_in(value), value
        assert REDACTED in repr(chain.append("state", ts=1.0, operation_id="o", data={"v": value}))
    assert not chain.redacts_keys_in({"user": "bob", "note": [{"city": "Paris"}]})


# --- JSON lines ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_jsonl_sink_round_trips_and_tampered_lines_are_located(tmp_path: Path) -> None:
    records = build_trail(300)
    path = tmp_path / "audit.jsonl"
    async with JsonlAuditSink(path) as sink:
        assert isinstance(sink, AuditSink)
        for record in records[:100]:
            await sink.write(record)
    async with JsonlAuditSink(path) as sink:  # reopened: appends, never truncates
        for record in records[100:]:
            await sink.write(record)
    raw = path.read_bytes()
    lines = raw.splitlines()
    assert len(lines) == 300 and raw.endswith(b"\n")
    assert verify_trail(lines, expected_head=records[-1].digest).ok
    assert verify_trail([line.decode() for line in lines]).ok

    def tampered(k: int, new: bytes) -> int | None:
        return verify_trail([*lines[:k], new, *lines[k + 1 :]]).first_broken

    k = 137
    assert tampered(k, lines[k].replace(b'"i":137', b'"i":138')) == k
    assert tampered(k, lines[k][:-5]) == k  # truncated line
    assert tampered(k, lines[k][:-1] + b',"approved":true}') == k  # field outside the digest
    assert tampered(k, b"") == k
    assert tampered(k, b"[1,2]") == k
    assert tampered(k, lines[k].replace(b'"seq":137', b'"seq":"137"')) == k
    report = verify_trail([lines[0], 42])  # type: ignore[list-item]
    assert report.first_broken == 1 and "not an audit record" in report.reason


@pytest.mark.parametrize(
    "field", [("prev_digest", None), ("digest", 7), ("seq", "0"), ("data", {"x": object()})]
)
def test_records_with_wrong_field_types_are_reported_not_crashed(field: tuple[str, Any]) -> None:
    (record,) = build_trail(1)
    broken = msgspec.structs.replace(record, **dict([field]))
    report = verify_trail([broken])
    assert not report.ok and report.first_broken == 0


@pytest.mark.anyio
async def test_concurrent_writers_never_interleave_lines(tmp_path: Path) -> None:
    records = build_trail(60)
    path = tmp_path / "concurrent.jsonl"
    async with JsonlAuditSink(path) as sink, anyio.create_task_group() as tg:
        for record in records:
            tg.start_soon(sink.write, record)
    decoded = [
        msgspec.json.decode(line, type=AuditRecord) for line in path.read_bytes().splitlines()
    ]
    assert sorted(r.seq for r in decoded) == list(range(60))
    assert {r.digest for r in decoded} == {r.digest for r in records}


@pytest.mark.anyio
async def test_memory_sink_keeps_records_and_lines() -> None:
    sink = MemoryAuditSink()
    records = build_trail(5)
    for record in records:
        await sink.write(record)
    assert sink.records == records
    assert sink.lines == [encode_record(r) for r in records]
    assert verify_trail(sink.lines).ok


# --- redaction and escaping ---------------------------------------------------------------

PLANTED = {
    "card": "4111111111111111SECRETPAN",
    "cvv": "CVVSECRET987",
    "token": "tok_SECRET_result_token",
    "dotted": "SECRET-in-a-dotted-key",
    "password": "hunter2-SECRET-pw",
    "auth": "Bearer sk-SECRET-bearer",
    "deep": "SECRET-deep-wildcard",
}


def _call_data() -> dict[str, Any]:
    return {
        "arguments": {
            "order_id": "A1",
            "card": {"number": PLANTED["card"], "exp": "12/30"},
            "cards": [{"cvv": PLANTED["cvv"], "last4": "1111"}, {"cvv": PLANTED["cvv"]}],
            "login": {"user": "bob", "PassWord": PLANTED["password"]},
            "headers": [{"Authorization": PLANTED["auth"]}],
        },
        "result": {
            "token": PLANTED["token"],
            "api.key": PLANTED["dotted"],
            "rows": [{"meta": {"x": PLANTED["deep"]}}, {"meta": {"y": PLANTED["deep"]}}],
        },
    }


# What a ToolSpec declares sensitive (argument paths and result paths, nested as the run
# loop nests them in the record's data).
SENSITIVE = [
    "$.arguments.card.number",
    "arguments.cards[*].cvv",
    "$.result.token",
    "$.result['api.key']",
    "$.result.rows[*].meta.*",
]


@pytest.mark.anyio
async def test_planted_secrets_never_appear_in_any_jsonl_audit_line(tmp_path: Path) -> None:
    path = tmp_path / "secrets.jsonl"
    chain = AuditChain(redact_paths=SENSITIVE[:2])
    async with JsonlAuditSink(path) as sink:
        for kind in AuditKind:
            record = chain.append(
                kind,
                ts=2.0,
                operation_id="op_1",
                call_id="call_1",
                tool="pay",
                data=_call_data(),
                redact_paths=SENSITIVE[2:],
            )
            await sink.write(record)
    raw = path.read_bytes()
    assert raw.count(b"\n") == len(AuditKind)
    for secret in PLANTED.values():
        assert secret.encode() not in raw
    assert b'"order_id":"A1"' in raw and b'"last4":"1111"' in raw  # the rest is kept
    assert raw.count(REDACTED.encode()) >= 9 * len(AuditKind)
    assert verify_trail(raw.splitlines()).ok


def test_redact_paths_wildcards_and_input_left_untouched() -> None:
    data = _call_data()
    before = msgspec.json.encode(data)
    out = redact(data, ["$.arguments.cards[1].cvv", "result.rows[*].meta", "$.nope.deeper"])
    assert msgspec.json.encode(data) == before
    assert out["arguments"]["cards"] == [
        {"cvv": PLANTED["cvv"], "last4": "1111"},
        {"cvv": REDACTED},
    ]
    assert out["result"]["rows"] == [{"meta": REDACTED}, {"meta": REDACTED}]
    # redact() applies only the given paths; the chain adds the default sensitive keys.
    assert out["arguments"]["login"]["PassWord"] == PLANTED["password"]
    assert redact([{"a": 1}, {"a": 2}], ["[*].a"]) == [{"a": REDACTED}, {"a": REDACTED}]
    assert redact({"a": 1}, ["$"]) == REDACTED


def test_path_syntax() -> None:
    assert parse_path("$.a.b[0].c") == parse_path("a.b[0].c") == ("a", "b", 0, "c")
    assert parse_path("$['a.b'][\"c\"]") == ("a.b", "c")
    assert parse_path("$") == ()
    assert repr(parse_path("$.a[*].*")) == "('a', *, *)"


@pytest.mark.parametrize("bad", ["$.", "$..a", "$[", "$[]", "$[x]", "$a", "$.a[", "$[-1]", "$['a]"])
def test_malformed_paths_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError, match="redaction path"):
        parse_path(bad)


def test_root_redaction_is_refused_by_the_chain() -> None:
    with pytest.raises(ConfigError):
        AuditChain(redact_paths=["$"])


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_control_characters_are_escaped_in_every_string_so_lines_cannot_be_forged() -> None:
    forged = '\n{"seq":1,"kind":"approval","data":{"approved_by":"admin"}}\r\u2028\x85\x1e'
    bidi = "refund\u202e\u2066txt.exe\x1b[2J\x00\x7f"
    chain = AuditChain()
    record = chain.append(
        forged,
        ts=0,
        operation_id=bidi,
        call_id=forged,
        tool=bidi,
        data={forged: [forged, {"k": bidi}], "path": "C:\\temp\\x0a"},
    )
    strings = [
        record.kind,
        record.operation_id,
        record.call_id,
        record.tool,
        *_strings(record.data),
    ]
    assert all(_UNSAFE.search(s) is None for s in strings if s is not None)
    line = encode_record(record).decode()
    assert len(line.splitlines()) == 1  # str.splitlines also splits on \x85, \x1e, \u2028
    assert "\\x0a" in record.call_id and "\\u202e" in record.tool  # type: ignore[operator]
    # A literal backslash sequence stays distinguishable from an escaped control character.
    assert record.data["path"] == "C:\\\\temp\\\\x0a"
    assert verify_trail([line]).ok


@settings(max_examples=300, deadline=None)
@given(a=st.text(), b=st.text())
def test_escaping_is_injective_and_leaves_no_unsafe_character(a: str, b: str) -> None:
    assert _UNSAFE.search(escape_controls(a)) is None
    assert (escape_controls(a) == escape_controls(b)) == (a == b)


def test_bad_data_is_a_config_error_and_leaves_the_chain_unchanged() -> None:
    chain = AuditChain()
    chain.append("requested", ts=1, operation_id="op")
    head, seq = chain.head, chain.next_seq
    for data, ts in (({"x": object()}, 1.0), ({1: "int key"}, 1.0), ({}, float("nan"))):
        with pytest.raises(ConfigError):
            chain.append("requested", ts=ts, operation_id="op", data=data)  # type: ignore[arg-type]
    assert (chain.head, chain.next_seq) == (head, seq)
    with pytest.raises(ConfigError):
        AuditChain(secret=b"")


def test_hostile_nesting_is_truncated_not_a_crash() -> None:
    deep: Any = "bottom"
    for _ in range(5000):
        deep = {"d": [deep]}
    record = AuditChain().append("result", ts=1, operation_id="op", data={"deep": deep})
    assert "[TRUNCATED" in encode_record(record).decode()
    assert verify_trail([encode_record(record)]).ok
