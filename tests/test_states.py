"""The operation state machine: every state × input pair, terminal states, reachability,
and the generated diagram (and the README's copy of it, once the README embeds it)."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from collections import deque
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from callgate.engine.core.errors import ConfigError, IllegalTransition
from callgate.engine.core.outcome import OutcomeKind, ProviderErrorInfo, TurnOutcome
from callgate.engine.core.states import (
    INITIAL,
    TERMINAL,
    TRANSITIONS,
    OpInput,
    OpState,
    StopInfo,
    allowed_inputs,
    input_for_outcome,
    mermaid_diagram,
    transition,
)

ROOT = Path(__file__).resolve().parent.parent
ALL_PAIRS = list(itertools.product(OpState, OpInput))
NON_TERMINAL = [s for s in OpState if s not in TERMINAL]


@pytest.mark.parametrize(("state", "event"), ALL_PAIRS, ids=lambda x: x.name)
def test_every_pair_follows_the_table_or_raises(state: OpState, event: OpInput) -> None:
    expected = TRANSITIONS.get((state, event))
    if expected is None:
        with pytest.raises(IllegalTransition):
            transition(state, event)
    else:
        assert transition(state, event) is expected


@given(st.sampled_from(OpState), st.sampled_from(OpInput))
def test_transition_is_the_table_lookup(state: OpState, event: OpInput) -> None:
    try:
        assert transition(state, event) is TRANSITIONS[(state, event)]
    except IllegalTransition:
        assert (state, event) not in TRANSITIONS


@given(st.lists(st.sampled_from(OpInput), max_size=40))
def test_random_input_sequences_never_leave_a_terminal_state(events: list[OpInput]) -> None:
    state = INITIAL
    for event in events:
        try:
            nxt = transition(state, event)
        except IllegalTransition:
            continue
        assert state not in TERMINAL, "a terminal state accepted an input"
        state = nxt


@pytest.mark.parametrize("state", sorted(TERMINAL), ids=lambda s: s.name)
def test_terminal_states_reject_every_input(state: OpState) -> None:
    assert allowed_inputs(state) == frozenset()
    for event in OpInput:
        with pytest.raises(IllegalTransition, match="terminal"):
            transition(state, event)


def test_terminal_set_is_exactly_the_five_end_states() -> None:
    assert {s.name for s in TERMINAL} == {
        "COMPLETED",
        "REFUSED",
        "INCOMPLETE",
        "FAILED",
        "ESCALATED",
    }


@pytest.mark.parametrize("state", NON_TERMINAL, ids=lambda s: s.name)
def test_every_non_terminal_state_can_reach_a_terminal_state(state: OpState) -> None:
    seen, queue = {state}, deque([state])
    while queue:
        current = queue.popleft()
        for (src, _), dst in TRANSITIONS.items():
            if src is current and dst not in seen:
                seen.add(dst)
                queue.append(dst)
    assert seen & TERMINAL


def test_every_state_is_reachable_from_the_initial_state() -> None:
    seen, queue = {INITIAL}, deque([INITIAL])
    while queue:
        current = queue.popleft()
        for (src, _), dst in TRANSITIONS.items():
            if src is current and dst not in seen:
                seen.add(dst)
                queue.append(dst)
    assert seen == set(OpState)


def test_every_input_is_used_somewhere() -> None:
    assert {event for (_, event) in TRANSITIONS} == set(OpInput)


def test_only_final_text_completes() -> None:
    into_completed = {(s, i) for (s, i), dst in TRANSITIONS.items() if dst is OpState.COMPLETED}
    assert into_completed == {(OpState.MODEL_REQUESTED, OpInput.FINAL_TEXT)}


def test_pause_turn_continues_the_same_model_turn() -> None:
    assert transition(OpState.MODEL_REQUESTED, OpInput.PAUSED) is OpState.MODEL_REQUESTED


@pytest.mark.parametrize("state", NON_TERMINAL, ids=lambda s: s.name)
def test_budget_and_deadline_escalate_from_every_non_terminal_state(state: OpState) -> None:
    assert transition(state, OpInput.BUDGET_EXHAUSTED) is OpState.ESCALATED
    assert transition(state, OpInput.DEADLINE) is OpState.ESCALATED


def test_safe_stops_escalate_and_binding_mismatch_fails() -> None:
    for (_, event), dst in TRANSITIONS.items():
        if event in (
            OpInput.NO_PROGRESS,
            OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE,
            OpInput.BUDGET_EXHAUSTED,
            OpInput.DEADLINE,
        ):
            assert dst is OpState.ESCALATED
        if event is OpInput.BINDING_MISMATCH:
            assert dst is OpState.FAILED
    assert transition(OpState.EXECUTING, OpInput.OUTCOME_UNKNOWN_UNRECONCILABLE) is (
        OpState.ESCALATED
    )


def test_a_whole_operation_with_an_approval_pause() -> None:
    path = [
        OpInput.TOOL_PROPOSALS,
        OpInput.APPROVAL_NEEDED,
        OpInput.RESUMED,
        OpInput.EXECUTABLE,
        OpInput.RESULTS_DONE,
        OpInput.RESULTS_SENT,
        OpInput.TRANSIENT_FAILURE,
        OpInput.RETRY_READY,
        OpInput.FINAL_TEXT,
    ]
    state = INITIAL
    for event in path:
        state = transition(state, event)
    assert state is OpState.COMPLETED


def test_illegal_transition_names_state_and_input() -> None:
    with pytest.raises(IllegalTransition, match=r"EXECUTING.*FINAL_TEXT"):
        transition(OpState.EXECUTING, OpInput.FINAL_TEXT)


# --- outcome -> input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "error", "expected"),
    [
        (OutcomeKind.FINAL_TEXT, None, OpInput.FINAL_TEXT),
        (OutcomeKind.TOOL_PROPOSALS, None, OpInput.TOOL_PROPOSALS),
        (OutcomeKind.REFUSAL, None, OpInput.REFUSAL),
        (OutcomeKind.TRUNCATED, None, OpInput.TRUNCATED),
        (OutcomeKind.PAUSED, None, OpInput.PAUSED),
        (OutcomeKind.FAILED, None, OpInput.API_FAILURE),
        (OutcomeKind.FAILED, ProviderErrorInfo(code="bad"), OpInput.API_FAILURE),
        (OutcomeKind.FAILED, ProviderErrorInfo(retryable=True), OpInput.TRANSIENT_FAILURE),
    ],
)
def test_input_for_outcome(
    kind: OutcomeKind, error: ProviderErrorInfo | None, expected: OpInput
) -> None:
    outcome = TurnOutcome(kind=kind, raw_reason="x", stop_reason="y", error=error)
    assert input_for_outcome(outcome) is expected
    assert (OpState.MODEL_REQUESTED, expected) in TRANSITIONS


# --- StopInfo ------------------------------------------------------------------------------


def test_stop_info_carries_both_reasons_and_round_trips() -> None:
    info = StopInfo(
        state=OpState.INCOMPLETE,
        input=OpInput.TRUNCATED,
        provider_reason="max_tokens",
        reason="the provider stopped at its output token limit",
    )
    again = msgspec.json.decode(msgspec.json.encode(info), type=StopInfo)
    assert again == info
    assert again.provider_reason == "max_tokens"


def test_stop_info_refuses_a_non_terminal_state_or_an_empty_reason() -> None:
    with pytest.raises(ConfigError):
        StopInfo(state=OpState.EXECUTING, input=OpInput.DEADLINE, provider_reason=None, reason="x")
    with pytest.raises(ConfigError):
        StopInfo(state=OpState.FAILED, input=OpInput.API_FAILURE, provider_reason="e", reason="")


# --- diagram -------------------------------------------------------------------------------


def test_diagram_has_every_edge_of_the_table() -> None:
    diagram = mermaid_diagram()
    assert diagram.startswith("stateDiagram-v2\n")
    edge_lines = {}
    for line in diagram.splitlines():
        m = re.fullmatch(r"    (\w+) --> (\w+): (.+)", line)
        if m:
            edge_lines[(m[1], m[2])] = set(m[3].split(", "))
    drawn = {
        (OpState[src], OpInput[event], OpState[dst])
        for (src, dst), events in edge_lines.items()
        for event in events
    }
    table = {(src, event, dst) for (src, event), dst in TRANSITIONS.items()}
    assert drawn == table
    for state in TERMINAL:
        assert f"    {state.name} --> [*]" in diagram
    assert f"    [*] --> {INITIAL.name}" in diagram


def test_diagram_is_deterministic() -> None:
    assert mermaid_diagram() == mermaid_diagram()


def test_the_cli_prints_the_diagram_without_a_warning() -> None:
    out = subprocess.run(
        [sys.executable, "-W", "error", "-m", "callgate.engine.cli", "states"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert (out.stdout, out.stderr) == (mermaid_diagram(), "")


def test_readme_diagram_matches_the_table() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.exists() else ""
    m = re.search(r"<!-- states:begin -->\n(.*?)<!-- states:end -->", text, re.DOTALL)
    assert m is not None, "README.md must embed the generated diagram between the markers"
    block = m[1].strip()
    block = re.sub(r"^```mermaid\n|\n```$", "", block)
    assert block.strip() == mermaid_diagram().strip(), (
        "README state diagram is stale: regenerate with callgate states"
    )
