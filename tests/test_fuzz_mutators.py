"""The SSE stream mutators of ``fuzz/mutators.py`` as plain functions under Hypothesis.

Meaning-preserving mutations must leave callgate's reading of every recorded stream
unchanged (same outcome kind, calls, arguments and text), which also shows that the
decoder is indifferent to JSON whitespace, fragment boundaries, line-end style, SSE
comments and the optional space after ``data:``. Breaking mutations feed the decode
target's invariants (a mini fuzz run inside the normal suite, bounded examples).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callgate.engine.core.decode import decode
from callgate.engine.core.outcome import TurnOutcome
from fuzz import mutators
from fuzz.stream_checks import check_decode

from .conftest import fixture_files

FILES = fixture_files()
BODIES = [(provider, path.read_bytes()) for provider, path in FILES]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _reading(outcome: TurnOutcome) -> tuple[object, ...]:
    # Arguments, not their raw text: Gemini keeps the argument bytes as received.
    calls = [(c.call_id, c.name, c.arguments) for c in outcome.calls]
    return outcome.kind, outcome.stop_reason, calls, outcome.text, outcome.refusal


def test_events_split_and_join_back_exactly() -> None:
    for _, body in BODIES:
        events = mutators.split_events(body)
        assert b"".join(events) == body
        assert all(events)
    assert mutators.split_events(b"data: a\r\n\r\ndata: b\r\rdata: c") == [
        b"data: a\r\n\r\n",
        b"data: b\r\r",
        b"data: c",
    ]


@SETTINGS
@given(case=st.sampled_from(BODIES), seed=st.integers(0, 2**32), rounds=st.integers(1, 5))
def test_valid_mutations_keep_the_reading(case: tuple[str, bytes], seed: int, rounds: int) -> None:
    provider, body = case
    mutated = mutators.mutate_valid(body, random.Random(seed), provider, rounds)
    assert _reading(decode(provider, [mutated])) == _reading(decode(provider, [body]))


@SETTINGS
@given(case=st.sampled_from(BODIES), seed=st.integers(0, 2**32))
def test_breaking_mutations_keep_the_decode_invariants(case: tuple[str, bytes], seed: int) -> None:
    provider, body = case
    check_decode(provider, mutators.mutate(body, random.Random(seed), provider))


@pytest.mark.parametrize("op", mutators.BREAKING + mutators.VALID, ids=lambda op: op.__name__)
def test_every_mutation_is_deterministic_and_total(op: mutators.Mutation) -> None:
    for provider, body in BODIES[::4]:
        for seed in range(3):
            first = op(body, random.Random(seed), provider)
            assert first == op(body, random.Random(seed), provider)
            assert isinstance(first, bytes)
        assert isinstance(op(b"", random.Random(0), provider), bytes)


def test_cut_reaches_every_prefix() -> None:
    body = b"event: error\ndata: {}\n\n"
    cuts = {mutators.cut(body, random.Random(s)) for s in range(2000)}
    assert cuts == {body[:i] for i in range(len(body) + 1)}


def test_injected_errors_make_the_turn_fail() -> None:
    for provider, body in BODIES:
        mutated = mutators.inject_error(body, random.Random(1), provider)
        assert mutated != body
        outcome = decode(provider, [mutated])
        assert not outcome.complete, (provider, outcome.stop_reason)


def test_guess_provider_names_every_fixture_with_content() -> None:
    # The one-event Anthropic error body has nothing provider-specific in it.
    guesses = {(provider, mutators.guess_provider(body)) for provider, body in BODIES}
    assert guesses - {(p, p) for p in mutators.PROVIDERS} == {("anthropic", None)}
