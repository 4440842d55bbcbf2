"""Audit trail, redaction and ``callgate audit verify`` fixes found by a review: model
output that cannot crash a run, validated result redaction paths, strict trail lines,
keyed Runner chains, digests that cannot be brute-forced back to redacted values, and a
canonical form that rejects what it says it rejects."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import hashlib
import io
import math
import os
import subprocess
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from callgate.adapters.render import RenderCall, render_turn
from callgate.engine.core.audit import AuditChain, AuditRecord, verify_trail
from callgate.engine.core.canonical import canonical_json, digest_fields, sha256_hex
from callgate.engine.core.errors import ConfigError
from callgate.engine.core.registry import Registry, ToolContext, ToolSpec
from callgate.engine.core.states import OpState
from callgate.engine.runtime.audit_sink import MemoryAuditSink, encode_record
from callgate.engine.runtime.loop import Runner
from callgate.engine.runtime.replay import ReplayServer, ReplayTurn
from callgate.engine.runtime.steps import OperationDrive
from callgate.engine.runtime.transport import ProviderEndpoint

from .cli_helpers import CLI, cli_env, run_all

FINAL = Path(__file__).parent / "streams" / "openai_chat_final_text.sse"
SECRET = b"audit-secret"


class NArgs(msgspec.Struct, forbid_unknown_fields=True):
    n: int


class PayArgs(msgspec.Struct, forbid_unknown_fields=True):
    account: str
    pin: str


class QArgs(msgspec.Struct, forbid_unknown_fields=True):
    q: str


def _pay(args: PayArgs, ctx: ToolContext) -> dict[str, Any]:
    return {"ok": True, "otp": "493817"}


def _n(args: NArgs, ctx: ToolContext) -> dict[str, Any]:
    return {"n": 1}


async def _run(
    registry: Registry, name: str, arguments: str, **kw: Any
) -> tuple[Any, MemoryAuditSink]:
    sink = MemoryAuditSink()
    turns = [
        ReplayTurn(body=render_turn("openai_chat", calls=[RenderCall("c1", name, arguments)])),
        ReplayTurn.from_file(FINAL),
    ]
    async with ReplayServer(turns) as server:
        runner = Runner(
            provider="openai_chat",
            model="gpt-4o",
            registry=registry,
            endpoint=ProviderEndpoint(base_url=server.base_url, api_key="sk-test"),
            audit=sink.write,
            **kw,
        )
        result = await runner.start("go")
    return result, sink


def _kind(sink: MemoryAuditSink, kind: str) -> AuditRecord:
    return next(r for r in sink.records if r.kind == kind)


# --- 1. a model's integer beyond 64 bits -------------------------------------------------


@pytest.mark.anyio
async def test_integer_beyond_64_bits_is_recorded_not_a_crash() -> None:
    registry = Registry([ToolSpec(name="t", description="d", args_type=NArgs, handler=_n)])
    raw = '{"n": 123456789012345678901234567890}'
    result, sink = await _run(registry, "t", raw)
    assert result.state is OpState.COMPLETED
    requested = _kind(sink, "requested")
    assert requested.data["arguments"] is None
    assert requested.data["arguments_canonical"] is False
    assert requested.data["raw_sha256"] == sha256_hex(raw.encode())
    assert verify_trail(sink.lines).ok


def test_chain_records_an_oversized_integer_instead_of_raising() -> None:
    chain = AuditChain()
    rec = chain.append("validated", ts=1.0, operation_id="op", data={"n": [2**64, -(2**63) - 1]})
    assert all(isinstance(v, str) and "64 bits" in v for v in rec.data["n"])
    assert verify_trail([encode_record(rec)]).ok


# --- 2. result redaction paths -----------------------------------------------------------


def _rows(args: QArgs, ctx: ToolContext) -> Any:
    return [{"token": "tok_SECRET"}]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("$", "tok_SECRET"),
        ("$[*].token", [{"token": "tok_SECRET"}]),
        ("[*].token", [{"token": "tok_SECRET"}]),
        ("$[0].token", [{"token": "tok_SECRET"}]),
        ("$.*", {"token": "tok_SECRET"}),
        ("$['token']", {"token": "tok_SECRET"}),
        ("token", {"token": "tok_SECRET"}),
        ("$['a.b']", {"a.b": "tok_SECRET"}),
    ],
)
def test_every_accepted_result_path_redacts(path: str, value: Any) -> None:
    spec = ToolSpec(
        name="t", description="d", args_type=QArgs, handler=_rows, sensitive_result_paths=(path,)
    )
    fake: Any = SimpleNamespace(r=SimpleNamespace(registry=Registry([spec])))
    paths = OperationDrive._sensitive(fake, "t", arguments=False)
    rec = AuditChain().append(
        "executed",
        ts=1.0,
        operation_id="op",
        data={"result": {"result": value}},
        redact_paths=paths,
    )
    assert b"tok_SECRET" not in encode_record(rec)


@pytest.mark.parametrize("path", ["$..token", "$.a[", "$[x]", "$[1", "$x", ""])
def test_malformed_result_paths_are_refused_when_the_spec_is_built(path: str) -> None:
    with pytest.raises(ConfigError, match="sensitive result path"):
        ToolSpec(
            name="t",
            description="d",
            args_type=QArgs,
            handler=_rows,
            sensitive_result_paths=(path,),
        )


# --- 3. and 4. strict trail lines --------------------------------------------------------


def _trail() -> list[bytes]:
    chain = AuditChain()
    return [
        encode_record(
            chain.append(
                "executed",
                ts=1.0,
                operation_id="op_1",
                call_id="c1",
                tool="pay",
                data={"amount": 100, "to": "alice"},
            )
        ),
        encode_record(chain.append("state", ts=2.0, operation_id="op_1", data={"to": "done"})),
    ]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b'"data":{', b'"data":{"amount":999999,"to":"mallory",'),
        (b'{"seq":0,', b'{"seq":0,"tool":"refund",'),
        (b'"amount":100', b'"amount": 100'),
    ],
    ids=["duplicate-data-key", "duplicate-top-level-key", "non-canonical-bytes"],
)
def test_a_line_that_is_not_its_records_encoding_is_rejected(old: bytes, new: bytes) -> None:
    lines = _trail()
    assert verify_trail(lines).ok
    lines[0] = lines[0].replace(old, new, 1)
    report = verify_trail(lines)
    assert not report.ok and report.first_broken == 0
    assert "not the canonical encoding" in report.reason


def test_a_deeply_nested_line_is_malformed_not_a_crash() -> None:
    from callgate.engine.cli_audit import verify_file

    line = encode_record(AuditChain().append("state", ts=1.0, operation_id="op", data={"x": 1}))
    deep = line.replace(b'"x":1', b'"x":' + b"[" * 100_000 + b"]" * 100_000)
    report = verify_trail([deep])
    assert not report.ok and report.first_broken == 0
    for kw in ({}, {"by_operation": True}, {"operation_id": "op"}):
        (chain,) = verify_file(io.BytesIO(deep), **kw)  # type: ignore[arg-type]
        assert not chain.ok


# --- 5. --operation compares the escaped id ----------------------------------------------


def _escaped_op_trail(tmp_path: Path) -> tuple[Path, str]:
    op = "acme\\order-17"
    chain = AuditChain()
    lines = [
        encode_record(chain.append("state", ts=float(i), operation_id=op, data={"i": i}))
        for i in range(3)
    ]
    lines[1] = lines[1].replace(b'"i":1', b'"i":9')
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(lines))
    return path, op


def test_operation_filter_matches_the_escaped_id(tmp_path: Path) -> None:
    path, op = _escaped_op_trail(tmp_path)
    (res,) = run_all(["audit", "verify", str(path), "--operation", op])
    assert res.returncode == 1, res.stdout
    assert "record 1" in res.stdout


def test_operation_filter_matching_nothing_fails(tmp_path: Path) -> None:
    path, _ = _escaped_op_trail(tmp_path)
    (res,) = run_all(["audit", "verify", str(path), "--operation", "op_missing"])
    assert res.returncode == 1
    assert "no record" in res.stdout + res.stderr
    assert "ok" not in res.stdout.split(":")[0]


# --- 6. a non-UTF-8 secret ---------------------------------------------------------------


def test_secret_env_accepts_non_utf8_bytes(tmp_path: Path) -> None:
    secret = b"\xff\xfe-raw-key"
    chain = AuditChain(secret=secret)
    path = tmp_path / "t.jsonl"
    path.write_bytes(encode_record(chain.append("state", ts=1.0, operation_id="op")))
    env = {os.fsencode(k): os.fsencode(v) for k, v in cli_env().items()}
    env[b"K"] = secret
    res = subprocess.run(
        [*CLI, "audit", "verify", str(path), "--secret-env", "K"],
        capture_output=True,
        env=env,
        check=False,
    )
    assert res.returncode == 0, res.stderr.decode(errors="replace")[-400:]
    assert res.stdout.startswith(b"ok: 1 records")


def test_secret_from_env_reads_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    from callgate.engine.cli_audit import secret_from_env

    monkeypatch.setitem(os.environb, b"CG_TEST_SECRET", b"\xff\xfex")
    assert secret_from_env("CG_TEST_SECRET") == b"\xff\xfex"


# --- 7. a keyed Runner chain -------------------------------------------------------------


@pytest.mark.anyio
async def test_runner_keys_its_audit_chain_with_audit_secret() -> None:
    registry = Registry([ToolSpec(name="t", description="d", args_type=NArgs, handler=_n)])
    result, sink = await _run(registry, "t", '{"n": 5}', audit_secret=SECRET)
    assert result.state is OpState.COMPLETED
    assert verify_trail(sink.lines, secret=SECRET).ok
    assert not verify_trail(sink.lines).ok
    # Edit a record and re-chain everything after it without the key: detected.
    forged, prev = [], sink.records[0].prev_digest
    for r in sink.records:
        data = dict(r.data, arguments={"n": 5000}) if r.kind == "requested" else r.data
        body = msgspec.structs.asdict(r) | {"data": data, "prev_digest": prev}
        body.pop("digest")
        from callgate.engine.core.audit import record_digest

        digest = record_digest(prev, body)
        forged.append(encode_record(AuditRecord(digest=digest, **body)))
        prev = digest
    assert not verify_trail(forged, secret=SECRET).ok


def test_runner_refuses_an_empty_audit_secret() -> None:
    registry = Registry([ToolSpec(name="t", description="d", args_type=NArgs, handler=_n)])
    with pytest.raises(ConfigError, match="audit secret"):
        Runner(
            provider="openai_chat",
            model="m",
            registry=registry,
            endpoint=ProviderEndpoint(base_url="http://127.0.0.1:9", api_key="k"),
            audit_secret=b"",
        )


# --- 8. no unkeyed digests of redacted values ---------------------------------------------

_PAY = ToolSpec(
    name="pay",
    description="Pay.",
    args_type=PayArgs,
    handler=_pay,
    sensitive_paths=("$.pin",),
    sensitive_result_paths=("$.otp",),
)
_PAY_RAW = '{"account": "ACC-1", "pin": "7351"}'
_DIGEST_FIELDS = {
    "requested": ("raw_sha256",),
    "executed": ("idempotency_key",),
    "result": ("request_sha256", "result_sha256", "binding_sha256"),
}


def _unkeyed_candidates() -> set[str]:
    args = {"account": "ACC-1", "pin": "7351"}
    return {
        sha256_hex(_PAY_RAW.encode()),
        digest_fields("pay", args),
        sha256_hex(canonical_json({"result": {"ok": True, "otp": "493817"}})),
    }


@pytest.mark.anyio
async def test_sensitive_calls_get_no_unkeyed_digests_without_a_secret() -> None:
    result, sink = await _run(Registry([_PAY]), "pay", _PAY_RAW)
    assert result.state is OpState.COMPLETED
    for kind, fields in _DIGEST_FIELDS.items():
        rec = _kind(sink, kind)
        for name in fields:
            assert name not in rec.data, (kind, name)
    # Neither secret as a value (a bare b"7351" can match inside a hex digest by chance).
    trail = b"".join(sink.lines)
    assert b'"7351"' not in trail and b'"493817"' not in trail


@pytest.mark.anyio
async def test_sensitive_calls_get_keyed_digests_with_an_audit_secret() -> None:
    result, sink = await _run(
        Registry([_PAY]), "pay", _PAY_RAW, audit_secret=SECRET, binding_secret=b"bind"
    )
    assert result.state is OpState.COMPLETED
    unkeyed = _unkeyed_candidates()
    requested, res = _kind(sink, "requested"), _kind(sink, "result")
    for value in (
        requested.data["raw_sha256"],
        res.data["request_sha256"],
        res.data["result_sha256"],
    ):
        assert isinstance(value, str) and len(value) == 64 and value not in unkeyed
    assert requested.data["digests"] == res.data["digests"] == "hmac"
    assert verify_trail(sink.lines, secret=SECRET).ok


@pytest.mark.anyio
async def test_calls_without_sensitive_paths_keep_plain_digests() -> None:
    registry = Registry([ToolSpec(name="t", description="d", args_type=NArgs, handler=_n)])
    raw = '{"n": 5}'
    _, sink = await _run(registry, "t", raw, audit_secret=SECRET)
    assert _kind(sink, "requested").data["raw_sha256"] == sha256_hex(raw.encode())
    assert _kind(sink, "result").data["request_sha256"] == digest_fields("t", {"n": 5})


class LoginArgs(msgspec.Struct, forbid_unknown_fields=True):
    user: str
    password: str


def _login(args: LoginArgs, ctx: ToolContext) -> dict[str, Any]:
    return {"user": args.user, "api_key": "sk-" + args.password}


# No declared paths: the trail redacts `password` and `api_key` for their names alone, so
# the digests over them are as guessable as a declared path's would be.
_LOGIN = ToolSpec(name="login", description="Log in.", args_type=LoginArgs, handler=_login)
_LOGIN_RAW = '{"user": "bob", "password": "7391"}'


def _login_unkeyed() -> set[str]:
    args = {"user": "bob", "password": "7391"}
    result = {"result": {"user": "bob", "api_key": "sk-7391"}}
    return {
        sha256_hex(_LOGIN_RAW.encode()),
        digest_fields("login", args),
        sha256_hex(canonical_json(result)),
    }


@pytest.mark.anyio
@pytest.mark.parametrize("secret", [SECRET, None], ids=["keyed", "no-secret"])
async def test_values_redacted_for_their_key_names_get_no_unkeyed_digests(
    secret: bytes | None,
) -> None:
    result, sink = await _run(Registry([_LOGIN]), "login", _LOGIN_RAW, audit_secret=secret)
    assert result.state is OpState.COMPLETED
    unkeyed = _login_unkeyed()
    for kind, fields in _DIGEST_FIELDS.items():
        rec = _kind(sink, kind)
        for name in fields:
            value = rec.data.get(name)
            assert value is None or value not in unkeyed, (kind, name)
            if secret is None:
                assert name not in rec.data, (kind, name)
    assert _kind(sink, "requested").data["arguments"]["password"] == "[REDACTED]"
    # Neither secret as a value (a bare b"7391" also matched, by chance, inside a hex digest
    # or a timestamp of some runs: the once-seen flake of this test).
    trail = b"".join(sink.lines)
    assert b'"7391"' not in trail and b"sk-7391" not in trail
    if secret is not None:
        assert _kind(sink, "result").data["digests"] == "hmac"


# --- 9. canonical JSON rejects orjson's native extras ------------------------------------


@dataclasses.dataclass
class _P:
    x: float


class _E(enum.Enum):
    A = "a"


class _SE(enum.StrEnum):
    A = "a"


@pytest.mark.parametrize(
    "bad",
    [
        datetime.datetime(2024, 1, 1),
        datetime.date(2024, 1, 1),
        datetime.time(1, 2),
        _P(1.0),
        {"p": _P(math.nan)},
        [{"d": datetime.date(2024, 1, 1)}],
    ],
    ids=["datetime", "date", "time", "dataclass", "nan-in-dc", "nested"],
)
def test_canonical_json_rejects_non_json_types(bad: Any) -> None:
    with pytest.raises(ConfigError):
        canonical_json(bad)


@pytest.mark.parametrize("value", [uuid.UUID(int=1), _E.A, _SE.A, [{"u": uuid.UUID(int=1)}]])
def test_uuid_and_enum_encode_as_their_builtin_form(value: Any) -> None:
    # The documented conversions: the same bytes as msgspec.to_builtins' form of them.
    assert canonical_json(value) == canonical_json(msgspec.to_builtins(value))


def test_canonical_json_still_encodes_plain_json() -> None:
    value = {"b": [1, 2.5, None, True, "x"], "a": {"k": "v"}, "t": (1,)}
    assert canonical_json(value) == b'{"a":{"k":"v"},"b":[1,2.5,null,true,"x"],"t":[1]}'
    assert digest_fields(value) == hashlib.sha256(b"[" + canonical_json(value) + b"]").hexdigest()
