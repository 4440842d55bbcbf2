"""The adapters' UTF-8 measures, and Gemini's check of the ``args`` bytes msgspec skips."""

from __future__ import annotations

import json

import pytest

from callgate.adapters._utf8 import is_utf8, utf8_len
from callgate.engine import OutcomeKind, decode


@pytest.mark.parametrize("text", ["", "ascii", "café", "日本語", "😀 x", "a" * 70000 + "é"])
def test_utf8_len_counts_encoded_bytes(text: str) -> None:
    assert utf8_len(text) == len(text.encode())


_SLICE = 1 << 16


@pytest.mark.parametrize("shift", range(-3, 4))
def test_is_utf8_accepts_a_character_cut_by_the_slice_boundary(shift: int) -> None:
    # A 4-byte character at every offset around the first 64 KiB boundary.
    data = b"a" * (_SLICE + shift - 2) + "😀".encode() + b"z"
    assert is_utf8(data)


@pytest.mark.parametrize(
    "data",
    [
        b"\xff",
        b"ok\xc3",  # a character cut off at the very end
        b"a" * (_SLICE - 1) + b"\xe6\x97",  # cut off after the boundary
        b"a" * (_SLICE * 2) + b"\xed\xa0\x80",  # an encoded surrogate
        b"\xc0\x80",  # an overlong NUL
    ],
)
def test_is_utf8_rejects_invalid_bytes(data: bytes) -> None:
    assert not is_utf8(data)
    with pytest.raises(UnicodeDecodeError):
        data.decode()  # the same verdict as one strict decode


def _gemini_call(args: bytes) -> bytes:
    head = b'data: {"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":'
    tail = b'}}]},"finishReason":"STOP"}],"responseId":"r1"}\r\n\r\n'
    return head + args + tail


@pytest.mark.parametrize("pad", [0, _SLICE - 9])
def test_gemini_args_with_invalid_utf8_fail_the_turn(pad: int) -> None:
    # msgspec skips the args unread (they are kept raw): the adapter checks them.
    args = b'{"a":"' + b"x" * pad + b'\xff"}'
    out = decode("gemini", [_gemini_call(args)])
    assert out.kind is OutcomeKind.FAILED
    assert "not valid UTF-8" in out.stop_reason
    assert out.calls == ()


@pytest.mark.parametrize("pad", [0, _SLICE - 9])
def test_gemini_args_with_multibyte_text_are_kept_verbatim(pad: int) -> None:
    args = b'{"a":"' + b"x" * pad + "日本😀".encode() + b'"}'
    out = decode("gemini", [_gemini_call(args)])
    assert out.kind is OutcomeKind.TOOL_PROPOSALS
    (call,) = out.calls
    assert call.raw_arguments == args
    assert call.arguments == json.loads(args)
