"""(Re)create the seed files of ``fuzz/corpus/`` from the recorded fixtures.

    python fuzz/seed_corpus.py

Seeds are named ``seed-*``; this script rewrites only those and never touches
regression inputs (``regress-*``) or merged coverage inputs. Stream targets get the
recorded bodies of their provider (``sse_decoder`` gets all of them, ``diff_sdk`` the
OpenAI and Anthropic ones); ``accumulator`` gets the engine-event sequences of every
fixture in its byte form; ``arguments`` the raw argument text of every recorded call
plus hand-picked edge cases; ``canonical`` a few values in its byte language.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from callgate.engine.core.decode import decode  # noqa: E402
from fuzz.mutators import PROVIDERS  # noqa: E402
from fuzz.stream_checks import RecordingAdapter  # noqa: E402

CORPUS = ROOT / "fuzz" / "corpus"
FIXTURES = ROOT / "tests" / "fixtures"

_ARGUMENT_EDGES = (
    b"",
    b" ",
    b"{}",
    b'{"a":1}',
    b'{"a":1,"a":2}',
    b'{"a":NaN}',
    b'{"a":1e400}',
    b'{"a":"\\ud800"}',
    b'{"\\u003a":1,":":2}',
    b'{"a":[[[[[[[[1]]]]]]]]}',
    b'{"a":123456789012345678901234567890}',
    b"[1,2]",
    b'{"a":1} x',
    b'{"a":"\xff"}',
)
_CANONICAL = (
    b"\x00",
    b"\x01\x17\x00\x41\x41\x41",
    b"\x02\x39\x08abc\x04\x00\x00\x00\x00\x00\x00\xf8\x7f",
    b"\x00\x49\x45a\x43\x80\x00\x00\x00\x00\x00\x00\x00\x00",
    b"\x03\x25\x45k\x07\x12\x16\x8d\xed\xa0\x80ab",
)


def _write(target: str, name: str, data: bytes) -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"seed-{name}").write_bytes(data)


def main() -> None:
    from fuzz.targets.accumulator import encode_events
    from fuzz.targets.diff_sdk import SDK_PROVIDERS
    from fuzz.targets.diff_sdk import check as diff_check

    for folder in CORPUS.glob("*"):
        for old in folder.glob("seed-*"):
            old.unlink()
    for provider in PROVIDERS:
        for path in sorted((FIXTURES / provider).glob("*.sse")):
            body = path.read_bytes()
            name = f"{provider}-{path.stem}"
            for target in ("sse_decoder", f"adapter_{provider}", f"decode_{provider}"):
                _write(target, name, body)
            if provider in SDK_PROVIDERS:
                diff_check(body)  # only seeds both sides agree on (raises otherwise)
                _write("diff_sdk", name, body)
            from callgate.engine.core.adapter import load_adapter
            from callgate.engine.core.decode import StreamDecoder

            recorder = RecordingAdapter(load_adapter(provider))
            stream = StreamDecoder(recorder)
            stream.feed(body)
            stream.finish()
            _write("accumulator", name, encode_events(recorder.events))
            for call in decode(provider, [body]).calls:
                _write("arguments", f"{name}-{call.index}", call.raw_arguments)
    for i, edge in enumerate(_ARGUMENT_EDGES):
        _write("arguments", f"edge-{i}", edge)
    for i, value in enumerate(_CANONICAL):
        _write("canonical", f"value-{i}", value)


if __name__ == "__main__":
    main()
