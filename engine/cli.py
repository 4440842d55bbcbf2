"""The ``callgate`` command line: the one public face that wires the engine to the adapters
(through provider names, resolved lazily).

    callgate decode --provider NAME [--chunk-size N] FILE   decode a captured SSE body
    callgate fixtures [DIR]                                 one line per recorded stream
    callgate states                                         the state diagram (Mermaid)
    callgate approvals list|show|approve|deny …             decide paused calls (cli_admin)
    callgate operations list|show|resume …                  inspect and resume (cli_admin)
    callgate audit verify FILE …                            check an audit trail (cli_audit)
    callgate demo …                                         the end-to-end demo (runtime.demo)

This module owns the parser and the stream commands; the store and audit commands live in
``cli_admin`` (``cli_resume`` for resume, ``cli_views`` for what they print) and
``cli_audit``. Everything a command writes goes through ``cli_output``: human-readable
lines made safe for a terminal, and a failed write of an answer told apart from every
other failure (``main`` maps it to its exit status). Only here may ``callgate.adapters`` be
reached, and only by provider name.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from .cli_admin import add_admin_commands
from .cli_audit import add_audit_commands
from .cli_errors import innermost
from .cli_output import (
    ANSWER_LOST,
    BROKEN_PIPE,
    UNWRITABLE,
    AnswerLost,
    CliParser,
    OutputFailed,
    output_failure,
    say,
    say_json,
    say_line,
    warn,
)
from .core.adapter import PROVIDERS, load_adapter
from .core.decode import StreamDecoder, decode
from .core.outcome import TurnOutcome
from .core.states import mermaid_diagram

__all__ = ["main", "outcome_json"]


def outcome_json(outcome: TurnOutcome) -> dict[str, Any]:
    """The stable JSON view of an outcome printed by ``callgate decode``."""
    return {
        "kind": outcome.kind.value,
        "raw_reason": outcome.raw_reason,
        "stop_reason": outcome.stop_reason,
        "response_id": outcome.response_id,
        "model": outcome.model,
        "text": outcome.text,
        "refusal": outcome.refusal,
        "calls": [
            {
                "index": c.index,
                "call_id": c.call_id,
                "name": c.name,
                "arguments": c.arguments,
                "error": c.error,
            }
            for c in outcome.calls
        ],
        "incomplete_calls": [
            {"index": c.index, "call_id": c.call_id, "name": c.name, "reason": c.reason}
            for c in outcome.incomplete_calls
        ],
        "error": None
        if outcome.error is None
        else {"code": outcome.error.code, "status": outcome.error.status},
    }


_READ_SIZE = 64 * 1024
_MAX_CHUNK = 64 * 1024 * 1024


def _decode_stream(provider: str, stream: BinaryIO, size: int) -> TurnOutcome:
    """Read ``stream`` in ``size``-byte chunks into the bounded decoder, and stop reading
    once the decoder has failed (a cap): memory stays bounded even for an endless input."""
    decoder = StreamDecoder(load_adapter(provider))
    while not decoder.failed:
        chunk = stream.read(size)
        if not chunk:
            break
        decoder.feed(chunk)
    return decoder.finish()


def _cmd_decode(args: argparse.Namespace) -> int:
    if args.chunk_size is not None and not 1 <= args.chunk_size <= _MAX_CHUNK:
        # (A read of that size is allocated up front: an unbounded one would fail late.)
        warn(f"callgate decode: --chunk-size must be 1 to {_MAX_CHUNK}")
        return 2
    size: int = args.chunk_size or _READ_SIZE
    try:
        if args.file == "-":
            if sys.stdin is None:
                warn("callgate decode: standard input is closed")
                return 2
            outcome = _decode_stream(args.provider, sys.stdin.buffer, size)
        else:
            with Path(args.file).open("rb") as stream:
                outcome = _decode_stream(args.provider, stream, size)
    except OSError as exc:
        warn(f"callgate decode: cannot read {args.file}: {exc.strerror}")
        return 2
    say_json(outcome_json(outcome))
    return 0


def fixture_lines(root: Path) -> Iterator[str]:
    """One line per recorded stream: family, file, outcome kind, raw reason, calls."""
    for family in PROVIDERS:
        for path in sorted((root / family).glob("*.sse")):
            outcome = decode(family, [path.read_bytes()])
            calls = ", ".join(f"{c.name}({c.call_id})" for c in outcome.calls) or "-"
            yield (
                f"{family:<20} {path.name:<64} {outcome.kind.value:<15} "
                f"{outcome.raw_reason or '-':<20} {calls}"
            )


def _cmd_fixtures(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    if not root.is_dir():
        warn(f"callgate fixtures: no such directory {root}")
        return 2
    try:
        for line in fixture_lines(root):
            say_line(line)  # (a file name is outside text: one line, escaped)
    except OSError as exc:  # e.g. a directory named like a stream (x.sse/)
        warn(f"callgate fixtures: cannot read {exc.filename}: {exc.strerror}")
        return 2
    return 0


def _cmd_states(args: argparse.Namespace) -> int:
    say(mermaid_diagram().removesuffix("\n"))
    return 0


_DEMO_MODULE = "callgate.engine.runtime.demo"


def _cmd_demo(args: argparse.Namespace, extra: Sequence[str]) -> int:
    # Imported only when asked for: the demo is optional and the CLI works without it.
    try:
        demo = importlib.import_module(_DEMO_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != _DEMO_MODULE:
            raise
        warn(f"callgate demo: not available ({_DEMO_MODULE} is not installed)")
        return 2
    summary = (demo.__doc__ or "the end-to-end demo").strip().splitlines()[0]
    parser = CliParser(prog="callgate demo", description=summary)
    demo.add_demo_arguments(parser)
    code = demo.run_demo(parser.parse_args(list(extra)))
    return int(code)


_DESCRIPTION = """\
callgate: the host-side control plane for LLM tool calling (the model proposes,
the host decides), from the command line.

  decode --provider NAME FILE        decode a captured SSE body into its outcome
  fixtures [DIR]                     decode every recorded stream, one line each
  states                             the operation state diagram (Mermaid)
  approvals list|show|approve|deny   decide the calls paused for a human
  operations list|show|resume        inspect operations; resume a paused one
  audit verify FILE                  check an audit trail's hash chain
  demo                               the end-to-end demo (callgate demo -h)

Each command's -h tells its options and its exit statuses."""

_EPILOG = f"""\
exit status:
  0    done
  1    refused (store, record, secret), or a broken audit trail
  2    usage error; or a command that changed nothing could not write its answer
  {ANSWER_LOST}    something was recorded (a decision, a resumed operation), but its
       answer could not be written to standard output
  {BROKEN_PIPE}  the reader of standard output went away (| head)
  operations resume has more (see callgate operations resume -h)"""


def _parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help_text: str
) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help_text, description=help_text[:1].upper() + help_text[1:])


def build_parser() -> argparse.ArgumentParser:
    # Raw: the command list and the exit statuses are laid out as written (the default
    # formatter re-wraps a description into one paragraph; the first line of this
    # module's docstring, used before, ended mid-sentence).
    parser: argparse.ArgumentParser = CliParser(
        prog="callgate",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _parser(sub, "decode", "decode a captured SSE body into its turn outcome (JSON)")
    p.add_argument("--provider", required=True, choices=PROVIDERS)
    p.add_argument(
        "--chunk-size", type=int, default=None, metavar="N", help="feed the body in N-byte chunks"
    )
    p.add_argument("file", help="path to the SSE body, or - for standard input")
    p.set_defaults(func=_cmd_decode)

    p = _parser(sub, "fixtures", "decode every recorded fixture, one line each")
    p.add_argument("dir", nargs="?", default="tests/fixtures")
    p.set_defaults(func=_cmd_fixtures)

    p = _parser(sub, "states", "print the operation state diagram (Mermaid)")
    p.set_defaults(func=_cmd_states)

    add_admin_commands(sub)
    add_audit_commands(sub)

    # The demo's own options are defined by the demo module, parsed in _cmd_demo (so -h is
    # left to it too).
    p = sub.add_parser(
        "demo", help="run the end-to-end demo (see callgate demo -h)", add_help=False
    )
    p.set_defaults(func=None)
    return parser


def _prog(args: argparse.Namespace | None) -> str:
    if args is None:
        return "callgate"
    name = getattr(args, "command_name", None)
    return name if isinstance(name, str) else f"callgate {args.command}"


def _escape_unencodable() -> None:
    """Text the output's encoding cannot hold (a tenant ``café`` on an ASCII or cp1252
    stdout, the ``…`` of a preview) is written as ``\xe9`` escapes: it ended in a
    UnicodeEncodeError traceback, after a decision had been recorded."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args: argparse.Namespace | None = None
    try:
        args, extra = parser.parse_known_args(argv)  # (-h writes its answer here)
        if sys.stdout is None:
            # Started with stdout closed (``>&-``): every command's answer would be lost,
            # and ``approvals approve --json`` failed only after its decision was
            # recorded. Refuse before anything is done.
            warn("callgate: standard output is closed; nothing was done")
            return UNWRITABLE
        _escape_unencodable()
        if args.command == "demo":
            return _cmd_demo(args, extra)
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # A failed write of the answer (cli_output): said as such, never as the store's
        # or a file's error; a reader that went away is no error of ours. (A task group
        # may wrap it.)
        inner = innermost(exc)
        if isinstance(inner, OutputFailed | AnswerLost):
            return output_failure(_prog(args), inner)
        if isinstance(inner, BrokenPipeError):  # (the demo's own prints)
            return output_failure(_prog(args), OutputFailed(inner))
        raise
    return code


if __name__ == "__main__":
    raise SystemExit(main())
