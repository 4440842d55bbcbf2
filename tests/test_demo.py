"""The demo end to end: every branch of the practice exercise ends in its named state, with
the downstream system and the verified audit trail as evidence; the default refund flow
crosses three processes (start, a separate approver, a fresh resume) for two provider
families; ``--live`` without an API key fails with one clear line and exit code 2."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from callgate.engine.core.audit import AuditRecord, verify_trail
from callgate.engine.core.states import OpState
from callgate.engine.runtime.demo import add_demo_arguments, run_demo
from callgate.engine.runtime.demo_scenarios import SCENARIOS
from callgate.engine.runtime.demo_tools import Downstream
from callgate.engine.runtime.loop import OperationResult

# The named end state of every branch, stated here independently of the scenario table.
EXPECTED = {
    "refund": OpState.COMPLETED,
    "max-tokens": OpState.INCOMPLETE,
    "unknown-tool": OpState.COMPLETED,
    "approval-expired": OpState.COMPLETED,
    "submit-timeout": OpState.COMPLETED,
    "repeated-call": OpState.ESCALATED,
    "refusal": OpState.REFUSED,
    "denied": OpState.COMPLETED,
}


class Run(msgspec.Struct):
    code: int
    out: str
    result: OperationResult
    audit: list[AuditRecord]
    audit_ok: bool
    refunds: int
    drafts: int


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_demo_arguments(parser)
    return parser.parse_args(list(argv))


def _collect(workdir: Path, code: int, out: str) -> Run:
    (result_file,) = workdir.glob("result-*.json")
    (audit_file,) = workdir.glob("audit-*.jsonl")
    lines = audit_file.read_bytes().splitlines()
    downstream = Downstream(workdir / "downstream.db")
    return Run(
        code=code,
        out=out,
        result=msgspec.json.decode(result_file.read_bytes(), type=OperationResult),
        audit=[msgspec.json.decode(line, type=AuditRecord) for line in lines],
        audit_ok=verify_trail(lines).ok,
        refunds=len(downstream.refunds()),
        drafts=len(downstream.drafts()),
    )


_CACHE: dict[tuple[str, ...], Run] = {}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Run]:
    """Run the demo in this process (its children are real processes) once per argument
    list; several tests look at the same run from different sides."""

    def run(*argv: str) -> Run:
        if argv not in _CACHE:
            workdir = tmp_path_factory.mktemp("demo") / "work"
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = run_demo(_args("--workdir", str(workdir), *argv))
            _CACHE[argv] = _collect(workdir, code, out.getvalue())
        return _CACHE[argv]

    return run


def executed(run: Run, tool: str) -> list[AuditRecord]:
    return [r for r in run.audit if r.kind == "executed" and r.tool == tool and r.data["ran"]]


def test_every_branch_of_the_exercise_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(EXPECTED)
    for name, state in EXPECTED.items():
        assert SCENARIOS[name].expected is state


@pytest.mark.parametrize("name", list(EXPECTED))
def test_scenario_ends_in_its_named_state(name: str, demo: Callable[..., Run]) -> None:
    run = demo("--scenario", name)
    assert run.result.state is EXPECTED[name], run.out
    assert run.code == 0, run.out
    assert run.audit_ok
    # The trail's last record is the final transition, into the named state.
    assert run.audit[-1].kind == "state" and run.audit[-1].data["to"] == EXPECTED[name].value
    assert f"✓ scenario {name}: expected {EXPECTED[name].name}" in run.out
    assert run.result.stop is not None and run.result.stop.state is EXPECTED[name]


def test_max_tokens_executes_nothing_from_the_cut_turn(
    demo: Callable[..., Run],
) -> None:
    run = demo("--scenario", "max-tokens")
    assert run.result.state is OpState.INCOMPLETE
    assert run.result.stop is not None and run.result.stop.provider_reason
    assert executed(run, "create_refund_draft") == [] and run.drafts == 0
    assert run.refunds == 0
    assert [c.tool for c in run.result.calls] == ["get_order"]  # only the earlier, whole turn


def test_submit_timeout_reconciles_to_exactly_one_refund(
    demo: Callable[..., Run],
) -> None:
    run = demo("--scenario", "submit-timeout")
    assert run.result.state is OpState.COMPLETED
    assert run.refunds == 1
    assert len(executed(run, "submit_refund")) == 1  # the retry never re-ran the handler
    first, retry = [c for c in run.result.calls if c.tool == "submit_refund"]
    assert (first.status, retry.status) == ("outcome_unknown", "replayed")
    assert first.call_id != retry.call_id
    assert first.idempotency_key == retry.idempotency_key is not None
    assert first.approval_id and retry.approval_id and first.approval_id != retry.approval_id


def test_repeated_call_escalates_and_runs_the_lookup_once(
    demo: Callable[..., Run],
) -> None:
    run = demo("--scenario", "repeated-call")
    assert run.result.state is OpState.ESCALATED
    assert run.result.stop is not None and "no_progress" in run.result.stop.reason
    assert len(executed(run, "get_order")) == 1


@pytest.mark.parametrize(
    ("name", "status"), [("denied", "denied"), ("approval-expired", "approval_expired")]
)
def test_undecided_or_denied_submission_never_pays(
    name: str, status: str, demo: Callable[..., Run]
) -> None:
    run = demo("--scenario", name)
    assert run.refunds == 0 and executed(run, "submit_refund") == []
    (submit,) = [c for c in run.result.calls if c.tool == "submit_refund"]
    assert submit.status == status and submit.approval_id


def _pids(out: str) -> dict[str, int]:
    found = re.findall(r"── \d · (.+?) \(.*?pid (\d+)\)", out)
    return {title: int(pid) for title, pid in found}


def _assert_three_processes(run: Run) -> None:
    pids = _pids(run.out)
    start = pids["start the operation"]
    approver = pids["an approver decides in a separate process"]
    resume = pids["resume in a fresh process"]
    assert len({start, approver, resume}) == 3, pids
    assert "sam (approver) approves apr_" in run.out


def test_default_refund_demo_as_a_command_three_processes(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, "-m", "callgate.engine.runtime.demo", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        check=False,
    )
    run = _collect(workdir, proc.returncode, proc.stdout)
    assert run.code == 0, proc.stdout + proc.stderr
    assert "provider    openai_responses" in run.out
    assert run.result.state is OpState.COMPLETED and run.refunds == 1 and run.audit_ok
    _assert_three_processes(run)
    assert "preparing to call submit_refund" in run.out
    assert "hash chain verified ok" in run.out


def test_default_refund_demo_on_anthropic(demo: Callable[..., Run]) -> None:
    run = demo("--provider", "anthropic")
    assert run.code == 0, run.out
    assert run.result.state is OpState.COMPLETED and run.refunds == 1 and run.audit_ok
    _assert_three_processes(run)
    assert _pids(run.out)["start the operation"] == os.getpid()
    (submit,) = [c for c in run.result.calls if c.tool == "submit_refund"]
    assert submit.call_id.startswith("toolu_") and submit.approval_id and submit.idempotency_key
    # The id table shows all four kinds of id.
    assert run.result.operation_id in run.out
    assert submit.approval_id[:14] in run.out and submit.idempotency_key[:12] in run.out


@pytest.mark.parametrize("provider", ["openai_chat", "gemini", "gemini_interactions"])
@pytest.mark.parametrize("name", ["max-tokens", "refusal"])
def test_stop_branches_on_the_other_families(
    provider: str, name: str, demo: Callable[..., Run]
) -> None:
    run = demo("--provider", provider, "--scenario", name)
    expected, _ = SCENARIOS[name].expected_for(provider)
    assert run.code == 0, run.out
    assert run.result.state is expected
    # Interactions has no refusal status: it fails, and is never mistaken for success.
    assert run.result.state is not OpState.COMPLETED
    assert executed(run, "create_refund_draft") == [] and run.refunds == 0


@pytest.mark.parametrize(
    ("provider", "variable"),
    [
        ("openai_responses", "OPENAI_API_KEY"),
        ("anthropic", "ANTHROPIC_API_KEY"),
        ("gemini", "GEMINI_API_KEY"),
    ],
)
def test_live_without_an_api_key_fails_clearly_with_exit_2(
    provider: str,
    variable: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(variable, raising=False)
    code = run_demo(_args("--live", "--provider", provider, "--workdir", str(tmp_path)))
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and variable in lines[0] and "--live" in lines[0]
    assert captured.out == ""
    assert not list(tmp_path.glob("audit-*"))  # nothing started


def test_live_runs_the_refund_scenario_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-used")
    code = run_demo(_args("--live", "--scenario", "denied", "--workdir", str(tmp_path)))
    assert code == 2
    assert "refund scenario only" in capsys.readouterr().err
